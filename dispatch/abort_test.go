package dispatch

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// silentEngine reads each request and never answers it, as an engine does
// while it queues or generates a long non-streaming response; with
// streamHeaders it first sends the headers of an event stream, as vLLM does
// before prefill. It reports on closed each connection the router closes,
// which is how an engine learns to stop generating.
type silentEngine struct {
	ln       net.Listener
	requests atomic.Int64
	closed   chan struct{}
}

func startSilentEngine(t *testing.T, streamHeaders bool) *silentEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &silentEngine{ln: ln, closed: make(chan struct{}, 16)}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
			go e.serve(c, streamHeaders)
		}
	}()
	return e
}

func (e *silentEngine) serve(c net.Conn, streamHeaders bool) {
	br := bufio.NewReader(c)
	var req fasthttp.Request
	if err := req.Read(br); err != nil {
		return
	}
	e.requests.Add(1)
	if streamHeaders {
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
	}
	// Nothing more comes from the router: a read returns only when it
	// closes the connection.
	_, _ = io.Copy(io.Discard, br)
	e.closed <- struct{}{}
}

func (e *silentEngine) addr() string { return e.ln.Addr().String() }

// waitClosed fails the test unless the router closes a connection to e
// within a generous deadline.
func (e *silentEngine) waitClosed(t *testing.T, what string) {
	t.Helper()
	select {
	case <-e.closed:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the engine's connection was not closed", what)
	}
}

