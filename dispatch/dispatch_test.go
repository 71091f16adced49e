package dispatch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfast/kvfast/internal/testnet"
	"github.com/kvfast/kvfast/workers"
	"github.com/valyala/fasthttp"
)

const completionBody = `{"model":"m","prompt":[1,2,3],"stream":true}`

func TestForwardStreamByteExact(t *testing.T) {
	events := append([]string{": warming up\n\n"}, vllmStream(20)...)
	events = append(events[:3], append([]string{
		"data: {\"choices\":[{\"text\":\"" + strings.Repeat("é", 20000) + "\"}]}\n\n", // larger than the relay buffer
		"data: {\"choices\":[{\"text\":\"crlf\"}]}\r\n\r\n",
	}, events[3:]...)...)
	want := strings.Join(events, "")
	var gotBody []byte
	engine := serve(t, func(ctx *fasthttp.RequestCtx) {
		gotBody = bytes.Clone(ctx.PostBody())
		if string(ctx.Path()) != "/v1/completions" || string(ctx.Method()) != "POST" {
			ctx.SetStatusCode(404)
			return
		}
		sseEngine(events, time.Millisecond, nil)(ctx)
	}, nil)
	pool := NewPool(Config{Health: noHealth})
	defer pool.Close()
	mustAdd(t, pool, 3, engine)
	rec := newRecorder()
	addr := serve(t, front(pool, 3, func() Observer { return rec }), nil)

	status, h, body := post(t, addr, "/v1/completions", completionBody)
	if status != 200 || string(body) != want {
		t.Fatalf("status %d, body differs: got %d bytes, want %d", status, len(body), len(want))
	}
	if string(gotBody) != completionBody {
		t.Fatalf("the engine got %q", gotBody)
	}
	if string(h.ContentType()) != "text/event-stream" || string(h.Peek("X-Engine")) != "stand-in" {
		t.Fatalf("headers not relayed: %s", h.String())
	}
	rec.wait(t)
	// The oversized event passes uninspected; the crlf one counts.
	if got := rec.summary(); got != "dispatched first item×21 complete:stop" {
		t.Fatalf("observer saw %q", got)
	}
}

func TestForwardNonStreaming(t *testing.T) {
	okBody := `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":"length"}],"usage":{"completion_tokens":5}}`
	errBody := `{"object":"error","message":"prompt too long","type":"BadRequestError","param":null,"code":400}`
	engine := serve(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		if bytes.Contains(ctx.PostBody(), []byte("bad")) {
			ctx.SetStatusCode(400)
			ctx.SetBodyString(errBody)
			return
		}
		ctx.SetBodyString(okBody)
	}, nil)
	pool := NewPool(Config{Health: noHealth})
	defer pool.Close()
	mustAdd(t, pool, 0, engine)
	for _, tc := range []struct {
		req, want string
		status    int
		log       string
	}{
		{`{"prompt":"x"}`, okBody, 200, "dispatched complete:length"},
		{`{"prompt":"bad"}`, errBody, 400, "dispatched abort"},
	} {
		rec := newRecorder()
		addr := serve(t, front(pool, 0, func() Observer { return rec }), nil)
		status, h, body := post(t, addr, "/v1/completions", tc.req)
		if status != tc.status || string(body) != tc.want || string(h.ContentType()) != "application/json" {
			t.Fatalf("got %d %q %q", status, h.ContentType(), body)
		}
		rec.wait(t)
		if got := rec.summary(); got != tc.log {
			t.Fatalf("observer saw %q, want %q", got, tc.log)
		}
	}
}

func TestClientDisconnectCancelsUpstream(t *testing.T) {
	events := vllmStream(2000)
	cancelled := make(chan struct{}, 1)
	engine := serve(t, sseEngine(events, 2*time.Millisecond, cancelled), nil)
	pool := NewPool(Config{Health: noHealth})
	defer pool.Close()
	mustAdd(t, pool, 1, engine)
	rec := newRecorder()
	addr := serve(t, front(pool, 1, func() Observer { return rec }), nil)

	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = conn.Write([]byte("POST /v1/completions HTTP/1.1\r\nHost: kvfast\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(completionBody)) + "\r\n\r\n" + completionBody))
	br := bufio.NewReader(conn)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the stream: %v", err)
		}
		if strings.HasPrefix(line, "data: ") {
			break
		}
	}
	_ = conn.Close()

	rec.wait(t)
	if !errors.Is(rec.aborted(), ErrClientGone) {
		t.Fatalf("observer: %s, %v", rec.summary(), rec.aborted())
	}
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the engine kept streaming to nobody")
	}
}

