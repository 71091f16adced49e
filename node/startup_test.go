package node

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/shm"
)

// slowModelsEngine is an engine that answers /health at once but says
// which model it serves (GET /v1/models) only once released: the window in
// which a router that trusted /health alone answered 404.
type slowModelsEngine struct {
	srv       *http.Server
	addr      string
	released  atomic.Bool
	modelAsks atomic.Int64
}

func startSlowModelsEngine(t *testing.T) *slowModelsEngine {
	t.Helper()
	e := &slowModelsEngine{}
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, _ *http.Request) {
		e.modelAsks.Add(1)
		if !e.released.Load() {
			w.WriteHeader(http.StatusServiceUnavailable) // still loading the model
			return
		}
		io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model","parent":null}]}`)
	})
	mux.HandleFunc("/v1/completions", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"text_completion","model":"m","choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = ln.Addr().String()
	e.srv = &http.Server{Handler: mux}
	go e.srv.Serve(ln)
	t.Cleanup(func() { e.srv.Close() })
	return e
}

// serveNode starts n on a loopback listener and returns its base URL.
func serveNode(t *testing.T, n *Node) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- n.Serve(ln) }()
	t.Cleanup(func() {
		n.Close()
		<-served
	})
	return "http://" + ln.Addr().String()
}

func getStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestStartupRaceHoldsRequests: a request naming the model of a static
// engine the router has not yet discovered waits for discovery instead of
// getting 404, and /ready stays 503 until the engine is routable.
func TestStartupRaceHoldsRequests(t *testing.T) {
	eng := startSlowModelsEngine(t)
	cfg := testConfig(t)
	cfg.Segment.Path = ""
	cfg.Static = []StaticWorker{{ID: 1, Endpoint: eng.addr}} // no model=: the engine says
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	base := serveNode(t, n)
	if got := getStatus(t, base+"/ready"); got != http.StatusServiceUnavailable {
		t.Fatalf("/ready before the engine's model is known: %d, want 503", got)
	}
	if got := getStatus(t, base+"/health"); got != http.StatusOK {
		t.Fatalf("/health: %d", got)
	}
	type answer struct {
		status int
		body   string
		err    error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":[1,2,3],"max_tokens":1}`))
		if err != nil {
			answered <- answer{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answered <- answer{status: resp.StatusCode, body: string(b)}
	}()
	// Let the router poll the loading engine a few dozen more times (5 ms
	// apart): a router that refuses instead of holding has answered by then.
	asked := eng.modelAsks.Load()
	waitFor(t, "the router to keep polling the engine's models", func() bool { return eng.modelAsks.Load() >= asked+40 })
	select {
	case a := <-answered:
		t.Fatalf("answered before the engine's model was known: %d %s %v", a.status, a.body, a.err)
	default:
	}
	if got := getStatus(t, base+"/ready"); got != http.StatusServiceUnavailable {
		t.Fatalf("/ready while the engine's model is unknown: %d, want 503", got)
	}
	eng.released.Store(true)
	select {
	case a := <-answered:
		if a.err != nil || a.status != http.StatusOK {
			t.Fatalf("held request: %d %s %v, want 200", a.status, a.body, a.err)
		}
	case <-time.After(testWait):
		t.Fatal("the held request was not answered after the engine's model became known")
	}
	waitFor(t, "/ready", func() bool { return getStatus(t, base+"/ready") == http.StatusOK })
	if got := n.Snapshot().Workers[0].Model; got != "m" {
		t.Fatalf("the static worker's model is %q, want the engine's m", got)
	}
	// Once settled, a model nobody serves is refused at once.
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"model":"other","prompt":[1,2,3]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown model after start-up: %d, want 404", resp.StatusCode)
	}
}

// TestSettlesAfterIndexRepair: a router whose segment's index holds bytes
// nobody wrote is not ready until its ingester has dealt with them (here:
// dropped the index, since no repair could be trusted), and says so.
func TestSettlesAfterIndexRepair(t *testing.T) {
	cfg := testConfig(t)
	seg, err := shm.Open(cfg.Segment.Path, shm.Options{Index: radix.Config{Capacity: cfg.Segment.IndexCapacity}})
	if err != nil {
		t.Fatal(err)
	}
	h := seg.Header()
	seg.Close()
	junk := make([]byte, h.IndexSize-64)
	r := rand.New(rand.NewPCG(5, 5))
	for i := range junk {
		junk[i] = byte(r.Uint32())
	}
	scribble(t, cfg.Segment.Path, h.IndexOffset+64, junk)
	var dropped atomic.Int64
	cfg.Logger = slog.New(countLog{"dropped the index: damaged beyond repair; it refills from the engines' next KV events, and routing meanwhile ignores what they cached before": &dropped})
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	select {
	case <-n.Settled():
	case <-time.After(testWait):
		t.Fatal("the router never settled")
	}
	if s := n.Snapshot(); s.Feed == nil || s.Feed.IndexResets != 1 || dropped.Load() != 1 {
		t.Fatalf("settled with feed %+v and %d drop logs, want the index dropped and said once", s.Feed, dropped.Load())
	}
	if err := n.Index().Verify(); err != nil {
		t.Fatal(err)
	}
}

// TestCorruptRegistrySlotIsLogged: a registry slot whose bytes no
// publisher writes is skipped and said, once a minute, not at every poll.
func TestCorruptRegistrySlotIsLogged(t *testing.T) {
	cfg := testConfig(t)
	cfg.RegistryPoll = time.Hour // the test drives syncRegistry itself
	var lines atomic.Int64
	cfg.Logger = slog.New(countLog{"skipping an unreadable registry slot": &lines})
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	p, err := shm.Register(cfg.Segment.Path, shm.WorkerConfig{WorkerID: 1, Model: "m", BlockSize: 16, Endpoint: "http://127.0.0.1:9"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// docs/shm-layout.md: the registry starts at byte 8192, 512 bytes a
	// slot, the model's length a u16 at byte 56 of it; its field holds 192.
	scribble(t, cfg.Segment.Path, 8192+int64(p.Slot())*512+56, binary.LittleEndian.AppendUint16(nil, 1000))
	for range 10 {
		n.syncRegistry()
	}
	if got := lines.Load(); got != 1 {
		t.Fatalf("the corrupt slot was logged %d times over 10 polls, want once", got)
	}
	if ws := n.Snapshot().Workers; len(ws) != 0 {
		t.Fatalf("a corrupt slot is routable: %+v", ws)
	}
}

// TestRefusedEngineInARestartLoopIsLoggedOnce: an engine whose block size
// the router cannot use, restarting over and over (a new registration
// each time), is reported once a minute, not at every restart.
func TestRefusedEngineInARestartLoopIsLoggedOnce(t *testing.T) {
	cfg := testConfig(t)
	cfg.RegistryPoll = time.Hour // the test drives syncRegistry itself
	cfg.Dispatch.Health.Interval = 0
	var refusals atomic.Int64
	cfg.Logger = slog.New(countLog{"cannot route to registered worker": &refusals})
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	for range 5 {
		bad, err := mocker.Start(mocker.Config{WorkerID: 1, BlockSize: 32, Segment: cfg.Segment.Path, Speedup: 100})
		if err != nil {
			t.Fatal(err)
		}
		n.syncRegistry()
		n.syncRegistry()
		if err := bad.Close(); err != nil {
			t.Fatal(err)
		}
		n.syncRegistry()
	}
	if got := refusals.Load(); got != 1 {
		t.Fatalf("5 refused registrations of one slot were logged %d times, want once", got)
	}
}

// TestForeignSegmentRefused: serve refuses a segment others may write,
// saying how to fix it, unless told to attach anyway.
func TestForeignSegmentRefused(t *testing.T) {
	cfg := testConfig(t)
	seg, err := shm.Open(cfg.Segment.Path, shm.Options{Index: radix.Config{Capacity: cfg.Segment.IndexCapacity}})
	if err != nil {
		t.Fatal(err)
	}
	seg.Close()
	if err := os.Chmod(cfg.Segment.Path, 0o666); err != nil {
		t.Fatal(err)
	}
	n, err := New(cfg)
	if err == nil {
		n.Close()
		t.Fatal("attached to a world-writable segment")
	}
	if !errors.Is(err, shm.ErrForeignSegment) || !strings.Contains(err.Error(), "--allow-foreign-segment") {
		t.Fatalf("refusal %v does not say how to override", err)
	}
	var warned atomic.Int64
	cfg.Logger = slog.New(countLog{"attached to a segment others may access (--allow-foreign-segment): whoever can write it can register engines and rewrite the index": &warned})
	cfg.Segment.AllowForeign = true
	n, err = New(cfg)
	if err != nil {
		t.Fatalf("with AllowForeign: %v", err)
	}
	n.Close()
	if warned.Load() != 1 {
		t.Fatalf("attached to a world-writable segment with %d warnings, want 1", warned.Load())
	}
}

// TestDefaultsAdmitOnlyWhatWorkersCanTake: with the default configuration
// a worker over the prompt-token threshold is busy, so a request waits in
// the queue rather than piling onto it.
func TestDefaultsAdmitOnlyWhatWorkersCanTake(t *testing.T) {
	cfg := testConfig(t)
	cfg.Segment.Path = ""
	cfg.Dispatch.Health.Interval = 0
	cfg.Static = []StaticWorker{{ID: 1, Endpoint: "127.0.0.1:9", Model: "m"}}
	if cfg.Sched.Busy == (sched.BusyThresholds{}) || cfg.Sched.QueueCapacity == 0 {
		t.Fatalf("default admission: busy %+v, queue %d", cfg.Sched.Busy, cfg.Sched.QueueCapacity)
	}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	var res sched.Reservation
	big := int(cfg.Sched.Busy.PrefillTokens) + 1
	if _, err := n.Scheduler().Select(context.Background(), &sched.Request{PromptTokens: big}, &res); err != nil {
		t.Fatal(err)
	}
	defer res.Release()
	dec, err := n.Scheduler().Select(context.Background(), &sched.Request{PromptTokens: 16, QueryOnly: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !dec.Busy {
		t.Fatal("a worker with more prompt tokens awaiting their first token than the default threshold still takes requests")
	}
}

// TestRetiredSegmentIsReported: a router whose segment another router
// recreated (--recreate-segment), or whose file was deleted, goes on
// reading the old file, which engines leave; it says so in its log, once a
// minute, and in /admin/workers and /metrics, so that the operator
// restarts it.
func TestRetiredSegmentIsReported(t *testing.T) {
	cfg := testConfig(t)
	cfg.RegistryPoll = time.Hour // the test drives syncRegistry itself
	var lines atomic.Int64
	cfg.Logger = slog.New(countLog{retiredMessage: &lines})
	old, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	old.syncRegistry()
	if lines.Load() != 0 || old.Snapshot().Index.SegmentRetired {
		t.Fatal("a live segment is reported retired")
	}

	cfg2 := cfg
	cfg2.Segment.Recreate = true
	var displaced, recreated atomic.Int64
	cfg2.Logger = slog.New(countLog{displacedMessage: &displaced, recreatedMessage: &recreated})
	cfg2.AdminListen = "127.0.0.1:0"
	successor, err := New(cfg2)
	if err != nil {
		t.Fatal(err)
	}
	defer successor.Close()
	// The successor says whom it displaced: the old router ingests (its
	// standby loop took the role) until it is restarted.
	if displaced.Load() != 1 {
		t.Errorf("recreating the segment of a running router was logged %d times, want once", displaced.Load())
	}
	// Said whether or not a router was displaced: the warm index is gone.
	if recreated.Load() != 1 {
		t.Errorf("recreating the segment was logged %d times, want once", recreated.Load())
	}
	for range 5 {
		old.syncRegistry()
	}
	if got := lines.Load(); got != 1 {
		t.Fatalf("the retired segment was logged %d times over 5 polls, want once", got)
	}
	if !old.Snapshot().Index.SegmentRetired {
		t.Fatal("the old router's snapshot does not say its segment is retired")
	}
	if successor.Snapshot().Index.SegmentRetired {
		t.Fatal("the successor's new segment is reported retired")
	}
	// A file deleted under its router (engines then register again in a
	// new one at the path) is reported as a recreated one is.
	if err := os.Remove(cfg.Segment.Path); err != nil {
		t.Fatal(err)
	}
	if !successor.Snapshot().Index.SegmentRetired {
		t.Fatal("a router whose segment file was deleted does not say so")
	}
}

// staticNodeCounting starts a node without a segment whose one static
// worker is eng, configured with model ("" to learn it), and counts the
// log records with message msg; the node closes with the test.
func staticNodeCounting(t *testing.T, eng *mocker.Engine, model, msg string) (*Node, *atomic.Int64) {
	t.Helper()
	cfg := testConfig(t)
	cfg.Segment.Path = ""
	cfg.Static = []StaticWorker{{ID: 1, Endpoint: "http://" + eng.Addr(), Model: model}}
	var n atomic.Int64
	cfg.Logger = slog.New(countLog{msg: &n})
	nd, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nd.Close() })
	return nd, &n
}

// TestStaticWorkerWrongModelIsLogged: a static worker configured with a
// model its engine does not list (a typo in model=) is reported, once,
// rather than routed to in silence while the engine refuses every
// request.
func TestStaticWorkerWrongModelIsLogged(t *testing.T) {
	eng, err := mocker.Start(mocker.Config{Speedup: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	n, warnings := staticNodeCounting(t, eng, "wrongname",
		"a worker's model is not one its engine lists in /v1/models: the engine refuses the model's requests, which go to other workers while one serves it")
	p := newAdapterPoller("")
	for range 3 {
		p.poll(context.Background(), n)
	}
	if got := warnings.Load(); got != 1 {
		t.Fatalf("the wrong model was reported %d times over 3 polls, want once", got)
	}
}

// TestEngineWantingAKeyIsLogged: an engine started with an API key that
// the router does not hold is reported, once, naming the flag that
// fixes it; with the key the router learns the engine's model.
func TestEngineWantingAKeyIsLogged(t *testing.T) {
	eng, err := mocker.Start(mocker.Config{Speedup: 100, APIKey: "engine-key"})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	n, warnings := staticNodeCounting(t, eng, "",
		"an engine refuses the router's credentials: give kvfast serve --engine-api-key-file holding the key the engine was started with (none is given, or another)")
	p := newAdapterPoller("")
	for range 3 {
		if p.poll(context.Background(), n) {
			t.Fatal("the static worker's model was learnt without the engine's key")
		}
	}
	if got := warnings.Load(); got != 1 {
		t.Fatalf("the refused key was reported %d times over 3 polls, want once", got)
	}
	if !newAdapterPoller("engine-key").poll(context.Background(), n) {
		t.Error("with the engine's key the static worker's model is still unknown")
	}
}

// TestAdapterListIsBounded: an engine's /v1/models may list anything; the
// router keeps at most maxAdapters of its adapters, none with a name
// longer than a registered model's, since it remembers adapter names for
// as long as it runs.
func TestAdapterListIsBounded(t *testing.T) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		var b strings.Builder
		b.WriteString(`{"object":"list","data":[{"id":"base","parent":null},{"id":"` + strings.Repeat("x", 1<<20) + `","parent":"base"}`)
		for i := range 2 * maxAdapters {
			fmt.Fprintf(&b, `,{"id":"lora-%d","parent":"base"}`, i)
		}
		b.WriteString(`]}`)
		_, _ = io.WriteString(w, b.String())
	}))
	defer engine.Close()
	p := newAdapterPoller("")
	models, err := p.fetch(context.Background(), strings.TrimPrefix(engine.URL, "http://"), "base")
	if err != nil || models.base != "base" || !models.listed {
		t.Fatalf("fetch: base %q, listed %v, err %v", models.base, models.listed, err)
	}
	got := models.adapters
	if len(got) != maxAdapters {
		t.Errorf("kept %d adapters, want %d", len(got), maxAdapters)
	}
	// Counted, for the poll's warning: their requests get 404.
	if models.dropped != 1+maxAdapters {
		t.Errorf("%d adapters counted as dropped, want %d", models.dropped, 1+maxAdapters)
	}
	for name := range got {
		if len(name) > shm.MaxModelLen {
			t.Fatalf("kept an adapter name of %d bytes", len(name))
		}
	}
}

// TestAdapterListReadsTheEngine: an engine serving one model under
// several names gives its adapters the first as parent (vLLM's
// --served-model-name a b); a worker registered under another of them
// serves them too (they were dropped unsaid, and their requests got the
// router's 404). owned_by tells vLLM and the mock, whose adapters the
// router must not credit to SGLang's spellings, from SGLang and others.
func TestAdapterListReadsTheEngine(t *testing.T) {
	for _, c := range []struct {
		name, list, model string
		want              map[string]string
		listed, sglang    bool
	}{
		{"vLLM, second served name", `[{"id":"a","owned_by":"vllm","parent":null},{"id":"b","owned_by":"vllm","parent":null},{"id":"sql","owned_by":"vllm","parent":"a"}]`,
			"b", map[string]string{"sql": "b"}, true, false},
		{"SGLang", `[{"id":"a","owned_by":"sglang"},{"id":"sql","owned_by":"sglang","parent":"a"}]`,
			"a", map[string]string{"sql": "a"}, true, true},
		{"another engine's model", `[{"id":"a","owned_by":"vllm"},{"id":"sql","parent":"a"}]`,
			"c", nil, false, false},
		{"an adapter of an unlisted base", `[{"id":"a","owned_by":"vllm"},{"id":"sql","parent":"z"}]`,
			"a", nil, true, false},
		// SGLang behind a proxy that rewrites owned_by, or an engine of
		// another name: only vLLM and the mock are known not to read
		// SGLang's spellings.
		{"another owner", `[{"id":"a","owned_by":"organization-owner"},{"id":"sql","parent":"a"}]`,
			"a", map[string]string{"sql": "a"}, true, true},
	} {
		engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, `{"object":"list","data":`+c.list+`}`)
		}))
		models, err := newAdapterPoller("").fetch(context.Background(), strings.TrimPrefix(engine.URL, "http://"), c.model)
		engine.Close()
		if err != nil || !maps.Equal(models.adapters, c.want) || models.listed != c.listed || models.sglang != c.sglang {
			t.Errorf("%s: adapters %v, listed %v, sglang %v, err %v; want %v, %v, %v",
				c.name, models.adapters, models.listed, models.sglang, err, c.want, c.listed, c.sglang)
		}
	}
}

