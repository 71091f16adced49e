package feed

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvfast/kvfast/internal/syncbuf"
	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
)

// Child processes are this test binary re-executed with KVFAST_FEED_CHILD
// naming their role, so every cross-process test is self-contained.
func TestMain(m *testing.M) {
	role := os.Getenv("KVFAST_FEED_CHILD")
	if role == "" {
		os.Exit(m.Run())
	}
	if err := runChild(role, os.Getenv("KVFAST_SEG")); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runChild(role, seg string) error {
	id, _ := strconv.ParseUint(os.Getenv("KVFAST_WORKER"), 10, 64)
	switch role {
	case "publish-file":
		ops, err := readOps(os.Getenv("KVFAST_OPS"))
		if err != nil {
			return err
		}
		p, err := shm.Register(seg, workerCfg(id))
		if err != nil {
			return err
		}
		for _, o := range ops {
			if err := publishOp(p, o); err != nil {
				return err
			}
		}
		fmt.Println(p.Slot(), p.Generation(), p.Seq())
		return nil // no Close: the worker stays live, as a running engine would
	case "publish-until-killed":
		n, _ := strconv.Atoi(os.Getenv("KVFAST_OPS_N"))
		ops := genOps(id, n)
		p, err := shm.Register(seg, workerCfg(id))
		if err != nil {
			return err
		}
		fmt.Println("READY")
		pace := os.Getenv("KVFAST_PACE") != ""
		holdAt, _ := strconv.Atoi(os.Getenv("KVFAST_HOLD_AT"))
		for i, o := range ops {
			if holdAt > 0 && i == holdAt {
				// Hold until the test says go on (a line on stdin), so that
				// the test acts mid-stream however slowly it runs.
				fmt.Println("HELD")
				if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
					return fmt.Errorf("cannot read the go-ahead: %w", err)
				}
			}
			if err := publishOp(p, o); err != nil {
				return err
			}
			if pace && i%64 == 0 {
				time.Sleep(200 * time.Microsecond)
			}
		}
		fmt.Println("DONE")
		time.Sleep(time.Hour)
	case "partial-write":
		n, _ := strconv.Atoi(os.Getenv("KVFAST_OPS_N"))
		p, err := shm.Register(seg, workerCfg(id))
		if err != nil {
			return err
		}
		for _, o := range genOps(id, n) {
			if err := publishOp(p, o); err != nil {
				return err
			}
		}
		// Write most of a valid-looking next record past head, the way a
		// publisher killed between copying and committing leaves it.
		s, err := shm.Open(seg, shm.Options{NoCreate: true})
		if err != nil {
			return err
		}
		h := s.Header()
		ring := ringAt(s, p.Slot())
		head := s.RingState(p.Slot()).Head
		rec := make([]byte, 56)
		rec[0], rec[4], rec[6] = 56, byte(shm.KindStored), testBlockSize
		rec[8] = byte(p.Seq() + 1)
		rec[16] = byte(p.Generation())
		rec[20] = 1
		f, err := os.OpenFile(seg, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		f.WriteAt(rec, ring+256+int64(head%uint64(h.RingBytes)))
		fmt.Println("READY")
		time.Sleep(time.Hour)
	case "latency-publisher":
		n, _ := strconv.Atoi(os.Getenv("KVFAST_OPS_N"))
		return latencyPublisher(seg, n)
	case "lock-registry":
		// Holds the registry lock (docs/shm-layout.md: a write lock on
		// byte 8192) until its stdin closes, as a hung process would.
		f, err := os.OpenFile(seg, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: 0, Start: 8192, Len: 1}
		if err := syscall.FcntlFlock(f.Fd(), syscall.F_SETLKW, &lk); err != nil {
			return err
		}
		fmt.Println("LOCKED")
		_, _ = io.Copy(io.Discard, os.Stdin)
		return nil
	case "ingest":
		s, err := shm.Open(seg, shm.Options{NoCreate: true})
		if err != nil {
			return err
		}
		in := New(s, Config{HeartbeatGrace: time.Hour})
		for {
			ok, err := in.Acquire(context.Background())
			if err != nil {
				return err
			}
			if ok {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		fmt.Println("LOCKED")
		return in.Run(context.Background())
	}
	return fmt.Errorf("unknown role %q", role)
}

// child starts this binary in a role and returns it with a reader of its
// stdout lines and a writer to its stdin.
type child struct {
	cmd   *exec.Cmd
	lines chan string
	stdin io.WriteCloser
}

func startChild(t *testing.T, role, seg string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{"KVFAST_FEED_CHILD=" + role, "KVFAST_SEG=" + seg}, env...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, lines: make(chan string, 16), stdin: in}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return c
}

func (c *child) expect(t *testing.T, want string) string {
	t.Helper()
	select {
	case line, ok := <-c.lines:
		if !ok {
			t.Fatalf("child exited before printing %q", want)
		}
		if want != "" && line != want {
			t.Fatalf("child printed %q, want %q", line, want)
		}
		return line
	case <-time.After(30 * time.Second):
		t.Fatalf("child did not print %q", want)
	}
	return ""
}

// resume lets a child held at KVFAST_HOLD_AT go on.
func (c *child) resume(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
		t.Fatalf("cannot resume the child: %v", err)
	}
}

func (c *child) kill(t *testing.T) {
	t.Helper()
	c.cmd.Process.Signal(syscall.SIGKILL)
	c.cmd.Wait()
}

func (c *child) wait(t *testing.T) {
	t.Helper()
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("child failed: %v", err)
	}
}

