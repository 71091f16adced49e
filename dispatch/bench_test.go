package dispatch

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// BenchmarkRelay is the proxy-overhead skeleton: one client on loopback
// calls a stand-in engine directly, then through a dispatch front end doing
// what the server will do. The difference of the latency percentiles is
// what the router adds (the target is 100µs or less at p50).
func BenchmarkRelay(b *testing.B) {
	plain := `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"hello","finish_reason":"length"}],"usage":{"completion_tokens":16}}`
	stream := vllmStream(16)
	engine := serve(b, func(ctx *fasthttp.RequestCtx) {
		if bytes.Contains(ctx.PostBody(), []byte(`"stream":true`)) {
			sseEngine(stream, 0, nil)(ctx)
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyString(plain)
	}, nil)
	pool := NewPool(Config{Health: noHealth})
	defer pool.Close()
	mustAdd(b, pool, 0, engine)
	router := serve(b, front(pool, 0, func() Observer { return nopObserver{} }), nil)

	for _, mode := range []struct{ name, body, want string }{
		{"plain", `{"model":"m","prompt":[1,2,3],"max_tokens":16}`, plain},
		{"stream", `{"model":"m","prompt":[1,2,3],"max_tokens":16,"stream":true}`, strings.Join(stream, "")},
	} {
		for _, target := range []struct{ name, addr string }{{"direct", engine}, {"dispatch", router}} {
			b.Run(mode.name+"/"+target.name, func(b *testing.B) {
				client := &fasthttp.HostClient{Addr: target.addr, MaxConns: 4}
				req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				defer fasthttp.ReleaseRequest(req)
				defer fasthttp.ReleaseResponse(resp)
				req.SetRequestURI("/v1/completions")
				req.Header.SetHost(target.addr)
				req.Header.SetMethod(fasthttp.MethodPost)
				req.Header.SetContentType("application/json")
				req.SetBodyString(mode.body)
				if err := client.Do(req, resp); err != nil || string(resp.Body()) != mode.want {
					b.Fatalf("warm-up: %v %q", err, resp.Body())
				}
				lat := make([]time.Duration, b.N)
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					start := time.Now()
					if err := client.Do(req, resp); err != nil {
						b.Fatal(err)
					}
					lat[i] = time.Since(start)
				}
				b.StopTimer()
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
			})
		}
	}
}
