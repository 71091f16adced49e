package dispatch

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// Engines that break HTTP's rules, and what the router must not do with
// what they send.

// rawEngine accepts connections on a loopback port and runs serveConn on
// each, on its own goroutine, until the test ends.
func rawEngine(t *testing.T, serveConn func(conn net.Conn, br *bufio.Reader)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { serveConn(c, bufio.NewReader(c)) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// answer writes a complete JSON response whose text names the request's
// body, so that a client can tell whose answer it got.
func answer(w io.Writer, body string) {
	payload := fmt.Sprintf(`{"choices":[{"text":"answer to %s","finish_reason":"stop"}]}`, body)
	fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(payload), payload)
}

// readRequest reads one request and returns its body.
func readRequest(br *bufio.Reader) (string, bool) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return "", false
	}
	b, _ := io.ReadAll(req.Body)
	return string(b), true
}

func roundTripBody(t *testing.T, pool *Pool, body string) (string, error) {
	t.Helper()
	c := pool.AcquireCall()
	defer c.Release()
	c.SetRequest([]byte("/v1/completions"), []byte(body))
	if err := c.Do(0, nil); err != nil {
		return "", err
	}
	got, err := c.ReadBody()
	return string(got), err
}

// TestUnsolicitedBytesAreNotAnAnswer: an engine that sends more than its
// response's framing says (a second response, or a Content-Length shorter
// than its body), with the response or while the connection sits in the
// pool, must not have those bytes read as the next request's answer:
// every client gets the answer to its own request.
func TestUnsolicitedBytesAreNotAnAnswer(t *testing.T) {
	// Larger than a connection's read buffer, so that what the first
	// response's reader took in does not hold it all.
	extra := func(w io.Writer) { answer(w, "nobody"+strings.Repeat(".", 16<<10)) }
	for _, tc := range []struct {
		name  string
		later bool // the extra bytes come once the router is done with the response
	}{{"with the response", false}, {"while idle", true}} {
		t.Run(tc.name, func(t *testing.T) {
			inject, injected := make(chan struct{}), make(chan struct{})
			var answered atomic.Bool
			engine := rawEngine(t, func(conn net.Conn, br *bufio.Reader) {
				for {
					body, ok := readRequest(br)
					if !ok {
						return
					}
					first := answered.CompareAndSwap(false, true) // the test's first request, on any connection
					var out strings.Builder
					answer(&out, body)
					if first && !tc.later {
						extra(&out)
					}
					if _, err := io.WriteString(conn, out.String()); err != nil {
						return
					}
					if first && tc.later {
						<-inject
						extra(conn)
						close(injected)
					}
				}
			})
			var injectOnce sync.Once
			t.Cleanup(func() { injectOnce.Do(func() { close(inject) }) }) // before the engine's: it may wait on inject
			pool := NewPool(Config{Health: noHealth, MaxIdleConnDuration: time.Minute})
			defer pool.Close()
			mustAdd(t, pool, 0, engine)
			for i, who := range []string{"alice", "bob", "carol"} {
				got, err := roundTripBody(t, pool, who)
				if err != nil {
					t.Fatalf("%s: %v", who, err)
				}
				if want := "answer to " + who; !strings.Contains(got, want) {
					t.Fatalf("%s got %.60q..., want %q", who, got, want)
				}
				if i == 0 && tc.later {
					injectOnce.Do(func() { close(inject) }) // alice's connection is back in the pool
					<-injected
					// Written is not yet received: wait until the bytes
					// are there to be seen, as they would be after any
					// pause an idle connection takes.
					waitUntil(t, "the unsolicited bytes to arrive", pool.Engine(0).HasUnsolicited)
				}
			}
		})
	}
}

// TestUnrelayableResponsesAreEngineFailures: a final status that is not
// 2xx, 4xx or 5xx, or a Content-Encoding nobody asked for, is not passed
// to the client as the engine's answer: the call fails, may go to
// another worker, and counts against the engine.
func TestUnrelayableResponsesAreEngineFailures(t *testing.T) {
	for _, head := range []string{
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
		"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:1/elsewhere\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 600 Nonsense\r\nContent-Length: 2\r\n\r\n{}",
		"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\n\x1f\x8b\x08\x00",
	} {
		status := head[9:12]
		t.Run(status, func(t *testing.T) {
			engine := rawEngine(t, func(conn net.Conn, br *bufio.Reader) {
				for {
					if _, ok := readRequest(br); !ok {
						return
					}
					if _, err := io.WriteString(conn, head); err != nil {
						return
					}
				}
			})
			pool := NewPool(Config{Health: noHealth})
			defer pool.Close()
			mustAdd(t, pool, 0, engine)
			_, err := roundTripBody(t, pool, "x")
			if !errors.Is(err, ErrEngineFailed) || !IsRetryable(err) || ErrorStatus(err) != fasthttp.StatusBadGateway {
				t.Fatalf("Do = %v (status %d), want a retryable engine failure, 502", err, ErrorStatus(err))
			}
			if got := pool.Engine(0).Failures(); got != 1 {
				t.Errorf("passive health counted %d failures, want 1", got)
			}
		})
	}
}