// TestAdapterListFollowsTheSlotsEngine: an engine that takes over a
// slot (the same worker id, restarted without the adapter) is not routed
// its predecessor's adapters, even while it does not answer /v1/models.
func TestAdapterListFollowsTheSlotsEngine(t *testing.T) {
	n, cfg := pollingNode(t, countLog{})
	first, err := mocker.Start(mocker.Config{WorkerID: 1, Segment: cfg.Segment.Path, Speedup: 100, LoRAAdapters: []string{"sql"}})
	if err != nil {
		t.Fatal(err)
	}
	n.syncRegistry()
	slot, ok := n.Scheduler().Resolve(1, 0)
	if !ok {
		t.Fatal("the first engine did not join")
	}
	p := newAdapterPoller("")
	p.poll(context.Background(), n)
	if a := p.pushed["sql"]; !a.Workers.Has(slot) {
		t.Fatalf("adapters %+v, want sql on slot %d", p.pushed, slot)
	}
	// /admin/workers says so, and that the mock is no SGLang engine.
	for _, wv := range n.Snapshot().Workers {
		if wv.Slot == int(slot) && (!slices.Equal(wv.Adapters, []string{"sql"}) || wv.SGLangSpellings) {
			t.Errorf("the worker's view lists adapters %q, sglang %v; want [sql], false", wv.Adapters, wv.SGLangSpellings)
		}
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second, err := mocker.Start(mocker.Config{WorkerID: 1, Segment: cfg.Segment.Path, Speedup: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	n.syncRegistry()
	if again, ok := n.Scheduler().Resolve(1, 0); !ok || again != slot {
		t.Fatalf("the second engine is in slot %d (%v), want %d", again, ok, slot)
	}
	p.client = &http.Client{Transport: unreachable{}}
	p.poll(context.Background(), n)
	if a, ok := p.pushed["sql"]; ok && a.Workers.Has(slot) {
		t.Errorf("slot %d's new engine, which lists no adapter, is routed the old one's: %+v", slot, p.pushed)
	}
}

// unreachable is a transport to engines that do not answer.
type unreachable struct{}

func (unreachable) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New("connection refused")
}

// TestTruncatedSegmentKeepsRouting: a process that truncates the segment
// file under the router (a publisher opening it with O_TRUNC) makes the
// next read of the mapping fault; the router catches it, detaches the
// segment, says so in its log and snapshot, and goes on routing to its
// static workers, sticky sessions and all, instead of dying of SIGBUS.
func TestTruncatedSegmentKeepsRouting(t *testing.T) {
	eng, err := mocker.Start(mocker.Config{Speedup: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	cfg := testConfig(t)
	cfg.Static = []StaticWorker{{ID: 1, Endpoint: "http://" + eng.Addr(), Model: "mock"}}
	var lost atomic.Int64
	cfg.Logger = slog.New(countLog{lostMessage: &lost})
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	base := serveNode(t, n)
	c := &http.Client{Timeout: testWait}
	post := func() int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, base+"/v1/completions",
			strings.NewReader(`{"model":"mock","prompt":[`+strings.Repeat("7,", 40)+`7],"max_tokens":2}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Kvfast-Session-Id", "conversation-1")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := post(); got != http.StatusOK {
		t.Fatalf("before the truncation: status %d", got)
	}
	if n.Snapshot().Index.SegmentRetired {
		t.Fatal("an intact segment is reported retired")
	}

	if err := os.Truncate(cfg.Segment.Path, 0); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if got := post(); got != http.StatusOK {
			t.Fatalf("request %d after the truncation: status %d", i, got)
		}
	}
	waitFor(t, "the lost segment to be logged", func() bool { return lost.Load() > 0 })
	if !n.Snapshot().Index.SegmentRetired {
		t.Fatal("the snapshot does not say the segment must be recreated")
	}
	if got := lost.Load(); got != 1 {
		t.Errorf("the lost segment was logged %d times, want once (throttled)", got)
	}
}

// TestModelsPollDoesNotFollowRedirects: an engine that answers GET
// /v1/models with a redirect must not have the router carry the engines'
// key (--engine-api-key-file) to wherever it points.
func TestModelsPollDoesNotFollowRedirects(t *testing.T) {
	var stolen atomic.Int64
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		stolen.Add(1)
		_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"mock","object":"model"}]}`)
	}))
	defer elsewhere.Close()
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL+"/steal", http.StatusTemporaryRedirect)
	}))
	defer engine.Close()
	cfg := testConfig(t)
	cfg.Segment.Path = ""
	cfg.Static = []StaticWorker{{ID: 1, Endpoint: engine.URL}}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if newAdapterPoller("engine-key").poll(context.Background(), n) {
		t.Error("a redirect taught the router a model")
	}
	if got := stolen.Load(); got != 0 {
		t.Fatalf("the redirect's target was asked %d times", got)
	}
}

