package fastpath_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
)

// dialFrom connects to addr from the loopback address local (127.0.0.x):
// a distinct client address on one host.
func dialFrom(t *testing.T, local, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: e2eWait}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("cannot connect from %s: %v", local, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// serveAdmin serves r's admin endpoints on a listener of their own (the
// configuration's AdminListen set, so that the API listener does not) and
// returns its address; the rig's shutdown closes it.
func serveAdmin(t *testing.T, r *e2eRouter) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.node.ServeAdmin(ln) }()
	return ln.Addr().String()
}

// getFrom sends GET path from the loopback address local and returns the
// status, or 0 and the error if the connection was refused or reset.
func getFrom(t *testing.T, local, addr, path string) (int, error) {
	t.Helper()
	c := dialFrom(t, local, addr)
	_ = c.SetDeadline(time.Now().Add(e2eWait))
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: kvfast\r\n\r\n"); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// TestIdleConnectionFlood: one address opening idle connections up to the
// router's connection limit takes only its per-address share; a client at
// another address still gets through; the idle ones are closed at the
// header timeout, long before the read timeout, and their 408s are not
// counted as completion errors; a request whose header arrived in time
// still has the read timeout for its body.
func TestIdleConnectionFlood(t *testing.T) {
	eng := startMock(t, mocker.Config{WorkerID: 1})
	cfg := e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.Addr(), Model: e2eModel})
	const maxConns, perIP = 8, 3
	cfg.HTTP.MaxConns = maxConns
	cfg.HTTP.MaxConnsPerIP = perIP
	cfg.HTTP.HeaderTimeout = 2 * time.Second
	cfg.HTTP.ReadTimeout = time.Minute // longer than the test waits for anything
	r := startE2ERouter(t, cfg)
	addr := strings.TrimPrefix(r.url, "http://")

	// A client whose header arrives now and whose body comes later.
	body := completionBody(e2eTokens(1, 64), false, 4)
	slow := dialFrom(t, "127.0.0.3", addr)
	_ = slow.SetDeadline(time.Now().Add(2 * e2eWait))
	if _, err := io.WriteString(slow, "POST /v1/completions HTTP/1.1\r\nHost: kvfast\r\nContent-Type: application/json\r\nContent-Length: "+
		strconv.Itoa(len(body))+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}

	// The flood: as many idle connections as the router takes in all.
	closed := make(chan []byte, maxConns)
	for range maxConns {
		c := dialFrom(t, "127.0.0.1", addr)
		go func() {
			_ = c.SetReadDeadline(time.Now().Add(2 * e2eWait))
			b, _ := io.ReadAll(c) // until the router closes it (or the deadline)
			closed <- b
		}()
	}
	// The router accepts in arrival order, so the flood is sorted out (its
	// share taken, the rest refused) before the next client is accepted;
	// the header timeout is long enough that the flood still holds its
	// share then.
	if status, err := getFrom(t, "127.0.0.2", addr, fastpath.PathHealth); status != http.StatusOK {
		t.Fatalf("a client at another address during the flood: status %d, %v", status, err)
	}
	refused, timedOut := 0, 0
	for range maxConns {
		select {
		case b := <-closed:
			switch {
			case bytes.HasPrefix(b, []byte("HTTP/1.1 429 ")):
				refused++ // over the per-address bound
			case bytes.HasPrefix(b, []byte("HTTP/1.1 408 ")):
				timedOut++ // the header timeout
			default:
				t.Errorf("an idle connection ended with %q", b)
			}
		case <-time.After(e2eWait):
			t.Fatalf("idle connections still open after %v: %d refused, %d cut at the header timeout", e2eWait, refused, timedOut)
		}
	}
	if refused != maxConns-perIP || timedOut != perIP {
		t.Errorf("%d refused and %d cut at the header timeout, want %d and %d", refused, timedOut, maxConns-perIP, perIP)
	}

	// Its header came before the flood's, so the header timeout has passed
	// for it too: the body still has the read timeout.
	if _, err := slow.Write(body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(slow), nil)
	if err != nil {
		t.Fatalf("the slow-body request: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the slow-body request: status %d", resp.StatusCode)
	}
	m := r.metrics(t)
	wantMetric(t, m, `kvfast_requests_total{endpoint="completions",status="client_error"}`, 0)
	wantMetric(t, m, `kvfast_http_transport_errors_total{reason="header_timeout"}`, perIP)
}