func TestEngineKilledMidStream(t *testing.T) {
	first := chunk(0, "a", "") + chunk(1, "b", "")
	engine := serve(t, func(ctx *fasthttp.RequestCtx) {
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(c net.Conn) {
			// A chunked stream cut short: the engine process died.
			_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
			for _, ev := range []string{chunk(0, "a", ""), chunk(1, "b", "")} {
				_, _ = c.Write([]byte(strconv.FormatInt(int64(len(ev)), 16) + "\r\n" + ev + "\r\n"))
			}
			time.Sleep(20 * time.Millisecond)
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // reset, as a killed process's socket does
			}
			_ = c.Close()
		})
	}, nil)
	pool := NewPool(Config{Health: noHealth})
	defer pool.Close()
	mustAdd(t, pool, 2, engine)
	rec := newRecorder()
	addr := serve(t, front(pool, 2, func() Observer { return rec }), nil)

	status, _, body := post(t, addr, "/v1/completions", completionBody)
	if status != 200 || !strings.HasPrefix(string(body), first) {
		t.Fatalf("status %d body %q", status, body)
	}
	tail, ok := strings.CutSuffix(strings.TrimPrefix(string(body), first), "data: [DONE]\n\n")
	if !ok {
		t.Fatalf("the client's stream does not end with [DONE]: %q", body)
	}
	var ev struct {
		Error struct {
			Message, Type, Code string
		}
	}
	if !strings.HasPrefix(tail, "data: ") || !strings.HasSuffix(tail, "\n\n") ||
		json.Unmarshal([]byte(strings.TrimSpace(tail[len("data: "):])), &ev) != nil || ev.Error.Code != "engine_failed" {
		t.Fatalf("the client did not get an error event: %q", tail)
	}
	rec.wait(t)
	if got := rec.summary(); got != "dispatched first item×2 abort" || !errors.Is(rec.aborted(), ErrEngineFailed) {
		t.Fatalf("observer: %s %v", got, rec.aborted())
	}
}

func TestConnectFailureIsRetryable(t *testing.T) {
	good := serve(t, sseEngine(vllmStream(2), 0, nil), nil)
	flips := make(chan string, 4)
	pool := NewPool(Config{Health: HealthConfig{Interval: time.Hour,
		OnChange: func(slot workers.Slot, _ string, h bool, cause error) {
			if !h && (cause == nil || !strings.Contains(cause.Error(), "connection refused")) {
				t.Errorf("slot %d turned unroutable for %v, want the refused connection", slot, cause)
			}
			flips <- fmt.Sprint(slot, h)
		}}})
	defer pool.Close()
	mustAdd(t, pool, 5, testnet.RefusingAddr(t))
	mustAdd(t, pool, 6, good)

	c := pool.AcquireCall()
	defer c.Release()
	c.SetRequest([]byte("/v1/completions"), []byte(completionBody))
	rec := newRecorder()
	err := c.Do(5, rec)
	if !errors.Is(err, ErrConnect) || !IsRetryable(err) || ErrorStatus(err) != 502 {
		t.Fatalf("Do = %v", err)
	}
	var de *Error
	if !errors.As(err, &de) || de.Slot != 5 || !strings.HasPrefix(err.Error(), "cannot forward to engine ") {
		t.Fatalf("error lacks context: %v", err)
	}
	rec.wait(t)
	if rec.summary() != "abort" || !errors.Is(rec.aborted(), ErrConnect) {
		t.Fatalf("observer: %s", rec.summary())
	}
	// A refused connection takes the engine out of selection at once,
	// before Do returns.
	if got := drain(flips); got != "[5 false]" {
		t.Fatalf("health flips %s after a refused connection, want [5 false]", got)
	}
	// The same call retries on another worker.
	rec2 := newRecorder()
	if err := c.Do(6, rec2); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := c.Relay(bufio.NewWriter(&out)); err != nil || out.String() != strings.Join(vllmStream(2), "") {
		t.Fatalf("retry: %v %q", err, out.String())
	}
	if rec2.summary() != "dispatched first item×2 complete:stop" {
		t.Fatalf("retry observer: %s", rec2.summary())
	}
}