// TestRewrittenRegistrationIsRefused: a live slot whose endpoint is
// rewritten in place, without the new generation a registration takes,
// is refused (logged once) instead of followed: the router had moved the
// worker's cache credit, and its clients' requests, to the new endpoint.
func TestRewrittenRegistrationIsRefused(t *testing.T) {
	var lines atomic.Int64
	n, cfg := pollingNode(t, countLog{"a live registration changed without re-registering: the slot is refused until a new registration": &lines})
	p, err := shm.Register(cfg.Segment.Path, shm.WorkerConfig{WorkerID: 1, Model: "m", BlockSize: 16, Endpoint: "http://127.0.0.1:9001"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	n.syncRegistry()
	if ws := n.Snapshot().Workers; len(ws) != 1 {
		t.Fatalf("the worker did not join: %+v", ws)
	}
	// docs/shm-layout.md: the registry starts at byte 8192, 512 bytes a
	// slot, the endpoint at byte 256 of it; the same length, another port.
	scribble(t, cfg.Segment.Path, 8192+int64(p.Slot())*512+256, []byte("http://127.0.0.1:9666"))
	for range 5 {
		n.syncRegistry()
	}
	if got := lines.Load(); got != 1 {
		t.Fatalf("the rewrite was logged %d times over 5 polls, want once", got)
	}
	if ws := n.Snapshot().Workers; len(ws) != 0 {
		t.Fatalf("a rewritten slot is routable: %+v", ws)
	}
}

// scribble writes b at off of the segment file at path, as another
// process with write access to it could.
func scribble(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestAdapterLoadedAtRunTimeIsServed: an adapter loaded on an engine at
// run time (vLLM's /v1/load_lora_adapter) is routed from its first
// request: the router asks the engines again before answering 404 for a
// model it does not know. It had answered 404 until its next poll, up to
// 2 s, and a client does not retry a 404. GET /v1/models/{id} does the
// same. A name no engine lists is still a 404.
func TestAdapterLoadedAtRunTimeIsServed(t *testing.T) {
	var loaded, late atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, _ *http.Request) {
		list := `{"object":"list","data":[{"id":"m","object":"model","parent":null}`
		if loaded.Load() {
			list += `,{"id":"new","object":"model","parent":"m"}`
		}
		if late.Load() {
			list += `,{"id":"late","object":"model","parent":"m"}`
		}
		io.WriteString(w, list+`]}`)
	})
	mux.HandleFunc("/v1/completions", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"text_completion","model":"new","choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`)
	})
	eng := httptest.NewServer(mux)
	defer eng.Close()
	cfg := testConfig(t)
	cfg.Segment.Path = ""
	cfg.Static = []StaticWorker{{ID: 1, Endpoint: eng.URL, Model: "m"}}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	url := serveNode(t, n)
	if code, body := postModel(t, url, "m"); code != http.StatusOK {
		t.Fatalf("the base model: %d %s", code, body)
	}
	loaded.Store(true)
	if code, body := postModel(t, url, "new"); code != http.StatusOK {
		t.Fatalf("an adapter loaded a moment ago: %d %s; want 200", code, body)
	}
	late.Store(true)
	if code := getStatus(t, url+"/v1/models/late"); code != http.StatusOK {
		t.Fatalf("GET /v1/models/ of an adapter loaded a moment ago: %d; want 200", code)
	}
	if code := getStatus(t, url+"/v1/models/other"); code != http.StatusNotFound {
		t.Fatalf("GET /v1/models/ of a name no engine lists: %d; want 404", code)
	}
	if code, body := postModel(t, url, "never-loaded"); code != http.StatusNotFound {
		t.Fatalf("a name no engine lists: %d %s; want 404", code, body)
	}
}