// TestAdminListenerHasItsOwnConnectionBound: an address that fills its
// connection bound on the API listener can still reach /health and
// /metrics on the admin listener (a probe or Prometheus sharing the
// address with busy clients, behind a proxy or SNAT).
func TestAdminListenerHasItsOwnConnectionBound(t *testing.T) {
	cfg := e2eConfig()
	const perIP = 2
	cfg.HTTP.MaxConnsPerIP = perIP
	cfg.HTTP.HeaderTimeout = time.Minute // the idle connections hold their share throughout
	cfg.AdminListen = "127.0.0.1:0"      // served below
	r := startE2ERouter(t, cfg)
	api := strings.TrimPrefix(r.url, "http://")
	admin := serveAdmin(t, r)
	for range perIP {
		dialFrom(t, "127.0.0.1", api)
	}
	// Accepted in arrival order: once this one is refused, the idle two
	// hold the address's share on the API listener.
	if status, _ := getFrom(t, "127.0.0.1", api, fastpath.PathHealth); status != http.StatusTooManyRequests {
		t.Fatalf("a third API connection from the address: status %d, want 429", status)
	}
	for _, path := range []string{fastpath.PathHealth, fastpath.PathMetrics} {
		if status, err := getFrom(t, "127.0.0.1", admin, path); status != http.StatusOK {
			t.Errorf("GET %s on the admin listener from the same address: status %d, %v", path, status, err)
		}
	}
}

