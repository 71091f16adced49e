package shm

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfast/kvfast/workers"
)

func TestRegistryLifecycle(t *testing.T) {
	seg, path := openTest(t, Options{})
	cfg := WorkerConfig{WorkerID: 42, DPRank: 0, Model: "llama", BlockSize: 16, KVCapacityBlocks: 9000, Endpoint: "http://127.0.0.1:8001"}
	p, err := Register(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rank1 := cfg
	rank1.DPRank = 1
	p1, err := Register(path, rank1)
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Close()
	if p.Slot() == p1.Slot() {
		t.Fatal("two DP ranks share a slot")
	}
	ws := seg.Workers(nil)
	if len(ws) != 2 {
		t.Fatalf("%d workers listed", len(ws))
	}
	w := ws[0]
	if w.WorkerID != 42 || w.DPRank != 0 || w.Model != "llama" || w.BlockSize != 16 || w.KVCapacityBlocks != 9000 ||
		w.Endpoint != cfg.Endpoint || w.State != StateLive || w.Generation != 1 || w.PID == 0 || w.Heartbeat == 0 {
		t.Fatalf("bad listing %+v", w)
	}
	if ws[1].DPRank != 1 {
		t.Fatalf("rank 1 listed as %+v", ws[1])
	}

	// A restarted engine (same id and rank) gets its old slot back under a
	// new generation, and the old publisher learns it lost the slot.
	again, err := Register(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if again.Slot() != p.Slot() || again.Generation() != 2 {
		t.Fatalf("re-registration: slot %d gen %d", again.Slot(), again.Generation())
	}
	if err := p.Heartbeat(); !errors.Is(err, ErrSlotLost) {
		t.Fatalf("old publisher heartbeat: %v", err)
	}
	p.Close()
	if info, _ := seg.Worker(again.Slot()); info.State != StateLive || info.Generation != 2 {
		t.Fatalf("old publisher's Close clobbered the new registration: %+v", info)
	}

	// Router marks it down; the next heartbeat revives it as it was (the
	// router kept its blocks), generation and sequence numbers kept.
	_, gen, beat := seg.SlotState(again.Slot())
	if ok, err := seg.MarkDown(again.Slot(), gen, beat); !ok || err != nil {
		t.Fatalf("MarkDown: %v %v", ok, err)
	}
	if info, _ := seg.Worker(again.Slot()); info.State != StateDown {
		t.Fatalf("state %v after MarkDown", info.State)
	}
	if err := again.Heartbeat(); err != nil {
		t.Fatal(err)
	}
	if info, _ := seg.Worker(again.Slot()); info.State != StateLive || info.Generation != 2 || again.Generation() != 2 {
		t.Fatalf("revive: %+v, publisher's gen %d; want live under gen 2", info, again.Generation())
	}
	// A stale MarkDown (heartbeat moved on) does nothing.
	if ok, _ := seg.MarkDown(again.Slot(), gen, beat); ok {
		t.Fatal("MarkDown with a stale heartbeat succeeded")
	}
	if err := again.Close(); err != nil {
		t.Fatal(err)
	}
	if info, _ := seg.Worker(again.Slot()); info.State != StateClosed {
		t.Fatalf("state %v after Close", info.State)
	}
	if err := again.Stored(0, false, nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Stored after Close: %v", err)
	}
}

func TestRegistryRejectsBadConfig(t *testing.T) {
	seg, _ := openTest(t, Options{})
	for _, cfg := range []WorkerConfig{
		{BlockSize: 0},
		{BlockSize: 16, Model: string(make([]byte, MaxModelLen+1))},
		{BlockSize: 16, Endpoint: string(make([]byte, MaxEndpointLen+1))},
	} {
		if _, err := seg.Register(cfg); err == nil {
			t.Errorf("accepted %+v", cfg)
		}
	}
}

// TestRegistryRefusesABlockTheRingCannotCarry: a block size of which not
// one block fits a record of the ring is refused before a slot is
// claimed: the worker never goes live.
func TestRegistryRefusesABlockTheRingCannotCarry(t *testing.T) {
	seg, _ := openTest(t, Options{RingBytes: MinRingBytes})
	for range 3 {
		if _, err := seg.Register(WorkerConfig{WorkerID: 1, BlockSize: 256, Endpoint: "127.0.0.1:8001"}); err == nil {
			t.Fatal("registered a block size no record can carry")
		}
	}
	if ws := seg.Workers(nil); len(ws) != 0 {
		t.Fatalf("refused registrations left slots behind: %+v", ws)
	}
}

func TestExpireClaim(t *testing.T) {
	seg, _ := openTest(t, Options{})
	sw := seg.u64(slotOff(5) + sState)
	atomic.StoreUint64(sw, nextState(0, StateClaiming))
	if _, ok := seg.Worker(5); ok {
		t.Fatal("claiming slot listed")
	}
	if ok, err := seg.ExpireClaim(5); !ok || err != nil {
		t.Fatalf("ExpireClaim: %v %v", ok, err)
	}
	if st, _, _ := seg.SlotState(5); st != StateDown {
		t.Fatalf("state %v", st)
	}
}

// TestRegistryHammer registers and closes workers from several goroutines
// while a reader lists them; no two live publishers may share a slot and
// no listing may show a half-written slot.
func TestRegistryHammer(t *testing.T) {
	seg, _ := openTest(t, Options{})
	var wg sync.WaitGroup
	var stop atomic.Bool
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			for _, w := range seg.Workers(nil) {
				if w.Model != "model-"+string(rune('a'+w.WorkerID%26)) || w.BlockSize != 16 {
					t.Errorf("torn slot %+v", w)
					return
				}
			}
		}
	}()
	var owners [64]atomic.Int32
	var writers sync.WaitGroup
	for g := 0; g < 4; g++ {
		writers.Add(1)
		go func(g int) {
			defer writers.Done()
			for i := 0; i < 200; i++ {
				id := uint64(g*1000 + i%40)
				p, err := seg.Register(WorkerConfig{WorkerID: id, BlockSize: 16, Model: "model-" + string(rune('a'+id%26))})
				if err != nil {
					t.Error(err)
					return
				}
				if owners[p.Slot()].Add(1) != 1 {
					t.Errorf("slot %d has two live owners", p.Slot())
				}
				owners[p.Slot()].Add(-1)
				p.Close()
			}
		}(g)
	}
	writers.Wait()
	stop.Store(true)
	wg.Wait()
}

