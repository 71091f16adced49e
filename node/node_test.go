package node

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/internal/redact"
	"github.com/kvfast/kvfast/internal/testnet"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/prompt"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
)

// testWait bounds every wait for something a node does on its own
// goroutines; generous, because the race detector on a shared 2-core
// machine is slow.
const testWait = 10 * time.Second

// testConfig is DefaultConfig sized for tests: small indexes, a fast
// registry poll, no log output.
func testConfig(t *testing.T) Config {
	cfg := DefaultConfig()
	cfg.Segment.Path = filepath.Join(t.TempDir(), "kvfast.shm")
	cfg.Segment.IndexCapacity = 1 << 12
	cfg.Approx.Capacity = 1 << 12
	cfg.RegistryPoll = 5 * time.Millisecond
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.AdminListen = "127.0.0.1:0" // never a fixed port in tests
	return cfg
}

// waitFor polls cond until it holds or testWait passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestCloseDropsEngineConnections: the model poll's kept-alive
// connections to engines (two goroutines each) close with the node, not
// at the transport's 90 s idle timeout: a soak's restarted routers had
// left theirs, and its goroutine check waited 89 of its 90 s.
func TestCloseDropsEngineConnections(t *testing.T) {
	var asked atomic.Int64
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			asked.Add(1)
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
			return
		}
		_, _ = io.WriteString(w, "{}")
	}))
	defer engine.Close()
	_, _ = fasthttp.DialTimeout(testnet.RefusingAddr(t), time.Second) // fasthttp's dialer goroutine, counted in the baseline
	baseline := runtime.NumGoroutine()
	cfg := testConfig(t)
	cfg.Static = []StaticWorker{{ID: 1, Endpoint: engine.URL, Model: "m"}}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the engine's models to be asked", func() bool { return asked.Load() > 0 })
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	// Well short of the idle timeout: the engine pool's cleaners take a
	// few seconds (TestCloseStopsBackgroundWork).
	waitGoroutines(t, baseline, 60*time.Second)
}

// waitGoroutines waits up to within for the goroutines to be back at
// baseline, and fails with every goroutine's stack if they are not.
func waitGoroutines(t *testing.T, baseline int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for runtime.NumGoroutine() > baseline {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after Close, %d before New:\n%s", runtime.NumGoroutine(), baseline,
				buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCloseStopsBackgroundWork: everything New starts (registry sync,
// approx expiry, ingestion, a ZMQ subscriber redialling a silent engine,
// health probes) stops on Close, Close is idempotent, and the segment is
// released: a second router on it takes the ingester role.
func TestCloseStopsBackgroundWork(t *testing.T) {
	// fasthttp's default dialer starts one goroutine for the life of the
	// process on its first dial; start it now, so that the baseline
	// counts it.
	_, _ = fasthttp.DialTimeout(testnet.RefusingAddr(t), time.Second)
	baseline := runtime.NumGoroutine()
	cfg := testConfig(t)
	cfg.Dispatch.Health.Interval = 5 * time.Millisecond
	cfg.Static = []StaticWorker{{ID: 1, Endpoint: testnet.RefusingAddr(t), Model: "m", Events: "tcp://" + testnet.RefusingAddr(t)}}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the node to ingest", func() bool { s := n.Snapshot(); return s.Feed != nil && s.Feed.Ingesting })
	waitFor(t, "the ZMQ feed to dial", func() bool {
		for _, w := range n.Snapshot().Workers {
			if w.ZMQ != nil && w.ZMQ.Disconnects > 0 {
				return true
			}
		}
		return false
	})
	if err := n.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := n.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown after Close: %v", err)
	}
	// The engine pool's HTTP clients stop their idle-connection cleaners
	// within a few seconds of their last connection: fasthttp gives no way
	// to stop them sooner.
	waitGoroutines(t, baseline, testWait)

	cfg.Static = nil
	again, err := New(cfg)
	if err != nil {
		t.Fatalf("cannot reopen the segment after Close: %v", err)
	}
	defer again.Close()
	waitFor(t, "a second router to take the ingester role", func() bool {
		s := again.Snapshot()
		return s.Feed != nil && s.Feed.Ingesting
	})
}

// TestRegistryJoinAndLeave: an engine that registers in the segment
// becomes a routable worker, and one that deregisters leaves the worker
// set.
func TestRegistryJoinAndLeave(t *testing.T) {
	cfg := testConfig(t)
	cfg.Dispatch.Health.Interval = 0 // no health checks
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	eng, err := mocker.Start(mocker.Config{WorkerID: 42, DPRank: 1, Segment: cfg.Segment.Path, Speedup: 100})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the engine to join", func() bool { return len(n.Snapshot().Workers) == 1 })
	w := n.Snapshot().Workers[0]
	if w.WorkerID != 42 || w.DPRank != 1 || w.Source != "registry" || w.Role != "both" || w.Endpoint != eng.Addr() || !w.Healthy || w.Generation == 0 {
		t.Errorf("joined worker %+v", w)
	}
	slot, ok := n.Scheduler().Resolve(42, 1)
	if !ok {
		t.Error("the scheduler cannot resolve the joined worker")
	}
	// The registration's generation reaches the scheduler, which starts a
	// restarted engine's cache, timing and progress afresh by it.
	if info, _ := n.Scheduler().Worker(slot); info.Generation != w.Generation {
		t.Errorf("scheduler has generation %d, the registry %d", info.Generation, w.Generation)
	}
	// What the router sent the engine (its own history, which text
	// prompts route on) is forgotten when the engine leaves.
	sent := []uint64{7, 8, 9}
	n.approx.Insert(slot, sent, time.Now())
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the engine to leave", func() bool { return len(n.Snapshot().Workers) == 0 })
	var overlaps workers.Overlaps
	if n.approx.FindMatches(sent, &overlaps); overlaps[slot] != 0 {
		t.Errorf("the history still credits the slot of an engine that left with %d blocks", overlaps[slot])
	}
	if _, ok := n.Scheduler().Resolve(42, 1); ok {
		t.Error("the scheduler still resolves a worker that left")
	}
}

// logAddr is a slog handler that hands over the address of the first
// "router listening" record.
type logAddr struct {
	once *sync.Once
	addr chan string
	hup  chan struct{} // a SIGHUP was logged as ignored; nil: not watched
}

func (h logAddr) Enabled(context.Context, slog.Level) bool { return true }
func (h logAddr) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h logAddr) WithGroup(string) slog.Handler            { return h }

func (h logAddr) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "SIGHUP ignored") && h.hup != nil {
		select {
		case h.hup <- struct{}{}:
		default:
		}
	}
	if r.Message != "router listening" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "addr" {
			h.once.Do(func() { h.addr <- a.Value.String() })
		}
		return true
	})
	return nil
}