// TestConnectionLimitRefusalIsRead: a connection over its address's
// bound is answered 429 in the OpenAI error format with Retry-After, and
// a client that writes its whole request, a large body included, before
// it reads (Python's urllib) reads that answer, not a reset; the refusal
// is counted.
func TestConnectionLimitRefusalIsRead(t *testing.T) {
	cfg := e2eConfig()
	cfg.HTTP.MaxConnsPerIP = 1
	cfg.HTTP.HeaderTimeout = time.Minute // the idle connection holds the share throughout
	cfg.AdminListen = "127.0.0.1:0"      // served below, with its own bound
	r := startE2ERouter(t, cfg)
	addr := strings.TrimPrefix(r.url, "http://")
	admin := serveAdmin(t, r)
	dialFrom(t, "127.0.0.1", addr)
	// Accepted in arrival order: a GET from the same address is refused
	// once the idle connection holds the share.
	waitFor(t, "the idle connection to hold the address's share", func() bool {
		status, _ := getFrom(t, "127.0.0.1", addr, fastpath.PathHealth)
		return status == http.StatusTooManyRequests
	})
	c := dialFrom(t, "127.0.0.1", addr)
	_ = c.SetDeadline(time.Now().Add(e2eWait))
	body := bytes.Repeat([]byte("x"), 4<<20) // far past the socket buffers
	if _, err := fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: kvfast\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(body); err != nil {
		t.Fatalf("writing the body before reading: %v (the refusal reset the connection)", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the refusal: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || checkOpenAIError(t, b) != "too_many_connections" {
		t.Errorf("refusal: %d, Retry-After %q, %s", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	mr, err := http.Get("http://" + admin + fastpath.PathMetrics)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(mr.Body)
	mr.Body.Close()
	if v := metricOr0(string(m), `kvfast_http_transport_errors_total{reason="too_many_connections"}`); v < 2 {
		t.Errorf("refusals counted: %v, want at least 2", v)
	}
}

// blockingEngine answers generation requests only when release is closed.
func blockingEngine(t *testing.T) (*e2eEngine, chan struct{}, chan struct{}) {
	t.Helper()
	arrived, release := make(chan struct{}, 16), make(chan struct{})
	eng := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		arrived <- struct{}{}
		<-release
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"choices":[{"index":0,"text":"x","finish_reason":"stop"}]}`)
	})
	return eng, arrived, release
}

// TestBodyBudget: request bodies in flight are bounded in bytes over all
// requests. A body that does not fit is refused with 503 and Retry-After
// from its header, before the client has sent it; once the bodies in
// flight end, the budget is free again.
func TestBodyBudget(t *testing.T) {
	eng, arrived, release := blockingEngine(t)
	cfg := e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.addr(), Model: e2eModel})
	const maxBody = 64 << 10
	cfg.HTTP.MaxBodyBytes = maxBody
	cfg.HTTP.BodyBudgetBytes = 2 * maxBody
	r := startE2ERouter(t, cfg)
	addr := strings.TrimPrefix(r.url, "http://")
	big := completionBody(e2eTokens(2, 8000), false, 4) // under maxBody, over half of it
	if len(big) > maxBody || len(big) <= maxBody/2 {
		t.Fatalf("body of %d bytes: want (%d, %d]", len(big), maxBody/2, maxBody)
	}
	var held sync.WaitGroup
	for range 2 {
		held.Go(func() {
			if resp := r.post(t, fastpath.PathCompletions, big, nil); resp.status != 200 {
				t.Errorf("a request within the budget: %d %s", resp.status, resp.body)
			}
		})
	}
	for range 2 {
		<-arrived // both bodies are held while their engine calls run
	}
	if v, _ := metricValue(r.metrics(t), "kvfast_request_body_bytes_in_flight"); v != float64(2*len(big)) {
		t.Errorf("body bytes in flight %v, want %d", v, 2*len(big))
	}
	// A third body does not fit: refused from its header, while the client
	// has sent only the first bytes.
	c := dialFrom(t, "127.0.0.1", addr)
	_ = c.SetDeadline(time.Now().Add(e2eWait))
	if _, err := io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: kvfast\r\nContent-Type: application/json\r\nContent-Length: "+
		strconv.Itoa(len(big))+"\r\n\r\n"+string(big[:100])); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("the over-budget request: %v", err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("the over-budget request: status %d, Retry-After %q: %s", resp.StatusCode, resp.Header.Get("Retry-After"), got)
	}
	if code := checkOpenAIError(t, got); code != "body_budget_exceeded" {
		t.Errorf("code %q", code)
	}
	close(release)
	held.Wait()
	waitFor(t, "the budget released", func() bool {
		v, ok := metricValue(r.metrics(t), "kvfast_request_body_bytes_in_flight")
		return ok && v == 0
	})
	if resp := r.post(t, fastpath.PathCompletions, big, nil); resp.status != 200 {
		t.Errorf("after the bodies ended: %d %s", resp.status, resp.body)
	}
}

// TestDeclaredBodyIsChargedAsItArrives: a client that declares a large
// body and sends none of it holds only the first step of its buffer, so a
// few such connections cannot take the budget from everyone else (four of
// them used to hold all of it here, and every other body got 503 until
// the read timeout).
func TestDeclaredBodyIsChargedAsItArrives(t *testing.T) {
	eng := startMock(t, mocker.Config{WorkerID: 1})
	cfg := e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.Addr(), Model: e2eModel})
	const maxBody = 1 << 20
	cfg.HTTP.MaxBodyBytes = maxBody
	cfg.HTTP.BodyBudgetBytes = maxBody
	r := startE2ERouter(t, cfg)
	addr := strings.TrimPrefix(r.url, "http://")
	const idle = 4
	for i := range idle {
		c := dialFrom(t, "127.0.0."+strconv.Itoa(2+i), addr)
		if _, err := io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: kvfast\r\nContent-Type: application/json\r\nContent-Length: "+
			strconv.Itoa(maxBody)+"\r\n\r\n{"); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the idle bodies charged their first step", func() bool {
		v, _ := metricValue(r.metrics(t), "kvfast_request_body_bytes_in_flight")
		return v == idle*fastpath.EagerBodyBytes
	})
	if resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(3, 64), false, 4), nil); resp.status != 200 {
		t.Errorf("a small request beside the declared bodies: %d %s", resp.status, resp.body)
	}
}

// TestOversizedBodyRefusalIsRead: a client that writes its whole oversized
// body before it reads, as Python's urllib and requests do, reads the 413
// instead of a connection reset.
func TestOversizedBodyRefusalIsRead(t *testing.T) {
	cfg := e2eConfig()
	const maxBody = 64 << 10
	cfg.HTTP.MaxBodyBytes = maxBody
	r := startE2ERouter(t, cfg)
	const size = 4 << 20 // far more than the socket buffers hold
	c := dialFrom(t, "127.0.0.1", strings.TrimPrefix(r.url, "http://"))
	_ = c.SetDeadline(time.Now().Add(2 * e2eWait))
	if _, err := io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: kvfast\r\nContent-Type: application/json\r\nContent-Length: "+
		strconv.Itoa(size)+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte("1,"), 8<<10)
	for sent := 0; sent < size; sent += len(chunk) {
		if _, err := c.Write(chunk[:min(len(chunk), size-sent)]); err != nil {
			t.Fatalf("the router reset the connection after %d bytes: %v", sent, err)
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the refusal: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("status %d, want 413", resp.StatusCode)
	}
}

// TestExpectContinue: a client that waits for 100 Continue before its
// body gets a 413 instead when the declared body is over the limit, and
// sends nothing; under the limit it gets the 100 and then its answer.
func TestExpectContinue(t *testing.T) {
	eng := startMock(t, mocker.Config{WorkerID: 1})
	cfg := e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.Addr(), Model: e2eModel})
	const maxBody = 64 << 10
	cfg.HTTP.MaxBodyBytes = maxBody
	r := startE2ERouter(t, cfg)
	addr := strings.TrimPrefix(r.url, "http://")
	head := func(size int) string {
		return "POST /v1/completions HTTP/1.1\r\nHost: kvfast\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: " +
			strconv.Itoa(size) + "\r\n\r\n"
	}

	c := dialFrom(t, "127.0.0.1", addr)
	_ = c.SetDeadline(time.Now().Add(e2eWait))
	if _, err := io.WriteString(c, head(maxBody+1)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer to the oversized declaration: %v", err)
	}
	refusal, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d, want 413 before the body", resp.StatusCode)
	}
	if code := checkOpenAIError(t, refusal); code != "body_too_large" {
		t.Errorf("refusal code %q, want body_too_large: %q", code, refusal)
	}
	waitFor(t, "the refusal to be counted", func() bool {
		v, _ := metricValue(r.metrics(t), `kvfast_http_transport_errors_total{reason="body_too_large"}`)
		return v == 1
	})

	body := completionBody(e2eTokens(5, 64), false, 2)
	c = dialFrom(t, "127.0.0.1", addr)
	_ = c.SetDeadline(time.Now().Add(e2eWait))
	if _, err := io.WriteString(c, head(len(body))); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err = http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusContinue {
		t.Fatalf("interim answer %v, %v: want 100 Continue", resp, err)
	}
	if _, err := c.Write(body); err != nil {
		t.Fatal(err)
	}
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d after 100 Continue: %s", resp.StatusCode, got)
	}
	waitReleased(t, r.node)
}

// TestStreamClientThatStopsReadingIsCut: a stream's client that stops
// reading (its receive window full) is cut once a write has waited
// --write-timeout, and its request released and counted as cancelled,
// instead of holding the engine and the booking while it stays connected.
func TestStreamClientThatStopsReadingIsCut(t *testing.T) {
	eng := startMock(t, mocker.Config{WorkerID: 1, Speedup: math.Inf(1)})
	cfg := e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.Addr(), Model: e2eModel})
	cfg.HTTP.WriteTimeout = time.Second
	r := startE2ERouter(t, cfg)
	c := dialFrom(t, "127.0.0.1", strings.TrimPrefix(r.url, "http://"))
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4096)
	}
	// Tens of megabytes of events, far more than the sockets buffer.
	body := completionBody(e2eTokens(9, 32), true, 200000)
	if _, err := io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: kvfast\r\nContent-Type: application/json\r\nContent-Length: "+
		strconv.Itoa(len(body))+"\r\n\r\n"+string(body)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stream to be booked", func() bool { return r.node.Snapshot().Queue.Booked == 1 })
	waitReleased(t, r.node) // the client is still connected, reading nothing
	waitFor(t, "the cut to be counted", func() bool {
		v, _ := metricValue(r.metrics(t), `kvfast_requests_total{endpoint="completions",status="cancelled"}`)
		return v == 1
	})
}

// TestLongStreamOutlivesWriteTimeout: --write-timeout bounds each write,
// not the stream: a stream several times longer that its client reads is
// relayed whole.
func TestLongStreamOutlivesWriteTimeout(t *testing.T) {
	eng := startMock(t, mocker.Config{WorkerID: 1, Speedup: 1}) // a decode step of about 3 ms
	cfg := e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.Addr(), Model: e2eModel})
	cfg.HTTP.WriteTimeout = time.Second
	r := startE2ERouter(t, cfg)
	start := time.Now()
	resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(10, 32), true, 1000), nil)
	if took := time.Since(start); took < 2*cfg.HTTP.WriteTimeout {
		t.Fatalf("the stream took %v: too short to show anything", took)
	}
	if resp.status != http.StatusOK || !bytes.HasSuffix(resp.body, []byte("data: [DONE]\n\n")) {
		t.Fatalf("status %d, stream ends %q", resp.status, resp.body[max(0, len(resp.body)-200):])
	}
	waitReleased(t, r.node)
}

// TestStreamEndsAtDoneThoughTheEngineHolds: an engine that sends [DONE]
// and keeps its response open is waited for briefly, not for the stream
// idle timeout: the client's stream ends, as a success, and the engine is
// not counted as failing for it.
func TestStreamEndsAtDoneThoughTheEngineHolds(t *testing.T) {
	hold := make(chan struct{})
	defer close(hold) // before the engine's cleanup, which waits for its handlers
	eng := startE2EEngine(t, sseHandler(func(w *bufio.Writer) {
		_ = writeFlush(w, concat([][]byte{itemEvent(0, " a", ""), itemEvent(1, " b", "stop"), []byte("data: [DONE]\n\n")}))
		<-hold
	}))
	cfg := e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.addr(), Model: e2eModel})
	cfg.Dispatch.Timeouts.Idle = time.Minute
	r := startE2ERouter(t, cfg)
	start := time.Now()
	resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(11, 32), true, 2), nil)
	if took := time.Since(start); took > cfg.Dispatch.Timeouts.Idle/2 {
		t.Fatalf("the stream took %v to end after [DONE]", took)
	}
	if resp.status != http.StatusOK || !bytes.HasSuffix(resp.body, []byte("data: [DONE]\n\n")) {
		t.Fatalf("status %d: %q", resp.status, resp.body)
	}
	waitReleased(t, r.node)
	waitFor(t, "the stream to be counted as a success", func() bool {
		v, _ := metricValue(r.metrics(t), `kvfast_requests_total{endpoint="completions",status="ok"}`)
		return v == 1
	})
}

// TestHTTP10StreamIsCloseDelimited: an HTTP/1.0 client cannot read chunked
// encoding; its stream has no length and ends with the connection.
func TestHTTP10StreamIsCloseDelimited(t *testing.T) {
	eng := startMock(t, mocker.Config{WorkerID: 1})
	r := startE2ERouter(t, e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.Addr(), Model: e2eModel}))
	body := completionBody(e2eTokens(3, 64), true, 5)
	c := dialFrom(t, "127.0.0.1", strings.TrimPrefix(r.url, "http://"))
	_ = c.SetDeadline(time.Now().Add(e2eWait))
	if _, err := io.WriteString(c, "POST /v1/completions HTTP/1.0\r\nHost: kvfast\r\nContent-Type: application/json\r\nContent-Length: "+
		strconv.Itoa(len(body))+"\r\n\r\n"+string(body)); err != nil {
		t.Fatal(err)
	}
	all, err := io.ReadAll(c) // the response ends when the router closes
	if err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
	head, payload, ok := bytes.Cut(all, []byte("\r\n\r\n"))
	if !ok || !bytes.Contains(head, []byte(" 200 ")) {
		t.Fatalf("response %q", all)
	}
	lower := bytes.ToLower(head)
	if bytes.Contains(lower, []byte("transfer-encoding")) || bytes.Contains(lower, []byte("content-length")) {
		t.Errorf("an HTTP/1.0 stream is framed: %q", head)
	}
	if !bytes.HasPrefix(payload, []byte("data: ")) || !bytes.Contains(payload, []byte("data: [DONE]")) {
		t.Errorf("payload is not the raw event stream: %q", payload)
	}
	waitReleased(t, r.node)
}

// TestObsFoldedHeaderRefused: a folded header line (here Transfer-Encoding,
// which a proxy may ignore while fasthttp reads it as chunked) is refused,
// the connection closed, and the refusal counted as a malformed request.
func TestObsFoldedHeaderRefused(t *testing.T) {
	eng, _, release := blockingEngine(t)
	close(release)
	r := startE2ERouter(t, e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.addr(), Model: e2eModel}))
	resp, body := rawRequest(t, strings.TrimPrefix(r.url, "http://"),
		"POST /v1/completions HTTP/1.1\r\nHost: kvfast\r\nContent-Type: application/json\r\nTransfer-Encoding:\r\n chunked\r\n\r\n"+
			"10\r\n{\"prompt\":[1,2]}\r\n0\r\n\r\n")
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("status %d: %s", resp.StatusCode, body)
	}
	if eng.requests.Load() != 0 {
		t.Error("the folded request reached the engine")
	}
	wantMetric(t, r.metrics(t), `kvfast_http_transport_errors_total{reason="malformed"}`, 1)
}

// TestAdminSurface: with an admin listener the API listener serves no admin
// endpoint under any spelling of its path; the admin listener does, behind
// the admin token; the OpenAI endpoints take API keys; and the engine gets
// the path that was routed, not the client's spelling of it.
func TestAdminSurface(t *testing.T) {
	var mu sync.Mutex
	var paths []string
	eng := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		mu.Lock()
		paths = append(paths, string(ctx.URI().PathOriginal()))
		mu.Unlock()
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"choices":[{"index":0,"text":"x","finish_reason":"stop"}]}`)
	})
	cfg := e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.addr(), Model: e2eModel})
	cfg.AdminListen = "127.0.0.1:0" // served below: the API listener must not serve admin
	cfg.HTTP.AdminToken = "admin-tok"
	cfg.HTTP.APIKeys = []string{"key-one", "key-two"}
	r := startE2ERouter(t, cfg)
	api := strings.TrimPrefix(r.url, "http://")
	adminAddr := serveAdmin(t, r)

	request := func(addr, method, path, auth string, body []byte) (int, []byte) {
		t.Helper()
		c := dialFrom(t, "127.0.0.1", addr)
		_ = c.SetDeadline(time.Now().Add(e2eWait))
		req := method + " " + path + " HTTP/1.1\r\nHost: kvfast\r\nConnection: close\r\n"
		if auth != "" {
			req += "Authorization: Bearer " + auth + "\r\n"
		}
		req += "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + string(body)
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	for _, p := range []string{"/admin/workers", "//admin/workers", "/v1/%2e%2e/admin/workers", "/v1/../admin/workers",
		"/%61dmin/workers", "/metrics", "/v1/./../metrics"} {
		for _, m := range []string{"GET", "POST", "DELETE"} {
			if status, b := request(api, m, p, "admin-tok", nil); status != http.StatusNotFound || !bytes.Contains(b, []byte("--admin-listen")) {
				t.Errorf("API listener: %s %s: %d %s", m, p, status, b)
			}
		}
	}
	if status, b := request(adminAddr, "GET", "/admin/workers", "", nil); status != http.StatusUnauthorized {
		t.Errorf("admin without the token: %d %s", status, b)
	}
	if status, b := request(adminAddr, "GET", "/admin/workers", "wrong", nil); status != http.StatusUnauthorized {
		t.Errorf("admin with a wrong token: %d %s", status, b)
	}
	if status, b := request(adminAddr, "GET", "//admin/workers", "admin-tok", nil); status != http.StatusOK || !bytes.Contains(b, []byte(`"workers"`)) {
		t.Errorf("admin with the token: %d %s", status, b)
	}
	if status, _ := request(adminAddr, "GET", "/metrics", "admin-tok", nil); status != http.StatusOK {
		t.Errorf("metrics on the admin listener: %d", status)
	}
	if status, _ := request(adminAddr, "POST", "/v1/completions", "key-one", completionBody(e2eTokens(4, 8), false, 1)); status != http.StatusNotFound {
		t.Errorf("completions on the admin listener: %d", status)
	}
	if status, _ := request(adminAddr, "GET", "/health", "", nil); status != http.StatusOK {
		t.Errorf("health on the admin listener: %d", status)
	}

	body := completionBody(e2eTokens(5, 8), false, 1)
	for _, key := range []string{"", "key-three", "key-on", "key-one2"} {
		status, b := request(api, "POST", "/v1/completions", key, body)
		if status != http.StatusUnauthorized {
			t.Errorf("API key %q: %d %s", key, status, b)
		} else if code := checkOpenAIError(t, b); code != "invalid_api_key" {
			t.Errorf("API key %q: code %q", key, code)
		}
	}
	if status, _ := request(api, "GET", "/v1/models", "", nil); status != http.StatusUnauthorized {
		t.Errorf("models without a key: %d", status)
	}
	if status, _ := request(api, "GET", "/health", "", nil); status != http.StatusOK {
		t.Errorf("health without a key: %d", status)
	}
	// Refusals are counted, so that key guessing can be alerted on.
	if status, b := request(adminAddr, "GET", "/metrics", "admin-tok", nil); status != http.StatusOK ||
		!bytes.Contains(b, []byte(`kvfast_auth_refused_total{scope="api"} 5`)) ||
		!bytes.Contains(b, []byte(`kvfast_auth_refused_total{scope="admin"} 2`)) {
		t.Errorf("refusals not counted: %d\n%s", status, grepLines(b, "kvfast_auth_refused_total"))
	}
	for _, p := range []string{"/v1/completions", "//v1/completions", "/v1/./completions", "/v1/x/../%63ompletions"} {
		if status, b := request(api, "POST", p, "key-two", body); status != http.StatusOK {
			t.Errorf("POST %s with a key: %d %s", p, status, b)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range paths {
		if p != fastpath.PathCompletions {
			t.Errorf("the engine was sent %q, not the routed path", p)
		}
	}
	if len(paths) != 4 {
		t.Errorf("the engine got %d requests, want 4", len(paths))
	}
}

// grepLines returns the lines of b that contain s.
func grepLines(b []byte, s string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestForwardingLoopIsRefused: requests the router forwards name it in
// X-Kvfast-Via, after the routers the client's request had passed; one
// that comes back naming it (an engine registered at the router's own
// address) is refused with 508 instead of being booked and forwarded
// again, round after round.
func TestForwardingLoopIsRefused(t *testing.T) {
	vias := make(chan string, 4)
	eng := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		vias <- string(ctx.Request.Header.Peek(fastpath.HeaderVia))
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"choices":[{"index":0,"text":"x","finish_reason":"stop"}]}`)
	})
	r := startE2ERouter(t, e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.addr(), Model: e2eModel}))
	body := completionBody(e2eTokens(4, 64), false, 4)
	if resp := r.post(t, fastpath.PathCompletions, body, map[string]string{fastpath.HeaderVia: "other-router"}); resp.status != 200 {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	via := <-vias
	first, own, ok := strings.Cut(via, ",")
	if !ok || first != "other-router" || own == "" {
		t.Fatalf("forwarded %s %q, want the client's routers, then this one's id", fastpath.HeaderVia, via)
	}
	resp := r.post(t, fastpath.PathCompletions, body, map[string]string{fastpath.HeaderVia: "a, " + own})
	if resp.status != 508 || checkOpenAIError(t, resp.body) != "loop_detected" {
		t.Fatalf("a request that came back: status %d: %s", resp.status, resp.body)
	}
	// Named in a second copy of the header (a proxy's own line): a loop
	// all the same.
	c := dialFrom(t, "127.0.0.1", strings.TrimPrefix(r.url, "http://"))
	_ = c.SetDeadline(time.Now().Add(e2eWait))
	if _, err := io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: kvfast\r\nContent-Type: application/json\r\n"+
		fastpath.HeaderVia+": a\r\n"+fastpath.HeaderVia+": "+own+"\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+string(body)); err != nil {
		t.Fatal(err)
	}
	twice, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	twice.Body.Close()
	if twice.StatusCode != 508 {
		t.Fatalf("a request naming the router in a second %s line: status %d, want 508", fastpath.HeaderVia, twice.StatusCode)
	}
	select {
	case v := <-vias:
		t.Fatalf("the looping request reached the engine (%s %q)", fastpath.HeaderVia, v)
	default:
	}
}

// TestLoopingWorkerIsNamed: the router that forwarded a request which came
// back (its worker's endpoint answered 508 loop_detected) names that
// worker and endpoint in its log; the router it came back to cannot.
func TestLoopingWorkerIsNamed(t *testing.T) {
	eng := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(fasthttp.StatusLoopDetected)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"loop","type":"server_error","code":"loop_detected"}}`)
	})
	logs := newLogCapture()
	cfg := e2eConfig(node.StaticWorker{ID: 41, Endpoint: eng.addr(), Model: e2eModel})
	cfg.Logger = slog.New(logs)
	r := startE2ERouter(t, cfg)
	if resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(4, 64), false, 4), nil); resp.status != 508 {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	line, ok := logs.find("508 loop_detected")
	if !ok || !strings.Contains(line, "worker=41") || !strings.Contains(line, "endpoint="+eng.addr()) {
		t.Fatalf("the looping worker is not named: %q", line)
	}
}

