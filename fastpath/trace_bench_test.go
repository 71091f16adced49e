package fastpath

import (
	"testing"

	"github.com/valyala/fasthttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// BenchmarkRouteOnlyTracing is what tracing costs a route-only request of
// 1024 tokens, in process (no network): off, the path the alloc tests
// hold at zero allocations; on, every request sampled and its spans
// (request, route, hash, lookup, select) batched to an exporter that
// drops them, so that only the router's side is measured. The figures are
// in BENCHMARKS.md.
func BenchmarkRouteOnlyTracing(b *testing.B) {
	body := tokenBody(benchTokens(1024, 151935), ", ", false)
	for _, traced := range []bool{false, true} {
		name := "off"
		if traced {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			s := newRouteTestServer(b, 4, "")
			fillRouteIndex(b, s, body, 0, 48)
			if traced {
				tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
				b.Cleanup(func() { _ = tp.Shutdown(b.Context()) })
				s.tracer = tp.Tracer("bench")
			}
			ctx := newRouteCtx(PathRouteCompletions, body, nil)
			ctx.Request.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
			s.handle(ctx)
			if code := ctx.Response.StatusCode(); code != fasthttp.StatusOK {
				b.Fatalf("status %d: %s", code, ctx.Response.Body())
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				ctx.Response.Reset()
				s.handle(ctx)
			}
		})
	}
}