// TestFirstByteTimeoutCoversHeaders: the first-byte timeout bounds the
// wait for the response's whole header, not for its first byte: an engine
// that dribbles its headers cannot hold a request past it.
func TestFirstByteTimeoutCoversHeaders(t *testing.T) {
	var stopped atomic.Bool
	engine := rawEngine(t, func(conn net.Conn, br *bufio.Reader) {
		if _, ok := readRequest(br); !ok {
			return
		}
		if _, err := io.WriteString(conn, "HTTP/1.1 200 OK\r\nX-Slow: "); err != nil {
			return
		}
		for range 100 { // 10 s of one byte every 100 ms, then the rest
			time.Sleep(100 * time.Millisecond)
			if _, err := io.WriteString(conn, "a"); err != nil {
				stopped.Store(true)
				return
			}
		}
		answer(conn, "late")
	})
	pool := NewPool(Config{Health: noHealth, Timeouts: Timeouts{FirstByte: 300 * time.Millisecond}})
	defer pool.Close()
	mustAdd(t, pool, 0, engine)
	_, err := roundTripBody(t, pool, "x")
	if !errors.Is(err, ErrFirstByteTimeout) {
		t.Fatalf("Do = %v, want the first-byte timeout", err)
	}
}

// TestReadBodyWithinCutsADribbledAnswer: an answer whose headers came at
// once and whose body comes a byte at a time (each byte resetting the idle
// timeout) is cut at ReadBodyWithin's deadline, as the engine's fault.
func TestReadBodyWithinCutsADribbledAnswer(t *testing.T) {
	engine := rawEngine(t, func(conn net.Conn, br *bufio.Reader) {
		if _, ok := readRequest(br); !ok {
			return
		}
		if _, err := io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"); err != nil {
			return
		}
		for { // a byte every 20 ms, until the router cuts it
			time.Sleep(20 * time.Millisecond)
			if _, err := io.WriteString(conn, " "); err != nil {
				return
			}
		}
	})
	pool, c := answeredCall(t, Config{Health: noHealth}, engine)
	if _, err := c.ReadBodyWithin(200 * time.Millisecond); !errors.Is(err, ErrIdleTimeout) {
		t.Fatalf("ReadBodyWithin = %v, want the idle timeout", err)
	}
	if got := pool.Engine(0).Failures(); got != 1 {
		t.Errorf("passive health counted %d failures, want 1", got)
	}
}

// answeredCall sends a request to engine, as slot 0 of a pool of cfg,
// and returns the pool and the call once the answer's headers are read;
// both go when the test ends.
func answeredCall(t *testing.T, cfg Config, engine string) (*Pool, *Call) {
	t.Helper()
	pool := NewPool(cfg)
	t.Cleanup(func() { pool.Close() })
	mustAdd(t, pool, 0, engine)
	c := pool.AcquireCall()
	t.Cleanup(c.Release) // before the pool's Close: cleanups run last-in first-out
	c.SetRequest([]byte("/v1/completions"), []byte("x"))
	if err := c.Do(0, nil); err != nil {
		t.Fatal(err)
	}
	return pool, c
}

// TestDoWithinGivesUpOnASilentEngine: an engine that takes the request and
// never answers is cut at DoWithin's bound, well inside the first-byte
// timeout, as a first-byte timeout and the engine's fault.
func TestDoWithinGivesUpOnASilentEngine(t *testing.T) {
	engine := rawEngine(t, func(conn net.Conn, br *bufio.Reader) {
		if _, ok := readRequest(br); !ok {
			return
		}
		_, _ = io.Copy(io.Discard, conn) // never answers
	})
	pool := NewPool(Config{Health: noHealth, Timeouts: Timeouts{FirstByte: time.Hour}})
	defer pool.Close()
	mustAdd(t, pool, 0, engine)
	c := pool.AcquireCall()
	defer c.Release()
	c.SetRequest([]byte("/v1/completions"), []byte("x"))
	if err := c.DoWithin(0, nil, 200*time.Millisecond); !errors.Is(err, ErrFirstByteTimeout) {
		t.Fatalf("DoWithin = %v, want the first-byte timeout", err)
	}
	if got := pool.Engine(0).Failures(); got != 1 {
		t.Errorf("passive health counted %d failures, want 1", got)
	}
}

