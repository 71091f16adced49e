package fastpath_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/node"
	"github.com/kvfast/kvfast/sched"
)

// A request that waits in the admission queue longer than the queue
// timeout is refused with 503 and Retry-After, leaves the queue, and never
// reaches the engine; the request holding the worker is unaffected.
func TestQueueTimeoutRefusesAndLeavesNoTrace(t *testing.T) {
	release := make(chan struct{})
	eng := startE2EEngine(t, sseHandler(func(w *bufio.Writer) {
		<-release // hold the first request in prefill, so the worker stays busy
		_ = writeFlush(w, itemEvent(0, " a", "stop"))
		_ = writeFlush(w, []byte(doneEvent))
	}))
	cfg := e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.addr(), Model: e2eModel})
	cfg.Sched.Busy = sched.BusyThresholds{PrefillTokens: 10}
	cfg.HTTP.QueueTimeout = 200 * time.Millisecond
	r := startE2ERouter(t, cfg)
	first, cancelFirst := r.openStreamAsync(t, completionBody(e2eTokens(1, 32), true, 4))
	defer cancelFirst()
	waitFor(t, "the first request to be booked", func() bool { return workerView(t, r.node, 1, 0).Requests == 1 })

	start := time.Now()
	resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(2, 32), false, 4), nil)
	if resp.status != http.StatusServiceUnavailable || checkOpenAIError(t, resp.body) != "queue_timeout" {
		t.Fatalf("queued request: status %d: %s", resp.status, resp.body)
	}
	if waited := time.Since(start); waited < 150*time.Millisecond {
		t.Fatalf("refused after %v, before the queue timeout", waited)
	}
	if resp.header.Get("Retry-After") == "" {
		t.Error("queue timeout without Retry-After")
	}
	if n := eng.requests.Load(); n != 1 {
		t.Fatalf("the engine got %d requests; the timed-out one must not reach it", n)
	}
	if v := r.node.Snapshot(); v.Queue.Waiting != 0 {
		t.Fatalf("%d requests still queued", v.Queue.Waiting)
	}
	close(release)
	res := <-first
	if res.err != nil {
		t.Fatal(res.err)
	}
	_, _ = io.Copy(io.Discard, res.resp.Body)
	res.resp.Body.Close()
	waitReleased(t, r.node)
}

// With n > 1 the first finish_reason ends one choice, not the request: its
// load stays booked until the stream ends.
func TestSeveralChoicesHoldLoadUntilStreamEnd(t *testing.T) {
	firstDone := make(chan struct{})
	rest := make(chan struct{})
	eng := startE2EEngine(t, sseHandler(func(w *bufio.Writer) {
		_ = writeFlush(w, choiceEvent(0, " a", ""))
		_ = writeFlush(w, choiceEvent(0, " b", "stop")) // choice 0 finishes
		close(firstDone)
		<-rest
		_ = writeFlush(w, choiceEvent(1, " c", "length"))
		_ = writeFlush(w, []byte(doneEvent))
	}))
	r := startE2ERouter(t, e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.addr(), Model: e2eModel}))
	body := []byte(strings.Replace(string(completionBody(e2eTokens(4, 32), true, 4)), `"stream":true`, `"stream":true,"n":2`, 1))
	res, cancel := r.openStreamAsync(t, body)
	defer cancel()
	<-firstDone
	got := <-res
	if got.err != nil {
		t.Fatal(got.err)
	}
	// Read until choice 0's finish has reached the client: the relay has
	// passed the first finish_reason on, and only then is the booking
	// worth checking.
	br := bufio.NewReader(got.resp.Body)
	var seen []byte
	for !bytes.Contains(seen, []byte(`"finish_reason":"stop"`)) {
		line, err := br.ReadBytes('\n')
		if err != nil {
			t.Fatalf("the stream ended before choice 0 finished: %v (%q)", err, seen)
		}
		seen = append(seen, line...)
	}
	if w := workerView(t, r.node, 1, 0); w.Requests != 1 {
		t.Fatalf("after choice 0 finished, %d requests booked; choice 1 is still running", w.Requests)
	}
	close(rest)
	tail, _ := io.ReadAll(br)
	got.resp.Body.Close()
	all := append(seen, tail...)
	if !bytes.HasSuffix(all, []byte(doneEvent)) {
		t.Fatalf("stream incomplete: %q", all)
	}
	waitReleased(t, r.node)
}

func choiceEvent(index int, text, finish string) []byte {
	fr := "null"
	if finish != "" {
		fr = `"` + finish + `"`
	}
	return []byte(`data: {"id":"cmpl-n","object":"text_completion","model":"` + e2eModel +
		`","choices":[{"index":` + string(rune('0'+index)) + `,"text":"` + text + `","finish_reason":` + fr + "}]}\n\n")
}

