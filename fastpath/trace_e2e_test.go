package fastpath_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/valyala/fasthttp"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/internal/rig"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
	"github.com/kvfast/kvfast/workers"
)

// otlpReceiver is an in-process OpenTelemetry collector: it takes OTLP/HTTP
// trace exports (protobuf, as the router's exporter sends them) and keeps
// their spans.
type otlpReceiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
}

func startOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/traces" || req.Method != http.MethodPost {
			http.NotFound(w, req)
			return
		}
		body, err := io.ReadAll(req.Body)
		var export coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &export)
		}
		if err != nil {
			t.Errorf("OTLP receiver: cannot read an export: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		for _, rs := range export.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				r.spans = append(r.spans, ss.GetSpans()...)
			}
		}
		r.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// received is every span exported so far, by name.
func (r *otlpReceiver) received() map[string][]*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	byName := map[string][]*tracepb.Span{}
	for _, s := range r.spans {
		byName[s.GetName()] = append(byName[s.GetName()], s)
	}
	return byName
}

// tracedConfig is the tests' router configuration exporting to r.
func tracedConfig(r *otlpReceiver, static ...node.StaticWorker) node.Config {
	cfg := e2eConfig(static...)
	cfg.Tracing.Endpoint = r.srv.URL
	return cfg
}

// closeRouter stops the router, which flushes the spans it buffered.
func closeRouter(t *testing.T, r *e2eRouter) {
	t.Helper()
	r.client.CloseIdleConnections()
	if err := r.rig.Close(); err != nil {
		t.Fatalf("cannot stop the router: %v", err)
	}
}

func attr(s *tracepb.Span, key string) string {
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

func spanID(s *tracepb.Span) string   { return hex.EncodeToString(s.GetSpanId()) }
func parentID(s *tracepb.Span) string { return hex.EncodeToString(s.GetParentSpanId()) }
func traceID(s *tracepb.Span) string  { return hex.EncodeToString(s.GetTraceId()) }

// one returns the only span named name, failing the test otherwise.
func one(t *testing.T, spans map[string][]*tracepb.Span, name string) *tracepb.Span {
	t.Helper()
	if len(spans[name]) != 1 {
		t.Fatalf("%d spans named %q, want 1 (spans: %v)", len(spans[name]), name, spanNames(spans))
	}
	return spans[name][0]
}

func spanNames(spans map[string][]*tracepb.Span) []string {
	var names []string
	for n, ss := range spans {
		for range ss {
			names = append(names, n)
		}
	}
	return names
}

// wantChild fails the test unless child's parent is parent.
func wantChild(t *testing.T, child, parent *tracepb.Span) {
	t.Helper()
	if parentID(child) != spanID(parent) || traceID(child) != traceID(parent) {
		t.Errorf("span %q (trace %s) has parent %s, want %q (%s, trace %s)", child.GetName(), traceID(child), parentID(child),
			parent.GetName(), spanID(parent), traceID(parent))
	}
}

// traceEngine is a stand-in engine that streams three tokens and keeps
// the trace context headers of every request it is sent.
type traceEngine struct {
	*e2eEngine
	mu      sync.Mutex
	parents []string // traceparent of each request
	states  []string // tracestate of each request
}

func startTraceEngine(t *testing.T) *traceEngine {
	te := &traceEngine{}
	stream := sseHandler(func(w *bufio.Writer) {
		for i := range 3 {
			finish := ""
			if i == 2 {
				finish = "length"
			}
			_ = writeFlush(w, itemEvent(i, " tok", finish))
		}
		_ = writeFlush(w, []byte(doneEvent))
	})
	te.e2eEngine = startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		te.mu.Lock()
		te.parents = append(te.parents, string(ctx.Request.Header.Peek("traceparent")))
		te.states = append(te.states, string(ctx.Request.Header.Peek("tracestate")))
		te.mu.Unlock()
		stream(ctx)
	})
	return te
}

func (te *traceEngine) seen() (parents, states []string) {
	te.mu.Lock()
	defer te.mu.Unlock()
	return append([]string(nil), te.parents...), append([]string(nil), te.states...)
}

const (
	clientTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpanID  = "00f067aa0ba902b7"
	clientParent  = "00-" + clientTraceID + "-" + clientSpanID + "-01"
	clientState   = "vendor=opaque"
)

