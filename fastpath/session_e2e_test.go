package fastpath_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/internal/rig"
	"github.com/kvfast/kvfast/node"
)

// sessionEngine is an SGLang stand-in: completions (answered by the
// test's handler), open_session and close_session, with a log of what
// arrived, in order.
type sessionEngine struct {
	ln      *killableListener
	mu      sync.Mutex
	log     []string
	callers []string // each session control call's Authorization and X-Request-Id
	// openFails makes open_session answer this status (0: open).
	openFails int
	// openDelay holds open_session that long before answering (and
	// opening).
	openDelay time.Duration
	// atClose, when set, runs as close_session arrives (the test reads the
	// router's bookings there).
	atClose func()
	// lists is the model GET /v1/models names ("": the tests' model).
	lists string
	// refusesKey makes GET /v1/models answer 401, as an engine restarted
	// with another --api-key does.
	refusesKey bool
}

func startSessionEngine(t *testing.T, handler fasthttp.RequestHandler) *sessionEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	se := &sessionEngine{ln: &killableListener{Listener: ln, conns: map[net.Conn]struct{}{}}}
	srv := &fasthttp.Server{Logger: quietFastHTTPLogger{}, CloseOnShutdown: true, Handler: func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case fastpath.PathHealth:
		case fastpath.PathCompletions, fastpath.PathChatCompletions:
			se.note("generate")
			handler(ctx)
		case "/open_session":
			se.note("open " + string(ctx.PostBody()))
			se.noteCaller(ctx)
			se.mu.Lock()
			fail, delay := se.openFails, se.openDelay
			se.mu.Unlock()
			time.Sleep(delay) // an engine slow to open: the router's call times out first
			if fail != 0 {
				ctx.SetStatusCode(fail)
				ctx.SetBodyString(`{"object":"error","message":"session exists"}`)
				return
			}
			ctx.SetBodyString(`"s"`)
		case "/close_session":
			se.mu.Lock()
			at := se.atClose
			se.mu.Unlock()
			if at != nil {
				at()
			}
			se.note("close " + string(ctx.PostBody()))
			se.noteCaller(ctx)
		case "/v1/models":
			se.mu.Lock()
			model, refuses := se.lists, se.refusesKey
			se.mu.Unlock()
			if refuses {
				ctx.SetStatusCode(fasthttp.StatusUnauthorized)
				return
			}
			if model == "" {
				model = e2eModel
			}
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"object":"list","data":[{"id":"` + model + `","object":"model"}]}`)
		default:
			ctx.SetStatusCode(fasthttp.StatusNotFound)
		}
	}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(se.ln)
	}()
	t.Cleanup(func() {
		se.kill()
		select {
		case <-done:
		case <-time.After(e2eWait):
			t.Error("stand-in engine did not stop")
		}
	})
	return se
}

func (se *sessionEngine) addr() string { return se.ln.Addr().String() }
func (se *sessionEngine) kill()        { se.ln.kill() }

func (se *sessionEngine) note(s string) {
	se.mu.Lock()
	se.log = append(se.log, s)
	se.mu.Unlock()
}

func (se *sessionEngine) noteCaller(ctx *fasthttp.RequestCtx) {
	se.mu.Lock()
	se.callers = append(se.callers, string(ctx.Request.Header.Peek("Authorization"))+" "+string(ctx.Request.Header.Peek(fastpath.HeaderRequestID)))
	se.mu.Unlock()
}

func (se *sessionEngine) events() []string {
	se.mu.Lock()
	defer se.mu.Unlock()
	return append([]string(nil), se.log...)
}

func plainAnswer(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	ctx.SetBodyString(`{"id":"x","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`)
}

func sessionRouter(t *testing.T, mutate func(*node.Config), engines ...*sessionEngine) *e2eRouter {
	t.Helper()
	var static []node.StaticWorker
	for i, e := range engines {
		static = append(static, node.StaticWorker{ID: uint64(i + 1), Endpoint: e.addr(), Model: e2eModel, KVBlocks: 1 << 16})
	}
	cfg := e2eConfig(static...)
	if mutate != nil {
		mutate(&cfg)
	}
	return startE2ERouter(t, cfg)
}

func sessionHeaders(id string, extra ...string) map[string]string {
	h := map[string]string{fastpath.HeaderSession: id}
	for i := 0; i+1 < len(extra); i += 2 {
		h[extra[i]] = extra[i+1]
	}
	return h
}

func servedBy(t *testing.T, r e2eResponse) string {
	t.Helper()
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	return r.header.Get(fastpath.HeaderWorker)
}

func metricOr0(text, series string) float64 {
	v, _ := metricValue(text, series)
	return v
}

