package fastpath

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvfast/kvfast/dispatch"
	"github.com/kvfast/kvfast/internal/clock"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/workers"
)

// The tests in package fastpath drive the front end alone: New over Deps
// that the test builds (an index, a scheduler and an engine pool over
// static workers), so that they can reach inside the Server (its handler,
// its metrics) where a whole router (package node) would hide it.
// Everything that needs the whole router (registry discovery, event
// feeds, the worker lifecycle) is tested in package fastpath_test, on
// internal/rig.

// frontWorker is one static worker of a test front end.
type frontWorker struct {
	endpoint string // host:port
	model    string
}

// frontState is the node's view for a front end without a node: the
// policy and nothing else, which is all /admin/workers and /metrics need
// to answer.
type frontState struct{ policy string }

func (s frontState) Snapshot() Snapshot { return Snapshot{Policy: s.policy, Workers: []WorkerView{}} }

// newTestFront builds a front end whose worker i has id i+1, rank 0 and
// the slot a node would give the i-th static worker (staticWorkerSlot).
// Health probes are off and logs discarded; the engine pool is closed and
// the front end shut down when the test ends.
func newTestFront(tb testing.TB, cfg Config, policy string, workers []frontWorker) *Server {
	tb.Helper()
	return newTestFrontWith(tb, cfg, policy, workers, nil)
}

// newTestFrontWith is newTestFront with the models' prompt renderers.
func newTestFrontWith(tb testing.TB, cfg Config, policy string, workers []frontWorker, renderers Renderers) *Server {
	tb.Helper()
	return newTestFrontSched(tb, cfg, sched.Config{}, policy, workers, renderers)
}