// TestAdapterUnloadedIsServedElsewhere: an engine that unloaded an adapter
// it listed when last asked answers its requests 404; until the next poll
// the router still sends them there. Such a request goes to another
// engine listing the adapter instead of reaching the client as a 404,
// which clients do not retry.
func TestAdapterUnloadedIsServedElsewhere(t *testing.T) {
	var unloadedHits atomic.Int64
	engine := func(unloaded bool) *httptest.Server {
		mux := http.NewServeMux()
		mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
		mux.HandleFunc("/v1/models", func(w http.ResponseWriter, _ *http.Request) {
			// Both list it: the unloaded one still did when the router asked.
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model","parent":null},{"id":"sql","object":"model","parent":"m"}]}`)
		})
		mux.HandleFunc("/v1/completions", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			if unloaded {
				unloadedHits.Add(1)
				w.WriteHeader(http.StatusNotFound)
				io.WriteString(w, `{"object":"error","message":"The model `+"`sql`"+` does not exist.","type":"NotFoundError","param":null,"code":404}`)
				return
			}
			io.WriteString(w, `{"id":"c","object":"text_completion","model":"sql","choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`)
		})
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		return srv
	}
	gone, kept := engine(true), engine(false)
	cfg := testConfig(t)
	cfg.Segment.Path = ""
	cfg.Static = []StaticWorker{{ID: 1, Endpoint: gone.URL, Model: "m"}, {ID: 2, Endpoint: kept.URL, Model: "m"}}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	url := serveNode(t, n)
	waitFor(t, "both engines to list the adapter", func() bool {
		m := n.adapters.Load()
		return m != nil && (*m)["sql"].Workers.Len() == 2
	})
	for i := 0; unloadedHits.Load() < 3; i++ {
		if i == 200 {
			t.Fatalf("no request reached the engine that unloaded the adapter in %d", i)
		}
		if code, body := postModel(t, url, "sql"); code != http.StatusOK {
			t.Fatalf("request %d for the adapter: %d %s; want 200 from the engine that still serves it", i, code, body)
		}
	}
}
