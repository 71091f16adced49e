//go:build !race

package fastpath

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/workers"
)

// TestRouteOnlyAllocations drives the server's handler in process, with one
// reused RequestCtx, through everything a route-only request does: header
// hints, parsing, block hashing, the index lookup, selection with scores,
// metrics and the hand-built JSON answer. Once the pooled exchange has grown
// to the request's size, none of it may allocate.
func TestRouteOnlyAllocations(t *testing.T) {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 90) // ~4 KB
	cases := []struct {
		name    string
		path    string
		body    []byte
		headers map[string]string
		cached  int // prompt blocks the first worker caches
		policy  string
		adapter bool // benchModel serves LoRA adapter "sql"
		session bool // the request's session is bound to worker 3
		encoder bool // an encode worker is present: multimodal items are read
	}{
		{name: "tokens 1K cache hit", path: PathRouteCompletions,
			body: tokenBody(benchTokens(1024, 151935), ", ", false), cached: 48},
		{name: "tokens 1K cold", path: PathRouteCompletions,
			body: tokenBody(benchTokens(1024, 151935), ", ", false)},
		{name: "tokens 4K cache hit", path: PathRouteCompletions,
			body: tokenBody(benchTokens(4096, 151935), ", ", true), cached: 200},
		{name: "query-only header with request id", path: PathCompletions,
			body: tokenBody(benchTokens(1024, 151935), ",", false), cached: 16,
			headers: map[string]string{HeaderQueryOnly: "true", HeaderRequestID: "client-id-42"}},
		{name: "pinned worker and rank", path: PathRouteCompletions,
			body:    tokenBody(benchTokens(1024, 151935), ", ", false),
			headers: map[string]string{HeaderWorker: "2", HeaderDPRank: "0", HeaderPriority: "-3"}},
		{name: "client trace context, tracing off", path: PathRouteCompletions,
			body: tokenBody(benchTokens(1024, 151935), ", ", false), cached: 8,
			headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "vendor=opaque"}},
		{name: "allow list", path: PathRouteCompletions,
			body: tokenBody(benchTokens(1024, 151935), ", ", false), cached: 8,
			headers: map[string]string{HeaderAllow: "1, 3:0"}},
		{name: "sticky session bound", path: PathRouteCompletions, session: true,
			body:    tokenBody(benchTokens(1024, 151935), ", ", false),
			headers: map[string]string{HeaderSession: "conversation-42"}},
		{name: "sticky session unbound", path: PathRouteCompletions,
			body:    tokenBody(benchTokens(1024, 151935), ", ", false),
			headers: map[string]string{HeaderSession: "conversation-43"}},
		{name: "LoRA adapter", path: PathRouteCompletions, adapter: true,
			body: bytes.Replace(tokenBody(benchTokens(1024, 151935), ", ", false), []byte(`"`+benchModel+`"`), []byte(`"sql"`), 1)},
		{name: "LoRA adapter as SGLang's base:adapter", path: PathRouteCompletions, adapter: true,
			body: bytes.Replace(tokenBody(benchTokens(1024, 151935), ", ", false), []byte(`"`+benchModel+`"`), []byte(`"`+benchModel+`:sql"`), 1)},
		{name: "LoRA adapter as SGLang's lora_path", path: PathRouteCompletions, adapter: true,
			body: bytes.Replace(tokenBody(benchTokens(1024, 151935), ", ", false), []byte(`"`+benchModel+`"`), []byte(`"`+benchModel+`","lora_path":"sql"`), 1)},
		{name: "text prompt, approximate", path: PathRouteCompletions, policy: "approx",
			body: []byte(`{"model":"` + benchModel + `","prompt":"` + text + `","max_tokens":64}`)},
		{name: "chat, approximate", path: PathRouteChatCompletions, policy: "approx",
			body: []byte(`{"model":"` + benchModel + `","messages":[{"role":"system","content":"Be brief."},` +
				`{"role":"user","content":"` + text + `"}],"stream":true}`)},
		{name: "chat with images, encoders present", path: PathRouteChatCompletions, policy: "approx", encoder: true,
			body: []byte(`{"model":"` + benchModel + `","messages":[{"role":"user","content":[{"type":"text","text":"` + text + `"},` +
				`{"type":"image_url","image_url":{"url":"data:image/png;base64,` + strings.Repeat("iVBORw0K", 512) + `"}},` +
				`{"type":"image_url","image_url":{"url":"https://example.com/cat.png"}}]}]}`)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newRouteTestServer(t, 4, tc.policy)
			if tc.adapter {
				s.SetAdapters(map[string]Adapter{"sql": {Base: benchModel, Workers: s.sched.Workers(), SGLang: s.sched.Workers()}})
			}
			if tc.encoder {
				if err := s.sched.Upsert(sched.WorkerInfo{ID: 99, Slot: 4, Model: benchModel, Endpoint: "127.0.0.1:99", Role: workers.RoleEncode}); err != nil {
					t.Fatal(err)
				}
			}
			if tc.cached > 0 {
				fillRouteIndex(t, s, tc.body, 0, tc.cached)
			}
			if tc.session {
				b := s.sessions.table
				b.Bind(b.Key([]byte("conversation-42")), 3, 0, b.Now(), int64(s.cfg.Sessions.TTL))
			}
			ctx := newRouteCtx(tc.path, tc.body, tc.headers)
			serve := func() {
				ctx.Response.Reset()
				s.handle(ctx)
			}
			serve() // grow the pooled exchange's buffers once
			if code := ctx.Response.StatusCode(); code != fasthttp.StatusOK {
				t.Fatalf("status %d: %s", code, ctx.Response.Body())
			}
			if !bytes.Contains(ctx.Response.Body(), []byte(`"worker_id":`)) {
				t.Fatalf("no decision in %s", ctx.Response.Body())
			}
			if tc.cached > 0 {
				// The index fill must be what the decision saw, or the
				// lookup's hit path is not what was measured.
				want := []byte(`"overlap_blocks":` + strconv.Itoa(tc.cached))
				if !bytes.Contains(ctx.Response.Body(), want) {
					t.Fatalf("want %s in %s", want, ctx.Response.Body())
				}
			}
			if n := testing.AllocsPerRun(200, serve); n != 0 {
				t.Fatalf("a route-only request made %v allocations", n)
			}
			if tc.session && !bytes.Contains(ctx.Response.Body(), []byte(`"worker_id":3`)) {
				t.Fatalf("the bound session was not routed to its worker: %s", ctx.Response.Body())
			}
			if code := ctx.Response.StatusCode(); code != fasthttp.StatusOK {
				t.Fatalf("status %d after the runs: %s", code, ctx.Response.Body())
			}
		})
	}
}