// TestMalformedAnswerIsNamed: a worker URL that names some other HTTP
// service answers 200 with what no engine sends. The client's 502 says
// the answer was malformed, not only that a connection failed, and the
// router warns, naming the worker, where a broken connection is logged
// at debug level only.
func TestMalformedAnswerIsNamed(t *testing.T) {
	eng := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/html")
		ctx.SetBodyString("<html>a dashboard</html>")
	})
	logs := newLogCapture()
	cfg := e2eConfig(node.StaticWorker{ID: 42, Endpoint: eng.addr(), Model: e2eModel})
	cfg.Logger = slog.New(logs)
	r := startE2ERouter(t, cfg)
	resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(5, 64), false, 4), nil)
	if resp.status != http.StatusBadGateway || checkOpenAIError(t, resp.body) != "engine_failed" || !bytes.Contains(resp.body, []byte("malformed answer")) {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	line, ok := logs.find("no OpenAI-compatible engine sends")
	if !ok || !strings.Contains(line, "worker=42") || !strings.Contains(line, "endpoint="+eng.addr()) || !strings.Contains(line, "not a JSON object") {
		t.Fatalf("the worker that answered so is not named: %q", line)
	}
	waitReleased(t, r.node)
}

// TestFailingEngineIsNamed: an engine whose requests time out, below the
// ejection thresholds, is named in a warning once a minute, where each
// failure had been logged at debug level only and an operator chasing
// 504s could not tell which engine sent them.
func TestFailingEngineIsNamed(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	eng := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		select {
		case <-release:
		case <-time.After(e2eWait):
		}
	})
	logs := newLogCapture()
	cfg := e2eConfig(node.StaticWorker{ID: 43, Endpoint: eng.addr(), Model: e2eModel})
	cfg.Dispatch.Timeouts.FirstByte = 50 * time.Millisecond
	cfg.Logger = slog.New(logs)
	r := startE2ERouter(t, cfg)
	for i := range 2 {
		resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(uint32(6+i), 64), false, 4), nil)
		if resp.status != http.StatusGatewayTimeout || checkOpenAIError(t, resp.body) != "engine_timeout" {
			t.Fatalf("request %d: status %d: %s", i, resp.status, resp.body)
		}
	}
	const msg = "an engine's request failed"
	line, ok := logs.find(msg)
	if !ok || !strings.HasPrefix(line, "WARN") || !strings.Contains(line, "worker=43") || !strings.Contains(line, "endpoint="+eng.addr()) ||
		!strings.Contains(line, "first-byte timeout") {
		t.Fatalf("the failing worker is not named in a warning: %q", line)
	}
	if n := logs.count(msg); n != 1 {
		t.Errorf("two failures within a minute logged %d warnings, want 1", n)
	}
	waitReleased(t, r.node)
}

