package fastpath_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/node"
)

// slowEngine answers nothing until the test calls the returned func: a
// generation that takes longer than any client is willing to wait. (The
// router closes its connection when the client leaves, but a fasthttp
// handler does not notice: the test lets it return before the engine
// stops. TestDepartedClientCancelsEngine checks the closed connection.)
func slowEngine(t *testing.T) (*e2eEngine, func()) {
	release := make(chan struct{})
	e := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		select {
		case <-release:
		case <-time.After(time.Minute):
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"choices":[{"index":0,"text":"late","finish_reason":"stop"}]}`)
	})
	return e, func() { close(release) }
}

// sendRaw writes a non-streaming completion on a connection of its own,
// which the test closes to play a client that leaves.
func sendRaw(t *testing.T, r *e2eRouter, body []byte) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	req := "POST " + fastpath.PathCompletions + " HTTP/1.1\r\nHost: kvfast\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + string(body)
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestDroppedNonStreamingRequestFreesBooking: the client leaves while the
// engine is still silent; its booking is released then, not when the
// engine answers.
func TestDroppedNonStreamingRequestFreesBooking(t *testing.T) {
	eng, answer := slowEngine(t)
	r := startE2ERouter(t, e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.addr(), Model: e2eModel}))
	defer answer()
	c := sendRaw(t, r, completionBody(e2eTokens(21, 64), false, 4))
	waitFor(t, "the engine to receive the request", func() bool { return eng.requests.Load() == 1 })
	if v := workerView(t, r.node, 1, 0); v.Requests != 1 {
		t.Fatalf("the request in flight is not booked: %+v", v)
	}
	c.Close()
	waitReleased(t, r.node)
}

// TestQueuedClientThatLeavesFreesItsSlot: a request waiting in the
// admission queue leaves it when its client hangs up, long before the
// queue timeout.
func TestQueuedClientThatLeavesFreesItsSlot(t *testing.T) {
	eng, answer := slowEngine(t)
	cfg := e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.addr(), Model: e2eModel})
	cfg.Sched.Busy.PrefillTokens = 1 // one request in prefill makes the worker busy
	cfg.HTTP.QueueTimeout = time.Hour
	r := startE2ERouter(t, cfg)
	defer answer()
	first := sendRaw(t, r, completionBody(e2eTokens(22, 64), false, 4))
	waitFor(t, "the engine to receive the first request", func() bool { return eng.requests.Load() == 1 })
	queued := sendRaw(t, r, completionBody(e2eTokens(23, 64), false, 4))
	waitFor(t, "the second request to queue", func() bool { return r.node.Snapshot().Queue.Waiting == 1 })
	queued.Close()
	waitFor(t, "the departed client to leave the queue", func() bool { return r.node.Snapshot().Queue.Waiting == 0 })
	if n := eng.requests.Load(); n != 1 {
		t.Errorf("the engine received %d requests; the departed one must not be sent", n)
	}
	first.Close()
	waitReleased(t, r.node)
}

// TestShutdownDrainsTheAdmissionQueue: a request waiting in the admission
// queue when Shutdown begins keeps its place while the router drains, and
// is served when the worker frees up before the deadline. fasthttp closes
// its RequestCtx's Done when Shutdown begins, and a wait under it was
// answered 503 no_worker_available at once, telling on-call that healthy
// workers were down.
func TestShutdownDrainsTheAdmissionQueue(t *testing.T) {
	eng, answer := slowEngine(t)
	cfg := e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.addr(), Model: e2eModel})
	cfg.Sched.Busy.PrefillTokens = 1 // one request in prefill makes the worker busy
	cfg.HTTP.QueueTimeout = time.Hour
	r := startE2ERouter(t, cfg)
	answered := false
	defer func() {
		if !answered {
			answer()
		}
	}()
	first := sendRaw(t, r, completionBody(e2eTokens(24, 64), false, 4))
	waitFor(t, "the engine to receive the first request", func() bool { return eng.requests.Load() == 1 })
	queued := sendRaw(t, r, completionBody(e2eTokens(25, 64), false, 4))
	waitFor(t, "the second request to queue", func() bool { return r.node.Snapshot().Queue.Waiting == 1 })

	shutdownDone := r.beginShutdown(t)
	// Nothing may answer the queued request while the engine holds the
	// first: a read that times out is the pass. (Under heavy load a wrong
	// answer could come later than this window and go unseen here; it
	// would still fail the status check below.)
	_ = queued.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	var one [1]byte
	if n, err := queued.Read(one[:]); n > 0 || !readTimedOut(err) {
		t.Fatalf("the queued request was answered while the router drained (read %d bytes, %v); it must wait for the worker", n, err)
	}
	_ = queued.SetReadDeadline(time.Time{})
	answered = true
	answer()
	for name, c := range map[string]net.Conn{"first": first, "queued": queued} {
		_ = c.SetReadDeadline(time.Now().Add(e2eWait))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("the %s request's answer: %v", name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("the %s request got %d %s during the drain, want 200", name, resp.StatusCode, body)
		}
	}
	select {
	case err := <-shutdownDone:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(e2eWait):
		t.Fatal("Shutdown did not return after the queue drained")
	}
	waitReleased(t, r.node)
}

func readTimedOut(err error) bool {
	ne, ok := errors.AsType[net.Error](err)
	return ok && ne.Timeout()
}