// The first request binds the session; later ones, whatever their prompt,
// go to the bound worker and refresh the binding.
func TestStickyBindAndRefresh(t *testing.T) {
	a, b := startSessionEngine(t, plainAnswer), startSessionEngine(t, plainAnswer)
	r := sessionRouter(t, nil, a, b)
	first := servedBy(t, r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(1, 64), false, 4), sessionHeaders("conv-1")))
	for i := range 8 {
		got := servedBy(t, r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(uint32(100+i), 64), false, 4), sessionHeaders("conv-1")))
		if got != first {
			t.Fatalf("request %d of the session went to worker %s, bound to %s", i+2, got, first)
		}
	}
	m := r.metrics(t)
	wantMetric(t, m, `kvfast_session_binds_total{result="new"}`, 1)
	wantMetric(t, m, `kvfast_session_binds_total{result="refreshed"}`, 8)
	wantMetric(t, m, `kvfast_session_lookups_total{result="hit"}`, 8)
	wantMetric(t, m, `kvfast_session_bindings`, 1)
	// Query-only requests read the binding but neither bind nor refresh.
	q := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(7, 64), false, 4), sessionHeaders("conv-1", fastpath.HeaderQueryOnly, "1"))
	if got := servedBy(t, q); got != first {
		t.Fatalf("query-only answer names worker %s, the session is bound to %s", got, first)
	}
	r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(8, 64), false, 4), sessionHeaders("never-bound", fastpath.HeaderQueryOnly, "1"))
	m = r.metrics(t)
	wantMetric(t, m, `kvfast_session_binds_total{result="refreshed"}`, 8)
	wantMetric(t, m, `kvfast_session_bindings`, 1)
}