func TestUnknownEngine(t *testing.T) {
	pool := NewPool(Config{Health: noHealth})
	defer pool.Close()
	c := pool.AcquireCall()
	defer c.Release()
	rec := newRecorder()
	err := c.Do(9, rec)
	if !errors.Is(err, ErrUnknownEngine) || IsRetryable(err) || ErrorStatus(err) != 503 {
		t.Fatalf("Do = %v", err)
	}
	rec.wait(t)
}

func TestTimeouts(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	engine := serve(t, func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/slow-first-byte":
			select {
			case <-release:
			case <-time.After(5 * time.Second):
			}
		case "/stall":
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				_, _ = w.WriteString(chunk(0, "a", ""))
				_ = w.Flush()
				select {
				case <-release:
				case <-time.After(5 * time.Second):
				}
			})
		}
	}, nil)
	pool := NewPool(Config{Health: noHealth, Timeouts: Timeouts{FirstByte: 150 * time.Millisecond, Idle: 150 * time.Millisecond}})
	defer pool.Close()
	mustAdd(t, pool, 0, engine)

	t.Run("first byte", func(t *testing.T) {
		c := pool.AcquireCall()
		defer c.Release()
		c.SetRequest([]byte("/slow-first-byte"), []byte(completionBody))
		rec := newRecorder()
		start := time.Now()
		err := c.Do(0, rec)
		if !errors.Is(err, ErrFirstByteTimeout) || IsRetryable(err) || ErrorStatus(err) != 504 {
			t.Fatalf("Do = %v", err)
		}
		if d := time.Since(start); d < 150*time.Millisecond || d > 3*time.Second {
			t.Fatalf("timed out after %v", d)
		}
		rec.wait(t)
	})
	t.Run("write", func(t *testing.T) {
		// An engine that accepts connections and never reads them: a
		// request larger than the sockets buffer cannot be written.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var held []net.Conn
		accepted := make(chan struct{})
		go func() {
			defer close(accepted)
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				held = append(held, c)
			}
		}()
		defer func() {
			_ = ln.Close()
			<-accepted
			for _, c := range held {
				_ = c.Close()
			}
		}()
		p := NewPool(Config{Health: noHealth, Timeouts: Timeouts{Write: 150 * time.Millisecond}})
		defer p.Close()
		mustAdd(t, p, 0, ln.Addr().String())
		c := p.AcquireCall()
		defer c.Release()
		c.SetRequest([]byte("/v1/completions"), bytes.Repeat([]byte("x"), 32<<20))
		if err := c.Do(0, nil); !errors.Is(err, ErrWriteTimeout) || IsRetryable(err) || ErrorStatus(err) != 504 {
			t.Fatalf("Do = %v, want ErrWriteTimeout", err)
		}
	})
	t.Run("idle", func(t *testing.T) {
		rec := newRecorder()
		addr := serve(t, front(pool, 0, func() Observer { return rec }), nil)
		start := time.Now()
		status, _, body := post(t, addr, "/stall", completionBody)
		if status != 200 || !strings.HasPrefix(string(body), chunk(0, "a", "")) ||
			!strings.HasSuffix(string(body), string(sseErrors[kindOf(ErrIdleTimeout)])) {
			t.Fatalf("status %d body %q", status, body)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("idle timeout took %v", d)
		}
		rec.wait(t)
		if rec.summary() != "dispatched first item×1 abort" || !errors.Is(rec.aborted(), ErrIdleTimeout) {
			t.Fatalf("observer: %s %v", rec.summary(), rec.aborted())
		}
	})
	t.Run("slow but steady stream is fine", func(t *testing.T) {
		// The stream (12 events, 1.2s) outlasts the idle timeout, and no
		// gap comes near it: a tenth of it, so that a loaded machine's
		// scheduling delays do not stretch a gap past it.
		const idle, gap = time.Second, 100 * time.Millisecond
		pool := NewPool(Config{Health: noHealth, Timeouts: Timeouts{FirstByte: idle, Idle: idle}})
		defer pool.Close()
		events := vllmStream(10)
		slow := serve(t, sseEngine(events, gap, nil), nil)
		mustAdd(t, pool, 1, slow)
		rec := newRecorder()
		addr := serve(t, front(pool, 1, func() Observer { return rec }), nil)
		status, _, body := post(t, addr, "/v1/completions", completionBody)
		if status != 200 || string(body) != strings.Join(events, "") {
			t.Fatalf("status %d body %q", status, body)
		}
		rec.wait(t)
	})
}