// TestTLSOnPlainHTTPIsRefusedAtOnce: a client that speaks TLS to the
// plain-HTTP listener (an https:// URL) has its handshake fail as soon as
// it is sent, with the error TLS libraries give for a plain-HTTP server,
// not after the header timeout; the raw answer is a 400 naming the
// mistake, counted apart from requests; the listener serves the next
// client as before.
func TestTLSOnPlainHTTPIsRefusedAtOnce(t *testing.T) {
	cfg := e2eConfig()
	cfg.HTTP.HeaderTimeout = time.Hour // far past the test's own wait: only a refusal ends it
	r := startE2ERouter(t, cfg)
	addr := strings.TrimPrefix(r.url, "http://")

	c := dialFrom(t, "127.0.0.1", addr)
	_ = c.SetDeadline(time.Now().Add(e2eWait))
	err := tls.Client(c, &tls.Config{ServerName: "kvfast", MinVersion: tls.VersionTLS12}).Handshake()
	var notTLS tls.RecordHeaderError
	if !errors.As(err, &notTLS) || !bytes.HasPrefix(notTLS.RecordHeader[:], []byte("HTTP/")) {
		t.Fatalf("handshake with the plain-HTTP listener: %v, want a record header error quoting an HTTP answer", err)
	}

	raw := dialFrom(t, "127.0.0.1", addr)
	_ = raw.SetDeadline(time.Now().Add(e2eWait))
	// A ClientHello's record header and a few bytes of its body.
	if _, err := raw.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03}); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(raw), nil)
	if err != nil {
		t.Fatalf("the raw answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), `"code":"tls_on_plain_http"`) {
		t.Errorf("the raw answer: %d %s", resp.StatusCode, body)
	}

	if status, err := getFrom(t, "127.0.0.1", addr, fastpath.PathHealth); status != http.StatusOK {
		t.Fatalf("a plain client after them: status %d, %v", status, err)
	}
	m := r.metrics(t)
	wantMetric(t, m, `kvfast_http_transport_errors_total{reason="tls_handshake"}`, 2)
	wantMetric(t, m, `kvfast_http_transport_errors_total{reason="malformed"}`, 0)
}