// TestRejectedRequestAllocations keeps the cheap refusals cheap: a body that
// fails to parse, or names no known model, is answered from the static
// error bodies, so hostile traffic cannot make the router allocate either.
func TestRejectedRequestAllocations(t *testing.T) {
	s := newRouteTestServer(t, 2, "")
	cases := []struct {
		name   string
		body   string
		status int
		want   *openai.Error
	}{
		{"malformed", `{"prompt":[1,2,`, fasthttp.StatusBadRequest, openai.ErrMalformedJSON},
		{"unknown model", `{"model":"nope","prompt":[1,2,3]}`, fasthttp.StatusNotFound, errUnknownModel},
		{"batch", `{"model":"` + benchModel + `","prompt":[[1],[2]]}`, fasthttp.StatusBadRequest, openai.ErrBatchNotSupported},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := newRouteCtx(PathRouteCompletions, []byte(tc.body), nil)
			serve := func() {
				ctx.Response.Reset()
				s.handle(ctx)
			}
			serve()
			if code := ctx.Response.StatusCode(); code != tc.status {
				t.Fatalf("status %d, want %d: %s", code, tc.status, ctx.Response.Body())
			}
			if n := testing.AllocsPerRun(200, serve); n != 0 {
				t.Fatalf("a refused request made %v allocations", n)
			}
			// The error body is rendered into the response's reused buffer;
			// it must still be whole after the runs.
			if got, want := string(ctx.Response.Body()), string(tc.want.AppendJSON(nil)); got != want {
				t.Fatalf("body %s, want %s", got, want)
			}
		})
	}
}