func pythonDir(t *testing.T) string {
	dir, err := filepath.Abs("../publishers/python")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestCrossProcessPublishers: a Go child, a Python publisher and a Python
// vLLM adapter each publish the same workload into one segment while this
// process ingests; the index must reflect exactly what each published.
func TestCrossProcessPublishers(t *testing.T) {
	seg := openSeg(t, 1<<20)
	in := acquire(t, seg, Config{HeartbeatGrace: time.Hour})
	ops := genOps(11, 1500)
	opsPath := writeOps(t, ops)

	type result struct {
		name string
		slot workers.Slot
		seq  uint64
	}
	var results []result
	parse := func(name, line string) {
		f := strings.Fields(line)
		if len(f) != 3 {
			t.Fatalf("%s printed %q", name, line)
		}
		slot, _ := strconv.Atoi(f[0])
		seq, _ := strconv.ParseUint(f[2], 10, 64)
		results = append(results, result{name, workers.Slot(slot), seq})
	}

	goChild := startChild(t, "publish-file", seg.Path(), "KVFAST_WORKER=1", "KVFAST_OPS="+opsPath)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // ingest concurrently with the publishers
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				in.Poll()
			}
		}
	}()
	parse("go", goChild.expect(t, ""))
	goChild.wait(t)

	python, err := exec.LookPath("python3")
	if err == nil {
		for i, mode := range []string{"direct", "vllm"} {
			cmd := exec.Command(python, "testdata/py_publish.py", seg.Path(), opsPath, strconv.Itoa(2+i), mode)
			cmd.Env = append(os.Environ(), "KVFAST_PY_DIR="+pythonDir(t))
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("python %s: %v\n%s", mode, err, out)
			}
			parse("python-"+mode, string(out))
		}
	} else {
		t.Log("python3 not found: Python publisher not exercised")
	}
	close(stop)
	wg.Wait()
	drainAll(in)

	want := newModel()
	for _, o := range ops {
		want.apply(o)
	}
	for _, r := range results {
		if r.seq != uint64(len(ops)) {
			t.Errorf("%s published %d records, want %d", r.name, r.seq, len(ops))
		}
		if _, last := seg.Reader(r.slot).Cursor(); last != r.seq {
			t.Errorf("%s: consumer cursor at %d, publisher at %d", r.name, last, r.seq)
		}
		want.check(t, seg.Index(), r.slot)
	}
	if st := in.Stats(); st.Gaps != 0 || st.Garbage != 0 || st.Duplicate != 0 || st.UnresolvedParent != 0 {
		t.Fatalf("stats %+v", st)
	}
	if python != "" {
		w, ok := seg.Worker(results[1].slot)
		if !ok || w.Model != testModel || w.DPRank != 3 || w.KVCapacityBlocks != 777 || w.Endpoint != "http://127.0.0.1:7777" || w.BlockSize != 4 {
			t.Fatalf("python registration %+v", w)
		}
		l, err := seg.LoadOf(results[1].slot)
		if err != nil || l.Running != 5 || l.Waiting != 2 || l.KVUsedBlocks != 40 || l.KVTotalBlocks != 777 || l.Generation != w.Generation {
			t.Fatalf("python load page %+v %v", l, err)
		}
		if w, _ := seg.Worker(results[2].slot); w.DPRank != 1 || w.Endpoint != "http://127.0.0.1:7778" {
			t.Fatalf("vllm adapter registration %+v", w)
		}
	}
}