// startRun runs Run(ctx, cfg) on a goroutine with a logger that catches
// the API listener's address, and returns that address once it is
// logged, the logger's channels, and where Run's result will come.
func startRun(ctx context.Context, t *testing.T, cfg Config) (string, logAddr, chan error) {
	t.Helper()
	logs := logAddr{once: new(sync.Once), addr: make(chan string, 1), hup: make(chan struct{}, 1)}
	cfg.Logger = slog.New(logs)
	ran := make(chan error, 1)
	go func() { ran <- Run(ctx, cfg) }()
	select {
	case addr := <-logs.addr:
		return addr, logs, ran
	case err := <-ran:
		t.Fatalf("Run returned before serving: %v", err)
	case <-time.After(testWait):
		t.Fatal("Run never logged its address")
	}
	return "", logs, ran // not reached: t.Fatal ends the test
}

// TestRunStopsOnCancel: Run serves until its context ends, then shuts
// down and returns nil.
func TestRunStopsOnCancel(t *testing.T) {
	cfg := testConfig(t)
	cfg.Listen = "127.0.0.1:0"
	cfg.Segment.Path = ""
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, logs, ran := startRun(ctx, t, cfg)
	resp, err := http.Get("http://" + addr + "/health")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "ok") {
		t.Fatalf("/health: %d %s", resp.StatusCode, body)
	}
	// SIGHUP, which kills a process that does not catch it, is logged and
	// ignored while Run serves (it catches it from its start).
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case <-logs.hup:
	case <-time.After(testWait):
		t.Fatal("SIGHUP was not logged as ignored")
	}
	// The admin endpoints are on the admin listener only.
	if resp, err := http.Get("http://" + addr + "/admin/workers"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("/admin/workers on the API listener: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	cancel()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run returned %v after its context ended", err)
		}
	case <-time.After(testWait):
		t.Fatal("Run did not return after its context ended")
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Error("the router still accepts after Run returned")
	}
}

// TestRunReportsListenFailure: Run fails, and releases what New opened,
// when it cannot listen.
func TestRunReportsListenFailure(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := testConfig(t)
	cfg.Listen = ln.Addr().String()
	err = Run(context.Background(), cfg)
	var op *net.OpError
	if err == nil || !errors.As(err, &op) {
		t.Fatalf("Run on a busy address = %v, want a listen error", err)
	}
	// The segment was closed: a router can open it and ingest.
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	waitFor(t, "the ingester role", func() bool { s := n.Snapshot(); return s.Feed != nil && s.Feed.Ingesting })
}

// TestNewRefusesBadStaticWorkers: a static worker whose event feed cannot
// work is refused when the router is built, naming the worker.
func TestNewRefusesBadStaticWorkers(t *testing.T) {
	for _, w := range []StaticWorker{
		{ID: 1, Endpoint: "127.0.0.1:9", Events: "tcp://127.0.0.1:5557"},                       // no model
		{ID: 2, Endpoint: "127.0.0.1:9", Model: "m", Events: "tcp://*:5557"},                   // where vLLM binds
		{ID: 3, Endpoint: "127.0.0.1:9", Model: "m", Events: "tcp://127.0.0.1:1", Replay: "x"}, // bad replay
		{ID: 4, Endpoint: "https://127.0.0.1:9"},                                               // not http
	} {
		cfg := testConfig(t)
		cfg.Segment.Path = ""
		cfg.Static = []StaticWorker{w}
		n, err := New(cfg)
		if err == nil {
			_ = n.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "worker "+strconv.Itoa(int(w.ID))) {
			t.Errorf("%+v: %v", w, err)
		}
	}
}

// TestCloseWhileRequestsRun: Close while clients hammer the endpoints that
// read the index (metrics, admin, routing) must not unmap the segment
// under a running handler, which faults the process. Close waits for the
// handlers it cut before it frees the segment.
func TestCloseWhileRequestsRun(t *testing.T) {
	for round := range 3 {
		n, err := New(testConfig(t))
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan error, 1)
		go func() { served <- n.Serve(ln) }()
		base := "http://" + ln.Addr().String()
		stop := make(chan struct{})
		var clients sync.WaitGroup
		var answered atomic.Int64
		for _, path := range []string{"/metrics", "/admin/workers", "/v1/route/completions"} {
			clients.Go(func() {
				c := &http.Client{Timeout: testWait}
				for {
					select {
					case <-stop:
						return
					default:
					}
					resp, err := c.Post(base+path, "application/json", strings.NewReader(`{"prompt":[1,2,3]}`))
					if err != nil {
						continue // refused or cut once Close runs
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					answered.Add(1)
				}
			})
		}
		waitFor(t, "the clients to get answers", func() bool { return answered.Load() > 20 })
		if err := n.Close(); err != nil {
			t.Fatalf("round %d: Close: %v", round, err)
		}
		close(stop)
		clients.Wait()
		if err := <-served; err != nil {
			t.Fatalf("round %d: Serve: %v", round, err)
		}
	}
}

// recordLog keeps the attributes of each record with message msg (those
// of the call; a logger's With attributes are not kept).
type recordLog struct {
	msg  string
	mu   sync.Mutex
	recs []map[string]string
}

func (h *recordLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recordLog) WithGroup(string) slog.Handler            { return h }
func (h *recordLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != h.msg {
		return nil
	}
	m := map[string]string{}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.String()
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, m)
	return nil
}

func (h *recordLog) records() []map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]map[string]string(nil), h.recs...)
}

// TestUnhealthyEngineSaysWhy: an unreachable static worker's health
// change says why (the refused connection), not only healthy=false, and
// the user info of its URL stays out of the log.
func TestUnhealthyEngineSaysWhy(t *testing.T) {
	cfg := testConfig(t)
	cfg.Segment.Path = ""
	cfg.Static = []StaticWorker{{ID: 1, Endpoint: "http://user:s3cret@" + testnet.RefusingAddr(t), Model: "m"}}
	logged := &recordLog{msg: "engine health changed"}
	cfg.Logger = slog.New(logged)
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	waitFor(t, "the health change", func() bool { return len(logged.records()) > 0 })
	rec := logged.records()[0]
	if rec["healthy"] != "false" || !strings.Contains(rec["err"], "connection refused") {
		t.Fatalf("health change %v: want healthy=false and err naming the refused connection", rec)
	}
	for k, v := range rec {
		if strings.Contains(v, "s3cret") {
			t.Fatalf("the log quotes the URL's password in %s: %v", k, rec)
		}
	}
}