// An engine's refusal of a request (a 4xx judging it) is not its
// acceptance: the session does not bind to it.
func TestStickyDoesNotBindOnARefusal(t *testing.T) {
	refuse := startSessionEngine(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(http.StatusBadRequest)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"object":"error","message":"n must be 1","type":"BadRequestError","code":400}`)
	})
	r := sessionRouter(t, nil, refuse)
	if res := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(1, 32), false, 4), sessionHeaders("conv")); res.status != http.StatusBadRequest {
		t.Fatalf("status %d: %s", res.status, res.body)
	}
	m := r.metrics(t)
	wantMetric(t, m, `kvfast_session_bindings`, 0)
	if v := metricOr0(m, `kvfast_session_binds_total{result="new"}`); v != 0 {
		t.Fatalf("a refused request bound its session (%v binds)", v)
	}
}

// A binding idle past the TTL expires: the next request of the session is
// routed afresh and binds again.
func TestStickyExpires(t *testing.T) {
	a := startSessionEngine(t, plainAnswer)
	r := sessionRouter(t, func(c *node.Config) { c.HTTP.Sessions.TTL = time.Nanosecond }, a)
	servedBy(t, r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(1, 32), false, 4), sessionHeaders("conv")))
	// A route-only query sees the binding expired but leaves it for the
	// session's next request to find, and to count.
	r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(1, 32), false, 4), sessionHeaders("conv", fastpath.HeaderQueryOnly, "1"))
	servedBy(t, r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(1, 32), false, 4), sessionHeaders("conv")))
	m := r.metrics(t)
	wantMetric(t, m, `kvfast_session_lookups_total{result="expired"}`, 1)
	wantMetric(t, m, `kvfast_session_binds_total{result="new"}`, 2)
}

// A bound worker outside the request's allow-list, failing, or down
// loses the session, which rebinds where the request lands.
func TestStickyUnbindsIneligibleWorker(t *testing.T) {
	engines := []*sessionEngine{startSessionEngine(t, plainAnswer), startSessionEngine(t, plainAnswer), startSessionEngine(t, plainAnswer)}
	r := sessionRouter(t, func(c *node.Config) {
		c.Dispatch.Outlier.Consecutive = 1 // one refused connection ejects the engine: "down"
		c.Dispatch.Outlier.MaxEjectedPercent = 100
		c.Dispatch.Outlier.BaseEjection = time.Hour
		c.Dispatch.Outlier.MaxEjection = time.Hour
	}, engines...)
	post := func(session string, seed uint32, extra ...string) string {
		t.Helper()
		return servedBy(t, r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(seed, 64), false, 4), sessionHeaders(session, extra...)))
	}
	x := post("s1", 1)
	// A client's pin wins over a binding, and the session binds where it lands.
	if got := post("s2", 2, fastpath.HeaderWorker, x); got != x {
		t.Fatalf("pinned request went to %s, want %s", got, x)
	}
	post("s3", 3, fastpath.HeaderWorker, x)
	others := []string{}
	for _, w := range []string{"1", "2", "3"} {
		if w != x {
			others = append(others, w)
		}
	}
	if got := post("s1", 4, fastpath.HeaderAllow, others[0]); got != others[0] {
		t.Fatalf("allow-listed request went to %s, want %s", got, others[0])
	}
	wantMetric(t, r.metrics(t), `kvfast_session_unbinds_total{reason="not_allowed"}`, 1)
	if got := post("s1", 5); got != others[0] {
		t.Fatalf("after the rebind the session went to %s, want %s", got, others[0])
	}
	// The bound worker's engine dies: the request is re-routed, and the
	// session rebinds to a survivor.
	id, _ := strconv.Atoi(x)
	engines[id-1].kill()
	if got := post("s2", 6); got == x {
		t.Fatal("served by the dead worker")
	}
	wantMetric(t, r.metrics(t), `kvfast_session_unbinds_total{reason="failed"}`, 1)
	// That failure ejected it: a session still bound there is moved off
	// before any attempt.
	waitFor(t, "the dead worker ejected", func() bool { return !workerView(t, r.node, uint64(id), 0).Healthy })
	if got := post("s3", 7); got == x {
		t.Fatal("served by the ejected worker")
	}
	m := r.metrics(t)
	wantMetric(t, m, `kvfast_session_unbinds_total{reason="down"}`, 1)
	wantMetric(t, m, `kvfast_session_unbinds_total{reason="failed"}`, 1)
	waitReleased(t, r.node)
}

// busyBoundWorker is a session bound to one of two engines, whose
// worker is then held busy by one request in prefill until release.
type busyBoundWorker struct {
	r       *e2eRouter
	bound   string     // the session's worker id
	release func()     // lets the held prefill finish
	blocked chan error // the held request's outcome
}

// holdBoundWorker starts two engines that hold a body asking for 7
// tokens in prefill (no token yet) until release and answer others at
// once, a router whose busy threshold is one request in prefill, binds
// session "conv" and makes its worker busy.
func holdBoundWorker(t *testing.T, busyUnbind time.Duration) *busyBoundWorker {
	held := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(held) }) }
	t.Cleanup(release)
	handler := func(ctx *fasthttp.RequestCtx) {
		if !bytes.Contains(ctx.PostBody(), []byte(`"max_tokens":7`)) {
			plainAnswer(ctx)
			return
		}
		sseHandler(func(w *bufio.Writer) {
			_ = writeFlush(w, []byte(": prefilling\n\n"))
			<-held
			_ = writeFlush(w, itemEvent(0, "a", "stop"))
			_ = writeFlush(w, []byte(doneEvent))
		})(ctx)
	}
	r := sessionRouter(t, func(c *node.Config) {
		c.Sched.Busy.PrefillTokens = 1 // one request in prefill makes a worker busy
		c.Sched.Busy.DecodeBlocksFraction = 0
		c.HTTP.Sessions.BusyUnbindAfter = busyUnbind
	}, startSessionEngine(t, handler), startSessionEngine(t, handler))
	bound := servedBy(t, r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(1, 64), false, 4), sessionHeaders("conv")))
	id, _ := strconv.ParseUint(bound, 10, 64)
	blocked := make(chan error, 1)
	go func() {
		resp, err := postNoFatal(r, completionBody(e2eTokens(9, 64), true, 7), map[string]string{fastpath.HeaderWorker: bound})
		if err == nil && resp.status != http.StatusOK {
			err = fmt.Errorf("status %d", resp.status)
		}
		blocked <- err
	}()
	waitFor(t, "the bound worker busy with a prefill", func() bool { return workerView(t, r.node, id, 0).PrefillTokens > 0 })
	return &busyBoundWorker{r: r, bound: bound, release: release, blocked: blocked}
}

// Transient overload does not unbind: a request of a session whose worker
// is busy waits in the admission queue for that worker, though others are
// idle.
func TestStickyIgnoresTransientOverload(t *testing.T) {
	h := holdBoundWorker(t, time.Hour)
	r := h.r
	queued := make(chan e2eResponse, 1)
	go func() {
		resp, _ := postNoFatal(r, completionBody(e2eTokens(2, 64), false, 4), sessionHeaders("conv"))
		queued <- resp
	}()
	waitFor(t, "the session's request to queue for its busy worker", func() bool { return r.node.Snapshot().Queue.Waiting > 0 })
	h.release()
	if err := <-h.blocked; err != nil {
		t.Fatal(err)
	}
	got := <-queued
	if got.status != http.StatusOK || got.header.Get(fastpath.HeaderWorker) != h.bound {
		t.Fatalf("queued request: status %d, worker %q; want 200 from the bound worker %s", got.status, got.header.Get(fastpath.HeaderWorker), h.bound)
	}
	m := r.metrics(t)
	for _, reason := range []string{"busy", "down", "failed", "removed"} {
		if v := metricOr0(m, `kvfast_session_unbinds_total{reason="`+reason+`"}`); v != 0 {
			t.Fatalf("transient overload unbound the session (%s: %v)", reason, v)
		}
	}
	waitReleased(t, r.node)
}

// A session's request queued behind its worker moves once the worker has
// stayed busy for --session-busy-unbind, as the session's next request
// would, instead of waiting out the queue timeout; the session follows it.
func TestStickyQueuedRequestMovesOffAWorkerThatStaysBusy(t *testing.T) {
	h := holdBoundWorker(t, 100*time.Millisecond)
	r := h.r
	got := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(2, 64), false, 4), sessionHeaders("conv"))
	moved := servedBy(t, got)
	if moved == h.bound {
		t.Fatalf("the queued request was served by its busy worker %s", moved)
	}
	wantMetric(t, r.metrics(t), `kvfast_session_unbinds_total{reason="busy"}`, 1)
	if again := servedBy(t, r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(3, 64), false, 4), sessionHeaders("conv"))); again != moved {
		t.Errorf("the session's next request went to %s, not to %s where it moved", again, moved)
	}
	h.release()
	if err := <-h.blocked; err != nil {
		t.Fatal(err)
	}
	waitReleased(t, r.node)
}

// postNoFatal is post for goroutines other than the test's.
func postNoFatal(r *e2eRouter, body []byte, hdr map[string]string) (e2eResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url+fastpath.PathCompletions, bytes.NewReader(body))
	if err != nil {
		return e2eResponse{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return e2eResponse{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return e2eResponse{status: resp.StatusCode, header: resp.Header, body: b}, err
}

// Two routers on one segment share bindings: a session bound through one
// is pinned by the other.
func TestStickySharedAcrossRoutersOnOneSegment(t *testing.T) {
	a, b := startSessionEngine(t, plainAnswer), startSessionEngine(t, plainAnswer)
	static := []node.StaticWorker{
		{ID: 1, Endpoint: a.addr(), Model: e2eModel, KVBlocks: 1 << 16},
		{ID: 2, Endpoint: b.addr(), Model: e2eModel, KVBlocks: 1 << 16},
	}
	one := startE2ERig(t, rig.Config{Node: e2eConfig(static...)})
	cfg := e2eConfig(static...)
	cfg.Segment.Path = one.rig.SegmentPath
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen = ln.Addr().String()
	n2, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- n2.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
		defer cancel()
		_ = n2.Shutdown(ctx)
		<-served
	})
	two := &e2eRouter{node: n2, url: "http://" + ln.Addr().String(), client: one.client}
	for i := range 6 {
		id := fmt.Sprintf("conv-%d", i)
		w1 := servedBy(t, one.post(t, fastpath.PathCompletions, completionBody(e2eTokens(uint32(i), 64), false, 4), sessionHeaders(id)))
		w2 := servedBy(t, two.post(t, fastpath.PathCompletions, completionBody(e2eTokens(uint32(50+i), 64), false, 4), sessionHeaders(id)))
		if w1 != w2 {
			t.Fatalf("session %s: router one bound it to %s, router two sent it to %s", id, w1, w2)
		}
	}
	wantMetric(t, two.metrics(t), `kvfast_session_lookups_total{result="hit"}`, 6)
}

// session_control: open runs on the chosen worker before the request; a
// close runs after the stream ended and its booking was freed, on the
// normal, engine-error and client-drop paths.
func TestSessionOpenCloseOrdering(t *testing.T) {
	for _, tc := range []struct {
		name   string
		engine func(release <-chan struct{}) fasthttp.RequestHandler
		drop   bool
	}{
		{"completed", func(<-chan struct{}) fasthttp.RequestHandler {
			return sseHandler(func(w *bufio.Writer) {
				_ = writeFlush(w, itemEvent(0, "a", ""))
				_ = writeFlush(w, itemEvent(1, "b", "stop"))
				_ = writeFlush(w, []byte(doneEvent))
			})
		}, false},
		{"engine breaks off", func(<-chan struct{}) fasthttp.RequestHandler {
			return sseHandler(func(w *bufio.Writer) { _ = writeFlush(w, itemEvent(0, "a", "")) })
		}, false},
		{"client drops", func(release <-chan struct{}) fasthttp.RequestHandler {
			// Generation goes on until the router, told of the client's
			// hang-up, stops relaying and closes the engine connection.
			return sseHandler(func(w *bufio.Writer) {
				for i := 0; i < 1<<20; i++ {
					if writeFlush(w, itemEvent(i, "a", "")) != nil {
						return
					}
					select {
					case <-release:
						return
					default:
					}
				}
			})
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			e := startSessionEngine(t, tc.engine(release))
			r := sessionRouter(t, nil, e)
			var bookedAtClose []int64
			var mu sync.Mutex
			e.mu.Lock()
			e.atClose = func() {
				var booked int64 = -1
				for _, w := range r.node.Snapshot().Workers {
					if w.WorkerID == 1 {
						booked = w.Requests
					}
				}
				mu.Lock()
				bookedAtClose = append(bookedAtClose, booked)
				mu.Unlock()
			}
			e.mu.Unlock()
			body := []byte(`{"model":"` + e2eModel + `","prompt":[1,2,3,4],"max_tokens":4,"stream":true,` +
				`"session_control":{"open":{"capacity_of_str_len":1000},"close":true}}`)
			resp, cancel := r.openStream(t, fastpath.PathCompletions, body, sessionHeaders("conv-9"))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if tc.drop {
				if _, err := readEvent(bufio.NewReader(resp.Body)); err != nil {
					t.Fatal(err)
				}
				cancel()
			} else {
				_, _ = io.Copy(io.Discard, resp.Body)
			}
			waitFor(t, "close_session", func() bool { ev := e.events(); return len(ev) == 3 })
			ev := e.events()
			if ev[0] != `open {"capacity_of_str_len":1000,"session_id":"conv-9"}` || ev[1] != "generate" ||
				ev[2] != `close {"session_id":"conv-9"}` {
				t.Fatalf("engine saw %q; want open, generate, close", ev)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(bookedAtClose) != 1 || bookedAtClose[0] != 0 {
				t.Fatalf("requests booked on the worker when close_session arrived: %v; want none", bookedAtClose)
			}
			waitReleased(t, r.node)
			m := r.metrics(t)
			wantMetric(t, m, `kvfast_session_control_total{op="open",result="ok"}`, 1)
			waitFor(t, "the close counted", func() bool {
				return metricOr0(r.metrics(t), `kvfast_session_control_total{op="close",result="ok"}`) == 1
			})
		})
	}
}

// An open that the worker refuses fails the request before dispatch: as
// the client's error when the engine judged the open (a session of that
// id exists), as the engine's when it failed or refused the router.
func TestSessionOpenFailsFast(t *testing.T) {
	for _, tc := range []struct {
		engine     int
		wantStatus int
		wantCode   string
	}{
		{fasthttp.StatusBadRequest, http.StatusBadRequest, "session_open_refused"},
		{fasthttp.StatusConflict, http.StatusBadRequest, "session_open_refused"},
		{fasthttp.StatusNotFound, http.StatusBadRequest, "session_control_unsupported"}, // an engine without sessions (vLLM)
		{fasthttp.StatusInternalServerError, http.StatusBadGateway, "session_open_failed"},
		{fasthttp.StatusUnauthorized, http.StatusBadGateway, "session_open_failed"},
		{fasthttp.StatusTooManyRequests, http.StatusBadGateway, "session_open_failed"},
	} {
		t.Run(strconv.Itoa(tc.engine), func(t *testing.T) {
			e := startSessionEngine(t, plainAnswer)
			e.mu.Lock()
			e.openFails = tc.engine
			e.mu.Unlock()
			r := sessionRouter(t, nil, e)
			resp := r.post(t, fastpath.PathCompletions, []byte(`{"model":"`+e2eModel+`","prompt":[1,2],"session_control":{"open":true}}`), sessionHeaders("conv"))
			if resp.status != tc.wantStatus || checkOpenAIError(t, resp.body) != tc.wantCode {
				t.Fatalf("status %d: %s; want %d %s", resp.status, resp.body, tc.wantStatus, tc.wantCode)
			}
			if ev := e.events(); len(ev) == 0 || !strings.HasPrefix(ev[0], "open ") || slices.Contains(ev, "generate") {
				t.Fatalf("engine saw %q; want the failed open and no generation", ev)
			}
			waitReleased(t, r.node)
		})
	}
	// Without a session id, session_control is refused.
	e := startSessionEngine(t, plainAnswer)
	r := sessionRouter(t, nil, e)
	resp := r.post(t, fastpath.PathCompletions, []byte(`{"model":"`+e2eModel+`","prompt":[1,2],"session_control":{"close":true}}`), nil)
	if resp.status != http.StatusBadRequest || checkOpenAIError(t, resp.body) != "session_id_required" {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
}

// TestSessionControlCarriesTheClient: open_session and close_session go
// with the client's Authorization, as its request does (an engine that
// requires its key refused every open), and its request id; and an open
// whose client leaves before the session is bound is closed again, which
// nothing else would do.
func TestSessionControlCarriesTheClient(t *testing.T) {
	hold := make(chan struct{})
	defer close(hold)
	var holding atomic.Bool
	e := startSessionEngine(t, func(ctx *fasthttp.RequestCtx) {
		if holding.Load() {
			<-hold // an engine slow to answer: the client gives up first
		}
		plainAnswer(ctx)
	})
	r := sessionRouter(t, nil, e)
	hdr := sessionHeaders("conv-a")
	hdr["Authorization"] = "Bearer sk-client"
	hdr[fastpath.HeaderRequestID] = "req-7"
	resp := r.post(t, fastpath.PathCompletions, []byte(`{"model":"`+e2eModel+`","prompt":[1,2],"session_control":{"open":true,"close":true}}`), hdr)
	if resp.status != http.StatusOK {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	waitFor(t, "close_session", func() bool { return len(e.events()) == 3 })
	e.mu.Lock()
	callers := append([]string(nil), e.callers...)
	e.mu.Unlock()
	if len(callers) != 2 || callers[0] != "Bearer sk-client req-7" || callers[1] != "Bearer sk-client req-7" {
		t.Fatalf("session control calls carried %q; want the client's key and request id on both", callers)
	}

	// Opened, then the client leaves before the engine answers: never
	// bound, so closed.
	holding.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url+fastpath.PathCompletions,
		strings.NewReader(`{"model":"`+e2eModel+`","prompt":[1,2],"session_control":{"open":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range sessionHeaders("conv-b") {
		req.Header.Set(k, v)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := r.client.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waitFor(t, "the request at the engine", func() bool { return len(e.events()) == 5 })
	cancel()
	<-done
	waitFor(t, "the abandoned session closed", func() bool {
		ev := e.events()
		return len(ev) == 6 && ev[5] == `close {"session_id":"conv-b"}`
	})
	waitReleased(t, r.node)
}

// Concurrent first requests of one new session agree on one worker: the
// session is claimed when the first is routed, not when its engine
// accepts it (a non-streamed answer is accepted only once generated, and
// the others went where selection sent them, split across workers).
func TestStickyConcurrentFirstRequestsAgree(t *testing.T) {
	const n = 8
	release := make(chan struct{})
	var arrived atomic.Int32
	hold := func(ctx *fasthttp.RequestCtx) {
		arrived.Add(1)
		<-release
		plainAnswer(ctx)
	}
	a, b := startSessionEngine(t, hold), startSessionEngine(t, hold)
	r := sessionRouter(t, nil, a, b)
	var once sync.Once
	defer once.Do(func() { close(release) })
	got := make(chan string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			res, err := postNoFatal(r, completionBody(e2eTokens(uint32(10+i), 64), false, 4), sessionHeaders("together"))
			if err != nil || res.status != http.StatusOK {
				got <- fmt.Sprintf("error %v, status %d", err, res.status)
				return
			}
			got <- res.header.Get(fastpath.HeaderWorker)
		})
	}
	// Every request is held by an engine before any is answered.
	waitFor(t, "every request at an engine", func() bool { return arrived.Load() == n })
	once.Do(func() { close(release) })
	wg.Wait()
	close(got)
	workersSeen := map[string]int{}
	for w := range got {
		workersSeen[w]++
	}
	if len(workersSeen) != 1 {
		t.Fatalf("the session's concurrent first requests went to %v, want one worker", workersSeen)
	}
	m := r.metrics(t)
	wantMetric(t, m, `kvfast_session_binds_total{result="new"}`, 1)
	wantMetric(t, m, `kvfast_session_bindings`, 1)
}

// A turn longer than the TTL keeps its session: idle time runs from the
// end of the turn (the binding was touched only when the engine accepted
// the request, and the next turn found it expired).
func TestStickyLongTurnOutlivesTheTTL(t *testing.T) {
	// The check after the turn must come within the TTL: 3 s is ample on
	// a loaded machine, and the turn takes 4.5.
	const ttl = 3 * time.Second
	slow := sseHandler(func(w *bufio.Writer) {
		for range 6 { // 4.5 s: longer than the TTL
			if writeFlush(w, []byte(`data: {"choices":[{"index":0,"text":"x","finish_reason":null}]}`+"\n\n")) != nil {
				return
			}
			time.Sleep(ttl / 4)
		}
		_ = writeFlush(w, []byte(`data: {"choices":[{"index":0,"text":"","finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n"))
	})
	a, b := startSessionEngine(t, slow), startSessionEngine(t, slow)
	r := sessionRouter(t, func(c *node.Config) { c.HTTP.Sessions.TTL = ttl }, a, b)
	servedBy(t, r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(1, 64), true, 4), sessionHeaders("long")))
	// Right after the turn the session has been idle for no time: its
	// binding is live (the gauge counts live bindings only).
	wantMetric(t, r.metrics(t), `kvfast_session_bindings`, 1)
}

// close_session calls in flight are bounded: past the bound a close is not
// sent but counted (each held a goroutine and a connection for up to
// --session-control-timeout, after its request was answered, so nothing
// else bounded them).
func TestSessionClosesInFlightAreBounded(t *testing.T) {
	defer fastpath.SetMaxPendingCloses(2)()
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock()
	e := startSessionEngine(t, plainAnswer)
	var held atomic.Int32
	e.mu.Lock()
	e.atClose = func() { held.Add(1); <-release }
	e.mu.Unlock()
	// The held closes must outlive the test's waits on a loaded machine.
	r := sessionRouter(t, func(c *node.Config) { c.HTTP.Sessions.ControlTimeout = time.Hour }, e)
	body := []byte(`{"model":"` + e2eModel + `","prompt":[1,2,3,4],"max_tokens":4,"session_control":{"close":true}}`)
	for i := range 3 {
		if res := r.post(t, fastpath.PathCompletions, body, sessionHeaders(fmt.Sprint("closing-", i))); res.status != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, res.status, res.body)
		}
	}
	waitFor(t, "one close dropped and two held by the engine", func() bool {
		return metricOr0(r.metrics(t), `kvfast_session_control_total{op="close",result="dropped"}`) == 1 && held.Load() == 2
	})
	unblock()
	waitFor(t, "the two closes answered", func() bool {
		return metricOr0(r.metrics(t), `kvfast_session_control_total{op="close",result="ok"}`) == 2
	})
	if n := held.Load(); n != 2 {
		t.Fatalf("the engine saw %d closes, want 2", n)
	}
}

// A bound worker that avoidUnlisted takes off the request's allow-list,
// because its engine stops listing the session's model or refuses the
// router's engine key, loses the session for that reason, not for an
// allow-list the client never sent (the router's own narrowing read as
// one).
func TestStickyUnbindsAWorkerTheRouterAvoids(t *testing.T) {
	for _, tc := range []struct {
		reason string
		sicken func(*sessionEngine)
		seen   func(fastpath.WorkerView) bool
	}{
		{"model", func(e *sessionEngine) { e.lists = "another-model" }, func(w fastpath.WorkerView) bool { return w.ModelUnlisted }},
		{"key_refused", func(e *sessionEngine) { e.refusesKey = true }, func(w fastpath.WorkerView) bool { return w.KeyRefused }},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			a, b := startSessionEngine(t, plainAnswer), startSessionEngine(t, plainAnswer)
			r := sessionRouter(t, func(c *node.Config) { c.Dispatch.EngineToken = "engine-key" }, a, b)
			first := servedBy(t, r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(1, 64), false, 4), sessionHeaders("avoided")))
			bound, boundID := a, uint64(1)
			if first == "2" {
				bound, boundID = b, 2
			}
			bound.mu.Lock()
			tc.sicken(bound)
			bound.mu.Unlock()
			waitFor(t, "the bound worker reported "+tc.reason, func() bool { return tc.seen(workerView(t, r.node, boundID, 0)) })
			if got := servedBy(t, r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(2, 64), false, 4), sessionHeaders("avoided"))); got == first {
				t.Fatalf("the session stayed on worker %s", got)
			}
			m := r.metrics(t)
			wantMetric(t, m, `kvfast_session_unbinds_total{reason="`+tc.reason+`"}`, 1)
			wantMetric(t, m, `kvfast_session_unbinds_total{reason="not_allowed"}`, 0)
		})
	}
}

// A session bound to a worker whose engine answered another request 429
// stays there: the engine's Retry-After keeps other requests off it, but
// a session's binding is a pin, which moves only if the engine answers
// the session's own request 429.
func TestStickySessionStaysOnAThrottledWorker(t *testing.T) {
	throttling := func(ctx *fasthttp.RequestCtx) {
		if bytes.Contains(ctx.PostBody(), []byte(`"max_tokens":7`)) {
			ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
			ctx.Response.Header.Set("Retry-After", "30")
			return
		}
		plainAnswer(ctx)
	}
	a, b := startSessionEngine(t, throttling), startSessionEngine(t, throttling)
	r := sessionRouter(t, nil, a, b)
	first := servedBy(t, r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(1, 64), false, 4), sessionHeaders("throttled")))
	other := "1"
	if first == "1" {
		other = "2"
	}
	if resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(2, 64), false, 7), map[string]string{fastpath.HeaderWorker: first}); resp.status != http.StatusTooManyRequests {
		t.Fatalf("pinned to the throttling engine: status %d: %s", resp.status, resp.body)
	}
	for i := range 3 {
		if got := servedBy(t, r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(uint32(10+i), 64), false, 4), sessionHeaders("throttled"))); got != first {
			t.Fatalf("turn %d of the session went to worker %s, bound to throttled %s", i+2, got, first)
		}
		if got := servedBy(t, r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(uint32(20+i), 64), false, 4), nil)); got != other {
			t.Fatalf("request %d without a session went to worker %s while %s is throttled", i, got, first)
		}
	}
	wantMetric(t, r.metrics(t), `kvfast_session_unbinds_total{reason="busy"}`, 0)
}

// With API keys, each key has its own session namespace: a tenant naming
// another's session id is not routed to that session's worker (which
// would say where it lives) and cannot move it with an allow-list.
func TestStickySessionsAreScopedByAPIKey(t *testing.T) {
	a, b := startSessionEngine(t, plainAnswer), startSessionEngine(t, plainAnswer)
	r := sessionRouter(t, func(c *node.Config) { c.HTTP.APIKeys = []string{"key-a", "key-b"} }, a, b)
	as := func(key string, extra ...string) map[string]string {
		return sessionHeaders("chat-1", append([]string{"Authorization", "Bearer " + key}, extra...)...)
	}
	first := servedBy(t, r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(1, 64), false, 4), as("key-a")))
	other := "1"
	if first == "1" {
		other = "2"
	}
	// Tenant b, same id, allowed only the other worker: routed there, and
	// tenant a's binding is not touched.
	if got := servedBy(t, r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(2, 64), false, 4), as("key-b", fastpath.HeaderAllow, other))); got != other {
		t.Fatalf("tenant b served by %s, want %s", got, other)
	}
	for i := range 3 {
		if got := servedBy(t, r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(uint32(3+i), 64), false, 4), as("key-a"))); got != first {
			t.Fatalf("tenant a's turn %d served by %s, want its session's worker %s", i, got, first)
		}
	}
	m := r.metrics(t)
	wantMetric(t, m, `kvfast_session_unbinds_total{reason="not_allowed"}`, 0)
}

// An open_session that times out may still open the session on the
// engine: the router closes it again, so that it does not hold the
// engine's memory until its own timeout, and a retried open of that id
// is not refused as a session that exists.
func TestStickyTimedOutOpenIsClosed(t *testing.T) {
	e := startSessionEngine(t, plainAnswer)
	e.openDelay = 2 * time.Second
	r := sessionRouter(t, func(c *node.Config) { c.HTTP.Sessions.ControlTimeout = 50 * time.Millisecond }, e)
	body := []byte(`{"model":"` + e2eModel + `","prompt":[1,2,3,4],"max_tokens":4,"session_control":{"open":{}}}`)
	if res := r.post(t, fastpath.PathCompletions, body, sessionHeaders("slow-open")); res.status != http.StatusBadGateway {
		t.Fatalf("status %d: %s", res.status, res.body)
	}
	waitFor(t, "the timed-out open closed again", func() bool {
		return metricOr0(r.metrics(t), `kvfast_session_control_total{op="close",result="ok"}`) == 1
	})
	if log := e.events(); !slices.Contains(log, `close {"session_id":"slow-open"}`) {
		t.Errorf("the engine's calls: %q", log)
	}
}

// A session id must be 1 to 256 bytes of UTF-8: past that, or not UTF-8
// (two such ids reached SGLang as one session_id, their bytes replaced by
// U+FFFD), it is a 400.
func TestStickySessionIDIsChecked(t *testing.T) {
	r := sessionRouter(t, nil, startSessionEngine(t, plainAnswer))
	for _, id := range []string{strings.Repeat("s", 257), "u-\xff", "u-\xfe"} {
		res := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(1, 32), false, 4), sessionHeaders(id))
		if res.status != http.StatusBadRequest || !strings.Contains(string(res.body), "invalid_header") {
			t.Errorf("session id %.20q: status %d %s, want 400 invalid_header", id, res.status, res.body)
		}
	}
	if got := servedBy(t, r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(1, 32), false, 4), sessionHeaders(strings.Repeat("é", 128)))); got == "" {
		t.Fatal("a 256-byte UTF-8 session id was not served")
	}
}

// A request that closes its session but cannot go to the bound worker
// (here its allow-list excludes it) is served elsewhere, and the
// close_session still goes to the bound worker's engine, where the
// engine session lives (it went to the other, which had none).
func TestSessionCloseGoesToTheBoundWorker(t *testing.T) {
	a, b := startSessionEngine(t, plainAnswer), startSessionEngine(t, plainAnswer)
	r := sessionRouter(t, nil, a, b)
	x := servedBy(t, r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(1, 64), false, 4), sessionHeaders("leaving")))
	bound, other, otherID := a, b, "2"
	if x == "2" {
		bound, other, otherID = b, a, "1"
	}
	body := []byte(`{"model":"` + e2eModel + `","prompt":[1,2,3,4],"max_tokens":4,"session_control":{"close":true}}`)
	if got := servedBy(t, r.post(t, fastpath.PathCompletions, body, sessionHeaders("leaving", fastpath.HeaderAllow, otherID))); got != otherID {
		t.Fatalf("the closing request went to %s, want %s", got, otherID)
	}
	closed := func(e *sessionEngine) bool { return slices.Contains(e.events(), `close {"session_id":"leaving"}`) }
	waitFor(t, "close_session at the bound worker's engine", func() bool { return closed(bound) })
	if closed(other) {
		t.Fatalf("close_session went to the worker that served the request too: %q", other.events())
	}
}

// An engine's 4xx to open_session (a session of that id open there
// already, from an earlier or concurrent request) fails the request but
// leaves the session bound where it lives.
func TestSessionOpenRefusalKeepsTheBinding(t *testing.T) {
	a, b := startSessionEngine(t, plainAnswer), startSessionEngine(t, plainAnswer)
	r := sessionRouter(t, nil, a, b)
	first := servedBy(t, r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(1, 64), false, 4), sessionHeaders("kept")))
	for _, e := range []*sessionEngine{a, b} {
		e.mu.Lock()
		e.openFails = fasthttp.StatusBadRequest // as to a session that exists
		e.mu.Unlock()
	}
	resp := r.post(t, fastpath.PathCompletions, []byte(`{"model":"`+e2eModel+`","prompt":[1,2],"session_control":{"open":true}}`), sessionHeaders("kept"))
	if resp.status != http.StatusBadRequest || checkOpenAIError(t, resp.body) != "session_open_refused" {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	if got := servedBy(t, r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(2, 64), false, 4), sessionHeaders("kept"))); got != first {
		t.Fatalf("after the refused open the session went to %s, bound to %s", got, first)
	}
	wantMetric(t, r.metrics(t), `kvfast_session_unbinds_total{reason="open_failed"}`, 0)
}