// A pin to a worker that exists but cannot serve now is a 503 to retry, not
// a 404: the pin is right, the worker is down.
func TestPinToUnhealthyWorkerIsUnavailable(t *testing.T) {
	eng := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`)
	})
	r := startE2ERouter(t, e2eConfig(
		node.StaticWorker{ID: 1, Endpoint: eng.addr(), Model: e2eModel},
		node.StaticWorker{ID: 2, Endpoint: eng.addr(), Model: e2eModel},
	))
	slot, ok := r.node.Scheduler().Resolve(2, 0)
	if !ok {
		t.Fatal("worker 2 not in the worker set")
	}
	r.node.Scheduler().SetHealthy(slot, false)
	resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(5, 16), false, 2),
		map[string]string{fastpath.HeaderWorker: "2", fastpath.HeaderDPRank: "0"})
	if resp.status != http.StatusServiceUnavailable || resp.header.Get("Retry-After") == "" {
		t.Fatalf("pin to an unhealthy worker: %d %s", resp.status, resp.body)
	}
	checkOpenAIError(t, resp.body)
	if resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(5, 16), false, 2),
		map[string]string{fastpath.HeaderWorker: "9", fastpath.HeaderDPRank: "0"}); resp.status != http.StatusNotFound {
		t.Fatalf("pin to an unknown worker: %d %s", resp.status, resp.body)
	}
}

// Refusals carry the request id too, so a client can quote it.
func TestRequestIDOnRefusals(t *testing.T) {
	r := startE2ERouter(t, e2eConfig())
	resp := r.post(t, fastpath.PathCompletions, []byte(`{"prompt":`), map[string]string{fastpath.HeaderRequestID: "req-42"})
	if resp.status != http.StatusBadRequest || resp.header.Get(fastpath.HeaderRequestID) != "req-42" {
		t.Fatalf("status %d, request id %q", resp.status, resp.header.Get(fastpath.HeaderRequestID))
	}
	// An id that is not printable ASCII is replaced: it would go into
	// the log and to the engine as it came.
	resp = r.post(t, fastpath.PathCompletions, []byte(`{"prompt":`), map[string]string{fastpath.HeaderRequestID: "ab\xffcd"})
	if !strings.HasPrefix(resp.header.Get(fastpath.HeaderRequestID), "kvf-") {
		t.Fatalf("a request id with a byte over 0x7e: echoed as %q, want one of the router's", resp.header.Get(fastpath.HeaderRequestID))
	}
	resp = r.post(t, fastpath.PathCompletions, []byte(`{"prompt":`), nil)
	if !strings.HasPrefix(resp.header.Get(fastpath.HeaderRequestID), "kvf-") {
		t.Fatalf("generated request id %q", resp.header.Get(fastpath.HeaderRequestID))
	}
	// Refused before the exchange reads the request (its method, its
	// key, its size), the client's id is echoed all the same.
	if resp := r.do(t, http.MethodGet, fastpath.PathCompletions, nil, map[string]string{fastpath.HeaderRequestID: "req-get"}); resp.status != http.StatusMethodNotAllowed ||
		resp.header.Get(fastpath.HeaderRequestID) != "req-get" {
		t.Errorf("GET: status %d, request id %q", resp.status, resp.header.Get(fastpath.HeaderRequestID))
	}
	cfg := e2eConfig()
	cfg.HTTP.APIKeys = []string{"sk-test"}
	cfg.HTTP.MaxBodyBytes = 1 << 10
	keyed := startE2ERouter(t, cfg)
	if resp := keyed.post(t, fastpath.PathCompletions, []byte(`{"prompt":"x"}`), map[string]string{fastpath.HeaderRequestID: "req-401"}); resp.status != http.StatusUnauthorized ||
		resp.header.Get(fastpath.HeaderRequestID) != "req-401" {
		t.Errorf("no key: status %d, request id %q", resp.status, resp.header.Get(fastpath.HeaderRequestID))
	}
	big := []byte(`{"prompt":"` + strings.Repeat("x", 2<<10) + `"}`)
	if resp := keyed.post(t, fastpath.PathCompletions, big, map[string]string{"Authorization": "Bearer sk-test", fastpath.HeaderRequestID: "req-413"}); resp.status != http.StatusRequestEntityTooLarge ||
		resp.header.Get(fastpath.HeaderRequestID) != "req-413" {
		t.Errorf("body too large: status %d, request id %q", resp.status, resp.header.Get(fastpath.HeaderRequestID))
	}
	// Another router process (a second one on the node, or this one
	// restarted) makes other ids: vLLM takes them for its own.
	other := startE2ERouter(t, e2eConfig())
	again := other.post(t, fastpath.PathCompletions, []byte(`{"prompt":`), nil)
	if a, b := resp.header.Get(fastpath.HeaderRequestID), again.header.Get(fastpath.HeaderRequestID); a == b {
		t.Errorf("two routers' first requests both got id %q", a)
	}
}

type streamResult struct {
	resp *http.Response
	err  error
}

// openStreamAsync posts body and delivers the response (headers read)
// when it comes; cancel abandons it.
func (r *e2eRouter) openStreamAsync(t *testing.T, body []byte) (<-chan streamResult, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url+fastpath.PathCompletions, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan streamResult, 1)
	go func() {
		resp, err := r.client.Do(req)
		out <- streamResult{resp, err}
	}()
	return out, cancel
}