// TestWorkerWithoutModelIsLogged: a publisher that registers no model
// name (the vLLM adapter without KVFAST_MODEL) serves nothing through the
// router; that is said once for the worker, not at every poll.
func TestWorkerWithoutModelIsLogged(t *testing.T) {
	var warnings atomic.Int64
	n, cfg := pollingNode(t, countLog{noModelMessage: &warnings})
	p, err := shm.Register(cfg.Segment.Path, shm.WorkerConfig{WorkerID: 3, BlockSize: cfg.Sched.BlockSize, Endpoint: "http://" + testnet.RefusingAddr(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for range 3 {
		n.syncRegistry()
	}
	if len(n.Snapshot().Workers) != 1 {
		t.Fatalf("the worker did not join: %+v", n.Snapshot().Workers)
	}
	if got := warnings.Load(); got != 1 {
		t.Fatalf("a worker without a model was reported %d times over 3 polls, want once", got)
	}
}

// TestRefusedRegistration: an engine the router cannot route to (its
// block size differs) is reported once, not at every registry poll, and
// a routable worker whose slot re-registers with a refused registration
// leaves the worker set instead of staying routable under it.
func TestRefusedRegistration(t *testing.T) {
	var refusals atomic.Int64
	n, cfg := pollingNode(t, countLog{"cannot route to registered worker": &refusals})

	good, err := mocker.Start(mocker.Config{WorkerID: 1, Segment: cfg.Segment.Path, Speedup: 100})
	if err != nil {
		t.Fatal(err)
	}
	n.syncRegistry()
	if len(n.Snapshot().Workers) != 1 {
		t.Fatalf("the good engine did not join: %+v", n.Snapshot().Workers)
	}
	if err := good.Close(); err != nil {
		t.Fatal(err)
	}
	// The same slot, re-registered before the router polls again, by an
	// engine whose block size the router cannot route.
	bad, err := mocker.Start(mocker.Config{WorkerID: 1, BlockSize: 32, Segment: cfg.Segment.Path, Speedup: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	for range 10 {
		n.syncRegistry()
	}
	if got := refusals.Load(); got != 1 {
		t.Errorf("the refused registration was logged %d times over 10 polls, want once", got)
	}
	if ws := n.Snapshot().Workers; len(ws) != 0 {
		t.Errorf("the slot's old registration is still routable: %+v", ws)
	}
	if _, ok := n.Scheduler().Resolve(1, 0); ok {
		t.Error("the scheduler still resolves the refused worker")
	}
	for i := range workers.Max {
		if e := n.engines.Engine(workers.Slot(i)); e != nil {
			t.Errorf("slot %d keeps an engine for the refused registration", i)
		}
	}
	// /admin/workers lists it, and why, until it goes.
	if r := n.Snapshot().Refused; len(r) != 1 || r[0].WorkerID != 1 || !strings.Contains(r[0].Reason, "block") {
		t.Errorf("refused registrations %+v, want worker 1's, with its block size", r)
	}
	// Registered anew, correctly, before the next poll: routable, and no
	// longer listed.
	if err := bad.Close(); err != nil {
		t.Fatal(err)
	}
	fixed, err := mocker.Start(mocker.Config{WorkerID: 1, Segment: cfg.Segment.Path, Speedup: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer fixed.Close()
	n.syncRegistry()
	if r, ws := n.Snapshot().Refused, n.Snapshot().Workers; len(r) != 0 || len(ws) != 1 {
		t.Errorf("after a good registration: refused %+v, workers %d", r, len(ws))
	}
	if err := fixed.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestPickEngine: a remote renderer is pointed at the healthy workers
// serving its model, in turn, never an encoder (it runs for encoding
// alone), and at none when no healthy one does.
func TestPickEngine(t *testing.T) {
	cfg := testConfig(t)
	cfg.Segment.Path = ""
	cfg.Dispatch.Health.Interval = 0 // no health checks
	cfg.Static = []StaticWorker{
		{ID: 1, Endpoint: "127.0.0.1:9001", Model: "a"},
		{ID: 2, Endpoint: "127.0.0.1:9002", Model: "b"},
		{ID: 3, Endpoint: "127.0.0.1:9003", Model: "a"},
		{ID: 4, Endpoint: "127.0.0.1:9004", Model: "a", Role: workers.RoleEncode},
	}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	seen := map[string]int{}
	for range 10 {
		slot, addr, ok := n.PickEngine("a", []byte("a"))
		if info, _ := n.sched.Worker(slot); !ok || info.Endpoint != addr || info.Model != "a" {
			t.Fatalf("picked slot %d %q (%v) for model a", slot, addr, ok)
		}
		seen[addr]++
	}
	if seen["127.0.0.1:9001"] != 5 || seen["127.0.0.1:9003"] != 5 {
		t.Fatalf("picks %v: want the two engines of model a in turn", seen)
	}
	if _, _, ok := n.PickEngine("c", nil); ok {
		t.Fatal("picked an engine for a model no worker serves")
	}
	slot, _, _ := n.PickEngine("b", nil)
	n.sched.SetHealthy(slot, false)
	if _, addr, ok := n.PickEngine("b", nil); ok {
		t.Fatalf("picked the unhealthy engine %s", addr)
	}
	// A request naming a LoRA adapter is rendered by an engine that lists
	// it: one without it refuses the render (vLLM's 404).
	var third workers.Slot
	for w := range n.sched.Workers().All() {
		if info, _ := n.sched.Worker(w); info.Endpoint == "127.0.0.1:9003" {
			third = w
		}
	}
	n.adapters.Store(&map[string]fastpath.Adapter{"sql": {Base: "a", Workers: workers.SetOf(third), SGLang: workers.SetOf(third)}})
	for range 4 {
		if slot, addr, ok := n.PickEngine("a", []byte("sql")); !ok || slot != third {
			t.Fatalf("picked slot %d %q (%v) for adapter sql, which only slot %d lists", slot, addr, ok, third)
		}
	}
	if _, addr, ok := n.PickEngine("a", []byte("nosuch")); ok {
		t.Fatalf("picked %s for an adapter no engine lists", addr)
	}
	// SGLang's "base:adapter" spelling names the same adapter, on the
	// engines that read it.
	if slot, addr, ok := n.PickEngine("a", []byte("a:sql")); !ok || slot != third {
		t.Fatalf("picked slot %d %q (%v) for a:sql, which only slot %d lists", slot, addr, ok, third)
	}
	n.adapters.Store(&map[string]fastpath.Adapter{"sql": {Base: "a", Workers: workers.SetOf(third)}})
	if _, addr, ok := n.PickEngine("a", []byte("a:sql")); ok {
		t.Fatalf("picked %s for a:sql, which no engine that reads the spelling lists", addr)
	}
}

// TestTokenizersInSnapshot: the snapshot lists every served model's
// tokenization; a remote spec for a model no worker serves yet is listed
// too, and a served model without one is approximate.
func TestTokenizersInSnapshot(t *testing.T) {
	cfg := testConfig(t)
	cfg.Segment.Path = ""
	cfg.Dispatch.Health.Interval = 0 // no health checks
	cfg.Static = []StaticWorker{{ID: 1, Endpoint: "127.0.0.1:9001", Model: "plain"}}
	cfg.Tokenizers.Specs = []prompt.Spec{{Model: "later", Source: prompt.Source{Kind: prompt.SourceRemote}}}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	got := n.Snapshot().Tokenizers
	if len(got) != 2 || got[0].Model != "later" || got[0].Mode != prompt.ModeRemote || got[1].Model != "plain" ||
		got[1].Mode != prompt.ModeNone || got[1].Exact {
		t.Fatalf("tokenizers %+v", got)
	}
	cfg.Tokenizers.Specs = []prompt.Spec{{Model: "x", Source: prompt.Source{Kind: prompt.SourceDir, Path: t.TempDir()}}}
	if n, err := New(cfg); err == nil {
		n.Close()
		t.Fatal("a tokenizer directory without tokenizer.json was accepted")
	}
}

// TestWarnExposure: an API listener other hosts can reach is reported at
// start when it checks no API key, and so are admin endpoints on it
// without a token; a loopback one is not.
func TestWarnExposure(t *testing.T) {
	for _, tc := range []struct {
		name       string
		addr       string
		keys       []string
		adminOnAPI bool
		want       []string
	}{
		{"loopback", "127.0.0.1:8000", nil, true, nil},
		{"exposed without keys", "0.0.0.0:8000", nil, false, []string{"no API key"}},
		{"exposed with keys", "10.1.2.3:8000", []string{"k"}, false, nil},
		{"exposed admin", "0.0.0.0:8000", []string{"k"}, true, []string{"without an admin token"}},
		{"exposed admin listener", "127.0.0.1:8000", nil, false, []string{"admin listener is reachable"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf strings.Builder
			n := &Node{log: slog.New(slog.NewTextHandler(&buf, nil))}
			n.cfg.HTTP.APIKeys, n.cfg.HTTP.AdminOnAPI = tc.keys, tc.adminOnAPI
			addr, err := net.ResolveTCPAddr("tcp", tc.addr)
			if err != nil {
				t.Fatal(err)
			}
			admin, err := net.ResolveTCPAddr("tcp", "127.0.0.1:8089")
			if err != nil {
				t.Fatal(err)
			}
			if tc.name == "exposed admin listener" {
				admin.IP = net.IPv4zero
			}
			n.warnExposure(addr, admin)
			for _, w := range tc.want {
				if !strings.Contains(buf.String(), w) {
					t.Errorf("no warning %q in %q", w, buf.String())
				}
			}
			if len(tc.want) == 0 && buf.Len() > 0 {
				t.Errorf("unexpected warning %q", buf.String())
			}
		})
	}
}

// TestSnapshotAfterClose: Snapshot stays safe once Close has unmapped the
// segment (a metrics scrape racing a shutdown, a test reading counters
// after it): it leaves the segment's parts out instead of faulting.
func TestSnapshotAfterClose(t *testing.T) {
	cfg := testConfig(t)
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	v := n.Snapshot()
	if v.Feed != nil || v.Index.Capacity != 0 {
		t.Errorf("a closed node reported its segment: feed %v, index %+v", v.Feed, v.Index)
	}
}

// TestRequestOnAStaleWorkerGoesElsewhere: a request waiting on an engine
// whose heartbeat then goes stale (a hung or dead engine the ingester
// marks down) does not wait out the first-byte timeout: the router gives
// the engine up, and the request, which has sent its client nothing, is
// answered by another worker.
func TestRequestOnAStaleWorkerGoesElsewhere(t *testing.T) {
	cfg := testConfig(t)
	cfg.Dispatch.Health.Interval = 0 // the silent engine has no /health
	cfg.HeartbeatGrace = 500 * time.Millisecond
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, stop := serveOn(t, n, n.Serve)
	defer stop()

	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	reached := make(chan struct{}, 8)
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var req http.Request
				if r, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
					req = *r
					_, _ = io.Copy(io.Discard, req.Body)
					reached <- struct{}{}
				}
				_, _ = io.Copy(io.Discard, c) // never answers
			}()
		}
	}()
	beating, stopEngine := beatingEngine(t, cfg.Segment.Path, 1, "http://"+silent.Addr().String())
	defer stopEngine()
	waitFor(t, "the silent engine to join", func() bool { return len(n.Snapshot().Workers) == 1 })

	type answer struct {
		status int
		worker string
		err    error
	}
	got := make(chan answer, 1)
	go func() {
		c := &http.Client{Timeout: testWait}
		resp, err := c.Post("http://"+ln.Addr().String()+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"mock","prompt":[1,2,3,4,5],"max_tokens":2}`))
		if err != nil {
			got <- answer{err: err}
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got <- answer{status: resp.StatusCode, worker: resp.Header.Get("X-Kvfast-Worker")}
	}()
	select {
	case <-reached:
	case <-time.After(testWait):
		t.Fatal("the request never reached the silent engine")
	}
	eng, err := mocker.Start(mocker.Config{WorkerID: 7, Segment: cfg.Segment.Path, Speedup: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	waitFor(t, "the second engine to join", func() bool { return len(n.Snapshot().Workers) == 2 })
	beating.Store(false) // the silent engine's heartbeat goes stale

	select {
	case a := <-got:
		if a.err != nil || a.status != http.StatusOK || a.worker != "7" {
			t.Fatalf("the request on the stale engine: status %d from worker %q, %v", a.status, a.worker, a.err)
		}
	case <-time.After(testWait):
		t.Fatal("the request still waits on the engine whose heartbeat went stale")
	}
}

// TestRegisteredEndpointsAreStrict: an endpoint from the segment is
// http://host:port or host:port and nothing the router would silently
// drop, and the refusal never carries credentials into the log.
func TestRegisteredEndpointsAreStrict(t *testing.T) {
	for _, ep := range []string{"127.0.0.1:8000", "http://127.0.0.1:8000", "http://engine-0:8000/", "[::1]:8000"} {
		if _, err := registeredAddr(ep); err != nil {
			t.Errorf("%q refused: %v", ep, err)
		}
	}
	for _, ep := range []string{"http://admin:s3cret@127.0.0.1:8000", "evil@127.0.0.1:8000", "http://127.0.0.1:8000/v1",
		"http://127.0.0.1:8000?x=1", "http://127.0.0.1:8000#f", "127.0.0.1:0", "127.0.0.1:65536", ":8000", "127.0.0.1:8000/x",
		"https://127.0.0.1:8000"} {
		_, err := registeredAddr(ep)
		if err == nil {
			t.Errorf("%q accepted", ep)
		} else if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%q: the refusal carries the password: %v", ep, err)
		}
	}
	for _, ep := range []string{"http://admin:s3cret@127.0.0.1:8000", "http://127.0.0.1:8000/?api_key=s3cret", "http://127.0.0.1:8000/#s3cret"} {
		if got := redact.Endpoint(ep); strings.Contains(got, "s3cret") {
			t.Errorf("%q logged as %q", ep, got)
		}
	}
}

// TestRegistrationChurnIsThrottled: a publisher that registers and closes
// over and over is logged joining or leaving once a minute, not at each
// round (the throttle writes the slot's last line once the minute is
// over: logthrottle's tests).
func TestRegistrationChurnIsThrottled(t *testing.T) {
	var joined, left atomic.Int64
	n, cfg := pollingNode(t, countLog{"worker joined": &joined, "worker left": &left})
	for range 5 {
		p, err := shm.Register(cfg.Segment.Path, shm.WorkerConfig{WorkerID: 3, Model: "m", BlockSize: cfg.Sched.BlockSize, Endpoint: "http://" + testnet.RefusingAddr(t)})
		if err != nil {
			t.Fatal(err)
		}
		n.syncRegistry()
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		n.syncRegistry()
	}
	if j, l := joined.Load(), left.Load(); j != 1 || l != 0 {
		t.Fatalf("5 rounds logged %d joins and %d leaves, want the first join alone", j, l)
	}
}

// A worker whose blocks the index refuses is named in the log (once a
// minute) and counted per worker, so that an operator can tell why its
// hits fell and who holds the index.
func TestIndexRefusalsAreReported(t *testing.T) {
	var refusedBy atomic.Uint64 // the worker id the line names
	cfg := testConfig(t)
	cfg.Segment.IndexWorkerShare = 0.25
	cfg.Dispatch.Health.Interval = 0
	// A static worker: a registered one's slot is emptied by the
	// ingester when it takes up the registration, refusals with it.
	cfg.Static = []StaticWorker{{ID: 42, Endpoint: testnet.RefusingAddr(t), Model: "m"}}
	cfg.Logger = slog.New(attrLog{indexFullMessage: func(a slog.Attr) {
		if a.Key == "worker" {
			refusedBy.Store(a.Value.Uint64())
		}
	}})
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	slot, ok := n.sched.Resolve(42, 0)
	if !ok {
		t.Fatal("the static worker has no slot")
	}
	// Written as its ZMQ feed would, once this router ingests: the
	// ingester empties a newly reserved slot before that.
	waitFor(t, "the ingester role", n.ingester.Ingesting)
	hashes := make([]uint64, cfg.Segment.IndexCapacity)
	for i := range hashes {
		hashes[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	_, refused := n.Index().StoredAgain(slot, hashes, nil)
	if refused < len(hashes)/2 {
		t.Fatalf("%d of %d blocks refused at a quarter share", refused, len(hashes))
	}
	// Named by its id, as /admin/workers and the metrics name it, beside
	// its slot.
	waitFor(t, "the refusals logged with the worker's id", func() bool { return refusedBy.Load() == 42 })
	if got := n.Index().Stats().WorkerRefused[slot]; got != uint64(refused) {
		t.Fatalf("Stats counts %d refusals, want %d", got, refused)
	}
}

// attrLog is a slog handler that shows each attribute of the records of
// the messages it names to that message's function.
type attrLog map[string]func(slog.Attr)

func (h attrLog) Enabled(context.Context, slog.Level) bool { return true }
func (h attrLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h attrLog) WithGroup(string) slog.Handler            { return h }
func (h attrLog) Handle(_ context.Context, r slog.Record) error {
	if f := h[r.Message]; f != nil {
		r.Attrs(func(a slog.Attr) bool { f(a); return true })
	}
	return nil
}

// pollingNode starts a node whose registry the test polls itself
// (syncRegistry), without health checks, logging into counts; the node
// is closed when the test ends.
func pollingNode(t *testing.T, counts countLog) (*Node, Config) {
	t.Helper()
	cfg := testConfig(t)
	cfg.RegistryPoll = time.Hour
	cfg.Dispatch.Health.Interval = 0
	cfg.Logger = slog.New(counts)
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, cfg
}

// countLog is a slog handler counting the records of the messages it
// names.
type countLog map[string]*atomic.Int64

func (h countLog) Enabled(context.Context, slog.Level) bool { return true }
func (h countLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h countLog) WithGroup(string) slog.Handler            { return h }
func (h countLog) Handle(_ context.Context, r slog.Record) error {
	if n := h[r.Message]; n != nil {
		n.Add(1)
	}
	return nil
}

// TestRestartedRouterKnowsRegisteredModels: a router restarted while its
// engines are away (closed or down in the registry) answers a request for
// their model 503 model_unavailable, which clients retry, and not the 404
// of a model never served.
func TestRestartedRouterKnowsRegisteredModels(t *testing.T) {
	cfg := testConfig(t)
	first, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := shm.Register(cfg.Segment.Path, shm.WorkerConfig{WorkerID: 1, Model: "gone-model", BlockSize: cfg.Sched.BlockSize,
		Endpoint: "http://" + testnet.RefusingAddr(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	url := serveNode(t, n)
	post := func(model string) (int, string) { return postModel(t, url, model) }
	if code, body := post("gone-model"); code != http.StatusServiceUnavailable || !strings.Contains(body, "model_unavailable") {
		t.Fatalf("a model the registry remembers: %d %s; want 503 model_unavailable", code, body)
	}
	if code, body := post("never-served"); code != http.StatusNotFound || !strings.Contains(body, "model_not_found") {
		t.Fatalf("a model never served: %d %s; want 404", code, body)
	}
}

// TestReadyLineMatchesReady: start-up that settles with no healthy worker
// (a static engine that is down) says so in the log, as /ready does,
// rather than "router ready".
func TestReadyLineMatchesReady(t *testing.T) {
	const unready = "router started, but no worker is healthy yet: /ready answers 503, and requests get 503 until one is (at once with no worker known, after the queue wait with workers down)"
	var ready, notReady atomic.Int64
	cfg := testConfig(t)
	cfg.Static = []StaticWorker{{ID: 1, Endpoint: "http://" + testnet.RefusingAddr(t), Model: "m"}}
	cfg.Logger = slog.New(countLog{"router ready": &ready, unready: &notReady})
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	// The background settling may come before the first health check
	// fails; the line is checked once the engine is known down.
	waitFor(t, "start-up to settle", func() bool { return ready.Load()+notReady.Load() > 0 })
	waitFor(t, "the health check to fail", func() bool { return !n.sched.Load(0).Healthy })
	before := ready.Load()
	n.logSettled(time.Now())
	if ready.Load() != before || notReady.Load() == 0 {
		t.Fatal(`"router ready" logged with the only worker's engine down`)
	}
}

// postModel posts a completion naming model to the router at url and
// returns the status and body.
func postModel(t *testing.T, url, model string) (int, string) {
	t.Helper()
	resp, err := http.Post(url+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"`+model+`","prompt":[1,2,3],"max_tokens":1}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestUnknownModelWithAModellessWorker: a publisher registered without a
// model name is no static worker whose model is still to be learned: a
// request for a model nobody serves is still a 404, not a 503 clients
// would retry for ever.
func TestUnknownModelWithAModellessWorker(t *testing.T) {
	cfg := testConfig(t)
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	url := serveNode(t, n)
	for i, model := range []string{"served", ""} {
		p, err := shm.Register(cfg.Segment.Path, shm.WorkerConfig{WorkerID: uint64(i + 1), Model: model, BlockSize: cfg.Sched.BlockSize,
			Endpoint: "http://" + testnet.RefusingAddr(t)})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
	}
	waitFor(t, "both workers", func() bool { return len(n.Snapshot().Workers) == 2 })
	if code, body := postModel(t, url, "typo"); code != http.StatusNotFound {
		t.Fatalf("a model nobody serves: %d %s; want 404", code, body)
	}
}

// TestEngineCollidingWithStaticWorker: an engine registering the worker
// id and rank a static --worker has (a --worker without id= takes its
// position, 0, 1, ..., which is also an engine's default id) is refused,
// and the refusal names the --worker to change rather than two slots.
func TestEngineCollidingWithStaticWorker(t *testing.T) {
	cfg := testConfig(t)
	cfg.RegistryPoll = time.Hour
	cfg.Dispatch.Health.Interval = 0
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Static = []StaticWorker{{ID: 0, Endpoint: "127.0.0.1:9", Model: "mock"}}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	eng, err := mocker.Start(mocker.Config{WorkerID: 0, Segment: cfg.Segment.Path, Speedup: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	n.syncRegistry()
	r := n.Snapshot().Refused
	if len(r) != 1 || !strings.Contains(r[0].Reason, "static --worker number 1 (127.0.0.1:9) is worker 0 rank 0 already: give it id=N") {
		t.Fatalf("refused registrations %+v: want the engine refused, naming --worker number 1", r)
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestRegisteredEngineNeverSharesAStaticSlot: a registry slot is an index
// slot, so an engine registered into a static worker's slot had its
// blocks credited to the static worker. The router reserves its static
// workers' slots: around an engine already live in the highest slot (a
// warm segment), and against every later registration, up to a full
// registry.
func TestRegisteredEngineNeverSharesAStaticSlot(t *testing.T) {
	cfg := testConfig(t)
	cfg.Dispatch.Health.Interval = 0
	seg, err := shm.Open(cfg.Segment.Path, shm.Options{Index: radix.Config{Capacity: cfg.Segment.IndexCapacity}})
	if err != nil {
		t.Fatal(err)
	}
	// Fill the registry, then close all but the highest slot's engine,
	// which caches a prompt's blocks.
	var pubs []*shm.Publisher
	for id := range uint64(workers.Max) {
		p, err := seg.Register(shm.WorkerConfig{WorkerID: 100 + id, Model: "m", BlockSize: 4, Endpoint: testnet.RefusingAddr(t)})
		if err != nil {
			t.Fatal(err)
		}
		pubs = append(pubs, p)
	}
	for _, p := range pubs[:workers.Max-1] {
		p.Close()
	}
	top := pubs[workers.Max-1]
	if top.Slot() != workers.Max-1 {
		t.Fatalf("the last registration took slot %d", top.Slot())
	}
	hashes := []uint64{11, 12, 13}
	if err := top.Stored(0, false, hashes, make([]uint32, 4*len(hashes))); err != nil {
		t.Fatal(err)
	}
	// The engine heartbeats until the test ends; then it closes, and its
	// segment after it (the publisher writes through seg's mapping).
	stopBeating, beating := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(beating)
		for {
			select {
			case <-stopBeating:
				return
			case <-time.After(50 * time.Millisecond):
				_ = top.Heartbeat()
			}
		}
	}()
	t.Cleanup(func() {
		close(stopBeating)
		<-beating
		_ = top.Close()
		_ = seg.Close()
	})

	cfg.Static = []StaticWorker{{ID: 7, Endpoint: testnet.RefusingAddr(t), Model: "m"}}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	static, ok := n.sched.Resolve(7, 0)
	if !ok || static == top.Slot() {
		t.Fatalf("the static worker is in slot %d (found %v), the live engine's", static, ok)
	}
	waitFor(t, "the live engine's blocks indexed", func() bool {
		return n.Index().Stats().WorkerBlocks[top.Slot()] == uint64(len(hashes))
	})
	if got := n.Index().Stats().WorkerBlocks[static]; got != 0 {
		t.Fatalf("the static worker is credited with %d blocks it never cached", got)
	}
	// Every later registration lands elsewhere; the last ones find the
	// registry full.
	full := false
	for id := uint64(1000); !full; id++ {
		p, err := shm.Register(cfg.Segment.Path, shm.WorkerConfig{WorkerID: id, Model: "m", BlockSize: 4, Endpoint: testnet.RefusingAddr(t)})
		switch {
		case errors.Is(err, shm.ErrRegistryFull):
			full = true
		case err != nil:
			t.Fatal(err)
		default:
			defer p.Close()
			if p.Slot() == static {
				t.Fatalf("engine %d registered into the static worker's slot %d", id, static)
			}
		}
	}
}

// TestDeadEngineStaysUnhealthy: an engine registered in the segment whose
// heartbeat stops leaves the worker set, but not /metrics: its
// kvfast_worker_healthy series stays, at 0, so that an alert on it fires
// (it had vanished with the worker), and /admin/workers lists it among
// the down registrations, until the engine registers again.
func TestDeadEngineStaysUnhealthy(t *testing.T) {
	cfg := testConfig(t)
	cfg.Dispatch.Health.Interval = 0
	cfg.HeartbeatGrace = 200 * time.Millisecond
	var downLines atomic.Int64
	cfg.Logger = slog.New(countLog{workerDownMessage: &downLines})
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, stop := serveOn(t, n, n.ServeAdmin)
	defer stop()
	api, stopAPI := serveOn(t, n, n.Serve)
	defer stopAPI()
	healthy := func() string {
		resp, err := http.Get("http://" + ln.Addr().String() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var lines []string
		for l := range strings.Lines(string(body)) {
			if strings.HasPrefix(l, "kvfast_worker_healthy{") {
				lines = append(lines, strings.TrimSpace(l))
			}
		}
		return strings.Join(lines, "; ")
	}
	beating, stopEngine := beatingEngine(t, cfg.Segment.Path, 3, testnet.RefusingAddr(t))
	defer stopEngine()
	waitFor(t, "the engine to join", func() bool { return len(n.Snapshot().Workers) == 1 })
	beating.Store(false) // the engine dies
	waitFor(t, "the engine to be presumed dead", func() bool {
		v := n.Snapshot()
		return len(v.Workers) == 0 && len(v.Down) == 1
	})
	if d := n.Snapshot().Down[0]; d.WorkerID != 3 || d.Model != mocker.DefaultModel {
		t.Fatalf("down registration %+v, want worker 3", d)
	}
	// Logged as the incident it is, though the slot's join was logged
	// within the minute.
	if got := downLines.Load(); got != 1 {
		t.Errorf("the engine's death was logged %d times, want once", got)
	}
	if got, want := healthy(), `kvfast_worker_healthy{dp_rank="0",worker="3"} 0`; got != want {
		t.Fatalf("/metrics says %q, want %q", got, want)
	}
	// A pin to it is a 503 to retry, as to any unhealthy worker; it was
	// the 404 of a worker never seen, which clients do not retry.
	for _, rank := range []string{""} { // with a rank: the model's 503 first, its only engine down
		req, _ := http.NewRequest(http.MethodPost, "http://"+api.Addr().String()+"/v1/completions",
			strings.NewReader(`{"model":"`+mocker.DefaultModel+`","prompt":[1,2,3],"max_tokens":1}`))
		req.Header.Set("X-Kvfast-Worker", "3")
		if rank != "" {
			req.Header.Set("X-Kvfast-Dp-Rank", rank)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
			!strings.Contains(string(body), `"code":"no_worker_available"`) {
			t.Errorf("a pin to the dead engine (rank %q): %d %v %s; want 503 with Retry-After", rank, resp.StatusCode, resp.Header, body)
		}
	}
	// Back: the series is the live worker's, once.
	beating.Store(true)
	waitFor(t, "the engine to come back", func() bool {
		v := n.Snapshot()
		return len(v.Workers) == 1 && len(v.Down) == 0
	})
	if got, want := healthy(), `kvfast_worker_healthy{dp_rank="0",worker="3"} 1`; got != want {
		t.Fatalf("/metrics says %q, want %q", got, want)
	}
}

// serveOn serves n on a loopback listener with serve (n.Serve or
// n.ServeAdmin); stop closes the node and waits for serve to return.
func serveOn(t *testing.T, n *Node, serve func(net.Listener) error) (ln net.Listener, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		n.Close()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- serve(ln) }()
	return ln, func() {
		n.Close()
		<-served
	}
}

// beatingEngine registers an engine (worker id, endpoint) in the segment
// at path and keeps its heartbeat going every 10 ms, however slow the
// machine, while the flag it returns is set (it starts set); stop ends
// the heartbeat and closes the registration.
func beatingEngine(t *testing.T, path string, id uint64, endpoint string) (beating *atomic.Bool, stop func()) {
	t.Helper()
	pub, err := shm.Register(path, shm.WorkerConfig{WorkerID: id, Model: mocker.DefaultModel, BlockSize: 16,
		KVCapacityBlocks: 1024, Endpoint: endpoint})
	if err != nil {
		t.Fatal(err)
	}
	beating = new(atomic.Bool)
	beating.Store(true)
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
				if beating.Load() {
					_ = pub.Heartbeat()
				}
			}
		}
	}()
	return beating, func() {
		close(quit)
		<-done // no heartbeat after the close
		_ = pub.Close()
	}
}

// TestRefusedRegistrationThatDies: a registration the router refused was
// never routed, and is no worker down when its engine dies: not in
// down_registrations nor unhealthy in /metrics, however many polls later
// (the refusal was forgotten at the next poll, which then reported it).
func TestRefusedRegistrationThatDies(t *testing.T) {
	n, cfg := pollingNode(t, countLog{})
	pub, err := shm.Register(cfg.Segment.Path, shm.WorkerConfig{WorkerID: 7, Model: "m", BlockSize: 32, Endpoint: "http://" + testnet.RefusingAddr(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	n.syncRegistry()
	if r := n.Snapshot().Refused; len(r) != 1 {
		t.Fatalf("refused registrations %+v, want worker 7's", r)
	}
	info, err := n.seg.ReadWorker(pub.Slot())
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := n.seg.MarkDown(pub.Slot(), info.Generation, info.Heartbeat); !ok || err != nil {
		t.Fatalf("cannot mark the refused registration down: %v, %v", ok, err)
	}
	for poll := range 3 {
		n.syncRegistry()
		if d := n.Snapshot().Down; len(d) != 0 {
			t.Fatalf("poll %d: the dead refused registration is reported down: %+v", poll, d)
		}
	}
}

// TestRunStoppedDuringStartup: a SIGTERM that comes while New opens the
// segment (seconds, for a large index) ends Run cleanly once New returns,
// where it used to kill the process and leave its half-made segment file.
// The router runs in a child process (this test binary again) so that the
// signal's default action, if it were not caught, kills the child and not
// the tests; the child's listener accepts once Run catches the signal.
func TestRunStoppedDuringStartup(t *testing.T) {
	if dir := os.Getenv("KVFAST_TEST_STARTUP_CHILD"); dir != "" {
		// Not testConfig: its t.TempDir would outlive a child the signal
		// kills; everything goes in the parent's directory.
		cfg := DefaultConfig()
		cfg.Logger = slog.New(slog.DiscardHandler)
		cfg.AdminListen = "127.0.0.1:0"
		cfg.Approx.Capacity = 1 << 12
		cfg.Segment.Path = filepath.Join(dir, "kvfast.shm")
		cfg.Segment.IndexCapacity = 1 << 22 // a start-up long enough to signal into
		cfg.Listen = os.Getenv("KVFAST_TEST_STARTUP_LISTEN")
		if err := Run(context.Background(), cfg); err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
		return
	}
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	child := exec.Command(os.Args[0], "-test.run=^TestRunStoppedDuringStartup$", "-test.count=1")
	child.Env = append(os.Environ(), "KVFAST_TEST_STARTUP_CHILD="+dir, "KVFAST_TEST_STARTUP_LISTEN="+addr)
	var out bytes.Buffer
	child.Stdout, child.Stderr = &out, &out
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	deadline := time.Now().Add(testWait)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("the child exited before listening: %v\n%s", err, out.Bytes())
		default:
		}
		if time.Now().After(deadline) {
			_ = child.Process.Kill()
			<-exited
			t.Fatalf("the child never listened on %s:\n%s", addr, out.Bytes())
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err := child.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the child, sent SIGTERM as it started: %v\n%s", err, out.Bytes())
		}
	case <-time.After(2 * testWait):
		_ = child.Process.Kill()
		<-exited
		t.Fatalf("the child did not stop after SIGTERM:\n%s", out.Bytes())
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "kvfast.shm" {
			t.Errorf("left in the segment directory: %s", e.Name())
		}
	}
}

// TestRunDrainsBeforeClosing: with a shutdown delay, a stop first takes the
// router out of rotation while it still serves (/ready 503 "draining",
// every answer closing its connection); a second signal ends the wait.
func TestRunDrainsBeforeClosing(t *testing.T) {
	cfg := testConfig(t)
	cfg.Listen = "127.0.0.1:0"
	cfg.Segment.Path = ""
	cfg.ShutdownDelay = time.Hour // only the second signal can end it
	// An engine that passes its health checks and drops every completion
	// unanswered: the router's 502 resets the response it had begun.
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/completions" {
			return // 200: /health, /v1/models
		}
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			c.Close()
		}
	}))
	defer engine.Close()
	cfg.Static = []StaticWorker{{ID: 1, Endpoint: engine.URL, Model: "m"}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, _, ran := startRun(ctx, t, cfg)
	get := func(path string) (int, string, bool) {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatalf("GET %s while draining: %v", path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), resp.Close
	}
	cancel()
	waitFor(t, "/ready to say draining", func() bool {
		status, body, _ := get("/ready")
		return status == http.StatusServiceUnavailable && strings.Contains(body, `"draining"`)
	})
	if status, _, closed := get("/health"); status != http.StatusOK || !closed {
		t.Fatalf("/health while draining: status %d, connection closed %v; want 200 and closed", status, closed)
	}
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":[1,2,3],"max_tokens":1}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || !resp.Close {
		t.Fatalf("a failed completion while draining: status %d, connection closed %v; want 502 and closed", resp.StatusCode, resp.Close)
	}
	select {
	case err := <-ran:
		t.Fatalf("Run returned %v before its shutdown delay ended", err)
	default:
	}
	// Run catches SIGINT while it shuts down: the second signal.
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run returned %v", err)
		}
	case <-time.After(testWait):
		t.Fatal("a second signal did not end the shutdown delay")
	}
}