func TestLoadSeqlock(t *testing.T) {
	seg, _ := openTest(t, Options{})
	p := register(t, seg, 1)
	var wg sync.WaitGroup
	var stop atomic.Bool
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := uint64(1); !stop.Load(); i++ {
			p.Load(Load{Running: i, Waiting: i, KVUsedBlocks: i, KVTotalBlocks: i})
		}
	}()
	var reads int
	for reads < 20000 {
		l, err := seg.LoadOf(p.Slot())
		if errors.Is(err, ErrTorn) {
			continue
		}
		if l.Running != l.Waiting || l.Running != l.KVUsedBlocks || l.Running != l.KVTotalBlocks {
			t.Fatalf("torn read %+v", l)
		}
		if l.Running > 0 && l.Generation != p.Generation() {
			t.Fatalf("generation %d", l.Generation)
		}
		reads++
	}
	stop.Store(true)
	wg.Wait()
	// A writer that died mid-update leaves seq odd: readers give up
	// cleanly, and the next write repairs it.
	seq := seg.u64(loadPageOff(int(p.Slot())) + lSeq)
	atomic.StoreUint64(seq, atomic.LoadUint64(seq)|1)
	if _, err := seg.LoadOf(p.Slot()); !errors.Is(err, ErrTorn) {
		t.Fatalf("odd seq: %v", err)
	}
	p.Load(Load{Running: 7})
	if l, err := seg.LoadOf(p.Slot()); err != nil || l.Running != 7 {
		t.Fatalf("after repair: %+v %v", l, err)
	}
}

