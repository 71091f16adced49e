package prompt

import (
	"context"
	"errors"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/workers"
)

// testRemoteConfig gives calls a generous timeout: the tests that want one
// to expire use an engine that never answers.
var testRemoteConfig = RemoteConfig{Timeout: 10 * time.Second, MaxResponseBytes: 1 << 20}

// parse parses body as a request to api, failing the test if it cannot.
func parse(tb testing.TB, api openai.API, body string) *openai.ParsedRequest {
	tb.Helper()
	var p openai.Parser
	r := new(openai.ParsedRequest)
	if err := p.Parse([]byte(body), api, r); err != nil {
		tb.Fatalf("cannot parse %s: %v", body, err)
	}
	return r
}

func startMock(tb testing.TB, cfg mocker.Config) *mocker.Engine {
	tb.Helper()
	cfg.Speedup = math.Inf(1)
	e, err := mocker.Start(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = e.Close() })
	return e
}

// TestRemoteAgainstMock renders against the mock engine, which answers
// vLLM's render endpoints, and against one configured without them, which
// the renderer must notice once and then ask /tokenize instead. Either way
// the ids are the ones the engine computes.
func TestRemoteAgainstMock(t *testing.T) {
	const system = "You are a terse assistant who answers in one word."
	chatBody := `{"model":"mock","messages":[{"role":"system","content":"` + system + `"},` +
		`{"role":"user","content":[{"type":"text","text":"why"},{"type":"text","text":"not?"}]}],"max_tokens":4,"stream":true}`
	wantChat, err := mocker.AppendChatTokens(nil, []mocker.ChatMessage{{Role: "system", Content: system}, {Role: "user", Content: "why not?"}})
	if err != nil {
		t.Fatal(err)
	}
	textBody := `{"model":"mock","prompt":"<|system|> ` + system + ` <|end|> <|user|> hello","max_tokens":2}`
	wantText := mocker.AppendTextTokens(nil, "<|system|> "+system+" <|end|> <|user|> hello")
	if !slices.Equal(wantText[:len(wantText)-1], wantChat[:len(wantText)-1]) {
		t.Fatal("the written-out template does not share the chat prompt's prefix")
	}

	for _, tc := range []struct {
		name     string
		disable  bool
		endpoint string
	}{{"render", false, "render"}, {"tokenize", true, "tokenize"}} {
		t.Run(tc.name, func(t *testing.T) {
			e := startMock(t, mocker.Config{DisableRender: tc.disable})
			rm := NewRemote("mock", FixedEngine(e.Addr()), testRemoteConfig)
			for i := range 3 { // the first call probes; later ones know
				got, err := rm.Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(chatBody), parse(t, openai.APIChatCompletions, chatBody))
				if err != nil || !slices.Equal(got, wantChat) {
					t.Fatalf("chat call %d: %v, %v; want %v", i, got, err, wantChat)
				}
				dst := make([]uint32, 3, 64)
				got, err = rm.Tokens(context.Background(), dst[:1], openai.APICompletions, []byte(textBody), parse(t, openai.APICompletions, textBody))
				if err != nil || !slices.Equal(got[1:], wantText) || got[0] != 0 {
					t.Fatalf("completions call %d: %v, %v; want [0] + %v", i, got, err, wantText)
				}
			}
			st := rm.status()
			want := []EngineStatus{{Addr: e.Addr(), Completions: tc.endpoint, Chat: tc.endpoint}}
			if !slices.Equal(st.Engines, want) || st.LastError != "" {
				t.Fatalf("status %+v, want engines %+v", st, want)
			}
			if o := rm.outcomes.load(); o != (Outcomes{OK: 6}) {
				t.Fatalf("outcomes %+v", o)
			}
		})
	}
}

// scriptedEngine is an HTTP engine whose answer the test sets: status and
// body per path, or no answer at all.
type scriptedEngine struct {
	addr    string
	answers atomic.Pointer[map[string]scripted]
	calls   atomic.Int64
	conns   atomic.Int64  // open client connections
	hang    chan struct{} // closed at cleanup: a hanging handler returns
	// key, when set, is the bearer token every call must carry, as an
	// engine started with --api-key wants; others get 401.
	key atomic.Pointer[string]
}