// TestTraceContextForwardedWhenTracingOff: without --otlp-endpoint the
// router traces nothing of its own, but the client's W3C trace context
// reaches the engine unchanged, so that the engine's spans join the
// client's trace.
func TestTraceContextForwardedWhenTracingOff(t *testing.T) {
	eng := startTraceEngine(t)
	r := startE2ERouter(t, e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.addr(), Model: e2eModel}))
	resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(1, 64), true, 3),
		map[string]string{"traceparent": clientParent, "tracestate": clientState})
	if resp.status != http.StatusOK {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	resp = r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(2, 64), true, 3), nil)
	if resp.status != http.StatusOK {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	parents, states := eng.seen()
	if len(parents) != 2 || parents[0] != clientParent || states[0] != clientState {
		t.Errorf("engine saw traceparents %q, tracestates %q; want the client's %q and %q first", parents, states, clientParent, clientState)
	}
	if len(parents) == 2 && (parents[1] != "" || states[1] != "") {
		t.Errorf("a request without trace context reached the engine with traceparent %q, tracestate %q", parents[1], states[1])
	}
}

// TestTracingExportsRequestSpans: with --otlp-endpoint, a streamed
// request that arrives with a client's traceparent is exported as one
// span tree in the client's trace: the request below the client's span,
// route with its hash, lookup and select stages, and the engine call
// with its first token; the engine is sent the engine call's span as
// its parent, with the client's tracestate. A request without a
// traceparent starts a trace of its own.
func TestTracingExportsRequestSpans(t *testing.T) {
	rcv := startOTLPReceiver(t)
	eng := startTraceEngine(t)
	r := startE2ERouter(t, tracedConfig(rcv, node.StaticWorker{ID: 1, Endpoint: eng.addr(), Model: e2eModel}))
	resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(1, 64), true, 3),
		map[string]string{"traceparent": clientParent, "tracestate": clientState})
	if resp.status != http.StatusOK {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	if items, _, done, _ := readStream(t, resp.body); items != 3 || !done {
		t.Fatalf("stream: %d items, done %v", items, done)
	}
	routeOnly := r.post(t, fastpath.PathRouteCompletions, completionBody(e2eTokens(3, 64), false, 3), nil)
	if routeOnly.status != http.StatusOK {
		t.Fatalf("route-only status %d: %s", routeOnly.status, routeOnly.body)
	}
	closeRouter(t, r)

	spans := rcv.received()
	var root *tracepb.Span
	for _, s := range spans["kvfast.request"] {
		if traceID(s) == clientTraceID {
			root = s
		}
	}
	if root == nil || len(spans["kvfast.request"]) != 2 {
		t.Fatalf("request spans %d, client's trace among them %v; spans: %v", len(spans["kvfast.request"]), root != nil, spanNames(spans))
	}
	if parentID(root) != clientSpanID || root.GetKind() != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("request span: parent %s kind %v, want the client's span %s and server", parentID(root), root.GetKind(), clientSpanID)
	}
	if got := attr(root, "kvfast.outcome"); got != "ok" {
		t.Errorf("request span outcome %q, want ok", got)
	}
	inTrace := func(name string) []*tracepb.Span {
		var out []*tracepb.Span
		for _, s := range spans[name] {
			if traceID(s) == clientTraceID {
				out = append(out, s)
			}
		}
		return out
	}
	byName := map[string][]*tracepb.Span{}
	for _, name := range []string{"route", "hash", "lookup", "select", "dispatch", "first_token", "queue", "tokenize", "prefill", "encode"} {
		byName[name] = inTrace(name)
	}
	route, sel, dispatch := one(t, byName, "route"), one(t, byName, "select"), one(t, byName, "dispatch")
	wantChild(t, route, root)
	wantChild(t, one(t, byName, "hash"), route)
	wantChild(t, one(t, byName, "lookup"), route)
	wantChild(t, sel, route)
	wantChild(t, dispatch, root)
	wantChild(t, one(t, byName, "first_token"), dispatch)
	for _, name := range []string{"queue", "tokenize", "prefill", "encode"} {
		if n := len(byName[name]); n != 0 {
			t.Errorf("%d %s spans for a request that had no such stage", n, name)
		}
	}
	if attr(sel, "kvfast.worker_id") != "1" || attr(dispatch, "kvfast.worker_id") != "1" {
		t.Errorf("select names worker %q, dispatch %q; want 1", attr(sel, "kvfast.worker_id"), attr(dispatch, "kvfast.worker_id"))
	}
	if dispatch.GetKind() != tracepb.Span_SPAN_KIND_CLIENT {
		t.Errorf("dispatch span kind %v, want client", dispatch.GetKind())
	}
	if route.GetStartTimeUnixNano() < root.GetStartTimeUnixNano() || dispatch.GetEndTimeUnixNano() > root.GetEndTimeUnixNano() {
		t.Errorf("stages outside the request's span: route starts %d, request %d; dispatch ends %d, request %d",
			route.GetStartTimeUnixNano(), root.GetStartTimeUnixNano(), dispatch.GetEndTimeUnixNano(), root.GetEndTimeUnixNano())
	}
	parents, states := eng.seen()
	want := "00-" + clientTraceID + "-" + spanID(dispatch) + "-01"
	if len(parents) != 1 || parents[0] != want || states[0] != clientState {
		t.Errorf("engine saw traceparent %q tracestate %q, want %q and %q", parents, states, want, clientState)
	}
	// The route-only request: a trace of its own, route and no engine call.
	var own *tracepb.Span
	for _, s := range spans["kvfast.request"] {
		if traceID(s) != clientTraceID {
			own = s
		}
	}
	if own == nil || len(own.GetParentSpanId()) != 0 || attr(own, "kvfast.outcome") != "route_only" {
		t.Fatalf("route-only request span: %v", own)
	}
	for _, s := range spans["dispatch"] {
		if traceID(s) == traceID(own) {
			t.Errorf("a route-only request has a dispatch span")
		}
	}
}

