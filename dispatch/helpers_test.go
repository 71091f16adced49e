package dispatch

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvfast/kvfast/workers"
	"github.com/valyala/fasthttp"
)

type nopObserver struct{}

func (nopObserver) OnDispatched()     {}
func (nopObserver) OnFirstToken()     {}
func (nopObserver) OnItem(int)        {}
func (nopObserver) OnComplete([]byte) {}
func (nopObserver) OnAbort(error)     {}

// recorder is an Observer that logs its calls and checks the protocol:
// nothing after the terminal call, and exactly one terminal call.
type recorder struct {
	mu       sync.Mutex
	log      []string
	items    int
	reason   string
	abortErr error
	terminal chan struct{}
	// atComplete, if set, runs inside OnComplete (to check ordering).
	atComplete func()
}

func newRecorder() *recorder { return &recorder{terminal: make(chan struct{})} }

func (r *recorder) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.terminal:
		panic("observer called after its terminal call: " + s)
	default:
	}
	r.log = append(r.log, s)
}

func (r *recorder) OnDispatched() { r.add("dispatched") }
func (r *recorder) OnFirstToken() { r.add("first") }
func (r *recorder) OnItem(n int) {
	r.add("item")
	r.mu.Lock()
	r.items += n
	r.mu.Unlock()
}

func (r *recorder) OnComplete(reason []byte) {
	if r.atComplete != nil {
		r.atComplete()
	}
	r.add("complete:" + string(reason))
	r.mu.Lock()
	r.reason = string(reason)
	r.mu.Unlock()
	close(r.terminal)
}

func (r *recorder) OnAbort(err error) {
	if err == nil {
		panic("OnAbort(nil)")
	}
	r.add("abort")
	r.mu.Lock()
	r.abortErr = err
	r.mu.Unlock()
	close(r.terminal)
}

// wait returns once the terminal call happened, failing the test after 10s.
func (r *recorder) wait(t *testing.T) {
	t.Helper()
	select {
	case <-r.terminal:
	case <-time.After(10 * time.Second):
		t.Fatalf("no terminal observer call; log %v", r.snapshot())
	}
}

func (r *recorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.log...)
}

// summary compresses the log: runs of "item" become "item×n".
func (r *recorder) summary() string {
	var out []string
	n := 0
	for _, s := range r.snapshot() {
		if s == "item" {
			n++
			continue
		}
		if n > 0 {
			out = append(out, fmt.Sprintf("item×%d", n))
			n = 0
		}
		out = append(out, s)
	}
	if n > 0 {
		out = append(out, fmt.Sprintf("item×%d", n))
	}
	return strings.Join(out, " ")
}

func (r *recorder) aborted() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.abortErr
}

// serve runs a fasthttp server for h on a loopback port until the test ends.
func serve(t testing.TB, h fasthttp.RequestHandler, tune func(*fasthttp.Server)) string {
	t.Helper()
	return serveAt(t, "127.0.0.1:0", h, tune)
}

// serveAt is serve on the listen address addr.
func serveAt(t testing.TB, addr string, h fasthttp.RequestHandler, tune func(*fasthttp.Server)) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &fasthttp.Server{Handler: h, CloseOnShutdown: true}
	if tune != nil {
		tune(s)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(ln)
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.ShutdownWithContext(ctx)
		<-done
	})
	return ln.Addr().String()
}

// sseEngine streams events, waiting gap between them, and reports on
// cancelled if a flush to the router fails.
func sseEngine(events []string, gap time.Duration, cancelled chan<- struct{}) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/health" {
			return
		}
		ctx.SetContentType("text/event-stream")
		ctx.Response.Header.Set("X-Engine", "stand-in")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for _, ev := range events {
				_, _ = w.WriteString(ev)
				if err := w.Flush(); err != nil {
					if cancelled != nil {
						cancelled <- struct{}{}
					}
					return
				}
				if gap > 0 {
					time.Sleep(gap)
				}
			}
		})
	}
}

// chunk renders an OpenAI completion chunk; a non-empty finish ends it.
func chunk(i int, text, finish string) string {
	fr := "null"
	if finish != "" {
		fr = `"` + finish + `"`
	}
	return fmt.Sprintf(`data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m",`+
		`"choices":[{"index":0,"text":%q,"logprobs":null,"finish_reason":%s}],"usage":null}`+"\n\n", text+fmt.Sprint(i), fr)
}

// vllmStream is a stream shaped like vLLM's: n items, the last terminal,
// a usage chunk, and [DONE].
func vllmStream(n int) []string {
	var evs []string
	for i := 0; i < n; i++ {
		fin := ""
		if i == n-1 {
			fin = "stop"
		}
		evs = append(evs, chunk(i, "tok", fin))
	}
	evs = append(evs,
		`data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":`+fmt.Sprint(n)+`}}`+"\n\n",
		"data: [DONE]\n\n")
	return evs
}

// front is the server flow the fastpath package will run, reduced to
// dispatch: forward to slot, relay streams, read plain bodies.
func front(pool *Pool, slot workers.Slot, obs func() Observer) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		call := pool.AcquireCall()
		call.SetRequest(ctx.RequestURI(), ctx.PostBody())
		var o Observer
		if obs != nil {
			o = obs()
		}
		if err := call.Do(slot, o); err != nil {
			call.Release()
			ctx.SetStatusCode(ErrorStatus(err))
			ctx.SetContentType("application/json")
			ctx.SetBody(AppendErrorJSON(nil, err))
			return
		}
		if err := call.AwaitStream(); err != nil {
			call.Release()
			ctx.SetStatusCode(ErrorStatus(err))
			ctx.SetContentType("application/json")
			ctx.SetBody(AppendErrorJSON(nil, err))
			return
		}
		call.CopyHeaders(&ctx.Response.Header)
		if call.IsEventStream() {
			ctx.SetBodyStreamWriter(call.StreamWriter())
			return
		}
		body, err := call.ReadBody()
		if err != nil {
			call.Release()
			ctx.Response.Header.Reset()
			ctx.SetStatusCode(ErrorStatus(err))
			ctx.SetContentType("application/json")
			ctx.SetBody(AppendErrorJSON(nil, err))
			return
		}
		ctx.SetBody(body)
		call.Release()
	}
}

// post sends body to addr and returns the status, headers and whole body.
func post(t testing.TB, addr, uri, body string) (int, *fasthttp.ResponseHeader, []byte) {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + uri)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.SetBodyString(body)
	if err := fasthttp.DoTimeout(req, resp, 20*time.Second); err != nil {
		t.Fatalf("POST %s: %v", uri, err)
	}
	h := new(fasthttp.ResponseHeader)
	resp.Header.CopyTo(h)
	return resp.StatusCode(), h, bytes.Clone(resp.Body())
}

// noHealth disables active checks, for tests about forwarding.
var noHealth = HealthConfig{Interval: -1}

func mustAdd(t testing.TB, p *Pool, slot workers.Slot, addr string) {
	t.Helper()
	if _, err := p.Add(slot, addr); err != nil {
		t.Fatal(err)
	}
}