// TestPublisherKilledMidWrite kills publishers while they write: nothing
// half-written may be applied, and everything committed must be.
func TestPublisherKilledMidWrite(t *testing.T) {
	t.Run("random kill", func(t *testing.T) {
		// 4 MiB rings hold the 30000 records (about 90 bytes each); every
		// segment is reserved on disk in full, so the rings are kept small.
		seg := openSeg(t, 4<<20)
		const n = 30000
		c := startChild(t, "publish-until-killed", seg.Path(), "KVFAST_WORKER=3", "KVFAST_OPS_N="+strconv.Itoa(n), "KVFAST_PACE=1")
		c.expect(t, "READY")
		// Unpaced, the publisher finished before any sleep-timed kill; paced,
		// it is killed once it has published a random share of the stream.
		target := uint64(1 + rand.IntN(n-1))
		deadline := time.Now().Add(time.Minute)
		for seg.RingState(0).Published < target {
			if time.Now().After(deadline) {
				t.Fatalf("the publisher published %d of %d records in a minute", seg.RingState(0).Published, target)
			}
			time.Sleep(100 * time.Microsecond)
		}
		c.kill(t)
		in := acquire(t, seg, Config{HeartbeatGrace: time.Hour})
		var seqs []uint64
		in.onApply = func(_ workers.Slot, rec *shm.Record) { seqs = append(seqs, rec.Seq) }
		drainAll(in)
		if uint64(len(seqs)) < target || seg.RingState(0).Dropped != 0 {
			t.Fatalf("applied %d records after a kill at %d or later (%+v)", len(seqs), target, seg.RingState(0))
		}
		t.Logf("killed after %d of %d records", len(seqs), n)
		for i, s := range seqs {
			if s != uint64(i+1) {
				t.Fatalf("record %d has seq %d", i, s)
			}
		}
		ops := genOps(3, n)
		m := newModel()
		for _, o := range ops[:len(seqs)] {
			m.apply(o)
		}
		m.check(t, seg.Index(), 0)
		if st := in.Stats(); st.Garbage != 0 || st.Gaps != 0 {
			t.Fatalf("stats %+v", st)
		}
	})
	t.Run("uncommitted record", func(t *testing.T) {
		seg := openSeg(t, 1<<20)
		c := startChild(t, "partial-write", seg.Path(), "KVFAST_WORKER=4", "KVFAST_OPS_N=200")
		c.expect(t, "READY")
		c.kill(t)
		in := acquire(t, seg, Config{HeartbeatGrace: time.Hour})
		drainAll(in)
		m := newModel()
		for _, o := range genOps(4, 200) {
			m.apply(o)
		}
		m.check(t, seg.Index(), 0)
		if st := in.Stats(); st.Records != 200 || st.Garbage != 0 {
			t.Fatalf("stats %+v", st)
		}
		// The engine restarts: the new generation overwrites the stale
		// bytes and its records apply from a clean slate.
		p, err := seg.Register(workerCfg(4))
		if err != nil {
			t.Fatal(err)
		}
		fresh := newModel()
		for _, o := range genOps(40, 50) {
			publishOp(p, o)
			fresh.apply(o)
		}
		drainAll(in)
		fresh.check(t, seg.Index(), p.Slot())
	})
}

