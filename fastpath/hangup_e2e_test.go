package fastpath_test

import (
	"net"
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