// TestReadyLineWhenSettledInNew: a router that settles as New returns (no
// segment, no worker waiting on its model) still says how it started:
// here, with no worker, the warning that nothing can be routed (it logged
// nothing; the ready line is logSettled's other branch, which
// TestReadyLineMatchesReady covers).
func TestReadyLineWhenSettledInNew(t *testing.T) {
	const unready = "router started, but no worker is healthy yet: /ready answers 503, and requests get 503 until one is (at once with no worker known, after the queue wait with workers down)"
	var ready, notReady atomic.Int64
	cfg := testConfig(t)
	cfg.Segment.Path = ""
	cfg.Logger = slog.New(countLog{"router ready": &ready, unready: &notReady})
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	waitFor(t, "the start-up line", func() bool { return ready.Load()+notReady.Load() > 0 })
	if notReady.Load() != 1 || ready.Load() != 0 {
		t.Fatalf("with no worker: %d ready lines, %d warnings; want the warning alone", ready.Load(), notReady.Load())
	}
}

// TestReadyLineAwaitingEngines: a router with a segment and no worker yet,
// the usual start (engines register after it), says so at info level,
// not with the warning of workers that are down.
func TestReadyLineAwaitingEngines(t *testing.T) {
	const unready = "router started, but no worker is healthy yet: /ready answers 503, and requests get 503 until one is (at once with no worker known, after the queue wait with workers down)"
	var awaiting, notReady atomic.Int64
	cfg := testConfig(t)
	cfg.Logger = slog.New(countLog{awaitingEnginesMessage: &awaiting, unready: &notReady})
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	waitFor(t, "the start-up line", func() bool { return awaiting.Load()+notReady.Load() > 0 })
	if awaiting.Load() != 1 || notReady.Load() != 0 {
		t.Fatalf("a segment and no engine yet: %d awaiting lines, %d warnings; want the awaiting line alone", awaiting.Load(), notReady.Load())
	}
}