// TestRouterRestartMidStream kills the ingesting router mid-stream and
// resumes in another process: the sequence numbers it applies must
// continue exactly after the persisted cursor, and the index must end
// equal to everything published, nothing lost or doubled.
func TestRouterRestartMidStream(t *testing.T) {
	seg := openSeg(t, 4<<20) // holds the 20000 records unconsumed
	router := startChild(t, "ingest", seg.Path())
	router.expect(t, "LOCKED")

	standby := New(seg, Config{HeartbeatGrace: time.Hour})
	if ok, _ := standby.Acquire(context.Background()); ok {
		t.Fatal("acquired the ingester lock while another process holds it")
	}
	const n = 20000
	// The publisher holds halfway until the router is dead, so that the
	// router cannot reach the end first, however slowly this test runs.
	pub := startChild(t, "publish-until-killed", seg.Path(), "KVFAST_WORKER=5", "KVFAST_OPS_N="+strconv.Itoa(n),
		"KVFAST_PACE=1", "KVFAST_HOLD_AT="+strconv.Itoa(n/2))
	pub.expect(t, "READY")
	// Let the router ingest part of the stream, then kill it.
	deadline := time.Now().Add(20 * time.Second)
	for seg.RingState(0).LastSeq < n/10 {
		if time.Now().After(deadline) {
			t.Fatal("child router is not ingesting")
		}
		time.Sleep(time.Millisecond)
	}
	router.kill(t)
	if st := seg.RingState(0); st.LastSeq > n/2 {
		t.Fatalf("the router applied seq %d, past where the publisher holds (%d)", st.LastSeq, n/2)
	}
	// Takeover: the dead holder's flock is gone.
	ok, err := standby.Acquire(context.Background())
	if !ok || err != nil {
		t.Fatalf("takeover after holder died: %v %v", ok, err)
	}
	defer standby.Release()
	resumeFrom := seg.RingState(0).LastSeq
	var seqs []uint64
	standby.onApply = func(_ workers.Slot, rec *shm.Record) { seqs = append(seqs, rec.Seq) }
	pub.expect(t, "HELD")
	pub.resume(t)
	pub.expect(t, "DONE")
	drainAll(standby)
	if len(seqs) == 0 || seqs[0] != resumeFrom+1 {
		t.Fatalf("resumed at seq %v, persisted cursor says %d", seqs[:min(1, len(seqs))], resumeFrom)
	}
	for i, s := range seqs {
		if s != resumeFrom+uint64(i)+1 {
			t.Fatalf("after restart, record %d has seq %d (resumed from %d)", i, s, resumeFrom)
		}
	}
	if last := seqs[len(seqs)-1]; last != n {
		t.Fatalf("last applied seq %d, published %d", last, n)
	}
	m := newModel()
	for _, o := range genOps(5, n) {
		m.apply(o)
	}
	m.check(t, seg.Index(), 0)
	if s := standby.Stats(); s.Gaps != 0 || s.Garbage != 0 {
		t.Fatalf("stats %+v", s)
	}
	t.Logf("child router applied 1..%d, this process %d..%d; duplicates skipped: %d", resumeFrom, resumeFrom+1, n, standby.Stats().Duplicate)
}