type scripted struct {
	status int
	body   []byte
	hang   bool
}

func startScripted(tb testing.TB) *scriptedEngine {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	se := &scriptedEngine{addr: ln.Addr().String(), hang: make(chan struct{})}
	se.set(nil)
	srv := &fasthttp.Server{Handler: se.handle, NoDefaultServerHeader: true, NoDefaultDate: true, NoDefaultContentType: true,
		ConnState: func(_ net.Conn, st fasthttp.ConnState) {
			switch st {
			case fasthttp.StateNew:
				se.conns.Add(1)
			case fasthttp.StateClosed:
				se.conns.Add(-1)
			}
		}}
	done := make(chan struct{})
	go func() { _ = srv.Serve(ln); close(done) }()
	tb.Cleanup(func() {
		close(se.hang)
		_ = srv.Shutdown()
		<-done
	})
	return se
}

func (se *scriptedEngine) set(m map[string]scripted) { se.answers.Store(&m) }

func (se *scriptedEngine) handle(ctx *fasthttp.RequestCtx) {
	se.calls.Add(1)
	a, ok := (*se.answers.Load())[string(ctx.Path())]
	key := se.key.Load()
	switch {
	case key != nil && string(ctx.Request.Header.Peek("Authorization")) != "Bearer "+*key:
		ctx.SetStatusCode(fasthttp.StatusUnauthorized)
		ctx.Response.SetBodyRaw([]byte(`{"error":"Unauthorized"}`))
	case !ok:
		ctx.SetStatusCode(fasthttp.StatusNotFound)
		ctx.Response.SetBodyRaw(notFound)
	case a.hang:
		<-se.hang
	default:
		ctx.SetStatusCode(a.status)
		ctx.Response.SetBodyRaw(a.body)
	}
}

var notFound = []byte(`{"detail":"Not Found"}`)

