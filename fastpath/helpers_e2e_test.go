package fastpath_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/internal/rig"
	"github.com/kvfast/kvfast/internal/rig/rigtest"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
	"github.com/kvfast/kvfast/radix"
)

// The end-to-end tests run a whole router on loopback (internal/rig: a
// node serving on an ephemeral port, with mock engines registered in its
// segment when a test asks for them), mock engines the test starts
// itself (mocker.Start), and e2eEngine, a fasthttp stand-in whose
// behaviour each test scripts, for the faults a real engine cannot be made
// to produce on cue. Everything a test starts, t.Cleanup stops.

const e2eModel = "mock" // mocker's default model, also served by e2eEngine workers

// e2eWait bounds every wait for something the router does asynchronously
// (releasing a guard after a relay, ingesting events); generous, because
// the race detector on a shared 2-core machine is slow.
const e2eWait = rig.DefaultWaitTimeout

// e2eRouter is a running router and a client for it.
type e2eRouter struct {
	rig    *rig.Rig
	node   *node.Node
	url    string // http://127.0.0.1:port
	client *http.Client
}

// e2eConfig is the tests' router configuration (rigtest.Config) with
// static workers.
func e2eConfig(static ...node.StaticWorker) node.Config {
	cfg := rigtest.Config()
	cfg.Static = static
	return cfg
}

// startE2ERouter serves cfg without a segment: static workers only.
func startE2ERouter(t *testing.T, cfg node.Config) *e2eRouter {
	t.Helper()
	return startE2ERig(t, rig.Config{Node: cfg, NoSegment: true})
}

// startE2ERig starts a rig and a client for its router; the client's
// idle connections are closed before the rig stops.
func startE2ERig(t *testing.T, cfg rig.Config) *e2eRouter {
	t.Helper()
	rg := rigtest.Start(t, cfg)
	tr := &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 16}
	t.Cleanup(tr.CloseIdleConnections) // before the rig's teardown: cleanups run last-in first-out
	return &e2eRouter{rig: rg, node: rg.Node, url: rg.URL, client: &http.Client{Transport: tr}}
}

// e2eResponse is a whole response as a client saw it.
type e2eResponse struct {
	status int
	header http.Header
	body   []byte
}

func (r *e2eRouter) do(t *testing.T, method, path string, body []byte, hdr map[string]string) e2eResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, r.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, path, err)
	}
	return e2eResponse{status: resp.StatusCode, header: resp.Header, body: b}
}

func (r *e2eRouter) post(t *testing.T, path string, body []byte, hdr map[string]string) e2eResponse {
	t.Helper()
	return r.do(t, http.MethodPost, path, body, hdr)
}

func (r *e2eRouter) get(t *testing.T, path string) e2eResponse {
	t.Helper()
	return r.do(t, http.MethodGet, path, nil, nil)
}

// openStream starts a request and returns the response with its body
// unread; cancel abandons it (the client going away).
func (r *e2eRouter) openStream(t *testing.T, path string, body []byte, hdr map[string]string) (*http.Response, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url+path, bytes.NewReader(body))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("POST %s: %v", path, err)
	}
	t.Cleanup(func() { resp.Body.Close(); cancel() })
	return resp, cancel
}

// metrics scrapes /metrics.
func (r *e2eRouter) metrics(t *testing.T) string {
	t.Helper()
	resp := r.get(t, fastpath.PathMetrics)
	if resp.status != http.StatusOK {
		t.Fatalf("GET /metrics: status %d: %s", resp.status, resp.body)
	}
	return string(resp.body)
}

// metricValue finds one sample in Prometheus text output. series is the
// name with its labels as the exposition writes them (sorted by name), e.g.
// kvfast_requests_total{endpoint="completions",status="ok"}.
func metricValue(text, series string) (float64, bool) {
	for line := range strings.Lines(text) {
		line = strings.TrimRight(line, "\n")
		rest, ok := strings.CutPrefix(line, series)
		if !ok || !strings.HasPrefix(rest, " ") {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		return v, err == nil
	}
	return 0, false
}

func wantMetric(t *testing.T, text, series string, want float64) {
	t.Helper()
	got, ok := metricValue(text, series)
	if !ok {
		t.Errorf("/metrics has no sample %s", series)
		return
	}
	if got != want {
		t.Errorf("%s = %v, want %v", series, got, want)
	}
}

// reservationsReleased reports whether nothing is booked on any worker and
// every booking made so far was released.
func reservationsReleased(v fastpath.Snapshot) bool {
	for _, w := range v.Workers {
		if w.Requests != 0 || w.ActiveBlocks != 0 || w.PrefillTokens != 0 || w.OutputBlocks != 0 {
			return false
		}
	}
	return v.Queue.Booked == v.Queue.Released && v.Queue.Waiting == 0
}

// waitReleased waits until the router holds no reservation: a stream's guard
// is released on the relay goroutine, shortly after the client's last byte.
func waitReleased(t *testing.T, n *node.Node) {
	t.Helper()
	var v fastpath.Snapshot
	err := rig.WaitFor(context.Background(), e2eWait, "every reservation released", func() bool {
		v = n.Snapshot()
		return reservationsReleased(v)
	})
	if err != nil {
		t.Fatalf("reservations leaked: queue %+v, workers %+v: %v", v.Queue, v.Workers, err)
	}
}

// waitFor polls cond until it holds or the wait times out.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := rig.WaitFor(context.Background(), e2eWait, what, cond); err != nil {
		t.Fatal(err)
	}
}