// TestIngesterLockTakeover: a standby Run takes over when the holder dies,
// and says, once, that it waits and, once, that it took over.
func TestIngesterLockTakeover(t *testing.T) {
	seg := openSeg(t, 1<<20)
	holder := startChild(t, "ingest", seg.Path())
	holder.expect(t, "LOCKED")
	var log syncbuf.Buffer
	in := New(seg, Config{StandbyPoll: 5 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	time.Sleep(30 * time.Millisecond)
	if in.Stats().Ingesting {
		t.Fatal("standby ingests while the holder is alive")
	}
	killed := time.Now()
	holder.kill(t)
	for !in.Stats().Ingesting {
		if time.Since(killed) > 10*time.Second {
			t.Fatal("standby never took over")
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("took over %v after the holder died", time.Since(killed).Round(time.Millisecond))
	if got := seg.Ingester().PID; got != uint64(os.Getpid()) {
		t.Fatalf("ingester pid %d", got)
	}
	cancel()
	<-done
	if out := log.String(); strings.Count(out, "another router ingests") != 1 || strings.Count(out, "took over ingesting") != 1 {
		t.Fatalf("the standby's log:\n%s", out)
	}
}

// TestPythonPublisherRespectsLiveHolder: the Python publisher, like the
// Go one, refuses to register the worker id of an engine that is alive
// and heartbeating (this process), and stops writing a ring whose slot
// another registration took.
func TestPythonPublisherRespectsLiveHolder(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found")
	}
	seg := openSeg(t, 1<<20)
	p, err := seg.Register(shm.WorkerConfig{WorkerID: 31, Model: "test-model", BlockSize: 4, Endpoint: "127.0.0.1:8031"})
	if err != nil {
		t.Fatal(err)
	}
	// Worker 33's registration records a pid no process has any more, as
	// an engine in another PID namespace looks from here.
	unseen, err := seg.Register(shm.WorkerConfig{WorkerID: 33, Model: "test-model", BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Skipf("cannot run a short-lived process: %v", err)
	}
	// docs/shm-layout.md: the registry starts at byte 8192, 512 bytes a
	// slot, the pid a u32 at byte 12 of it.
	scribble(t, seg.Path(), 8192+int64(unseen.Slot())*512+12, binary.LittleEndian.AppendUint32(nil, uint32(exited.Process.Pid)))
	// The holders heartbeat while the Python publisher watches them.
	stop, beating := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(beating)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				_ = p.Heartbeat()
				_ = unseen.Heartbeat()
			}
		}
	}()
	cmd := exec.Command(python, "testdata/py_registry.py", seg.Path(), "31", "32", "33")
	cmd.Env = append(os.Environ(), "KVFAST_PY_DIR="+pythonDir(t))
	out, err := cmd.CombinedOutput()
	close(stop)
	<-beating
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	if got := strings.Fields(string(out)); !slices.Equal(got, []string{"refused", "displaced-refused", "lost"}) {
		t.Fatalf("python publisher: %s", out)
	}
	if err := p.Heartbeat(); err != nil {
		t.Fatalf("the live holder lost its slot: %v", err)
	}
}

// TestPythonPublisherLocksAcrossThreads: two publishers of one process
// exclude each other from the registry. POSIX record locks belong to the
// process, so the second publisher's lock did not wait for the first's,
// and two threads could claim one slot.
func TestPythonPublisherLocksAcrossThreads(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found")
	}
	seg := openSeg(t, 1<<20)
	cmd := exec.Command(python, "testdata/py_lock_threads.py", seg.Path())
	cmd.Env = append(os.Environ(), "KVFAST_PY_DIR="+pythonDir(t))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "waited" {
		t.Fatalf("the second publisher's registry lock: %s; want it to wait for the first's", got)
	}
}

// TestPythonPublisherSkipsReservedSlots: the Python publisher never
// claims a slot a router reserved for a static worker, not for an engine
// with that worker's id, nor when it is the last slot left.
func TestPythonPublisherSkipsReservedSlots(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found")
	}
	seg := openSeg(t, 1<<20)
	slots, _, err := seg.Reserve([]shm.Reservation{{WorkerID: 40, Model: "test-model"}})
	if err != nil {
		t.Fatal(err)
	}
	register := func(id int) string {
		cmd := exec.Command(python, "testdata/py_reserved.py", seg.Path(), strconv.Itoa(id))
		cmd.Env = append(os.Environ(), "KVFAST_PY_DIR="+pythonDir(t))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("python: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if got := register(40); got == strconv.Itoa(int(slots[0])) || strings.HasPrefix(got, "error") {
		t.Fatalf("the static worker's id registered into: %s (its reserved slot is %d)", got, slots[0])
	}
	for id := uint64(100); ; id++ {
		if _, err := seg.Register(shm.WorkerConfig{WorkerID: id, Model: "test-model", BlockSize: 4}); err != nil {
			if !errors.Is(err, shm.ErrRegistryFull) {
				t.Fatal(err)
			}
			break
		}
	}
	if got := register(41); got != "full" {
		t.Fatalf("with only the reserved slot left, the Python publisher got: %s", got)
	}
}