// TestRemoteFailures: every way an engine can fail ends in an error that
// says which, counted under its outcome, and never in wrong ids.
func TestRemoteFailures(t *testing.T) {
	se := startScripted(t)
	chat := `{"messages":[{"role":"user","content":"x"}]}`
	text := `{"prompt":"x"}`
	ok := func(ids string) scripted { return scripted{status: 200, body: []byte(ids)} }
	cases := []struct {
		name    string
		answers map[string]scripted
		api     openai.API
		want    error
		ids     []uint32
	}{
		{"render", map[string]scripted{pathRenderChat: ok(`{"token_ids":[1,2,3]}`)}, openai.APIChatCompletions, nil, []uint32{1, 2, 3}},
		{"render list", map[string]scripted{pathRenderCompletions: ok(`[{"token_ids":[4]}]`)}, openai.APICompletions, nil, []uint32{4}},
		{"tokenize", map[string]scripted{pathTokenize: ok(`{"tokens":[5,6],"count":2}`)}, openai.APIChatCompletions, nil, []uint32{5, 6}},
		{"server error", map[string]scripted{pathRenderChat: {status: 500, body: []byte(`{}`)}}, openai.APIChatCompletions, ErrEngine, nil},
		{"bad request", map[string]scripted{pathRenderChat: {status: 400, body: []byte(`{"error":{}}`)}}, openai.APIChatCompletions, ErrRejected, nil},
		{"unauthorized", map[string]scripted{pathRenderChat: {status: 401, body: []byte(`{"error":"Unauthorized"}`)}}, openai.APIChatCompletions, ErrRejected, nil},
		{"unknown model is not a missing route", map[string]scripted{pathRenderChat: {status: 404, body: []byte(`{"error":{"message":"no model"}}`)},
			pathTokenize: ok(`{"tokens":[1]}`)}, openai.APIChatCompletions, ErrRejected, nil},
		{"neither endpoint", nil, openai.APIChatCompletions, ErrUnsupported, nil},
		{"not JSON", map[string]scripted{pathRenderChat: ok(`{"token_ids":[1,2`)}, openai.APIChatCompletions, ErrBadResponse, nil},
		{"no ids", map[string]scripted{pathRenderChat: ok(`{"tokens":[1]}`)}, openai.APIChatCompletions, ErrBadResponse, nil},
		{"empty ids", map[string]scripted{pathRenderChat: ok(`{"token_ids":[]}`)}, openai.APIChatCompletions, ErrBadResponse, nil},
		{"negative id", map[string]scripted{pathRenderChat: ok(`{"token_ids":[1,-2]}`)}, openai.APIChatCompletions, ErrBadResponse, nil},
		{"fractional id", map[string]scripted{pathRenderChat: ok(`{"token_ids":[1.5]}`)}, openai.APIChatCompletions, ErrBadResponse, nil},
		{"id over the vocabulary", map[string]scripted{pathRenderChat: ok(`{"token_ids":[1,1000]}`)}, openai.APIChatCompletions, ErrBadResponse, nil},
		{"string ids", map[string]scripted{pathRenderChat: ok(`{"token_ids":"1 2"}`)}, openai.APIChatCompletions, ErrBadResponse, nil},
		{"a batch", map[string]scripted{pathRenderCompletions: ok(`[{"token_ids":[1]},{"token_ids":[2]}]`)}, openai.APICompletions, ErrBadResponse, nil},
		{"too large", map[string]scripted{pathRenderChat: ok(`{"token_ids":[1],"pad":"` + strings.Repeat("x", 4096) + `"}`)}, openai.APIChatCompletions, ErrBadResponse, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			se.set(tc.answers)
			rm := NewRemote("m", FixedEngine(se.addr), RemoteConfig{Timeout: 10 * time.Second, MaxResponseBytes: 2048, MaxTokenID: 999})
			body := chat
			if tc.api == openai.APICompletions {
				body = text
			}
			got, err := rm.Tokens(context.Background(), nil, tc.api, []byte(body), parse(t, tc.api, body))
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			var f *Failure
			if err != nil && (!errors.As(err, &f) || !strings.HasPrefix(f.Detail, "POST "+se.addr+"/") || rm.status().LastError != err.Error()) {
				t.Fatalf("error %q says nothing of the call, or is not the last error (%q)", err, rm.status().LastError)
			}
			if err == nil && !slices.Equal(got, tc.ids) {
				t.Fatalf("ids %v, want %v", got, tc.ids)
			}
			o := rm.outcomes.load()
			if total := o.OK + o.Timeout + o.EngineError + o.Rejected + o.Unsupported + o.BadResponse + o.NoEngine + o.Cancelled; total != 1 {
				t.Fatalf("outcomes %+v: want exactly one", o)
			}
		})
	}

	t.Run("more ids than the request could render to", func(t *testing.T) {
		// Each id is booked as prefill: a short prompt rendered to tens
		// of thousands of ids is the engine's fault, not a long prompt.
		many := `{"token_ids":[1` + strings.Repeat(",1", 70000) + `]}`
		se.set(map[string]scripted{pathRenderChat: ok(many)})
		rm := NewRemote("m", FixedEngine(se.addr), RemoteConfig{Timeout: 10 * time.Second, MaxResponseBytes: 1 << 20, MaxTokenID: 999})
		if _, err := rm.Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(chat), parse(t, openai.APIChatCompletions, chat)); !errors.Is(err, ErrBadResponse) {
			t.Fatalf("error %v, want ErrBadResponse", err)
		}
	})
	t.Run("images by URL allow their placeholders", func(t *testing.T) {
		// /tokenize reports no multimodal features; the two images the
		// messages name stand for up to 16,384 placeholders each.
		images := `{"messages":[{"role":"user","content":[{"type":"text","text":"compare"},` +
			`{"type":"image_url","image_url":{"url":"http://h/a.png"}},{"type":"image_url","image_url":{"url":"http://h/b.png"}}]}]}`
		ids := `{"tokens":[1` + strings.Repeat(",1", 90000) + `]}`
		se.set(map[string]scripted{pathTokenize: ok(ids)})
		rm := NewRemote("m", FixedEngine(se.addr), RemoteConfig{Timeout: 10 * time.Second, MaxResponseBytes: 1 << 20, MaxTokenID: 999})
		got, err := rm.Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(images), parse(t, openai.APIChatCompletions, images))
		if err != nil || len(got) != 90001 {
			t.Fatalf("%d ids, %v: the images' placeholders were not allowed for", len(got), err)
		}
	})
	t.Run("a route missing is remembered, an unknown model is not", func(t *testing.T) {
		se.set(map[string]scripted{pathRenderChat: {status: 404, body: []byte(`{"error":{"message":"no model"}}`)}})
		rm := NewRemote("m", FixedEngine(se.addr), testRemoteConfig)
		for range 2 {
			if _, err := rm.Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(chat), parse(t, openai.APIChatCompletions, chat)); !errors.Is(err, ErrRejected) {
				t.Fatal(err)
			}
		}
		if st := rm.status(); st.Engines[0].Chat != "unknown" {
			t.Fatalf("status %+v", st)
		}
		se.set(map[string]scripted{pathTokenize: ok(`{"tokens":[9]}`)})
		before := se.calls.Load()
		for range 3 {
			got, err := rm.Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(chat), parse(t, openai.APIChatCompletions, chat))
			if err != nil || !slices.Equal(got, []uint32{9}) {
				t.Fatal(got, err)
			}
		}
		// The first call asked render, then /tokenize; the others only /tokenize.
		if n := se.calls.Load() - before; n != 4 {
			t.Fatalf("%d calls, want 4", n)
		}
		if st := rm.status(); st.Engines[0].Chat != "tokenize" || st.Engines[0].Completions != "unknown" {
			t.Fatalf("status %+v", st)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		se.set(map[string]scripted{pathRenderChat: {hang: true}})
		rm := NewRemote("m", FixedEngine(se.addr), RemoteConfig{Timeout: 50 * time.Millisecond, MaxResponseBytes: 1 << 20})
		if _, err := rm.Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(chat), parse(t, openai.APIChatCompletions, chat)); !errors.Is(err, ErrTimeout) {
			t.Fatalf("error %v, want %v", err, ErrTimeout)
		}
		if o := rm.outcomes.load(); o.Timeout != 1 || rm.status().LastError == "" {
			t.Fatalf("outcomes %+v, status %+v", o, rm.status())
		}
	})

	t.Run("no engine, a dead engine, a token prompt, a cancelled request", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := ln.Addr().String()
		ln.Close()
		req := parse(t, openai.APIChatCompletions, chat)
		if _, err := NewRemote("m", noEngines{}, testRemoteConfig).Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(chat), req); !errors.Is(err, ErrNoEngine) {
			t.Errorf("no engine: %v", err)
		}
		if _, err := NewRemote("m", FixedEngine(dead), testRemoteConfig).Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(chat), req); !errors.Is(err, ErrEngine) {
			t.Errorf("dead engine: %v", err)
		}
		tokens := `{"prompt":[1,2]}`
		if _, err := NewRemote("m", FixedEngine(se.addr), testRemoteConfig).Tokens(context.Background(), nil, openai.APICompletions, []byte(tokens), parse(t, openai.APICompletions, tokens)); !errors.Is(err, ErrNotRendered) {
			t.Errorf("token prompt: %v", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		rm := NewRemote("m", FixedEngine(se.addr), testRemoteConfig)
		if _, err := rm.Tokens(ctx, nil, openai.APIChatCompletions, []byte(chat), req); !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled: %v", err)
		}
		if o := rm.outcomes.load(); o.Cancelled != 1 {
			t.Errorf("outcomes %+v", o)
		}
	})
}