// chatteringEngine streams events and then a comment every 20 ms, times
// over, for as long as the connection lasts; done is set once it stops.
func chatteringEngine(t *testing.T, events []string, times int) (addr string, done *atomic.Bool) {
	done = new(atomic.Bool)
	addr = serve(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			defer done.Store(true)
			for _, ev := range events {
				_, _ = w.WriteString(ev)
			}
			for range times {
				_, _ = w.WriteString(": still here\n\n")
				if w.Flush() != nil {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}, nil)
	return addr, done
}

// relayFrom posts a completion through a front end over the one engine at
// addr, and returns the client's answer and what the observer saw.
func relayFrom(t *testing.T, engine string) (status int, body []byte, rec *recorder) {
	pool := NewPool(Config{Health: noHealth})
	t.Cleanup(pool.Close)
	mustAdd(t, pool, 0, engine)
	rec = newRecorder()
	addr := serve(t, front(pool, 0, func() Observer { return rec }), nil)
	status, _, body = post(t, addr, "/v1/completions", completionBody)
	return status, body, rec
}

// TestStreamEndsSoonAfterDone: after [DONE] an engine has only the end of
// the body left to send; one that goes on sending is cut within the grace,
// instead of holding the client's stream open for as long as it talks.
func TestStreamEndsSoonAfterDone(t *testing.T) {
	engine, engineDone := chatteringEngine(t, vllmStream(3), 1000) // 20 s of chatter after [DONE]
	status, body, _ := relayFrom(t, engine)
	if status != 200 || !strings.Contains(string(body), "[DONE]") {
		t.Fatalf("status %d, body %q", status, body)
	}
	if engineDone.Load() {
		t.Fatal("the client's stream lasted as long as the engine's chatter after [DONE]")
	}
}

// TestStreamEndsSoonAfterTheLastFinish: an engine that has sent its last
// finish_reason and usage and then stalls, sending neither [DONE] nor the
// body's end, holds the client's complete answer for finishGrace, not
// for as long as it keeps the connection alive.
func TestStreamEndsSoonAfterTheLastFinish(t *testing.T) {
	defer setFinishGrace(time.Second)()
	evs := vllmStream(3)
	// All but [DONE], then a minute of keep-alive comments, which reset
	// the idle timeout.
	engine, engineDone := chatteringEngine(t, evs[:len(evs)-1], 3000)
	status, body, rec := relayFrom(t, engine)
	if status != 200 || !strings.Contains(string(body), `"completion_tokens":3`) || strings.Contains(string(body), "error") {
		t.Fatalf("status %d, body %q", status, body)
	}
	if engineDone.Load() {
		t.Fatal("the client's stream lasted as long as the engine's chatter after the last finish_reason")
	}
	rec.wait(t)
	if got := rec.summary(); got != "dispatched first item×3 complete:stop" {
		t.Errorf("observer saw %q", got)
	}
}

// TestEngineErrorThenStall: an engine that sends its own error event and
// then neither [DONE] nor the body's end has ended its answer: the client's
// stream ends within the grace, with [DONE] after the engine's error.
// It waited for the whole idle timeout, and then got no [DONE].
func TestEngineErrorThenStall(t *testing.T) {
	defer setFinishGrace(200 * time.Millisecond)()
	errorEvent := `data: {"object":"error","message":"boom","type":"InternalServerError","code":500}` + "\n\n"
	stalled := make(chan struct{})
	engine := serve(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			_, _ = w.WriteString(chunk(0, "tok", "") + errorEvent)
			if w.Flush() != nil {
				return
			}
			select { // until the relay lets go of the connection, or a minute
			case <-stalled:
			case <-time.After(time.Minute):
			}
		})
	}, nil)
	defer close(stalled)
	pool := NewPool(Config{Health: noHealth, Timeouts: Timeouts{Idle: time.Minute}})
	defer pool.Close()
	mustAdd(t, pool, 0, engine)
	rec := newRecorder()
	addr := serve(t, front(pool, 0, func() Observer { return rec }), nil)
	status, _, body := post(t, addr, "/v1/completions", completionBody)
	if want := chunk(0, "tok", "") + errorEvent + "data: [DONE]\n\n"; status != 200 || string(body) != want {
		t.Fatalf("status %d, body %q; want %q", status, body, want)
	}
	rec.wait(t)
	if err := rec.aborted(); !errors.Is(err, ErrEngineError) {
		t.Errorf("observer: %v (%s); want the engine's error", err, rec.summary())
	}
	// A failure for passive health, as an error under a 2xx plain
	// answer is; it had counted as a success.
	if got := pool.Engine(0).Failures(); got != 1 {
		t.Errorf("%d failures counted against the engine, want 1", got)
	}
}