func waitRequests(t *testing.T, e *silentEngine, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.requests.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("the engine received %d requests, want %d", e.requests.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestAbortWhileWaitingForHeaders: a client that leaves while a
// non-streaming request waits on a silent engine makes Do return at once
// with ErrClientGone, long before the first-byte timeout, and closes the
// engine connection; the observer's one end is that abort.
func TestAbortWhileWaitingForHeaders(t *testing.T) {
	eng := startSilentEngine(t, false)
	pool := NewPool(Config{Health: noHealth, Timeouts: Timeouts{FirstByte: time.Hour}})
	defer pool.Close()
	mustAdd(t, pool, 0, eng.addr())
	c := pool.AcquireCall()
	c.SetRequest([]byte("/v1/completions"), []byte(completionBody))
	rec := newRecorder()
	done := make(chan error, 1)
	go func() { done <- c.Do(0, rec) }()
	waitRequests(t, eng, 1)
	c.Abort()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClientGone) || IsRetryable(err) {
			t.Fatalf("Do after Abort: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Do still waits on the silent engine after Abort")
	}
	eng.waitClosed(t, "Abort during Do")
	rec.wait(t)
	if got := rec.summary(); got != "abort" || !errors.Is(rec.aborted(), ErrClientGone) {
		t.Fatalf("observer: %s %v", got, rec.aborted())
	}
	c.Release()
	if n := pool.Engine(0).client.ConnsCount(); n != 0 {
		t.Fatalf("%d engine connections still counted after the abort", n)
	}
	if !pool.Engine(0).routable {
		t.Fatal("a departed client was held against the engine")
	}
}

// TestCutWhileWaitingForHeaders: a shutdown's Cut fails Do with
// ErrShuttingDown (503, not retried) and is not held against the engine,
// however many requests it cuts there.
func TestCutWhileWaitingForHeaders(t *testing.T) {
	eng := startSilentEngine(t, false)
	pool := NewPool(Config{Health: noHealth, Timeouts: Timeouts{FirstByte: time.Hour},
		Outlier: OutlierConfig{Consecutive: 2, FailurePercent: -1, BaseEjection: time.Hour, MaxEjectedPercent: 100}})
	defer pool.Close()
	mustAdd(t, pool, 0, eng.addr())
	for i := range int64(3) {
		c := pool.AcquireCall()
		c.SetRequest([]byte("/v1/completions"), []byte(completionBody))
		done := make(chan error, 1)
		go func() { done <- c.Do(0, nil) }()
		waitRequests(t, eng, i+1)
		c.Cut()
		select {
		case err := <-done:
			if !errors.Is(err, ErrShuttingDown) || IsRetryable(err) || ErrorStatus(err) != 503 {
				t.Fatalf("Do after Cut: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Do still waits on the silent engine after Cut")
		}
		c.Release()
	}
	if st := pool.Engine(0).Outlier(); st.Ejected {
		t.Fatalf("cuts were held against the engine: %+v", st)
	}
}

// TestFailPrefill: a call whose request's prefill failed elsewhere fails
// with ErrPrefillFailed (502, not retried), whether it still waits for
// the engine's headers or relays a stream that has not started, and the
// stream's client is told with an error event; neither is held against
// the engine, however often it happens.
func TestFailPrefill(t *testing.T) {
	for _, stream := range []bool{false, true} {
		eng := startSilentEngine(t, stream)
		pool := NewPool(Config{Health: noHealth, Timeouts: Timeouts{FirstByte: time.Hour, Idle: time.Hour},
			Outlier: OutlierConfig{Consecutive: 2, FailurePercent: -1, BaseEjection: time.Hour, MaxEjectedPercent: 100}})
		mustAdd(t, pool, 0, eng.addr())
		for i := range int64(3) {
			c := pool.AcquireCall()
			c.SetRequest([]byte("/v1/completions"), []byte(completionBody))
			var out bytes.Buffer
			w := bufio.NewWriter(&out)
			done := make(chan error, 1)
			if stream {
				// The engine sent its headers: the client has its stream.
				if err := c.Do(0, newRecorder()); err != nil {
					t.Fatal(err)
				}
				go func() { done <- c.Relay(w) }()
			} else {
				go func() { done <- c.Do(0, newRecorder()) }()
				waitRequests(t, eng, i+1)
			}
			c.FailPrefill()
			c.Abort() // a later hang-up does not change what the call failed with
			select {
			case err := <-done:
				if !errors.Is(err, ErrPrefillFailed) || IsRetryable(err) || ErrorStatus(err) != 502 {
					t.Fatalf("stream %v: %v", stream, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("stream %v: the call still waits on the engine after FailPrefill", stream)
			}
			eng.waitClosed(t, "FailPrefill")
			if stream && !bytes.Contains(out.Bytes(), []byte(`"code":"prefill_failed"`)) {
				t.Fatalf("the stream's client was not told: %q", out.Bytes())
			}
			c.Release()
		}
		if st := pool.Engine(0).Outlier(); st.Ejected {
			t.Fatalf("stream %v: failed prefills were held against the decode engine: %+v", stream, st)
		}
		pool.Close()
	}
}

// TestAbortBeforeFirstEvent: an event stream whose engine sent its headers
// and then stays silent (queueing, prefill) is cut by Abort, not by the
// idle timeout.
func TestAbortBeforeFirstEvent(t *testing.T) {
	eng := startSilentEngine(t, true)
	pool := NewPool(Config{Health: noHealth, Timeouts: Timeouts{FirstByte: time.Hour, Idle: time.Hour}})
	defer pool.Close()
	mustAdd(t, pool, 0, eng.addr())
	c := pool.AcquireCall()
	c.SetRequest([]byte("/v1/completions"), []byte(completionBody))
	rec := newRecorder()
	if err := c.Do(0, rec); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	w := bufio.NewWriter(io.Discard)
	go func() { done <- c.Relay(w) }()
	c.Abort()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClientGone) {
			t.Fatalf("Relay after Abort: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Relay still waits on the silent engine after Abort")
	}
	eng.waitClosed(t, "Abort during Relay")
	rec.wait(t)
	if got := rec.summary(); got != "dispatched abort" || !errors.Is(rec.aborted(), ErrClientGone) {
		t.Fatalf("observer: %s %v", got, rec.aborted())
	}
	if w.Buffered() != 0 {
		t.Fatal("an error event was written to a departed client")
	}
	c.Release()
}

// TestAbortBeforeDo: a call aborted before it was sent sends nothing, on
// any attempt, until it is released; a released call is fresh again.
func TestAbortBeforeDo(t *testing.T) {
	eng := startSilentEngine(t, false)
	// A call that did reach the silent engine fails at the first-byte
	// timeout instead, with another error.
	pool := NewPool(Config{Health: noHealth, Timeouts: Timeouts{FirstByte: time.Second}})
	defer pool.Close()
	mustAdd(t, pool, 0, eng.addr())
	c := pool.AcquireCall()
	c.SetRequest([]byte("/v1/completions"), []byte(completionBody))
	c.Abort()
	for range 2 {
		rec := newRecorder()
		if err := c.Do(0, rec); !errors.Is(err, ErrClientGone) {
			t.Fatalf("Do of an aborted call: %v", err)
		}
		rec.wait(t)
	}
	if n := eng.requests.Load(); n != 0 {
		t.Fatalf("the engine received %d requests of an aborted call", n)
	}
	c.Release()
}

// TestAbortAfterCompletionKeepsConnection: a response read to its end
// returns its connection to the pool at once, so an Abort that comes
// later (the client leaving right after its answer) closes nothing.
func TestAbortAfterCompletionKeepsConnection(t *testing.T) {
	engine := serve(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"choices":[{"index":0,"text":"x","finish_reason":"stop"}]}`)
	}, nil)
	pool := NewPool(Config{Health: noHealth})
	defer pool.Close()
	mustAdd(t, pool, 0, engine)
	for i := range 3 {
		c := pool.AcquireCall()
		c.SetRequest([]byte("/v1/completions"), []byte(completionBody))
		if err := c.Do(0, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ReadBody(); err != nil {
			t.Fatal(err)
		}
		c.Abort()
		c.Release()
		if n := pool.Engine(0).client.ConnsCount(); n != 1 {
			t.Fatalf("request %d: %d engine connections, want the one pooled connection", i, n)
		}
	}
}

// TestAbandonFailsRequestsAsEngineFailures: abandoning an engine the
// router learned is gone closes its connections, so that a request
// waiting for its headers fails now as an engine failure another worker
// may retry, and a stream under way ends with an error event, long
// before the first-byte and idle timeouts; the slot is then empty, and a
// later Add starts a fresh engine, with no connection dialed before.
func TestAbandonFailsRequestsAsEngineFailures(t *testing.T) {
	plain, streaming := startSilentEngine(t, false), startSilentEngine(t, true)
	pool := NewPool(Config{Health: noHealth, Timeouts: Timeouts{FirstByte: time.Hour, Idle: time.Hour}})
	defer pool.Close()
	mustAdd(t, pool, 0, plain.addr())
	mustAdd(t, pool, 1, streaming.addr())

	waiting := pool.AcquireCall()
	defer waiting.Release()
	waiting.SetRequest([]byte("/v1/completions"), []byte(completionBody))
	done := make(chan error, 1)
	go func() { done <- waiting.Do(0, nil) }()
	waitRequests(t, plain, 1)

	stream := pool.AcquireCall()
	defer stream.Release()
	stream.SetRequest([]byte("/v1/completions"), []byte(completionBody))
	rec := newRecorder()
	if err := stream.Do(1, rec); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	w := bufio.NewWriter(&out)
	relayed := make(chan error, 1)
	go func() { relayed <- stream.Relay(w) }()

	pool.Abandon(0)
	select {
	case err := <-done:
		// The broken connection looks stale, and its one retry on the
		// same engine is refused a connection: either way another
		// worker may take the request.
		if !IsRetryable(err) {
			t.Fatalf("Do on an abandoned engine: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Do still waits on an abandoned engine")
	}
	plain.waitClosed(t, "Abandon during Do")
	if pool.Engine(0) != nil {
		t.Fatal("the abandoned engine is still in its slot")
	}

	pool.Abandon(1)
	select {
	case err := <-relayed:
		if !errors.Is(err, ErrEngineFailed) {
			t.Fatalf("Relay from an abandoned engine: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Relay still waits on an abandoned engine")
	}
	rec.wait(t)
	if !errors.Is(rec.aborted(), ErrEngineFailed) {
		t.Fatalf("observer of the abandoned stream: %s %v", rec.summary(), rec.aborted())
	}
	if !bytes.Contains(out.Bytes(), []byte(`"error"`)) {
		t.Fatalf("the abandoned stream's client got no error event: %q", out.Bytes())
	}

	mustAdd(t, pool, 0, plain.addr())
	if e := pool.Engine(0); e == nil || e.client.ConnsCount() != 0 || e.Outlier().Ejections != 0 {
		t.Fatal("the engine added after Abandon is not fresh")
	}
}

// TestEngineDyingWithTheRequest: an engine that takes a request on a
// connection dialled for it and drops the connection before answering
// failed with the request in hand: ErrEngineFailed (retryable on another
// engine), and the request is not sent to it again, which could run it
// twice; only a pooled connection that carried a request before may be
// stale and worth a second try.
func TestEngineDyingWithTheRequest(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var requests atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			var req fasthttp.Request
			if req.Read(bufio.NewReader(c)) == nil {
				requests.Add(1)
			}
			c.Close()
		}
	}()
	pool := NewPool(Config{Health: noHealth, Timeouts: Timeouts{FirstByte: time.Hour}})
	defer pool.Close()
	mustAdd(t, pool, 0, ln.Addr().String())
	c := pool.AcquireCall()
	defer c.Release()
	c.SetRequest([]byte("/v1/completions"), []byte(completionBody))
	err = c.Do(0, newRecorder())
	if !errors.Is(err, ErrEngineFailed) || !IsRetryable(err) || ErrorStatus(err) != 502 {
		t.Fatalf("Do on an engine that broke the connection with the request: %v", err)
	}
	if n := requests.Load(); n != 1 {
		t.Fatalf("the engine was sent the request %d times, want once", n)
	}
}

// TestEngineDyingWithTheRequestOnAPooledConnection: on a keep-alive
// connection that carried a request before, a break before the response
// may be staleness, so the request is sent once more on a new connection;
// when the engine then refuses the connection, it failed with the request
// (ErrEngineFailed), not one that was never reached (ErrConnect).
func TestEngineDyingWithTheRequestOnAPooledConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		var req fasthttp.Request
		if req.Read(br) != nil {
			return
		}
		// The first request is answered; the second is taken, and the
		// engine dies with it.
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
		req.Reset()
		_ = req.Read(br)
		ln.Close()
	}()
	pool := NewPool(Config{Health: noHealth, Timeouts: Timeouts{FirstByte: time.Hour}})
	defer pool.Close()
	mustAdd(t, pool, 0, ln.Addr().String())
	first := pool.AcquireCall()
	first.SetRequest([]byte("/v1/completions"), []byte(completionBody))
	if err := first.Do(0, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := first.ReadBody(); err != nil {
		t.Fatal(err)
	}
	first.Release()
	c := pool.AcquireCall()
	defer c.Release()
	c.SetRequest([]byte("/v1/completions"), []byte(completionBody))
	err = c.Do(0, newRecorder())
	if !errors.Is(err, ErrEngineFailed) || errors.Is(err, ErrConnect) || !IsRetryable(err) {
		t.Fatalf("Do on an engine that died with the request on a pooled connection: %v", err)
	}
}
