package fastpath

import (
	"context"
	"strconv"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvfast/kvfast/internal/clock"
	"github.com/kvfast/kvfast/internal/tracing"
	"github.com/kvfast/kvfast/sched"
)

// Span names of a traced request. The request's span is the root (or a
// child of the client's traceparent); route and its stages, the engine
// calls and the first token hang below it.
const (
	spanRequest    = "kvfast.request"
	spanRoute      = "route"
	spanTokenize   = "tokenize"
	spanHash       = "hash"
	spanLookup     = "lookup"
	spanSelect     = "select"
	spanQueue      = "queue"
	spanDispatch   = "dispatch" // the engine call that answers the client (the decode stage when disaggregated)
	spanFirstToken = "first_token"
	spanPrefill    = "prefill" // a disaggregated request's prefill call
	spanEncode     = "encode"  // one multimodal item's encoder call
)

// requestTrace is one request's spans. Its zero value is an untraced
// request: with tracing off (Deps.Tracer nil) nothing here is set, and
// every trace method returns at its first check, so the request path
// allocates nothing for it. The stage timestamps are clock readings that
// prepare and select store either way; spans are built from them after
// the fact, so that a traced request measures what an untraced one does.
type requestTrace struct {
	ctx      context.Context // carries root; nil: the request is not traced
	root     trace.Span
	dispatch trace.Span // the engine call in flight; nil between calls
	sentAt   int64      // when dispatch began (clock.Now)

	routeAt, hashAt, lookupAt, selectAt int64 // prepare's and select's stage starts
	rendered                            bool  // the tokenize stage ran
}

// traceStart starts the request's span, as a child of the client's W3C
// traceparent when it sent one, at the request's arrival.
func (ex *exchange) traceStart(ctx *fasthttp.RequestCtx) {
	tracer := ex.s.tracer
	if tracer == nil {
		return
	}
	carrier := propagation.MapCarrier{}
	for _, k := range [...]string{headerTraceparent, headerTracestate} {
		if v := ctx.Request.Header.Peek(k); len(v) > 0 {
			carrier[k] = string(v)
		}
	}
	parent := tracing.Propagator.Extract(context.Background(), carrier)
	ex.tr.ctx, ex.tr.root = tracer.Start(parent, spanRequest,
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(clock.Time(ex.arrived)),
		trace.WithAttributes(
			attribute.String("http.request.method", "POST"),
			attribute.String("http.route", string(routedPath(ex.api))),
			attribute.String("kvfast.request_id", string(ex.rid)),
		))
}

// traceRoute records the routing of the request's decode (or only) stage:
// route, with its tokenize, hash, lookup and select stages, and the queue
// wait inside select when it queued. It runs once select has returned.
func (ex *exchange) traceRoute(dec *sched.Decision, err error) {
	if ex.tr.ctx == nil {
		return
	}
	tracer, tr := ex.s.tracer, &ex.tr
	now := clock.Now()
	ctx, route := tracer.Start(tr.ctx, spanRoute, trace.WithTimestamp(clock.Time(tr.routeAt)),
		trace.WithAttributes(attribute.String("kvfast.model", ex.sreq.Model), attribute.Int("kvfast.prompt_tokens", ex.sreq.PromptTokens),
			attribute.Int("kvfast.prompt_blocks", len(ex.hashes)), attribute.Bool("kvfast.exact", ex.exact)))
	if tr.rendered {
		finishedSpan(tracer, ctx, spanTokenize, tr.routeAt, tr.hashAt)
	}
	finishedSpan(tracer, ctx, spanHash, tr.hashAt, tr.lookupAt)
	finishedSpan(tracer, ctx, spanLookup, tr.lookupAt, tr.selectAt)
	sctx, sel := tracer.Start(ctx, spanSelect, trace.WithTimestamp(clock.Time(tr.selectAt)))
	if since := ex.wait.queuedSince(); since != 0 {
		finishedSpan(tracer, sctx, spanQueue, since, now)
	}
	if err != nil {
		sel.SetStatus(codes.Error, err.Error())
	} else {
		sel.SetAttributes(decisionAttributes(dec)...)
	}
	sel.End(trace.WithTimestamp(clock.Time(now)))
	route.End(trace.WithTimestamp(clock.Time(now)))
}