// TestPythonAdapterUnits runs the vLLM adapter's own tests
// (publishers/python/test_kvfast_vllm.py), which need no consumer: an
// engine started before its router, for one.
func TestPythonAdapterUnits(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found")
	}
	cmd := exec.Command(python, "-B", "-m", "unittest", "test_kvfast_vllm")
	cmd.Dir = pythonDir(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("python3 -m unittest test_kvfast_vllm: %v\n%s", err, out)
	}
}

// TestHeldRegistryLockDoesNotKeepTheDeadRoutable: a worker whose
// heartbeat stopped while another process holds the registry lock cannot
// be marked down, but is reported stale (the router routes it as down)
// until it can; then it is marked down and no longer stale.
func TestHeldRegistryLockDoesNotKeepTheDeadRoutable(t *testing.T) {
	seg := openSeg(t, shm.MinRingBytes)
	in := acquire(t, seg, Config{HeartbeatGrace: 200 * time.Millisecond, RegistryEvery: time.Millisecond})
	p, err := seg.Register(workerCfg(1))
	if err != nil {
		t.Fatal(err)
	}
	locker := startChild(t, "lock-registry", seg.Path())
	locker.expect(t, "LOCKED")
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30s", what)
			}
			drainAll(in)
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitUntil("the silent worker reported stale", func() bool { return in.Stale().Has(p.Slot()) })
	if info, _ := seg.Worker(p.Slot()); info.State != shm.StateLive {
		t.Fatalf("marked %v while the lock was held elsewhere", info.State)
	}
	locker.stdin.Close()
	waitUntil("the worker marked down", func() bool {
		info, _ := seg.Worker(p.Slot())
		return info.State == shm.StateDown
	})
	if in.Stale().Has(p.Slot()) {
		t.Fatal("still stale once marked down")
	}
}

// TestPythonPublisherRevives: the Python publisher, marked down while it
// was paused, takes its registration back as it was (the Go publisher's
// TestPausedWorkerRevivesWithItsBlocks), so that what it cached before,
// during and after the pause is claimed exactly, with no gap.
func TestPythonPublisherRevives(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found")
	}
	seg := openSeg(t, 1<<20)
	in := acquire(t, seg, Config{HeartbeatGrace: time.Hour})
	ops := genOps(12, 90)
	cmd := exec.Command(python, "testdata/py_publish.py", seg.Path(), writeOps(t, ops), "41", "revive")
	cmd.Env = append(os.Environ(), "KVFAST_PY_DIR="+pythonDir(t))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := bufio.NewScanner(stdout)
	readLine := func() []string {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("python stopped: %v\n%s", lines.Err(), stderr.String())
		}
		return strings.Fields(lines.Text())
	}
	before := readLine()
	slotN, _ := strconv.Atoi(before[0])
	slot := workers.Slot(slotN)
	drainAll(in)
	_, gen, beat := seg.SlotState(slot)
	if ok, err := seg.MarkDown(slot, gen, beat); !ok || err != nil {
		t.Fatalf("MarkDown: %v %v", ok, err)
	}
	drainAll(in)
	if _, err := io.WriteString(stdin, "\n"); err != nil {
		t.Fatal(err)
	}
	after := readLine()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("python: %v\n%s", err, stderr.String())
	}
	drainAll(in)
	if after[0] != before[0] || after[1] != before[1] || after[2] != strconv.Itoa(len(ops)) {
		t.Fatalf("python went from slot, generation, seq %v to %v, want the same slot and generation and seq %d", before, after, len(ops))
	}
	if info, _ := seg.Worker(slot); info.State != shm.StateLive || info.Generation != gen {
		t.Fatalf("revived as %+v, want live under generation %d", info, gen)
	}
	want := newModel()
	for _, o := range ops {
		want.apply(o)
	}
	want.check(t, seg.Index(), slot)
	if st := in.Stats(); st.WorkersRevived != 1 || st.Gaps != 0 || st.SkippedDown != 0 || st.GenerationBumps != 0 {
		t.Fatalf("stats after the revival %+v", st)
	}
}