func TestStaleKeepAliveConnectionIsRetried(t *testing.T) {
	// The engine drops idle connections after 50ms, the router keeps them
	// for 10s: the second request lands on a connection the engine closed.
	engine := serve(t, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(`{"choices":[]}`) },
		func(s *fasthttp.Server) { s.IdleTimeout = 50 * time.Millisecond })
	pool := NewPool(Config{Health: noHealth, MaxIdleConnDuration: 10 * time.Second})
	defer pool.Close()
	mustAdd(t, pool, 0, engine)
	for i := 0; i < 3; i++ {
		c := pool.AcquireCall()
		c.SetRequest([]byte("/v1/completions"), []byte(`{}`))
		if err := c.Do(0, nil); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if _, err := c.ReadBody(); err != nil {
			t.Fatal(err)
		}
		c.Release()
		time.Sleep(150 * time.Millisecond)
	}
}

func TestReleaseBeforeRelayCancelsUpstream(t *testing.T) {
	cancelled := make(chan struct{}, 1)
	engine := serve(t, sseEngine(vllmStream(5000), time.Millisecond, cancelled), nil)
	pool := NewPool(Config{Health: noHealth})
	defer pool.Close()
	mustAdd(t, pool, 0, engine)
	c := pool.AcquireCall()
	c.SetRequest([]byte("/v1/completions"), []byte(completionBody))
	rec := newRecorder()
	if err := c.Do(0, rec); err != nil {
		t.Fatal(err)
	}
	c.Release()
	rec.wait(t)
	if !errors.Is(rec.aborted(), ErrAbandoned) {
		t.Fatalf("observer: %s %v", rec.summary(), rec.aborted())
	}
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the engine was not cancelled")
	}
}