// beginShutdown starts the router's graceful Shutdown (bounded by
// e2eWait) and returns once its listener refuses connections, with the
// channel Shutdown's result arrives on.
func (r *e2eRouter) beginShutdown(t *testing.T) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
		defer cancel()
		done <- r.node.Shutdown(ctx)
	}()
	addr := strings.TrimPrefix(r.url, "http://")
	waitFor(t, "the listener to close", func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
	return done
}

// workerView returns the admin view of worker id, rank.
func workerView(t *testing.T, n *node.Node, id uint64, rank uint32) fastpath.WorkerView {
	t.Helper()
	for _, w := range n.Snapshot().Workers {
		if w.WorkerID == id && w.DPRank == rank {
			return w
		}
	}
	t.Fatalf("worker %d rank %d is not in the admin view", id, rank)
	return fastpath.WorkerView{}
}

// openAIError is the error body every refusal must carry.
type openAIError struct {
	Error *struct {
		Message *string `json:"message"`
		Type    *string `json:"type"`
		Param   any     `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// checkOpenAIError checks that body is {"error":{"message","type","param",
// "code"}} with string message, type and code and a string or null param,
// and returns the code.
func checkOpenAIError(t *testing.T, body []byte) string {
	t.Helper()
	var raw map[string]map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatalf("error body is not a JSON object of objects: %v: %q", err, body)
	}
	if len(raw) != 1 || raw["error"] == nil {
		t.Fatalf("error body has no lone \"error\" object: %q", body)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := raw["error"][k]; !ok {
			t.Errorf("error body lacks %q: %q", k, body)
		}
	}
	var e openAIError
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body: %v: %q", err, body)
	}
	if e.Error.Message == nil || *e.Error.Message == "" || e.Error.Type == nil || *e.Error.Type == "" ||
		e.Error.Code == nil || *e.Error.Code == "" {
		t.Errorf("error body needs a non-empty message, type and code: %q", body)
	}
	if _, ok := e.Error.Param.(string); !ok && e.Error.Param != nil {
		t.Errorf("error param must be a string or null: %q", body)
	}
	if e.Error.Code == nil {
		return ""
	}
	return *e.Error.Code
}

// e2eTokens returns n token ids, distinct per seed, below 50000.
func e2eTokens(seed uint32, n int) []uint32 {
	out := make([]uint32, n)
	x := seed*2654435761 + 1
	for i := range out {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		out[i] = x % 50000
	}
	return out
}

// completionBody is a completions request with a token prompt.
func completionBody(tokens []uint32, stream bool, maxTokens int) []byte {
	b := []byte(`{"model":"` + e2eModel + `","prompt":[`)
	for i, tok := range tokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(tok), 10)
	}
	b = append(b, `],"max_tokens":`...)
	b = strconv.AppendInt(b, int64(maxTokens), 10)
	b = append(b, `,"stream":`...)
	b = strconv.AppendBool(b, stream)
	return append(b, '}')
}

// concat joins byte slices.
func concat(parts [][]byte) []byte { return bytes.Join(parts, nil) }

// readEvent reads one server-sent event, its blank line included.
func readEvent(r *bufio.Reader) ([]byte, error) {
	var ev []byte
	for {
		line, err := r.ReadBytes('\n')
		ev = append(ev, line...)
		if err != nil {
			return ev, err
		}
		if len(line) == 1 || (len(line) == 2 && line[0] == '\r') {
			return ev, nil
		}
	}
}

// itemEvent is one completions stream chunk, vLLM-shaped.
func itemEvent(i int, text, finish string) []byte {
	fr := "null"
	if finish != "" {
		fr = `"` + finish + `"`
	}
	return []byte(`data: {"id":"cmpl-standin","object":"text_completion","created":1,"model":"` + e2eModel +
		`","choices":[{"index":0,"text":` + strconv.Quote(text) + `,"logprobs":null,"finish_reason":` + fr +
		`}],"usage":null,"n":` + strconv.Itoa(i) + "}\n\n")
}

const doneEvent = "data: [DONE]\n\n"

// startMock starts a mock engine and stops it at the end of the test.
func startMock(t *testing.T, cfg mocker.Config) *mocker.Engine {
	t.Helper()
	if cfg.Speedup == 0 {
		cfg.Speedup = 20
	}
	e, err := mocker.Start(cfg)
	if err != nil {
		t.Fatalf("cannot start a mock engine: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("mock engine close: %v", err)
		}
	})
	return e
}

// e2eEngine is a stand-in engine: a fasthttp server whose generation
// endpoints run the test's handler, and which can be killed outright.
type e2eEngine struct {
	ln       *killableListener
	srv      *fasthttp.Server
	handler  fasthttp.RequestHandler
	requests atomic.Int64
	done     chan struct{}

	mu         sync.Mutex
	bodies     [][]byte
	requestIDs []string
}

// startE2EEngine serves handler on /v1/completions and
// /v1/chat/completions, and 200 on /health.
func startE2EEngine(t *testing.T, handler fasthttp.RequestHandler) *e2eEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &e2eEngine{ln: &killableListener{Listener: ln, conns: map[net.Conn]struct{}{}}, handler: handler,
		done: make(chan struct{})}
	e.srv = &fasthttp.Server{Handler: e.handle, Logger: quietFastHTTPLogger{}, CloseOnShutdown: true}
	go func() {
		defer close(e.done)
		_ = e.srv.Serve(e.ln)
	}()
	t.Cleanup(func() {
		e.kill()
		select {
		case <-e.done:
		case <-time.After(e2eWait):
			t.Error("stand-in engine did not stop")
		}
	})
	return e
}