// TestTracingDisaggregatedStages: a disaggregated request's trace has
// its prefill call beside the decode stage's engine call, both below the
// request's span.
func TestTracingDisaggregatedStages(t *testing.T) {
	rcv := startOTLPReceiver(t)
	cfg := tracedConfig(rcv)
	cfg.HTTP.Disagg = fastpath.DisaggConfig{Protocol: fastpath.DisaggVLLM, MinRemoteTokens: 64}
	r := startE2ERig(t, rig.Config{Node: cfg})
	for id, role := range map[uint64]workers.Role{1: workers.RolePrefill, 2: workers.RoleDecode} {
		startMock(t, mocker.Config{WorkerID: id, Role: role, Segment: r.rig.SegmentPath, KVBlocks: 2048})
	}
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	if err := r.rig.WaitWorkers(ctx, 2); err != nil {
		t.Fatal(err)
	}
	resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(1, 300), true, 4), nil)
	if resp.status != http.StatusOK || resp.header.Get(fastpath.HeaderPrefillWorker) != "1" {
		t.Fatalf("status %d, prefill worker %q: %s", resp.status, resp.header.Get(fastpath.HeaderPrefillWorker), resp.body)
	}
	closeRouter(t, r)
	spans := rcv.received()
	root, prefill, dispatch := one(t, spans, "kvfast.request"), one(t, spans, "prefill"), one(t, spans, "dispatch")
	wantChild(t, prefill, root)
	wantChild(t, dispatch, root)
	if attr(prefill, "kvfast.worker_id") != "1" || attr(prefill, "kvfast.stage") != "prefill" {
		t.Errorf("prefill span: worker %q stage %q", attr(prefill, "kvfast.worker_id"), attr(prefill, "kvfast.stage"))
	}
	if attr(dispatch, "kvfast.worker_id") != "2" || attr(dispatch, "kvfast.stage") != "decode" {
		t.Errorf("dispatch span: worker %q stage %q, want the decode stage on 2", attr(dispatch, "kvfast.worker_id"), attr(dispatch, "kvfast.stage"))
	}
	if prefill.GetEndTimeUnixNano() > dispatch.GetStartTimeUnixNano() {
		t.Errorf("the prefill call ends after the decode call starts (vLLM runs them one after the other)")
	}
}

// TestTracingEncoderStage: each image of a multimodal request has its
// encoder call in the trace, below the request's span.
func TestTracingEncoderStage(t *testing.T) {
	rcv := startOTLPReceiver(t)
	r := startE2ERig(t, rig.Config{Node: tracedConfig(rcv), Engines: 2, Roles: []workers.Role{workers.RoleBoth, workers.RoleEncode},
		Engine: mocker.Config{WorkerID: 1, Speedup: 20}})
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	if err := r.rig.WaitWorkers(ctx, 2); err != nil {
		t.Fatal(err)
	}
	resp := r.post(t, fastpath.PathChatCompletions, imagesChat(false, imageURL("x"), imageURL("y")), nil)
	if resp.status != http.StatusOK {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	closeRouter(t, r)
	spans := rcv.received()
	root := one(t, spans, "kvfast.request")
	if len(spans["encode"]) != 2 {
		t.Fatalf("%d encode spans, want one per image: %v", len(spans["encode"]), spanNames(spans))
	}
	for _, s := range spans["encode"] {
		wantChild(t, s, root)
		if attr(s, "kvfast.worker_id") != "2" || !strings.EqualFold(s.GetKind().String(), "SPAN_KIND_CLIENT") {
			t.Errorf("encode span: worker %q kind %v, want the encoder 2 and client", attr(s, "kvfast.worker_id"), s.GetKind())
		}
	}
	wantChild(t, one(t, spans, "dispatch"), root)
}