// TestRegisterRefusesALiveHolder: a second engine given the worker id and
// rank of one that heartbeats is refused once its heartbeat is seen to
// move, saying which process and endpoint hold them; a holder whose
// heartbeat stands still past liveHeartbeat, or whose process is gone, is
// taken over (an engine restarted after a crash), and the displaced
// publisher can no longer write the slot's ring.
func TestRegisterRefusesALiveHolder(t *testing.T) {
	seg, _ := openTest(t, Options{})
	cfg := WorkerConfig{WorkerID: 7, Model: "m", BlockSize: 4, Endpoint: "127.0.0.1:8007"}
	p, err := seg.Register(cfg)
	if err != nil {
		t.Fatal(err)
	}
	off := slotOff(p.slot)
	// The registration made as if by another process that is alive, this
	// test's parent: not one of this process's own.
	p.forget()
	atomic.StoreUint32(seg.u32(off+sPID), uint32(os.Getppid()))
	stop := keepBeating(p)
	_, err = seg.Register(cfg)
	stop()
	if !errors.Is(err, ErrWorkerLive) || !strings.Contains(err.Error(), "127.0.0.1:8007") ||
		!strings.Contains(err.Error(), strconv.Itoa(os.Getppid())) {
		t.Fatalf("a heartbeating holder's worker id was registered again: %v", err)
	}
	if err := p.Heartbeat(); err != nil {
		t.Fatalf("the holder lost its slot to a refused registration: %v", err)
	}

	// Its heartbeat stands still past liveHeartbeat: presumed dead.
	atomic.StoreUint64(seg.u64(off+sHeartbeat), uint64(monoNow()-2*liveHeartbeat.Nanoseconds()))
	q, err := seg.Register(cfg)
	if err != nil || q.Slot() != p.Slot() {
		t.Fatalf("a stale holder's slot was not taken over: %v", err)
	}
	head := seg.RingState(q.Slot()).Head
	if err := p.Stored(0, false, []uint64{1}, make([]uint32, 4)); !errors.Is(err, ErrSlotLost) {
		t.Fatalf("the displaced publisher wrote: %v", err)
	}
	if err := p.Removed([]uint64{1}); !errors.Is(err, ErrSlotLost) {
		t.Fatalf("the displaced publisher wrote: %v", err)
	}
	if err := p.Cleared(); !errors.Is(err, ErrSlotLost) {
		t.Fatalf("the displaced publisher wrote: %v", err)
	}
	if got := seg.RingState(q.Slot()).Head; got != head {
		t.Fatalf("the ring's head moved from %d to %d under the displaced publisher", head, got)
	}
	if err := q.Stored(0, false, []uint64{1}, make([]uint32, 4)); err != nil {
		t.Fatalf("the new holder cannot write: %v", err)
	}

	// A holder whose process has exited, heartbeat fresh: taken over at
	// once.
	q.forget()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skipf("cannot run a short-lived process: %v", err)
	}
	atomic.StoreUint32(seg.u32(off+sPID), uint32(cmd.Process.Pid))
	atomic.StoreUint64(seg.u64(off+sHeartbeat), uint64(monoNow()))
	if _, err := seg.Register(cfg); err != nil {
		t.Fatalf("a dead holder's slot was not taken over: %v", err)
	}
}

// TestRegisterTakesOverItsOwn: this process registering a worker id it
// holds already (an engine of it starting again) takes the slot at once,
// whatever pid the slot records: another PID namespace's pid may equal
// this process's.
func TestRegisterTakesOverItsOwn(t *testing.T) {
	seg, _ := openTest(t, Options{})
	cfg := WorkerConfig{WorkerID: 8, Model: "m", BlockSize: 4}
	p, err := seg.Register(cfg)
	if err != nil {
		t.Fatal(err)
	}
	atomic.StoreUint32(seg.u32(slotOff(p.slot)+sPID), uint32(os.Getppid()))
	q, err := seg.Register(cfg)
	if err != nil || q.Slot() != p.Slot() {
		t.Fatalf("this process's own registration was not taken over: %v", err)
	}
	// And a pid equal to this process's does not make another process's
	// registration this one's: while it heartbeats, it is refused.
	q.forget()
	atomic.StoreUint32(seg.u32(slotOff(q.slot)+sPID), uint32(os.Getpid()))
	stop := keepBeating(q)
	_, err = seg.Register(cfg)
	stop()
	if !errors.Is(err, ErrWorkerLive) {
		t.Fatalf("another process's registration under this process's pid was taken over: %v", err)
	}
}