// TestItemsAfterAFinishKeepTheStream: an engine that repeats a finish
// (a choice's finish_reason, then more items) is still answering: the
// grace after the last finish_reason does not cut what follows.
func TestItemsAfterAFinishKeepTheStream(t *testing.T) {
	defer setFinishGrace(time.Second)()
	steps := int(finishGrace/(100*time.Millisecond)) + 20 // items past the grace
	engine := serve(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			_, _ = w.WriteString(chunk(0, "tok", "stop"))
			for i := range steps {
				_, _ = w.WriteString(chunk(i+1, "more", ""))
				if w.Flush() != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
			_, _ = w.WriteString("data: [DONE]\n\n")
		})
	}, nil)
	status, body, _ := relayFrom(t, engine)
	if n := strings.Count(string(body), `"more`); status != 200 || n != steps || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("status %d, %d of %d items after the finish, body ends %q", status, n, steps, body[max(0, len(body)-40):])
	}
}

// TestConnectionNamedHeadersStayWithTheEngine: a header the engine's
// Connection header names belongs to the engine's connection, not to the
// response, and is not passed on.
func TestConnectionNamedHeadersStayWithTheEngine(t *testing.T) {
	// As Go and Python servers spell them: uvicorn sends lowercase names.
	for _, connection := range []string{"Connection: keep-alive, X-Hop", "connection: keep-alive, x-hop"} {
		t.Run(connection[:10], func(t *testing.T) {
			engine := rawEngine(t, func(conn net.Conn, br *bufio.Reader) {
				for {
					if _, ok := readRequest(br); !ok {
						return
					}
					payload := `{"choices":[{"text":"hi","finish_reason":"stop"}]}`
					fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\n%s\r\nX-Hop: internal\r\nX-Kept: yes\r\n"+
						"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", connection, len(payload), payload)
				}
			})
			pool := NewPool(Config{Health: noHealth})
			defer pool.Close()
			mustAdd(t, pool, 0, engine)
			addr := serve(t, front(pool, 0, nil), nil)
			status, h, _ := post(t, addr, "/v1/completions", completionBody)
			if status != 200 || string(h.Peek("X-Kept")) != "yes" {
				t.Fatalf("status %d, headers %s", status, h.String())
			}
			if v := h.Peek("X-Hop"); len(v) != 0 {
				t.Errorf("X-Hop, named in the engine's Connection header, reached the client: %q", v)
			}
		})
	}
}