// TestHostPort: what a worker's endpoint may be. A typo is refused at
// start; what dialed before the host check stays accepted.
func TestHostPort(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:8000", "http://127.0.0.1:8000", "engine-0.svc.cluster.local:8000", "engine_0:8000",
		"[::1]:8000", "[fe80::1%eth0]:8000", ":8000", "localhost:09001"} {
		if _, err := hostPort(ok); err != nil {
			t.Errorf("hostPort(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"http//127.0.0.1:8000", "127.0.0.1:99999", "127.0.0.1:0", "host:port", "ftp://h:1",
		"user:pw@h:1", "127.0.0.1", "a..b:80", "bad host:80"} {
		if _, err := hostPort(bad); err == nil {
			t.Errorf("hostPort(%q) accepted", bad)
		}
	}
}

// TestBadTokenizerLeavesNoSegment: a tokenizer that cannot be loaded is
// refused before the segment is opened, so a router that cannot start
// leaves no segment file behind (a 132 MiB one, at the defaults), and the
// error names the flag.
func TestBadTokenizerLeavesNoSegment(t *testing.T) {
	cfg := testConfig(t)
	spec, err := prompt.ParseSpec("m=" + filepath.Join(t.TempDir(), "missing"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Tokenizers.Specs = []prompt.Spec{spec}
	if n, err := New(cfg); err == nil {
		_ = n.Close()
		t.Fatal("New accepted a tokenizer directory that does not exist")
	} else if !strings.Contains(err.Error(), "--tokenizer") {
		t.Errorf("the error does not name the flag: %v", err)
	}
	if _, err := os.Stat(cfg.Segment.Path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused start left the segment behind: %v", err)
	}
}