func TestHealthChecks(t *testing.T) {
	var status atomic.Int32
	status.Store(200)
	var checks atomic.Int32
	engine := serve(t, func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/healthz" {
			checks.Add(1)
			ctx.SetStatusCode(int(status.Load()))
		}
	}, nil)
	flips := make(chan bool, 16)
	pool := NewPool(Config{Health: HealthConfig{
		Path: "/healthz", Interval: 10 * time.Millisecond, Timeout: time.Second, FailAfter: 2, RecoverAfter: 2,
		OnChange: func(slot workers.Slot, addr string, healthy bool, _ error) {
			if slot != 7 || addr != engine {
				t.Errorf("OnChange(%d, %s)", slot, addr)
			}
			flips <- healthy
		},
	}})
	defer pool.Close()
	mustAdd(t, pool, 7, engine)
	expect := func(want bool) {
		t.Helper()
		select {
		case got := <-flips:
			if got != want {
				t.Fatalf("flip to %v, want %v", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no flip to %v after %d checks", want, checks.Load())
		}
	}
	// A new engine starts healthy: the first flip is to unhealthy.
	status.Store(503)
	expect(false)
	status.Store(200)
	expect(true)
	status.Store(500)
	expect(false)
	status.Store(204)
	expect(true)

	pool.Remove(7)
	if pool.Engine(7) != nil {
		t.Fatal("Remove left the engine selectable")
	}
	n := checks.Load()
	time.Sleep(50 * time.Millisecond)
	if checks.Load() > n+1 {
		t.Fatal("checks continue after Remove")
	}
}

// TestHealthChecksReachIPv6Engines: an engine at an IPv6 address is
// checked, as it is forwarded to (the checks dialled IPv4 only, so such
// an engine failed every one and never took a request).
func TestHealthChecksReachIPv6Engines(t *testing.T) {
	if ln, err := net.Listen("tcp", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	} else {
		ln.Close()
	}
	var checks atomic.Int32
	engine := serveAt(t, "[::1]:0", func(ctx *fasthttp.RequestCtx) { checks.Add(1) }, nil)
	flips := make(chan bool, 16)
	pool := NewPool(Config{Health: HealthConfig{Interval: 10 * time.Millisecond, Timeout: time.Second, FailAfter: 1,
		OnChange: func(_ workers.Slot, _ string, healthy bool, _ error) { flips <- healthy }}})
	defer pool.Close()
	mustAdd(t, pool, 3, engine)
	deadline := time.After(10 * time.Second)
	for checks.Load() < 3 {
		select {
		case h := <-flips:
			t.Fatalf("the engine at %s flipped to healthy=%v after %d checks", engine, h, checks.Load())
		case <-deadline:
			t.Fatalf("%d checks reached the engine at %s in 10 s", checks.Load(), engine)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func TestHealthCheckOfDeadEngine(t *testing.T) {
	type flip struct {
		healthy bool
		cause   error
	}
	flips := make(chan flip, 4)
	pool := NewPool(Config{Health: HealthConfig{Interval: 10 * time.Millisecond, Timeout: 200 * time.Millisecond,
		OnChange: func(_ workers.Slot, _ string, h bool, cause error) { flips <- flip{h, cause} }}})
	defer pool.Close()
	mustAdd(t, pool, 0, testnet.RefusingAddr(t))
	select {
	case f := <-flips:
		if f.healthy {
			t.Fatal("a dead engine stays healthy")
		}
		// The operator's question: why.
		if f.cause == nil || !strings.Contains(f.cause.Error(), "connection refused") {
			t.Fatalf("a dead engine turned unhealthy for %v, want the refused connection", f.cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a dead engine was never marked unhealthy")
	}
}

func TestPoolAdd(t *testing.T) {
	pool := NewPool(Config{Health: noHealth})
	defer pool.Close()
	if _, err := pool.Add(workers.Max, "127.0.0.1:1"); err == nil {
		t.Fatal("slot out of range accepted")
	}
	if _, err := pool.Add(0, "no-port"); err == nil {
		t.Fatal("address without a port accepted")
	}
	a, _ := pool.Add(0, "127.0.0.1:1")
	b, _ := pool.Add(0, "127.0.0.1:1")
	if a != b {
		t.Fatal("re-adding the same address replaced the engine")
	}
	c, _ := pool.Add(0, "127.0.0.1:2")
	if c == a || pool.Engine(0) != c || c.addr != "127.0.0.1:2" || c.slot != 0 {
		t.Fatal("a new address did not replace the engine")
	}
	pool.Close()
	if _, err := pool.Add(1, "127.0.0.1:1"); err == nil || pool.Engine(1) != nil || pool.Engine(0) != nil {
		t.Fatal("a closed pool accepts or keeps engines")
	}
}

func TestAppendErrorJSON(t *testing.T) {
	for _, k := range kinds {
		var v struct {
			Error struct {
				Message, Type, Code string
				Param               *string
			}
		}
		err := &Error{Addr: "127.0.0.1:1", Op: "forward to", Kind: k.kind, Cause: io.EOF}
		if jerr := json.Unmarshal(AppendErrorJSON(nil, err), &v); jerr != nil {
			t.Fatal(jerr)
		}
		if v.Error.Code != k.code || v.Error.Type != "server_error" || v.Error.Message == "" || v.Error.Param != nil ||
			strings.Contains(v.Error.Message, "127.0.0.1") {
			t.Fatalf("%+v", v)
		}
		if !strings.HasPrefix(k.kind.Error(), "kvfast: ") {
			t.Fatalf("sentinel %q", k.kind)
		}
	}
	if kinds[kindOf(errors.New("other"))].kind != ErrEngineFailed {
		t.Fatal("unclassified errors are not engine failures")
	}
}

func TestBusyEngineIsRetryableButHealthy(t *testing.T) {
	release := make(chan struct{})
	engine := serve(t, func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/health" {
			return
		}
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			_, _ = w.WriteString(chunk(0, "a", ""))
			_ = w.Flush()
			<-release
		})
	}, nil)
	flips := make(chan string, 4)
	pool := NewPool(Config{MaxConnsPerEngine: 1, Health: HealthConfig{Interval: time.Hour,
		OnChange: func(slot workers.Slot, _ string, h bool, _ error) { flips <- fmt.Sprint(slot, h) }}})
	defer pool.Close()
	mustAdd(t, pool, 0, engine)
	first := pool.AcquireCall()
	first.SetRequest([]byte("/v1/completions"), []byte(completionBody))
	if err := first.Do(0, nil); err != nil {
		t.Fatal(err)
	}
	second := pool.AcquireCall()
	second.SetRequest([]byte("/v1/completions"), []byte(completionBody))
	err := second.Do(0, nil)
	if !IsRetryable(err) || !errors.Is(err, fasthttp.ErrNoFreeConns) {
		t.Fatalf("Do on a busy engine = %v", err)
	}
	// Not "cannot connect to the engine" (a 502 that sent operators
	// looking for a network fault): the router's own bound, a 503 that
	// names it.
	if !errors.Is(err, ErrConnsExhausted) || errors.Is(err, ErrConnect) || ErrorStatus(err) != 503 ||
		!bytes.Contains(AppendErrorJSON(nil, err), []byte(`"engine_connections_exhausted"`)) {
		t.Fatalf("Do on a busy engine = %v, status %d, body %s", err, ErrorStatus(err), AppendErrorJSON(nil, err))
	}
	if got := drain(flips); got != "[]" {
		t.Fatalf("a busy engine flipped health: %s", got)
	}
	second.Release()
	first.Release() // closes the stalled stream's connection
	close(release)
	// The connection the first call held is given back: with one allowed,
	// a third request gets through.
	third := pool.AcquireCall()
	defer third.Release()
	third.SetRequest([]byte("/v1/completions"), []byte(completionBody))
	if err := third.Do(0, nil); err != nil {
		t.Fatalf("Do after the busy connection was released = %v", err)
	}
}

// drain returns what ch holds now, without waiting.
func drain(ch chan string) string {
	var got []string
	for {
		select {
		case s := <-ch:
			got = append(got, s)
		default:
			return fmt.Sprint(got)
		}
	}
}

// TestResponseLimits: a plain response whose Content-Length is over
// MaxResponseBodySize is refused unread; one without a length is cut at
// the limit; and the bytes responses hold at once over all calls stay
// within ResponseBudgetBytes, a response that does not fit being refused
// as the router's overload, not the engine's fault, until Release gives
// the budget back.
func TestResponseLimits(t *testing.T) {
	const relay, limit = 1 << 10, 64 << 10
	big := bytes.Repeat([]byte("x"), 48<<10)
	engine := serve(t, func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/declared":
			ctx.SetBody(make([]byte, limit+1))
		case "/chunked":
			ctx.SetBodyStream(bytes.NewReader(make([]byte, limit+1)), -1)
		default:
			ctx.SetBody(big)
		}
	}, nil)
	pool := NewPool(Config{Health: noHealth, RelayBufferSize: relay, MaxResponseBodySize: limit, ResponseBudgetBytes: limit})
	defer pool.Close()
	mustAdd(t, pool, 0, engine)
	read := func(path string) (*Call, error) {
		c := pool.AcquireCall()
		c.SetRequest([]byte(path), []byte(`{}`))
		if err := c.Do(0, nil); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		_, err := c.ReadBody()
		return c, err
	}
	for _, path := range []string{"/declared", "/chunked"} {
		c, err := read(path)
		if !errors.Is(err, ErrResponseTooLarge) {
			t.Errorf("%s: %v, want ErrResponseTooLarge", path, err)
		}
		c.Release()
	}
	if held := pool.ResponseBytes(); held != 0 {
		t.Fatalf("%d budget bytes held after release", held)
	}
	first, err := read("/big")
	if err != nil {
		t.Fatal(err)
	}
	if held := pool.ResponseBytes(); held <= 0 || held > limit {
		t.Fatalf("one response holds %d budget bytes", held)
	}
	second, err := read("/big")
	if !errors.Is(err, ErrResponseBudget) || ErrorStatus(err) != 503 || IsEngineFault(ErrResponseBudget) {
		t.Fatalf("a second response past the budget: %v (status %d)", err, ErrorStatus(err))
	}
	second.Release()
	first.Release()
	if held := pool.ResponseBytes(); held != 0 {
		t.Fatalf("%d budget bytes held after release", held)
	}
	third, err := read("/big")
	if err != nil {
		t.Fatalf("after release the budget is free again: %v", err)
	}
	third.Release()
}