// TestStreamConnectionIsReusedAfterTheGrace: the check for unsolicited
// bytes must not mistake the read deadline a stream's end left on its
// connection (the grace after [DONE]) for a broken connection: a healthy
// engine's connection is reused however long it sat idle in the pool.
func TestStreamConnectionIsReusedAfterTheGrace(t *testing.T) {
	var mu sync.Mutex
	conns := map[uint64]bool{}
	engine := serve(t, func(ctx *fasthttp.RequestCtx) {
		mu.Lock()
		conns[ctx.ConnID()] = true
		mu.Unlock()
		// A pause after each event, [DONE] included: the router's read
		// of the body's end then runs under the grace's deadline.
		sseEngine(vllmStream(2), 20*time.Millisecond, nil)(ctx)
	}, nil)
	pool := NewPool(Config{Health: noHealth, MaxIdleConnDuration: time.Minute})
	defer pool.Close()
	mustAdd(t, pool, 0, engine)
	addr := serve(t, front(pool, 0, nil), nil)
	for i := range 2 {
		if status, _, body := post(t, addr, "/v1/completions", completionBody); status != 200 || !strings.Contains(string(body), "[DONE]") {
			t.Fatalf("request %d: status %d, body %q", i, status, body)
		}
		if i == 0 {
			time.Sleep(doneGrace + 500*time.Millisecond) // past the deadline the stream's end set
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(conns) != 1 {
		t.Errorf("two streams a grace apart took %d connections, want 1 reused", len(conns))
	}
}

// TestErrorUnderA2xxCountsAgainstTheEngine: an engine that reports an
// error with a success status has failed; passive health counts it, as it
// would the 5xx the error should have come with.
func TestErrorUnderA2xxCountsAgainstTheEngine(t *testing.T) {
	engine := serve(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"oom","code":500}}`)
	}, nil)
	pool := NewPool(Config{Health: noHealth})
	defer pool.Close()
	mustAdd(t, pool, 0, engine)
	if _, err := roundTripBody(t, pool, "x"); err != nil {
		t.Fatal(err)
	}
	if got := pool.Engine(0).Failures(); got != 1 {
		t.Errorf("passive health counted %d failures, want 1", got)
	}
}

// TestDeclaredLengthIsNotTakenUpFront: an engine that declares a large
// body and sends it slowly holds budget for what it sent, not for what it
// declared: declaring is free, and would let one engine starve every
// other request's answers.
func TestDeclaredLengthIsNotTakenUpFront(t *testing.T) {
	const declared = 1 << 20
	engine := rawEngine(t, func(conn net.Conn, br *bufio.Reader) {
		if _, ok := readRequest(br); !ok {
			return
		}
		fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", declared, strings.Repeat(" ", 100))
		_, _ = io.Copy(io.Discard, br) // hold the connection until the router closes it
	})
	pool := NewPool(Config{Health: noHealth, RelayBufferSize: 16, MaxResponseBodySize: 4 << 20})
	defer pool.Close()
	mustAdd(t, pool, 0, engine)
	c := pool.AcquireCall()
	c.SetRequest([]byte("/v1/completions"), []byte(`{}`))
	if err := c.Do(0, nil); err != nil {
		t.Fatal(err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		_, _ = c.ReadBody()
	}()
	waitUntil(t, "the body's first bytes charged", func() bool { return pool.ResponseBytes() > 0 })
	if held := pool.ResponseBytes(); held > declared/2 {
		t.Errorf("%d budget bytes held for about 100 received", held)
	}
	c.Abort()
	<-read
	c.Release()
}

// TestRequireObject: for a request only a JSON object answers, a 2xx
// that is no JSON object is the engine's failure, in passive health and
// to the caller, who gets no bytes to take for an answer; without it the
// same answer is read as the engine's, uncounted.
func TestRequireObject(t *testing.T) {
	for _, answer := range []string{"<html>busy</html>", `{"object":"error","message":"boom","type":"InternalServerError","code":500}`, `{"error":{"message":"oom"}}`,
		`{"id":"x","choices":[{"text":"a"`} { // cut short, with a Content-Length of what was sent
		t.Run(answer, func(t *testing.T) { testRequireObject(t, answer) })
	}
}

// testRequireObject: an engine answering 200 with answer, which is no
// completion, fails a call that requires one (an error object relayed as
// a 200 was counted a success, and never retried elsewhere).
func testRequireObject(t *testing.T, answer string) {
	engine := serve(t, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(answer) }, nil)
	pool := NewPool(Config{Health: noHealth})
	defer pool.Close()
	mustAdd(t, pool, 0, engine)
	for _, require := range []bool{false, true} {
		c := pool.AcquireCall()
		c.SetRequest([]byte("/v1/completions"), []byte(`{}`))
		if require {
			c.RequireObject()
		}
		if err := c.Do(0, nil); err != nil {
			t.Fatal(err)
		}
		body, err := c.ReadBody()
		if require && (!errors.Is(err, ErrEngineFailed) || body != nil) {
			t.Fatalf("RequireObject: ReadBody gave %q, %v; want no body and ErrEngineFailed", body, err)
		}
		if !require && err != nil {
			t.Fatal(err)
		}
		c.Release()
		// An error under a 2xx counts against the engine either way; the
		// count runs on over both calls.
		var want int32
		errorObject := strings.Contains(answer, "error")
		switch {
		case errorObject && require:
			want = 2
		case errorObject || require:
			want = 1
		}
		if got := pool.Engine(0).Failures(); got != want {
			t.Errorf("RequireObject %v: %d failures counted, want %d", require, got, want)
		}
	}
}

// TestIdleTimeoutBoundsAWholeBody: a plain answer's body must be whole
// within the idle timeout of its headers. Each byte of one dribbled a
// byte every 20 ms reset the idle timeout, and a request waited as long
// as the engine dribbled: hours at a byte a second.
func TestIdleTimeoutBoundsAWholeBody(t *testing.T) {
	const spaces = 100 // two seconds of dribbling, ten idle timeouts
	engine := rawEngine(t, func(conn net.Conn, br *bufio.Reader) {
		if _, ok := readRequest(br); !ok {
			return
		}
		if _, err := fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", spaces+2); err != nil {
			return
		}
		for range spaces {
			time.Sleep(20 * time.Millisecond)
			if _, err := io.WriteString(conn, " "); err != nil {
				return
			}
		}
		_, _ = io.WriteString(conn, "}")
	})
	_, c := answeredCall(t, Config{Health: noHealth, Timeouts: Timeouts{Idle: 200 * time.Millisecond}}, engine)
	if body, err := c.ReadBody(); !errors.Is(err, ErrIdleTimeout) {
		t.Fatalf("ReadBody = %q, %v; want the idle timeout", body, err)
	}
}

// TestIdleTimeoutBoundsAnEvent: an event of a stream must be whole within
// the idle timeout of its first byte; one dribbled a byte every 20 ms
// ends the stream as an idle timeout.
func TestIdleTimeoutBoundsAnEvent(t *testing.T) {
	event := vllmStream(1)[0]
	engine := serve(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for i := range len(event) { // a second or more for one event
				_ = w.WriteByte(event[i])
				if w.Flush() != nil {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
			_, _ = w.WriteString("data: [DONE]\n\n")
		})
	}, nil)
	pool := NewPool(Config{Health: noHealth, Timeouts: Timeouts{Idle: 200 * time.Millisecond}})
	defer pool.Close()
	mustAdd(t, pool, 0, engine)
	rec := newRecorder()
	addr := serve(t, front(pool, 0, func() Observer { return rec }), nil)
	if status, _, body := post(t, addr, "/v1/completions", completionBody); status != 200 {
		t.Fatalf("status %d, body %q", status, body)
	}
	rec.wait(t)
	if err := rec.aborted(); !errors.Is(err, ErrIdleTimeout) {
		t.Fatalf("stream ended with %v (%s), want the idle timeout", err, rec.summary())
	}
}

// TestEndlessEventIsCut: one event that never ends, sent as fast as the
// relay takes it, ends the stream once it outgrows what the router takes
// of a plain answer (MaxResponseBodySize). Each buffer of it the relay
// passed on restarted the event's idle clock, and gigabytes went through
// for as long as the client waited.
func TestEndlessEventIsCut(t *testing.T) {
	var sent atomic.Int64
	engine := serve(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			_, _ = w.WriteString(`data: {"id":"`)
			part := bytes.Repeat([]byte("a"), 64<<10)
			for sent.Load() < 1<<30 { // past it the relay never cut it: the test fails below
				if _, err := w.Write(part); err != nil || w.Flush() != nil {
					return
				}
				sent.Add(int64(len(part)))
			}
		})
	}, nil)
	pool := NewPool(Config{Health: noHealth, MaxResponseBodySize: 1 << 20})
	defer pool.Close()
	mustAdd(t, pool, 0, engine)
	rec := newRecorder()
	addr := serve(t, front(pool, 0, func() Observer { return rec }), nil)
	status, _, body := post(t, addr, "/v1/completions", completionBody)
	if status != 200 || !bytes.HasSuffix(body, sseErrors[kindOf(ErrResponseTooLarge)]) {
		t.Fatalf("status %d, %d bytes ending %q; want the event cut with engine_response_too_large", status, len(body), body[max(0, len(body)-120):])
	}
	rec.wait(t)
	if err := rec.aborted(); !errors.Is(err, ErrResponseTooLarge) || len(body) > 2<<20 {
		t.Fatalf("stream ended with %v after %d bytes relayed (%d sent); want it cut past 1 MiB", err, len(body), sent.Load())
	}
}

// TestStreamEndingBeforeItsFirstByte: an engine that sends a stream's
// headers and then ends the body, or drops the connection, has failed
// before anything reached the client: AwaitStream says so with an error
// that lets the request go elsewhere, counted against the engine. It had
// reached the client as a 200 with an error event.
func TestStreamEndingBeforeItsFirstByte(t *testing.T) {
	for name, tail := range map[string]string{"empty body": "0\r\n\r\n", "dropped": ""} {
		t.Run(name, func(t *testing.T) {
			engine := rawEngine(t, func(conn net.Conn, br *bufio.Reader) {
				if _, ok := readRequest(br); !ok {
					return
				}
				_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+tail)
				conn.Close()
			})
			pool, c := answeredCall(t, Config{Health: noHealth}, engine)
			err := c.AwaitStream()
			if !IsRetryable(err) || !errors.Is(err, ErrEngineFailed) {
				t.Fatalf("AwaitStream = %v; want a retryable engine failure", err)
			}
			if got := pool.Engine(0).Failures(); got != 1 {
				t.Errorf("%d failures counted against the engine, want 1", got)
			}
		})
	}
}