type noEngines struct{}

func (noEngines) PickEngine(string, []byte) (workers.Slot, string, bool) { return 0, "", false }

// movingEngine names whichever engine the test last set, in one slot.
type movingEngine struct{ addr atomic.Pointer[string] }

func (m *movingEngine) PickEngine(string, []byte) (workers.Slot, string, bool) {
	return 3, *m.addr.Load(), true
}

// TestRemoteEngineReplaced: when a slot's engine changes, the renderer
// forgets what it learned about the old one.
func TestRemoteEngineReplaced(t *testing.T) {
	a := startMock(t, mocker.Config{DisableRender: true})
	b := startMock(t, mocker.Config{})
	var m movingEngine
	rm := NewRemote("mock", &m, testRemoteConfig)
	body := `{"prompt":"a b"}`
	for _, e := range []*mocker.Engine{a, b} {
		addr := e.Addr()
		m.addr.Store(&addr)
		if _, err := rm.Tokens(context.Background(), nil, openai.APICompletions, []byte(body), parse(t, openai.APICompletions, body)); err != nil {
			t.Fatal(err)
		}
	}
	if st := rm.status(); len(st.Engines) != 1 || st.Engines[0].Addr != b.Addr() || st.Engines[0].Completions != "render" {
		t.Fatalf("status %+v", st)
	}
}