// TestDeclaredLengthIsChargedOnce: a body whose length the engine
// declares is read into one buffer of that size, charged once; growing by
// doubling would charge (and allocate) the outgrown sizes too, which a
// budget just above the body refuses.
func TestDeclaredLengthIsChargedOnce(t *testing.T) {
	const relay, size = 1 << 10, 100 << 10
	engine := serve(t, func(ctx *fasthttp.RequestCtx) { ctx.SetBody(make([]byte, size)) }, nil)
	// Doubling from the relay buffer would charge 1+2+…+64 KiB and then
	// 128 KiB: 255 KiB in all.
	pool := NewPool(Config{Health: noHealth, RelayBufferSize: relay, MaxResponseBodySize: 1 << 20, ResponseBudgetBytes: size + 1})
	defer pool.Close()
	mustAdd(t, pool, 0, engine)
	c := pool.AcquireCall()
	defer c.Release()
	c.SetRequest([]byte("/v1/completions"), []byte(`{}`))
	if err := c.Do(0, nil); err != nil {
		t.Fatal(err)
	}
	body, err := c.ReadBody()
	if err != nil || len(body) != size {
		t.Fatalf("ReadBody: %d bytes, %v", len(body), err)
	}
	if held := pool.ResponseBytes(); held > size+1 {
		t.Errorf("a %d-byte body holds %d budget bytes", size, held)
	}
}