// traceDispatch starts the span of the engine call about to be sent with
// req, and puts its traceparent into req: the engine's spans become its
// children. A retry ends the previous attempt's span first
// (traceDispatchFailed).
func (ex *exchange) traceDispatch(req *fasthttp.Request) {
	if ex.tr.ctx == nil {
		return
	}
	ex.tr.sentAt = clock.Now()
	var stage string
	if ex.pre.decided {
		stage = "decode"
	}
	ex.tr.dispatch = ex.startCall(spanDispatch, req, &ex.dec, stage)
}

// traceDispatchFailed ends the span of an engine call that failed and is
// about to be retried elsewhere.
func (ex *exchange) traceDispatchFailed(err error) {
	if ex.tr.dispatch == nil {
		return
	}
	endCall(ex.tr.dispatch, err)
	ex.tr.dispatch = nil
}

// traceFirstToken records the wait from sending the request to its first
// output token, below the engine call's span.
func (ex *exchange) traceFirstToken(now int64) {
	if ex.tr.dispatch == nil {
		return
	}
	ctx := trace.ContextWithSpan(ex.tr.ctx, ex.tr.dispatch)
	finishedSpan(ex.s.tracer, ctx, spanFirstToken, ex.tr.sentAt, now)
}

// traceEnd ends the request's spans, with its outcome, when the exchange
// is cleaned up.
func (ex *exchange) traceEnd() {
	tr := &ex.tr
	if tr.ctx == nil {
		return
	}
	if tr.dispatch != nil {
		endCall(tr.dispatch, ex.abortErr)
	}
	tr.root.SetAttributes(attribute.String("kvfast.outcome", ex.outcome), attribute.Int("kvfast.output_items", ex.items))
	if ex.outcome != statusOK && ex.outcome != statusRouteOnly {
		tr.root.SetStatus(codes.Error, ex.outcome)
	}
	tr.root.End()
}

// startCall starts the client span of one engine call of the request
// (name: dispatch, prefill or encode) and injects its traceparent into
// req. It returns nil when the request is not traced.
func (ex *exchange) startCall(name string, req *fasthttp.Request, dec *sched.Decision, stage string) trace.Span {
	if ex.tr.ctx == nil {
		return nil
	}
	attrs := append(decisionAttributes(dec), attribute.String("server.address", dec.Endpoint))
	if stage != "" {
		attrs = append(attrs, attribute.String("kvfast.stage", stage))
	}
	ctx, span := ex.s.tracer.Start(ex.tr.ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	carrier := propagation.MapCarrier{}
	tracing.Propagator.Inject(ctx, carrier)
	for k, v := range carrier {
		req.Header.Set(k, v)
	}
	return span
}

// endCall ends an engine call's span; err marks it failed.
func endCall(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

func decisionAttributes(dec *sched.Decision) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("kvfast.worker_id", strconv.FormatUint(dec.WorkerID, 10)),
		attribute.Int("kvfast.dp_rank", int(dec.DPRank)),
		attribute.Int("kvfast.overlap_blocks", int(dec.OverlapBlocks)),
	}
}

// finishedSpan records a stage that ran from start to end (clock
// readings) below the span in ctx.
func finishedSpan(tracer trace.Tracer, ctx context.Context, name string, start, end int64) {
	_, span := tracer.Start(ctx, name, trace.WithTimestamp(clock.Time(start)))
	span.End(trace.WithTimestamp(clock.Time(end)))
}

// W3C trace-context headers, forwarded to engines as they came when the
// router does not trace the request itself.
const (
	headerTraceparent = "traceparent"
	headerTracestate  = "tracestate"
)
