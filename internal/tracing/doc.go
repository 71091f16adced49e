// Package tracing sets up kvfast's OpenTelemetry trace export: an OTLP/HTTP
// exporter to the collector named by --otlp-endpoint, a batching tracer
// provider, and W3C trace-context propagation.
//
// # Responsibility
//
// It turns the operator's tracing settings into a trace.Tracer that the
// front end (package fastpath) starts its per-request spans with, and
// flushes what is buffered when the router stops. What a span covers
// (route, queue, dispatch, first token, the stages of disaggregated and
// multimodal requests) is fastpath's business; this package knows nothing
// of requests. Tracing is off unless an endpoint is set: then no provider
// exists, fastpath holds a nil tracer, and the request path pays one nil
// check per stage.
//
// # What it owns
//
// The tracer provider and its exporter. The node creates one Provider in
// New and shuts it down after the front end has drained, so that the spans
// of the last requests are exported.
//
// # Concurrency
//
// The provider's batch processor runs one goroutine of the OpenTelemetry
// SDK, which exports in the background; spans are started and ended from
// any goroutine. Shutdown is safe to call more than once.
package tracing