// TestEngineToken: with Config.EngineToken every request to an engine,
// forwarded or a health check, carries the router's bearer token in
// place of the client's; without one, the client's goes through.
func TestEngineToken(t *testing.T) {
	seen := make(chan string, 16)
	engine := serve(t, func(ctx *fasthttp.RequestCtx) {
		seen <- string(ctx.Path()) + " " + string(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization))
		ctx.SetBodyString(`{"choices":[]}`)
	}, nil)
	forward := func(p *Pool) {
		t.Helper()
		c := p.AcquireCall()
		defer c.Release()
		c.SetRequest([]byte("/v1/completions"), []byte(`{"prompt":[1]}`))
		c.Request().Header.Set(fasthttp.HeaderAuthorization, "Bearer client-key")
		if err := c.Do(1, nil); err != nil {
			t.Fatalf("Do: %v", err)
		}
		if _, err := c.ReadBody(); err != nil {
			t.Fatalf("ReadBody: %v", err)
		}
	}

	p := NewPool(Config{EngineToken: "engine-key", Health: HealthConfig{Interval: time.Hour}})
	mustAdd(t, p, 1, engine)
	forward(p)
	got := map[string]bool{<-seen: true, <-seen: true} // the first health check and the request, in either order
	p.Close()
	for _, want := range []string{"/health Bearer engine-key", "/v1/completions Bearer engine-key"} {
		if !got[want] {
			t.Errorf("the engine saw %v; want %q among them", got, want)
		}
	}

	p = NewPool(Config{Health: HealthConfig{Interval: -1}})
	defer p.Close()
	mustAdd(t, p, 1, engine)
	forward(p)
	if s := <-seen; s != "/v1/completions Bearer client-key" {
		t.Errorf("without an engine token the engine saw %q; want the client's key", s)
	}
}