func (e *e2eEngine) addr() string { return e.ln.Addr().String() }

func (e *e2eEngine) handle(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case fastpath.PathHealth:
		ctx.SetStatusCode(fasthttp.StatusOK)
	case fastpath.PathCompletions, fastpath.PathChatCompletions:
		e.requests.Add(1)
		e.mu.Lock()
		e.bodies = append(e.bodies, append([]byte(nil), ctx.PostBody()...))
		e.requestIDs = append(e.requestIDs, string(ctx.Request.Header.Peek(fastpath.HeaderRequestID)))
		e.mu.Unlock()
		e.handler(ctx)
	default:
		ctx.SetStatusCode(fasthttp.StatusNotFound)
	}
}

// received returns the bodies and request ids the engine was sent.
func (e *e2eEngine) received() ([][]byte, []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([][]byte(nil), e.bodies...), append([]string(nil), e.requestIDs...)
}

// kill stops the engine the hard way: the listener and every open
// connection are closed at once, as when the process dies.
func (e *e2eEngine) kill() { e.ln.kill() }

// killableListener tracks accepted connections so that kill can cut them.
type killableListener struct {
	net.Listener
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	killed bool
}

func (l *killableListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.killed {
		c.Close()
		return nil, net.ErrClosed
	}
	l.conns[c] = struct{}{}
	return c, nil
}

func (l *killableListener) kill() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.killed {
		return
	}
	l.killed = true
	_ = l.Listener.Close()
	for c := range l.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // a reset, as a dead process's kernel sends
		}
		_ = c.Close()
	}
}

type quietFastHTTPLogger struct{}

func (quietFastHTTPLogger) Printf(string, ...any) {}

// sseHandler answers with an event stream written by body.
func sseHandler(body func(w *bufio.Writer)) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.Response.Header.Set("Cache-Control", "no-cache")
		ctx.SetBodyStreamWriter(body)
	}
}

// writeFlush writes p and flushes it to the connection.
func writeFlush(w *bufio.Writer, p []byte) error {
	if _, err := w.Write(p); err != nil {
		return err
	}
	return w.Flush()
}

// decodeJSON unmarshals body into v or fails the test.
func decodeJSON(t *testing.T, body []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("cannot decode %q: %v", body, err)
	}
}

// indexBlocks records in the router's index that worker id, rank caches
// the first blocks of tokens, hashed as the router hashes e2eModel's
// prompts. It stands in for the engine's KV events.
func indexBlocks(t *testing.T, n *node.Node, id uint64, rank uint32, tokens []uint32) {
	t.Helper()
	slot, ok := n.Scheduler().Resolve(id, rank)
	if !ok {
		t.Fatalf("worker %d rank %d is unknown", id, rank)
	}
	hashes := radix.AppendBlockHashes(nil, radix.NamespaceSeed(e2eModel, "", ""), tokens, n.Scheduler().BlockSize())
	n.Index().Stored(slot, hashes)
}

// logCapture is a slog handler that keeps every record's message and
// attributes as text, for tests of what the router logs.
type logCapture struct {
	mu   *sync.Mutex
	logs *[]string
}

func newLogCapture() logCapture { return logCapture{mu: new(sync.Mutex), logs: new([]string)} }

func (c logCapture) Enabled(context.Context, slog.Level) bool { return true }

func (c logCapture) Handle(_ context.Context, r slog.Record) error {
	line := r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
	c.mu.Lock()
	*c.logs = append(*c.logs, line)
	c.mu.Unlock()
	return nil
}

func (c logCapture) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c logCapture) WithGroup(string) slog.Handler      { return c }

// find returns the first record containing s.
func (c logCapture) find(s string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range *c.logs {
		if strings.Contains(l, s) {
			return l, true
		}
	}
	return "", false
}

// count returns how many records contain s.
func (c logCapture) count(s string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, l := range *c.logs {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}