// TestHeldVerdictWaitsForAServedStream: a 5xx held for a request that
// another engine may serve counts once one does, not at the 2xx headers
// of a stream that then proves empty: that engine served nothing.
func TestHeldVerdictWaitsForAServedStream(t *testing.T) {
	answer := func(head, body string) string {
		return rawEngine(t, func(conn net.Conn, br *bufio.Reader) {
			if _, ok := readRequest(br); ok {
				_, _ = io.WriteString(conn, head+body)
			}
			conn.Close()
		})
	}
	sse := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
	pool := NewPool(Config{Health: noHealth})
	defer pool.Close()
	mustAdd(t, pool, 0, answer("HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\nConnection: close\r\n\r\n", "{}"))
	mustAdd(t, pool, 1, answer(sse, ""))
	mustAdd(t, pool, 2, answer(sse, strings.Join(vllmStream(2), "")))
	var a Attempts
	c := pool.AcquireCall()
	defer c.Release()
	c.SetAttempts(&a)
	c.SetRequest([]byte("/v1/completions"), []byte(`{"prompt":"x","stream":true}`))
	if err := c.Do(0, newRecorder()); err != nil || c.StatusCode() != 500 {
		t.Fatalf("Do on the 5xx engine: %v, status %d", err, c.StatusCode())
	}
	_ = c.Discard()
	if err := c.Do(1, newRecorder()); err != nil {
		t.Fatal(err)
	}
	if err := c.AwaitStream(); !IsRetryable(err) {
		t.Fatalf("AwaitStream on the empty stream = %v; want a retryable failure", err)
	}
	if got := pool.Engine(0).Failures(); got != 0 {
		t.Errorf("the 5xx counted (%d failures) when an empty stream's headers came; nothing served the request", got)
	}
	if err := c.Do(2, newRecorder()); err != nil {
		t.Fatal(err)
	}
	if err := c.AwaitStream(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := c.Relay(bufio.NewWriter(&out)); err != nil {
		t.Fatal(err)
	}
	if got := pool.Engine(0).Failures(); got != 1 {
		t.Errorf("after another engine's stream served the request, the 5xx engine has %d failures; want 1", got)
	}
	if n := a.Done(); n != 0 {
		t.Errorf("%d verdicts still held after the request was served", n)
	}
}

// TestAwaitedStreamRelaysWhole: what AwaitStream read is relayed first,
// without waiting for more, and the rest after it: byte for byte, events
// observed, whether the first read held part of an event, several, or as
// much as the relay buffer holds.
func TestAwaitedStreamRelaysWhole(t *testing.T) {
	for _, bufSize := range []int{200, 4096} { // an event in a small buffer, and the default
		evs := vllmStream(5)
		want := strings.Join(evs, "")
		engine := rawEngine(t, func(conn net.Conn, br *bufio.Reader) {
			if _, ok := readRequest(br); !ok {
				return
			}
			_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"+evs[0]+evs[1])
			time.Sleep(50 * time.Millisecond) // the first read ends within the second event, or after it
			_, _ = io.WriteString(conn, strings.Join(evs[2:], ""))
			conn.Close()
		})
		pool := NewPool(Config{Health: noHealth, RelayBufferSize: bufSize})
		mustAdd(t, pool, 0, engine)
		rec := newRecorder()
		addr := serve(t, front(pool, 0, func() Observer { return rec }), nil)
		status, _, body := post(t, addr, "/v1/completions", completionBody)
		if status != 200 || string(body) != want {
			t.Errorf("buffer %d: status %d, body %q; want %q", bufSize, status, body, want)
		}
		rec.wait(t)
		if got := rec.summary(); !strings.HasPrefix(got, "dispatched first") || !strings.HasSuffix(got, "complete:length") && !strings.HasSuffix(got, "complete:stop") {
			t.Errorf("buffer %d: observer saw %q", bufSize, got)
		}
		pool.Close()
	}
}

// TestMalformedAnswerBytesStayOutOfErrors: fasthttp quotes the bytes of
// an answer it cannot parse in its error, which reaches the log; an engine
// that echoes its request there would put a client's key or prompt in
// the journal (a secrets review saw it).
func TestMalformedAnswerBytesStayOutOfErrors(t *testing.T) {
	for _, answer := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: zzSECRET-ECHO\r\n\r\n",
		// The request itself, echoed: its status line is the request line
		// (the diff review's find: fasthttp quotes the whole block).
		"POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer SECRET-ECHO\r\nContent-Length: 2\r\n\r\n{}",
		"HTTP/1.1 2x0 SECRET-ECHO\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX-A: a\x01SECRET-ECHO\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: SECRET-ECHO\r\n\r\n",
	} {
		engine := rawEngine(t, func(conn net.Conn, br *bufio.Reader) {
			if _, ok := readRequest(br); ok {
				_, _ = io.WriteString(conn, answer)
			}
			_ = conn.Close()
		})
		pool := NewPool(Config{Health: noHealth})
		mustAdd(t, pool, 0, engine)
		_, err := roundTripBody(t, pool, "prompt")
		pool.Close()
		if err == nil || strings.Contains(err.Error(), "SECRET-ECHO") {
			t.Errorf("answer %.40q: error %v; want one that quotes none of the answer", answer, err)
		}
	}
}

