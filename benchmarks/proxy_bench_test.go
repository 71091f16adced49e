package benchmarks

import (
	"bufio"
	"bytes"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/internal/rig"
	"github.com/kvfast/kvfast/internal/rig/rigtest"
	"github.com/kvfast/kvfast/node"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
)

const proxyModel = "bench-model"

// BenchmarkProxyOverhead measures what a kvfast router adds to a request's
// latency. One client calls a stand-in engine directly and through a real
// router (a node over two static workers, kv policy, the index
// holding part of the prompt) on loopback, alternating the two, and the
// benchmark reports both latency distributions and their difference:
// p50-added-µs is the router's p50 minus the direct p50, likewise p99 (a
// difference of percentiles, not a percentile of differences, since the
// two requests of a pair are independent).
//
// The stand-in engine answers at once with fixed vLLM-shaped bodies, so
// that everything measured is HTTP and routing; a simulated engine's step
// loop would add its own jitter to both sides and hide a 100 µs budget.
// Streams are 16 token events, a finish event and [DONE], flushed one event
// at a time as an engine produces them.
//
// ns/op covers one direct and one routed request.
func BenchmarkProxyOverhead(b *testing.B) {
	engine := startStandInEngine(b)
	router := startProxyRouter(b, engine)

	for _, stream := range []bool{false, true} {
		for _, tokens := range []int{16, 1024} {
			mode := "plain"
			if stream {
				mode = "stream"
			}
			body := completionBody(tokens, stream)
			fillProxyIndex(b, router.Node, body, tokens)
			b.Run(mode+"/tokens="+strconv.Itoa(tokens), func(b *testing.B) {
				direct := newTimedClient(b, engine, body)
				routed := newTimedClient(b, router.Addr, body)
				want := direct.mustDo(b)
				if got := routed.mustDo(b); !bytes.Equal(got, want) {
					b.Fatalf("the router changed the response:\n%s\nwant\n%s", got, want)
				}
				if len(routed.resp.Header.Peek(fastpath.HeaderWorker)) == 0 {
					b.Fatal("the routed response names no worker")
				}
				dlat, rlat := make([]time.Duration, b.N), make([]time.Duration, b.N)
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					if i%2 == 0 {
						dlat[i], rlat[i] = direct.timedDo(b), routed.timedDo(b)
					} else {
						rlat[i], dlat[i] = routed.timedDo(b), direct.timedDo(b)
					}
				}
				b.StopTimer()
				slices.Sort(dlat)
				slices.Sort(rlat)
				d50, d99 := percentile(dlat, 50), percentile(dlat, 99)
				r50, r99 := percentile(rlat, 50), percentile(rlat, 99)
				b.ReportMetric(micros(d50), "direct-p50-µs")
				b.ReportMetric(micros(d99), "direct-p99-µs")
				b.ReportMetric(micros(r50), "router-p50-µs")
				b.ReportMetric(micros(r99), "router-p99-µs")
				b.ReportMetric(micros(r50-d50), "p50-added-µs")
				b.ReportMetric(micros(r99-d99), "p99-added-µs")
			})
		}
	}
}

func percentile(sorted []time.Duration, p int) time.Duration {
	return sorted[min(len(sorted)-1, len(sorted)*p/100)]
}

func micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// timedClient sends one prepared request over one pooled connection.
type timedClient struct {
	client *fasthttp.HostClient
	req    *fasthttp.Request
	resp   *fasthttp.Response
}

func newTimedClient(b *testing.B, addr string, body []byte) *timedClient {
	c := &timedClient{
		client: &fasthttp.HostClient{Addr: addr, MaxConns: 1, ReadTimeout: 10 * time.Second},
		req:    fasthttp.AcquireRequest(),
		resp:   fasthttp.AcquireResponse(),
	}
	c.req.SetRequestURI(fastpath.PathCompletions)
	c.req.Header.SetHost(addr)
	c.req.Header.SetMethod(fasthttp.MethodPost)
	c.req.Header.SetContentType("application/json")
	c.req.SetBody(body)
	b.Cleanup(func() {
		c.client.CloseIdleConnections()
		fasthttp.ReleaseRequest(c.req)
		fasthttp.ReleaseResponse(c.resp)
	})
	return c
}

func (c *timedClient) timedDo(b *testing.B) time.Duration {
	start := time.Now()
	if err := c.client.Do(c.req, c.resp); err != nil {
		b.Fatal(err)
	}
	d := time.Since(start)
	if c.resp.StatusCode() != fasthttp.StatusOK {
		b.Fatalf("status %d: %s", c.resp.StatusCode(), c.resp.Body())
	}
	return d
}