// newTestFrontSched is newTestFrontWith over a scheduler configured by sc
// (its Policy is set from policy).
func newTestFrontSched(tb testing.TB, cfg Config, sc sched.Config, policy string, workers []frontWorker, renderers Renderers) *Server {
	tb.Helper()
	if policy == "" {
		policy = "kv"
	}
	p, useApprox, err := sched.ParsePolicy(policy)
	if err != nil {
		tb.Fatal(err)
	}
	index, err := radix.NewHeap(radix.Config{Capacity: 1 << 16})
	if err != nil {
		tb.Fatal(err)
	}
	approx, err := radix.NewApprox(radix.Config{Capacity: 1 << 16}, time.Minute)
	if err != nil {
		tb.Fatal(err)
	}
	sc.Policy = p
	scheduler, err := sched.New(sc)
	if err != nil {
		tb.Fatal(err)
	}
	dcfg := dispatch.DefaultConfig()
	dcfg.Health.Interval = -1
	pool := dispatch.NewPool(dcfg)
	tb.Cleanup(pool.Close) // after the front end's shutdown: cleanups run last-in first-out
	for i, w := range workers {
		slot := staticWorkerSlot(i)
		if err := scheduler.Upsert(sched.WorkerInfo{ID: uint64(i + 1), Slot: slot, Model: w.model, Endpoint: w.endpoint}); err != nil {
			tb.Fatal(err)
		}
		if _, err := pool.Add(slot, w.endpoint); err != nil {
			tb.Fatal(err)
		}
	}
	s, err := New(cfg, Deps{Index: index, Approx: approx, Sched: scheduler, Engines: pool, UseApprox: useApprox,
		Renderers: renderers, State: frontState{policy}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s
}

// staticWorkerSlot is the slot a node gives its i-th static worker.
func staticWorkerSlot(i int) workers.Slot { return workers.Slot(workers.Max - 1 - i) }

// newRouteTestServer is a front end over n workers (ids 1..n) serving
// benchModel at endpoints that are never called: route-only requests do
// not forward, and health probes are off, so no traffic leaves the
// process.
func newRouteTestServer(tb testing.TB, n int, policy string) *Server {
	tb.Helper()
	workers := make([]frontWorker, n)
	for i := range workers {
		workers[i] = frontWorker{endpoint: "127.0.0.1:" + strconv.Itoa(9+i), model: benchModel}
	}
	return newTestFront(tb, DefaultConfig(), policy, workers)
}

// released reports whether the scheduler holds no booking: nothing
// waiting, every booking released, no load on any worker.
func released(s *Server) bool {
	st := s.sched.Stats()
	if st.Waiting != 0 || st.Booked != st.Released {
		return false
	}
	for w := range s.sched.Workers().All() {
		if ld := s.sched.Load(w); ld.Requests != 0 || ld.ActiveBlocks != 0 || ld.PrefillTokens != 0 || ld.OutputBlocks != 0 {
			return false
		}
	}
	return true
}

// TestModelOfAJoiningWorker: a worker is routable from the moment the
// scheduler has it, and the node tells the request path of it only after
// its scan (WorkersChanged). A request for its model in between routes,
// instead of being answered 404 for a model that is served; a model no
// worker serves is still 404.
func TestModelOfAJoiningWorker(t *testing.T) {
	s := newRouteTestServer(t, 1, "")
	if err := s.sched.Upsert(sched.WorkerInfo{ID: 7, Slot: 3, Model: "late-model", Endpoint: "127.0.0.1:30"}); err != nil {
		t.Fatal(err)
	}
	body := func(model string) []byte {
		return []byte(`{"model":"` + model + `","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`)
	}
	if code, a, raw := routeOnce(t, s, PathRouteCompletions, body("late-model")); code != http.StatusOK || a.WorkerID != 7 {
		t.Errorf("the joining worker's model: status %d, worker %d: %s; want 200 from worker 7", code, a.WorkerID, raw)
	}
	if code, _, raw := routeOnce(t, s, PathRouteCompletions, body("nobody-serves-this")); code != http.StatusNotFound {
		t.Errorf("an unknown model: status %d: %s; want 404", code, raw)
	}
}

// TestRequestWithoutModel: a request that names no model goes to the one
// model served; where several are, each engine would answer with its own
// (whichever the request reached), so it is refused.
func TestRequestWithoutModel(t *testing.T) {
	s := newRouteTestServer(t, 1, "")
	for _, body := range []string{`{"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`,
		`{"model":"","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`} {
		if code, _, raw := routeOnce(t, s, PathRouteCompletions, []byte(body)); code != http.StatusOK {
			t.Errorf("%s with one model served: %d %s; want 200", body, code, raw)
		}
	}
	if err := s.sched.Upsert(sched.WorkerInfo{ID: 7, Slot: 3, Model: "other-model", Endpoint: "127.0.0.1:30"}); err != nil {
		t.Fatal(err)
	}
	s.WorkersChanged()
	code, _, raw := routeOnce(t, s, PathRouteCompletions, []byte(`{"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`))
	if code != http.StatusBadRequest || !strings.Contains(string(raw), "model_required") {
		t.Errorf("no model with two served: %d %s; want 400 model_required", code, raw)
	}
}

// TestWorkerOfUnknownModel: a static worker whose engine has not told its
// model yet is not listed as a model named "", and a request for a model
// no known worker serves is answered 503 while such a worker exists (it
// may be that worker's model: an engine still loading, or down past
// start-up's wait), 404 once no such worker is left. A request naming the
// model "" routes as one naming none.
func TestWorkerOfUnknownModel(t *testing.T) {
	s := newRouteTestServer(t, 1, "")
	settled := make(chan struct{})
	s.settled, s.cfg.QueueTimeout = settled, 10*time.Millisecond
	if err := s.sched.Upsert(sched.WorkerInfo{ID: 7, Slot: 3, Endpoint: "127.0.0.1:30"}); err != nil {
		t.Fatal(err)
	}
	s.WorkersChanged()
	ctx := newRouteCtx(PathModels, nil, nil)
	ctx.Request.Header.SetMethod(http.MethodGet)
	s.handle(ctx)
	if body := string(ctx.Response.Body()); ctx.Response.StatusCode() != http.StatusOK || strings.Contains(body, `"id":""`) {
		t.Errorf("GET /v1/models: %d %s; want no model named \"\"", ctx.Response.StatusCode(), body)
	}
	body := []byte(`{"model":"later","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`)
	if code, _, raw := routeOnce(t, s, PathRouteCompletions, body); code != http.StatusServiceUnavailable || !strings.Contains(string(raw), "not known yet") {
		t.Errorf("a model no known worker serves, with a worker's model unknown: %d %s; want 503", code, raw)
	}
	empty := []byte(`{"model":"","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`)
	if code, a, raw := routeOnce(t, s, PathRouteCompletions, empty); code != http.StatusOK || a.WorkerID == 7 {
		t.Errorf("model \"\": %d, worker %d: %s; want 200 from the known model's worker", code, a.WorkerID, raw)
	}
	close(settled)
	if code, _, raw := routeOnce(t, s, PathRouteCompletions, body); code != http.StatusServiceUnavailable {
		t.Errorf("after start-up settled, a worker's model still unknown: %d %s; want 503", code, raw)
	}
	s.sched.Remove(3)
	s.WorkersChanged()
	if code, _, raw := routeOnce(t, s, PathRouteCompletions, body); code != http.StatusNotFound {
		t.Errorf("a model no worker serves: %d %s; want 404", code, raw)
	}
}

// TestUnloadedAdapter: an adapter unloaded from engines that still serve
// its base model is gone for good: a 404, as GET /v1/models/{id} says,
// once its base model has been served for adapterReturnGrace without it
// (a restarted engine lists its adapters within a few polls). It had been
// a 503 for the router's life, which clients retried for ever. An adapter
// whose engines all left is a 503 until they are back.
func TestUnloadedAdapter(t *testing.T) {
	s := newRouteTestServer(t, 2, "")
	body := []byte(`{"model":"sql","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`)
	s.SetAdapters(map[string]Adapter{"sql": {Base: benchModel, Workers: s.sched.Workers()}})
	if code, _, raw := routeOnce(t, s, PathRouteCompletions, body); code != http.StatusOK {
		t.Fatalf("a served adapter: %d %s", code, raw)
	}
	s.SetAdapters(nil)
	if code, _, raw := routeOnce(t, s, PathRouteCompletions, body); code != http.StatusServiceUnavailable ||
		!bytes.Contains(raw, []byte("no longer list it")) {
		// Its engines serve the base model: not "every worker is down".
		t.Fatalf("an adapter just gone: %d %s; want 503 saying its engines no longer list it", code, raw)
	}
	age := func() { // as if adapterReturnGrace had passed
		d := *s.departed.Load()
		if e, ok := d["sql"]; ok && e.baseBack != 0 {
			e.baseBack -= int64(adapterReturnGrace)
			d["sql"] = e
		}
	}
	age()
	if code, _, raw := routeOnce(t, s, PathRouteCompletions, body); code != http.StatusNotFound {
		t.Fatalf("an adapter unloaded for good: %d %s; want 404", code, raw)
	}

	// Its only engine restarts while another serves the base model: 503
	// however long the restart, until that engine is back without it.
	a, _ := s.sched.Resolve(1, 0)
	infoA, _ := s.sched.Worker(a)
	s.SetAdapters(map[string]Adapter{"sql": {Base: benchModel, Workers: workers.SetOf(a)}})
	s.sched.Remove(a)
	s.SetAdapters(nil)
	s.WorkersChanged()
	age()
	if code, _, raw := routeOnce(t, s, PathRouteCompletions, body); code != http.StatusServiceUnavailable {
		t.Fatalf("an adapter whose engine restarts: %d %s; want 503", code, raw)
	}
	if err := s.sched.Upsert(infoA); err != nil {
		t.Fatal(err)
	}
	s.WorkersChanged() // back, without the adapter
	age()
	if code, _, raw := routeOnce(t, s, PathRouteCompletions, body); code != http.StatusNotFound {
		t.Fatalf("an adapter its engine came back without: %d %s; want 404", code, raw)
	}

	// Its engines leave with it: 503 until they are back, however long.
	s.SetAdapters(map[string]Adapter{"sql": {Base: benchModel, Workers: s.sched.Workers()}})
	for w := range s.sched.Workers().All() {
		s.sched.Remove(w)
	}
	s.SetAdapters(nil)
	s.WorkersChanged()
	if d, ok := (*s.departed.Load())["sql"]; !ok || !d.unavailable(clock.Now()+int64(time.Hour)) {
		t.Fatalf("an adapter whose engines all left: departed %+v (%v); want a 503 until they are back", d, ok)
	}
}

// TestAdapterAsBaseColonAdapter: SGLang takes a LoRA adapter as
// "base:adapter" in model, or as lora_path beside the base model, and
// lists it as "adapter" with its base as parent. Such a request routes as
// one naming the adapter, in its namespace, among the SGLang workers
// listing it: vLLM answers "base:adapter" with 404 and ignores lora_path,
// serving the base model, so crediting a vLLM worker with the adapter's
// blocks claimed a cache its engine would not use. GET /v1/models lists
// the adapter once, and a model really named so keeps its name.
func TestAdapterAsBaseColonAdapter(t *testing.T) {
	s := newTestFront(t, DefaultConfig(), "", []frontWorker{
		{endpoint: "127.0.0.1:9", model: benchModel}, {endpoint: "127.0.0.1:10", model: benchModel},
		{endpoint: "127.0.0.1:11", model: "m:sql"}, {endpoint: "127.0.0.1:12", model: benchModel}})
	second, _ := s.sched.Resolve(2, 0) // SGLang, lists sql
	fourth, _ := s.sched.Resolve(4, 0) // vLLM, lists sql
	s.SetAdapters(map[string]Adapter{"sql": {Base: benchModel, Workers: workers.SetOf(second) | workers.SetOf(fourth), SGLang: workers.SetOf(second)}})
	for _, c := range []struct {
		model, loraPath, allow string
		want                   int
	}{
		{benchModel + ":sql", "", "1", http.StatusBadRequest}, // serves the base model, not the adapter
		{benchModel + ":sql", "", "2", http.StatusOK},
		{benchModel + ":sql", "", "4", http.StatusBadRequest}, // vLLM: the engine's 404
		{benchModel + ":nosuch", "", "2", http.StatusNotFound},
		{"sql", "", "4", http.StatusOK},   // the adapter's own name: every engine listing it
		{"m:sql", "", "3", http.StatusOK}, // a served model, not an alias
		{"m:sql", "", "2", http.StatusBadRequest},
		// SGLang's older spelling: the base model, and lora_path.
		{benchModel, "sql", "1", http.StatusBadRequest},
		{benchModel, "sql", "2", http.StatusOK},
		{benchModel, "sql", "4", http.StatusBadRequest}, // vLLM would answer from the base model
		{benchModel, "nosuch", "1", http.StatusOK},      // the engine's to refuse
		{"m:sql", "sql", "3", http.StatusOK},            // not that model's adapter
	} {
		ctx := newRouteCtx(PathRouteCompletions, []byte(`{"model":"`+c.model+`","lora_path":"`+c.loraPath+`","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`),
			map[string]string{HeaderAllow: c.allow})
		s.handle(ctx)
		if got := ctx.Response.StatusCode(); got != c.want {
			t.Errorf("model %s, lora_path %q, allow %s: %d %s; want %d", c.model, c.loraPath, c.allow, got, ctx.Response.Body(), c.want)
		}
	}
	seeds := *s.seeds.Load()
	if a, b := seeds["sql"], seeds[benchModel+":sql"]; a.seed != b.seed || a.name != benchModel {
		t.Errorf("the alias %+v is not the adapter %+v", b, a)
	}
	ctx := newRouteCtx(PathModels, nil, nil)
	ctx.Request.Header.SetMethod(http.MethodGet)
	s.handle(ctx)
	var list struct{ Data []struct{ ID string } }
	if err := json.Unmarshal(ctx.Response.Body(), &list); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	if want := []string{"m:sql", benchModel, "sql"}; !slices.Equal(ids, want) {
		t.Errorf("GET /v1/models lists %q; want %q, no alias", ids, want)
	}

	// Only vLLM engines list the adapter: "base:adapter" is a model no
	// one serves, and lora_path is ignored, the request the base model's.
	s = newTestFront(t, DefaultConfig(), "", []frontWorker{{endpoint: "127.0.0.1:9", model: benchModel}, {endpoint: "127.0.0.1:10", model: benchModel}})
	second, _ = s.sched.Resolve(2, 0)
	s.SetAdapters(map[string]Adapter{"sql": {Base: benchModel, Workers: workers.SetOf(second)}})
	ctx = newRouteCtx(PathRouteCompletions, []byte(`{"model":"`+benchModel+`:sql","prompt":[1,2,3]}`), nil)
	s.handle(ctx)
	if got := ctx.Response.StatusCode(); got != http.StatusNotFound {
		t.Errorf("base:adapter with no SGLang engine listing it: %d %s; want 404", got, ctx.Response.Body())
	}
	_, seed, _, only, err := s.namespace(context.Background(), &openai.ParsedRequest{Model: []byte(benchModel), LoRAPath: []byte("sql")})
	if err != nil || seed != radix.NamespaceSeed(benchModel, "", "") || only != 0 {
		t.Errorf("lora_path with no SGLang engine listing the adapter: seed %x, only %v, err %v; want the base model's (%x), any worker",
			seed, only, err, radix.NamespaceSeed(benchModel, "", ""))
	}
}

// TestRepeatedHintHeader: a hint header sent twice is refused. The first
// copy had counted, so a client's X-Kvfast-Allow before a gateway's own
// was the one used.
func TestRepeatedHintHeader(t *testing.T) {
	s := newRouteTestServer(t, 3, "")
	body := []byte(`{"model":"` + benchModel + `","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`)
	for _, c := range []struct{ header, first, second string }{
		{HeaderAllow, "3", "1"}, {HeaderWorker, "1", "2"}, {HeaderDPRank, "0", "0"},
		{HeaderPriority, "1", "2"}, {HeaderQueryOnly, "0", "1"}, {HeaderSession, "a", "b"},
	} {
		ctx := newRouteCtx(PathRouteCompletions, body, nil)
		if c.header == HeaderDPRank {
			ctx.Request.Header.Set(HeaderWorker, "1")
		}
		ctx.Request.Header.Add(c.header, c.first)
		ctx.Request.Header.Add(c.header, c.second)
		s.handle(ctx)
		if got := ctx.Response.StatusCode(); got != http.StatusBadRequest ||
			!strings.Contains(string(ctx.Response.Body()), `"param":"`+c.header+`","code":"invalid_header"`) {
			t.Errorf("%s twice: %d %s; want 400 invalid_header naming it", c.header, got, ctx.Response.Body())
		}
	}
	// A first copy sent empty is a copy too: it hid the gateway's list.
	ctx := newRouteCtx(PathRouteCompletions, body, map[string]string{HeaderWorker: "1"})
	ctx.Request.Header.Add(HeaderAllow, "")
	ctx.Request.Header.Add(HeaderAllow, "2")
	s.handle(ctx)
	if got := ctx.Response.StatusCode(); got != http.StatusBadRequest {
		t.Errorf("an empty %s, then another: %d %s; want 400", HeaderAllow, got, ctx.Response.Body())
	}
	ctx = newRouteCtx(PathRouteCompletions, body, map[string]string{HeaderAllow: "3,1", HeaderWorker: "1"})
	s.handle(ctx)
	if got := ctx.Response.StatusCode(); got != http.StatusOK {
		t.Errorf("each hint once: %d %s", got, ctx.Response.Body())
	}
}

// TestPinToDownRegistration: a pin to an engine presumed dead (its
// registration down, the scheduler without it) is a 503 to retry, with
// or without its rank, where a pin to an id never seen stays a 404.
func TestPinToDownRegistration(t *testing.T) {
	s := newRouteTestServer(t, 2, "")
	s.SetDown([]RegistrationView{{WorkerID: 99, Model: benchModel}})
	body := []byte(`{"model":"` + benchModel + `","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`)
	for _, c := range []struct {
		hdr  map[string]string
		want int
	}{
		{map[string]string{HeaderWorker: "99"}, http.StatusServiceUnavailable},
		{map[string]string{HeaderWorker: "99", HeaderDPRank: "0"}, http.StatusServiceUnavailable},
		{map[string]string{HeaderWorker: "98"}, http.StatusNotFound},
		{map[string]string{HeaderWorker: "98", HeaderDPRank: "0"}, http.StatusNotFound},
	} {
		ctx := newRouteCtx(PathRouteCompletions, body, c.hdr)
		s.handle(ctx)
		if got := ctx.Response.StatusCode(); got != c.want ||
			got == http.StatusServiceUnavailable && len(ctx.Response.Header.Peek("Retry-After")) == 0 {
			t.Errorf("%v: %d %s; want %d", c.hdr, got, ctx.Response.Body(), c.want)
		}
	}
	s.SetDown(nil) // back, or gone for good
	ctx := newRouteCtx(PathRouteCompletions, body, map[string]string{HeaderWorker: "99"})
	s.handle(ctx)
	if got := ctx.Response.StatusCode(); got != http.StatusNotFound {
		t.Errorf("a pin to a registration no longer down: %d; want 404", got)
	}
}

// TestAllowListWithoutTheModel: an allow-list naming no worker that
// serves the requested model or adapter is the client's mistake, a 400,
// as a pin to such a worker is; a 503 was retried for ever.
func TestAllowListWithoutTheModel(t *testing.T) {
	s := newTestFront(t, DefaultConfig(), "", []frontWorker{
		{endpoint: "127.0.0.1:9", model: benchModel}, {endpoint: "127.0.0.1:10", model: benchModel}, {endpoint: "127.0.0.1:11", model: "other"}})
	second, _ := s.sched.Resolve(2, 0)
	s.SetAdapters(map[string]Adapter{"sql": {Base: benchModel, Workers: workers.SetOf(second)}})
	for _, c := range []struct {
		model, allow string
		want         int
	}{
		{"other", "1", http.StatusBadRequest},
		{"other", "1,2", http.StatusBadRequest},
		{"other", "3", http.StatusOK},
		{"sql", "1", http.StatusBadRequest}, // serves the base model, not the adapter
		{"sql", "2", http.StatusOK},
		{benchModel, "1", http.StatusOK},
	} {
		ctx := newRouteCtx(PathRouteCompletions, []byte(`{"model":"`+c.model+`","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`),
			map[string]string{HeaderAllow: c.allow})
		s.handle(ctx)
		if got := ctx.Response.StatusCode(); got != c.want ||
			got == http.StatusBadRequest && !strings.Contains(string(ctx.Response.Body()), `"code":"allow_excluded"`) {
			t.Errorf("model %s, allow %s: %d %s; want %d", c.model, c.allow, got, ctx.Response.Body(), c.want)
		}
	}
	// A static worker whose model is still to be learned may be the one
	// the list names: not the client's mistake yet.
	s.cfg.QueueTimeout = 10 * time.Millisecond
	if err := s.sched.Upsert(sched.WorkerInfo{ID: 7, Slot: 9, Endpoint: "127.0.0.1:30"}); err != nil {
		t.Fatal(err)
	}
	s.WorkersChanged()
	ctx := newRouteCtx(PathRouteCompletions, []byte(`{"model":"other","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`),
		map[string]string{HeaderAllow: "7"})
	s.handle(ctx)
	if got := ctx.Response.StatusCode(); got == http.StatusBadRequest {
		t.Errorf("an allow-list naming a worker of unknown model: %d %s; want it routed or a 503 to retry", got, ctx.Response.Body())
	}
}