// TestEdgeRefusesBeforeTheBody: what the edge can judge from the header it
// answers before reading the body. A multipart body was parsed whole by
// fasthttp (into memory and temporary files) before the handler ran, past
// --max-body-bytes, the body budget and the API key; a client asking to
// send its body (Expect: 100-continue) without a valid key was told to go
// on, and refused only once the body came.
func TestEdgeRefusesBeforeTheBody(t *testing.T) {
	eng := startMock(t, mocker.Config{WorkerID: 1})
	cfg := e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.Addr(), Model: e2eModel})
	const maxBody = 64 << 10
	cfg.HTTP.MaxBodyBytes = maxBody
	cfg.HTTP.APIKeys = []string{"key-one"}
	r := startE2ERouter(t, cfg)
	addr := strings.TrimPrefix(r.url, "http://")
	answer := func(head, body string) (int, string) {
		t.Helper()
		c := dialFrom(t, "127.0.0.1", addr)
		_ = c.SetDeadline(time.Now().Add(e2eWait))
		if _, err := io.WriteString(c, head+body); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no answer before the rest of the body: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, checkOpenAIError(t, b)
	}
	// Four times the limit declared, a sixteenth of it sent: the answer
	// must come without the rest.
	multipart := "POST /v1/completions HTTP/1.1\r\nHost: kvfast\r\nAuthorization: Bearer key-one\r\n" +
		"Content-Type: multipart/form-data; boundary=xyz\r\nContent-Length: " + strconv.Itoa(4*maxBody) + "\r\n\r\n"
	part := "--xyz\r\nContent-Disposition: form-data; name=\"f\"; filename=\"a\"\r\n\r\n" + strings.Repeat("A", maxBody/16)
	if status, code := answer(multipart, part); status != http.StatusRequestEntityTooLarge || code != "body_too_large" {
		t.Errorf("an oversized multipart body: %d %s; want 413 body_too_large before it is read", status, code)
	}
	unkeyed := "POST /v1/completions HTTP/1.1\r\nHost: kvfast\r\nContent-Type: multipart/form-data; boundary=xyz\r\n" +
		"Content-Length: " + strconv.Itoa(maxBody) + "\r\n\r\n"
	if status, code := answer(unkeyed, part); status != http.StatusUnauthorized || code != "invalid_api_key" {
		t.Errorf("a multipart body without a key: %d %s; want 401 invalid_api_key before it is read", status, code)
	}
	expect := "POST /v1/completions HTTP/1.1\r\nHost: kvfast\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n" +
		"Content-Length: 1000\r\n\r\n"
	if status, code := answer(expect, ""); status != http.StatusUnauthorized || code != "invalid_api_key" {
		t.Errorf("Expect: 100-continue without a key: %d %s; want 401 invalid_api_key instead of 100", status, code)
	}
	if status, code := answer(strings.Replace(expect, "Expect:", "Authorization: Bearer key-two\r\nExpect:", 1), ""); status != http.StatusUnauthorized {
		t.Errorf("Expect: 100-continue with a wrong key: %d %s; want 401", status, code)
	}
}