func TestEngineAddr(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8001": "127.0.0.1:8001", "http://localhost:8001/v1": "localhost:8001",
		"http://[::1]:9": "[::1]:9", "http://engine": "engine:80",
	} {
		if got, ok := engineAddr(in); !ok || got != want {
			t.Errorf("engineAddr(%q) = %q, %v", in, got, ok)
		}
	}
	for _, in := range []string{"https://x:1", "/models/x", "hf:a/b", "remote", "http://"} {
		if got, ok := engineAddr(in); ok {
			t.Errorf("engineAddr(%q) = %q", in, got)
		}
	}
}

// benchChat is a chat request of about n words.
func benchChat(n int) string {
	var b strings.Builder
	b.WriteString(`{"model":"mock","messages":[{"role":"system","content":"`)
	for i := range n {
		b.WriteString("w")
		b.WriteString(strconv.Itoa(i % 997))
		b.WriteByte(' ')
	}
	b.WriteString(`"},{"role":"user","content":"go"}],"max_tokens":8}`)
	return b.String()
}

// BenchmarkRemoteRender is the round trip of a remote render of a chat
// request, to the mock engine on loopback (engine: the mock's own parsing
// and tokenizing included) and to a canned engine that answers a fixed
// body (canned: the router's side alone: request, HTTP, validation).
func BenchmarkRemoteRender(b *testing.B) {
	for _, words := range []int{1000, 4000} {
		body := benchChat(words)
		req := parse(b, openai.APIChatCompletions, body)
		b.Run("engine/"+strconv.Itoa(words)+"w", func(b *testing.B) {
			e := startMock(b, mocker.Config{})
			rm := NewRemote("mock", FixedEngine(e.Addr()), testRemoteConfig)
			benchRender(b, rm, body, req)
		})
		b.Run("canned/"+strconv.Itoa(words)+"w", func(b *testing.B) {
			ids, err := mocker.AppendChatTokens(nil, []mocker.ChatMessage{{Role: "system", Content: body}, {Role: "user", Content: "go"}})
			if err != nil {
				b.Fatal(err)
			}
			se := startScripted(b)
			se.set(map[string]scripted{pathRenderChat: {status: 200, body: []byte(`{"token_ids":` + idsJSON(ids[:words+4]) + `}`)}})
			rm := NewRemote("mock", FixedEngine(se.addr), testRemoteConfig)
			benchRender(b, rm, body, req)
		})
	}
}

func benchRender(b *testing.B, rm *Remote, body string, req *openai.ParsedRequest) {
	var dst []uint32
	var err error
	raw := []byte(body)
	b.ReportAllocs()
	for b.Loop() {
		if dst, err = rm.Tokens(context.Background(), dst[:0], openai.APIChatCompletions, raw, req); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(dst)), "tokens/op")
}

func idsJSON(ids []uint32) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(uint64(id), 10))
	}
	b.WriteByte(']')
	return b.String()
}