func (c *timedClient) mustDo(b *testing.B) []byte {
	c.timedDo(b)
	return bytes.Clone(c.resp.Body())
}

// completionBody is a completions request with a token prompt, the way an
// OpenAI client library writes it.
func completionBody(tokens int, stream bool) []byte {
	b := []byte(`{"model": "` + proxyModel + `", "prompt": [`)
	x := uint32(2463534242)
	for i := range tokens {
		if i > 0 {
			b = append(b, ", "...)
		}
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b = strconv.AppendUint(b, uint64(x%128000), 10)
	}
	b = append(b, `], "max_tokens": 16, "temperature": 0.0, "stream": `...)
	b = strconv.AppendBool(b, stream)
	return append(b, `}`...)
}

// startProxyRouter runs a router as kvfast serve configures it, over two
// static workers both served by the stand-in engine, with health checks
// off (the engine is up for the whole benchmark and probes would only add
// noise) and logs discarded.
func startProxyRouter(b *testing.B, engine string) *rig.Rig {
	cfg := node.DefaultConfig()
	cfg.Dispatch.Health.Interval = 0 // no health checks
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Static = []node.StaticWorker{
		{ID: 1, Endpoint: engine, Model: proxyModel},
		{ID: 2, Endpoint: engine, Model: proxyModel},
	}
	return rigtest.Start(b, rig.Config{Node: cfg, NoSegment: true})
}

// fillProxyIndex records that worker 1 caches the first half of body's
// prompt, so that routing weighs a real overlap against load.
func fillProxyIndex(b *testing.B, n *node.Node, body []byte, tokens int) {
	var p openai.Parser
	r := new(openai.ParsedRequest)
	if err := p.Parse(body, openai.APICompletions, r); err != nil || len(r.Tokens) != tokens {
		b.Fatalf("cannot parse the benchmark body: %v", err)
	}
	hashes := radix.AppendBlockHashes(nil, radix.NamespaceSeed(proxyModel, "", ""), r.Tokens[:tokens/2], radix.DefaultBlockSize)
	for _, w := range n.Snapshot().Workers {
		if w.WorkerID == 1 {
			n.Index().Stored(workers.Slot(w.Slot), hashes)
			return
		}
	}
	b.Fatal("worker 1 is not in the admin view")
}

func listen(b *testing.B) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ln.Close() })
	return ln
}

// startStandInEngine serves vLLM-shaped answers at once: a completion for
// a non-streaming request, and for a streaming one 16 token events, a
// finish event and [DONE], each flushed on its own.
func startStandInEngine(b *testing.B) string {
	plain := []byte(`{"id":"cmpl-bench","object":"text_completion","created":1700000000,"model":"` + proxyModel +
		`","choices":[{"index":0,"text":" the quick brown fox jumps over the lazy dog and runs far away again",` +
		`"logprobs":null,"finish_reason":"length","stop_reason":null}],` +
		`"usage":{"prompt_tokens":1024,"total_tokens":1040,"completion_tokens":16,"prompt_tokens_details":null}}`)
	var events [][]byte
	for i := range 16 {
		events = append(events, []byte(`data: {"id":"cmpl-bench","object":"text_completion","created":1700000000,"model":"`+
			proxyModel+`","choices":[{"index":0,"text":" w`+strconv.Itoa(i)+`","logprobs":null,"finish_reason":null,"stop_reason":null}]}`+"\n\n"))
	}
	events = append(events,
		[]byte(`data: {"id":"cmpl-bench","object":"text_completion","created":1700000000,"model":"`+proxyModel+
			`","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length","stop_reason":null}]}`+"\n\n"),
		[]byte("data: [DONE]\n\n"))
	streamOut := func(w *bufio.Writer) {
		for _, ev := range events {
			if _, err := w.Write(ev); err != nil {
				return
			}
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
	srv := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			switch string(ctx.Path()) {
			case fastpath.PathCompletions:
			case "/health":
				return
			default:
				ctx.SetStatusCode(fasthttp.StatusNotFound)
				return
			}
			if bytes.Contains(ctx.PostBody(), []byte(`"stream": true`)) {
				ctx.SetContentType("text/event-stream")
				ctx.Response.Header.Set("Cache-Control", "no-cache")
				ctx.SetBodyStreamWriter(streamOut)
				return
			}
			ctx.SetContentType("application/json")
			ctx.SetBody(plain)
		},
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
	}
	ln := listen(b)
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}