// TestConnectionLimitAnswersAsTheAPI: a connection over --max-conns is
// answered 503 in the OpenAI error format, with Retry-After; it got
// fasthttp's own plain-text 503, which clients cannot parse. The admin
// listener keeps its own bound, so an operator still gets in.
func TestConnectionLimitAnswersAsTheAPI(t *testing.T) {
	eng := startMock(t, mocker.Config{WorkerID: 1})
	cfg := e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.Addr(), Model: e2eModel})
	cfg.AdminListen = "127.0.0.1:0"
	cfg.HTTP.MaxConns = 2
	cfg.HTTP.MaxConnsPerIP = 0
	r := startE2ERouter(t, cfg)
	addr := strings.TrimPrefix(r.url, "http://")
	adminAddr := serveAdmin(t, r)
	for range cfg.HTTP.MaxConns {
		// Held open; one request each proves the router accepted it.
		c := dialFrom(t, "127.0.0.1", addr)
		_ = c.SetDeadline(time.Now().Add(e2eWait))
		if _, err := io.WriteString(c, "GET /health HTTP/1.1\r\nHost: kvfast\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("a connection within the limit: %v %v", resp, err)
		}
		resp.Body.Close()
	}
	c := dialFrom(t, "127.0.0.1", addr)
	_ = c.SetDeadline(time.Now().Add(e2eWait))
	_, _ = io.WriteString(c, "GET /health HTTP/1.1\r\nHost: kvfast\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("the connection over the limit: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
		checkOpenAIError(t, b) != "too_many_connections" {
		t.Errorf("over --max-conns: %d, Retry-After %q, %s; want 503 too_many_connections with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	if status, err := getFrom(t, "127.0.0.1", adminAddr, fastpath.PathHealth); status != http.StatusOK {
		t.Errorf("the admin listener while the API's connections are all taken: %d %v", status, err)
	}
}