// TestRenderedRouteAllocations: a chat or text request whose model has a
// renderer takes the tokenize stage and then the token-prompt path, and
// allocates nothing of its own either (the renderer here appends fixed ids
// without allocating; the remote renderer's own test,
// prompt.TestRemoteAllocations, covers the round trip).
func TestRenderedRouteAllocations(t *testing.T) {
	ids := benchTokens(1024, 151935)
	s := newRenderTestServer(t, 4, "", &fakeRenderer{ids: ids})
	fillRouteIndex(t, s, tokenBody(ids, ",", false), 0, 40)
	for _, tc := range []struct {
		name, path string
		body       []byte
	}{
		{"chat", PathRouteChatCompletions, []byte(`{"model":"` + benchModel + `","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}],"stream":true}`)},
		{"text", PathRouteCompletions, []byte(`{"model":"` + benchModel + `","prompt":"once upon a time","max_tokens":64}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := newRouteCtx(tc.path, tc.body, nil)
			serve := func() {
				ctx.Response.Reset()
				s.handle(ctx)
			}
			serve()
			if code := ctx.Response.StatusCode(); code != fasthttp.StatusOK ||
				!bytes.Contains(ctx.Response.Body(), []byte(`"overlap_blocks":40`)) || !bytes.Contains(ctx.Response.Body(), []byte(`"exact":true`)) {
				t.Fatalf("status %d: %s", code, ctx.Response.Body())
			}
			if n := testing.AllocsPerRun(200, serve); n != 0 {
				t.Fatalf("a rendered route-only request made %v allocations", n)
			}
		})
	}
}

// TestOverloadAllocations: when every worker is busy and the admission
// queue is full, the request is refused with 429 and a Retry-After. That
// refusal is the path a traffic spike takes for every request beyond
// capacity, so it must allocate nothing either: a router shedding load
// must not add garbage collection to its troubles.
func TestOverloadAllocations(t *testing.T) {
	s := newTestFrontSched(t, DefaultConfig(),
		sched.Config{Busy: sched.BusyThresholds{PrefillTokens: 1}, QueueCapacity: -1},
		"", []frontWorker{{endpoint: "127.0.0.1:9", model: benchModel}, {endpoint: "127.0.0.1:10", model: benchModel}}, nil)
	// One booking of two prompt tokens on each worker makes both busy.
	held := make([]sched.Reservation, 2)
	for i := range held {
		if _, err := s.sched.Select(t.Context(), &sched.Request{Model: benchModel, PromptTokens: 2}, &held[i]); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for i := range held {
			held[i].Release()
		}
	})
	// A sticky session's request is pinned to its bound worker and takes
	// the session's own refusal path (selectSticky).
	b := s.sessions.table
	b.Bind(b.Key([]byte("conversation-7")), 1, 0, b.Now(), int64(s.cfg.Sessions.TTL))
	for _, tc := range []struct {
		name    string
		headers map[string]string
	}{
		{"plain", nil},
		{"sticky session", map[string]string{HeaderSession: "conversation-7"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := newRouteCtx(PathCompletions, tokenBody(benchTokens(1024, 151935), ", ", false), tc.headers)
			serve := func() {
				ctx.Response.Reset()
				s.handle(ctx)
			}
			serve()
			if code := ctx.Response.StatusCode(); code != fasthttp.StatusTooManyRequests {
				t.Fatalf("status %d, want 429: %s", code, ctx.Response.Body())
			}
			if n := testing.AllocsPerRun(200, serve); n != 0 {
				t.Fatalf("a request refused as overloaded made %v allocations", n)
			}
			if got, want := string(ctx.Response.Body()), string(errOverloaded.AppendJSON(nil)); got != want {
				t.Fatalf("body %s, want %s", got, want)
			}
			if ra := string(ctx.Response.Header.Peek("Retry-After")); ra != "1" {
				t.Fatalf("Retry-After %q, want 1 (the scheduler's minimum)", ra)
			}
			if st := s.sched.Stats(); st.Booked != 2 || st.Waiting != 0 {
				t.Fatalf("refusals left bookings or waiters behind: %+v", st)
			}
		})
	}
}