// TestRemoteBacksOffAStalledEngine: an engine that keeps timing out stops
// being asked for a while, so that requests route approximately at once
// instead of each waiting out the timeout; one that answers is asked
// again.
func TestRemoteBacksOffAStalledEngine(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // accept and never answer
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	rm := NewRemote("m", FixedEngine(ln.Addr().String()), RemoteConfig{Timeout: 50 * time.Millisecond,
		MaxResponseBytes: 1 << 20})
	defer rm.closeIdle()
	body := `{"prompt":"hello"}`
	r := parse(t, openai.APICompletions, body)
	var errs []error
	for range 4 {
		_, err := rm.Tokens(context.Background(), nil, openai.APICompletions, []byte(body), r)
		errs = append(errs, err)
	}
	if !errors.Is(errs[0], ErrTimeout) || !errors.Is(errs[1], ErrTimeout) {
		t.Fatalf("the first two calls: %v, %v; want timeouts", errs[0], errs[1])
	}
	if !errors.Is(errs[2], ErrBackoff) || !errors.Is(errs[3], ErrBackoff) {
		t.Fatalf("after two timeouts: %v, %v; want ErrBackoff", errs[2], errs[3])
	}
	if o := rm.outcomes.load(); o.Timeout != 2 || o.Backoff != 2 {
		t.Errorf("outcomes %+v", o)
	}
}

// TestRemoteEngineToken: an engine started with an API key answers the
// remote renderer only when it sends RemoteConfig.EngineToken.
func TestRemoteEngineToken(t *testing.T) {
	se := startScripted(t)
	se.set(map[string]scripted{pathRenderChat: {status: 200, body: []byte(`{"token_ids":[1,2,3]}`)}})
	key := "engine-key"
	se.key.Store(&key)
	chat := `{"messages":[{"role":"user","content":"x"}]}`
	for _, tc := range []struct {
		token string
		want  error
	}{{"", ErrRejected}, {"other-key", ErrRejected}, {key, nil}} {
		rm := NewRemote("m", FixedEngine(se.addr), RemoteConfig{Timeout: 10 * time.Second, MaxResponseBytes: 2048, EngineToken: tc.token})
		got, err := rm.Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(chat), parse(t, openai.APIChatCompletions, chat))
		if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("token %q: error %v, want %v", tc.token, err, tc.want)
		}
		if err == nil && !slices.Equal(got, []uint32{1, 2, 3}) {
			t.Errorf("token %q: ids %v", tc.token, got)
		}
	}
}

// TestRemoteBoundsCallsInFlight: a model's renderer holds at most its
// budget's worth of answers at once; past it a render is not asked for
// (outcome busy, routed approximately) rather than waited on, so a sick
// engine answering slowly with megabytes cannot take the router's memory.
func TestRemoteBoundsCallsInFlight(t *testing.T) {
	release := make(chan struct{})
	var arrived atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		arrived.Add(1)
		<-release
		ctx.SetBodyString(`{"token_ids":[1,2,3]}`)
	}}
	served := make(chan struct{})
	go func() { _ = srv.Serve(ln); close(served) }()
	defer func() { _ = srv.Shutdown(); <-served }()

	// 64 MiB answers: the 256 MiB budget holds 4, the floor is 8.
	rm := NewRemote("m", FixedEngine(ln.Addr().String()), RemoteConfig{Timeout: time.Minute, MaxResponseBytes: 64 << 20})
	limit := rm.maxInFlight()
	if limit != 8 {
		t.Fatalf("maxInFlight() = %d, want the floor of 8", limit)
	}
	chat := `{"messages":[{"role":"user","content":"x"}]}`
	errs := make(chan error, limit)
	for range limit {
		r := parse(t, openai.APIChatCompletions, chat) // on the test's goroutine: it may fail the test
		go func() {
			_, err := rm.Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(chat), r)
			errs <- err
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for arrived.Load() < limit {
		if time.Now().After(deadline) {
			close(release)
			t.Fatalf("only %d of %d renders reached the engine", arrived.Load(), limit)
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := rm.Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(chat), parse(t, openai.APIChatCompletions, chat)); !errors.Is(err, ErrBusy) {
		t.Errorf("a render past the budget: %v, want ErrBusy", err)
	}
	close(release)
	for range limit {
		if err := <-errs; err != nil {
			t.Errorf("a render within the budget: %v", err)
		}
	}
	if o := rm.outcomes.load(); o.Busy != 1 || o.OK != uint64(limit) {
		t.Errorf("outcomes %+v, want %d ok and 1 busy", o, limit)
	}
	if _, err := rm.Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(chat), parse(t, openai.APIChatCompletions, chat)); err != nil {
		t.Errorf("after the calls ended: %v", err)
	}
}