// TestRegisterWaitsOutAFutureHeartbeat: a holder whose heartbeat is ahead
// of this clock never ages; one that stands still for liveHeartbeat of
// watching is taken over all the same, so a registration never waits
// without end.
func TestRegisterWaitsOutAFutureHeartbeat(t *testing.T) {
	seg, _ := openTest(t, Options{})
	cfg := WorkerConfig{WorkerID: 9, Model: "m", BlockSize: 4}
	p, err := seg.Register(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p.forget()
	off := slotOff(p.slot)
	atomic.StoreUint32(seg.u32(off+sPID), uint32(os.Getppid()))
	atomic.StoreUint64(seg.u64(off+sHeartbeat), uint64(monoNow()+int64(time.Hour)))
	q, err := seg.Register(cfg)
	if err != nil || q.Slot() != p.Slot() {
		t.Fatalf("a holder whose heartbeat is an hour ahead and stands still was not taken over: %v", err)
	}
}

// keepBeating heartbeats p every 10 ms, as a live engine does, until the
// function it returns is called; that function returns once it stopped.
func keepBeating(p *Publisher) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case <-time.After(10 * time.Millisecond):
				_ = p.Heartbeat()
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

// TestReserve: slots a router reserves for its static workers are never
// claimed by a registering engine, even once every other slot is taken
// or an engine shares a static worker's id; a router restarted with the
// same list keeps its slots and generations, and a stale reservation is
// released to the next router that reserves.
func TestReserve(t *testing.T) {
	seg, path := openTest(t, Options{})
	// A live engine already holds the highest slot (every slot was
	// registered, then all but the highest closed): the reservation goes
	// around it, not over it.
	var first []*Publisher
	for id := range uint64(workersMax) {
		p, err := seg.Register(WorkerConfig{WorkerID: 100 + id, BlockSize: 16, Endpoint: "127.0.0.1:9000"})
		if err != nil {
			t.Fatal(err)
		}
		first = append(first, p)
	}
	for _, p := range first[:workersMax-1] {
		p.Close()
	}
	defer first[workersMax-1].Close()
	if first[workersMax-1].Slot() != workersMax-1 {
		t.Fatalf("the last registration took slot %d", first[workersMax-1].Slot())
	}

	static := []Reservation{{WorkerID: 1, Model: "m", Endpoint: "http://127.0.0.1:8001"}, {WorkerID: 2, Model: "m"}}
	slots, gens, err := seg.Reserve(static)
	if err != nil {
		t.Fatal(err)
	}
	if slots[0] != workersMax-2 || slots[1] != workersMax-3 {
		t.Fatalf("reserved slots %v, want %d and %d (the top one is live)", slots, workersMax-2, workersMax-3)
	}
	for i, slot := range slots {
		info, err := seg.ReadWorker(slot)
		if err != nil || info.State != StateReserved || info.WorkerID != static[i].WorkerID || info.Generation != gens[i] {
			t.Fatalf("slot %d: %+v, %v", slot, info, err)
		}
	}
	// An engine with a static worker's id does not take its slot.
	same, err := Register(path, WorkerConfig{WorkerID: 1, BlockSize: 16, Endpoint: "127.0.0.1:9001"})
	if err != nil {
		t.Fatal(err)
	}
	defer same.Close()
	if same.Slot() == slots[0] {
		t.Fatal("an engine with a static worker's id took its reserved slot")
	}
	// Fill the registry: the last registrations fail rather than land in
	// a reserved slot.
	var pubs []*Publisher
	defer func() {
		for _, p := range pubs {
			p.Close()
		}
	}()
	for id := uint64(1000); ; id++ {
		p, err := seg.Register(WorkerConfig{WorkerID: id, BlockSize: 16, Endpoint: "127.0.0.1:9002"})
		if err != nil {
			if !errors.Is(err, ErrRegistryFull) {
				t.Fatal(err)
			}
			break
		}
		if p.Slot() == slots[0] || p.Slot() == slots[1] {
			t.Fatalf("registration %d took reserved slot %d", id, p.Slot())
		}
		pubs = append(pubs, p)
	}
	if want := int(workersMax) - 1 - 2 - 1; len(pubs) != want { // the live top one, two reserved, same
		t.Fatalf("%d registrations fitted, want %d", len(pubs), want)
	}

	// The same list again (a restarted router): same slots, same
	// generations, so the ingester keeps their blocks.
	again, againGens, err := seg.Reserve(static)
	if err != nil || again[0] != slots[0] || again[1] != slots[1] || againGens[0] != gens[0] || againGens[1] != gens[1] {
		t.Fatalf("reserving again: %v %v, %v; want %v %v", again, againGens, err, slots, gens)
	}
	if !seg.KeepReserved(slots[0], gens[0]) || seg.KeepReserved(slots[0], gens[0]+1) {
		t.Fatal("KeepReserved does not tell its own reservation from another generation's")
	}

	// A router with another list, while the first one's reservations are
	// fresh, cannot take them: the registry is full.
	if _, _, err := seg.Reserve([]Reservation{{WorkerID: 3}}); !errors.Is(err, ErrRegistryFull) {
		t.Fatalf("reserving over fresh reservations: %v", err)
	}
	// Once they are stale, the next router takes one and releases the
	// other; the first router learns it lost its slots.
	for _, slot := range slots {
		atomic.StoreUint64(seg.u64(slotOff(int(slot))+sHeartbeat), uint64(monoNow()-2*reservationStale.Nanoseconds()))
	}
	got, _, err := seg.Reserve([]Reservation{{WorkerID: 3}})
	if err != nil || got[0] != slots[0] {
		t.Fatalf("reserving over stale reservations: %v, %v", got, err)
	}
	if st, _, _ := seg.SlotState(slots[1]); st != StateClosed {
		t.Fatalf("a stale reservation left over is %v, want closed", st)
	}
	if seg.KeepReserved(slots[0], gens[0]) {
		t.Fatal("the first router still holds a slot another router took")
	}
}

const workersMax = workers.Max

// TestReleaseStaleReservation: a reservation its router no longer
// refreshes is released by the ingester's scan (ReleaseStale), so that
// slots a router left do not stay out of the publishers' reach when no
// router reserves any more; a fresh one stays. And a router waiting for
// the registry lock gives up, saying why, rather than hang at start-up
// behind a publisher stopped mid-registration.
func TestReleaseStaleReservation(t *testing.T) {
	seg, _ := openTest(t, Options{})
	slots, _, err := seg.Reserve([]Reservation{{WorkerID: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := seg.ReleaseStale(slots[0]); ok || err != nil {
		t.Fatalf("a fresh reservation released: %v %v", ok, err)
	}
	atomic.StoreUint64(seg.u64(slotOff(int(slots[0]))+sHeartbeat), uint64(monoNow()-2*reservationStale.Nanoseconds()))
	if ok, err := seg.ReleaseStale(slots[0]); !ok || err != nil {
		t.Fatalf("a stale reservation kept: %v %v", ok, err)
	}
	if st, _, _ := seg.SlotState(slots[0]); st != StateClosed {
		t.Fatalf("released to %v, want closed", st)
	}
	p, err := seg.Register(WorkerConfig{WorkerID: 2, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	unlock, _, err := seg.lockRegistry(true) // a publisher mid-registration
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	if _, err := seg.lockRegistryWithin(50 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "held it") {
		t.Fatalf("waiting for a held registry lock: %v", err)
	}
}

// TestRegistryLockHolderNamesTheProcess: while another process holds the
// registry lock (a publisher stopped mid-registration), RegistryLockHolder
// names its pid, which the ingester's warning about a worker it cannot
// mark down reports; with none held, 0.
func TestRegistryLockHolderNamesTheProcess(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found")
	}
	seg, path := openTest(t, Options{})
	if pid := seg.RegistryLockHolder(); pid != 0 {
		t.Fatalf("no lock held, holder %d", pid)
	}
	// The publishers' lock: byte 8192, one byte (docs/shm-layout.md).
	cmd := exec.Command(python, "-c", `import os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
os.lseek(fd, 8192, os.SEEK_SET)
os.lockf(fd, os.F_LOCK, 1)
print("locked", flush=True)
sys.stdin.read()`, path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	line := make([]byte, len("locked\n"))
	if _, err := io.ReadFull(stdout, line); err != nil || string(line) != "locked\n" {
		t.Fatalf("the locking process said %q: %v", line, err)
	}
	if pid := seg.RegistryLockHolder(); pid != cmd.Process.Pid {
		t.Fatalf("holder %d, want the locking process %d", pid, cmd.Process.Pid)
	}
}