// TestStreamFirstTokenIsUnderTheFirstByteTimeout: vLLM's API server sends
// a stream's headers at once and its first event after queueing and
// prefill. That wait is the first token's, bounded by the first-byte
// timeout as a plain answer's is, not by the idle timeout between the
// pieces of an answer under way: a stream whose prefill outlasted the
// idle timeout (2 minutes by default, against 10 for the first byte) was
// cut with a 504 that the same request unstreamed would not have had.
func TestStreamFirstTokenIsUnderTheFirstByteTimeout(t *testing.T) {
	events := vllmStream(3)
	headersFirst := func(delay time.Duration, body string) string {
		return rawEngine(t, func(conn net.Conn, br *bufio.Reader) {
			if _, ok := readRequest(br); !ok {
				return
			}
			_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
			// Queueing and prefill; over early if the router hangs up, or
			// the test ends and closes the connection.
			_ = conn.SetReadDeadline(time.Now().Add(delay))
			if _, err := br.ReadByte(); !errors.Is(err, os.ErrDeadlineExceeded) {
				return
			}
			_, _ = io.WriteString(conn, body)
			conn.Close()
		})
	}
	t.Run("a prefill longer than the idle timeout", func(t *testing.T) {
		engine := headersFirst(time.Second, strings.Join(events, ""))
		_, c := answeredCall(t, Config{Health: noHealth, Timeouts: Timeouts{FirstByte: time.Minute, Idle: 100 * time.Millisecond}}, engine)
		if err := c.AwaitStream(); err != nil {
			t.Fatalf("AwaitStream = %v; want the stream, its first event within the first-byte timeout", err)
		}
		var out bytes.Buffer
		if err := c.Relay(bufio.NewWriter(&out)); err != nil || out.String() != strings.Join(events, "") {
			t.Fatalf("Relay = %v, relayed %q", err, out.String())
		}
	})
	t.Run("no first event within a DoWithin bound", func(t *testing.T) {
		// A prefill stage's own bound covers its stream's first bytes
		// too: a hung prefill is not held for the first-byte timeout.
		engine := headersFirst(time.Minute, "")
		pool := NewPool(Config{Health: noHealth, Timeouts: Timeouts{FirstByte: time.Hour, Idle: time.Hour}})
		t.Cleanup(pool.Close)
		mustAdd(t, pool, 0, engine)
		c := pool.AcquireCall()
		t.Cleanup(c.Release)
		c.SetRequest([]byte("/v1/completions"), []byte("x"))
		if err := c.DoWithin(0, nil, 200*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- c.AwaitStream() }()
		select {
		case err := <-done:
			if !errors.Is(err, ErrFirstByteTimeout) {
				t.Fatalf("AwaitStream = %v; want ErrFirstByteTimeout", err)
			}
		case <-time.After(time.Minute):
			t.Fatal("AwaitStream still waits a minute past the call's 200ms bound")
		}
	})
	t.Run("no first event within the first-byte timeout", func(t *testing.T) {
		engine := headersFirst(time.Minute, "")
		_, c := answeredCall(t, Config{Health: noHealth, Timeouts: Timeouts{FirstByte: 200 * time.Millisecond, Idle: time.Minute}}, engine)
		if err := c.AwaitStream(); !errors.Is(err, ErrFirstByteTimeout) {
			t.Fatalf("AwaitStream = %v; want ErrFirstByteTimeout", err)
		}
	})
}
