package fastpath

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/internal/clock"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/radix"
)

// benchModel is the model tokenBody's bodies name.
const benchModel = "meta-llama/Llama-3.1-8B-Instruct"

// fillRouteIndex records that static worker i caches the first blocks blocks of
// body's token prompt, hashed the way the router hashes it.
func fillRouteIndex(tb testing.TB, s *Server, body []byte, i, blocks int) {
	tb.Helper()
	r := new(openai.ParsedRequest)
	if err := s.parser.Parse(body, openai.APICompletions, r); err != nil {
		tb.Fatal(err)
	}
	hashes := radix.AppendBlockHashes(nil, radix.NamespaceSeed(benchModel, "", ""), r.Tokens, s.sched.BlockSize())
	if len(hashes) < blocks {
		tb.Fatalf("the prompt has %d blocks, fewer than %d", len(hashes), blocks)
	}
	s.index.Stored(staticWorkerSlot(i), hashes[:blocks])
}

// newRouteCtx is a POST to path, reusable across handler calls.
func newRouteCtx(path string, body []byte, headers map[string]string) *fasthttp.RequestCtx {
	var req fasthttp.Request
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(path)
	req.Header.SetContentType("application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	req.SetBody(body)
	ctx := &fasthttp.RequestCtx{}
	ctx.Init(&req, nil, nil)
	return ctx
}

// routeHTTP is the route-only endpoint behind net/http: the baseline of
// BenchmarkRouteOnly.
//
// It is a native net/http handler, not the fasthttp handler run through an
// adaptor (which would add a full request and response conversion that no
// net/http server would pay). It runs the same routing code as the fasthttp
// endpoint, on the same pooled exchange: openai.Parser.Parse, prepare (block
// hashes and the index lookup), a query-only sched.Select with scores, and
// appendRouteJSON for the answer, plus the same request-id echo and
// decision headers. Only the HTTP layer differs: net/http's request and
// header maps, its body reader (read into a pooled buffer, bounded like
// fasthttp's MaxRequestBodySize) and its ResponseWriter. Routing hint
// headers are looked up as the fasthttp side does; the benchmark sends none,
// so pins and allow-lists, which need the fasthttp header parser, are
// refused rather than half-implemented.
type routeHTTP struct {
	s    *Server
	bufs sync.Pool // *[]byte request bodies
}

func (h *routeHTTP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s := h.s
	if r.Method != http.MethodPost || r.URL.Path != PathRouteCompletions {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	bp, _ := h.bufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	defer h.bufs.Put(bp)
	body, err := appendHTTPBody((*bp)[:0], r.Body, r.ContentLength, s.cfg.MaxBodyBytes)
	*bp = body
	if err != nil {
		writeHTTPError(w, http.StatusRequestEntityTooLarge, openai.ErrBodyTooLarge)
		return
	}

	ex := s.acquireExchange()
	ex.api = openai.APICompletions
	defer ex.cleanup()
	if v := r.Header.Get(HeaderRequestID); v != "" && len(v) <= 128 {
		ex.rid = append(ex.rid[:0], v...)
	} else {
		ex.rid = append(ex.rid[:0], "kvf-"...)
		ex.rid = strconv.AppendUint(ex.rid, s.requestID.Add(1), 36)
	}
	if err := s.parser.Parse(body, ex.api, &ex.req); err != nil {
		e := asRequestError(err)
		s.metrics.count(ex.api, statusClientError)
		writeHTTPError(w, e.Status, e)
		return
	}
	if r.Header.Get(HeaderWorker) != "" || r.Header.Get(HeaderDPRank) != "" || r.Header.Get(HeaderAllow) != "" ||
		r.Header.Get(HeaderPriority) != "" {
		writeHTTPError(w, http.StatusBadRequest, errBaselineHints)
		return
	}
	if e := s.prepare(r.Context(), body, ex); e != nil {
		s.metrics.count(ex.api, statusClientError)
		writeHTTPError(w, e.Status, e)
		return
	}
	ex.sreq.QueryOnly = true
	ex.sreq.Scores = ex.scores
	dec, err := s.sched.Select(r.Context(), &ex.sreq, nil)
	s.metrics.stageSched.Observe(seconds(clock.Since(ex.lastItem)))
	if err != nil {
		s.metrics.count(ex.api, statusUnavailable)
		writeHTTPError(w, http.StatusServiceUnavailable, errNoWorker)
		return
	}
	s.metrics.count(ex.api, statusRouteOnly)
	ex.dec = dec
	hd := w.Header()
	hd.Set(HeaderWorker, strconv.FormatUint(dec.WorkerID, 10))
	hd.Set(HeaderDPRank, strconv.FormatUint(uint64(dec.DPRank), 10))
	hd.Set(HeaderOverlapBlocks, strconv.FormatUint(uint64(dec.OverlapBlocks), 10))
	hd.Set(HeaderRequestID, string(ex.rid))
	hd.Set("Content-Type", "application/json")
	ex.out = s.appendRouteJSON(ex.out[:0], ex)
	hd.Set("Content-Length", strconv.Itoa(len(ex.out)))
	_, _ = w.Write(ex.out)
}

// appendHTTPBody appends the request body to dst, refusing more than limit bytes.
func appendHTTPBody(dst []byte, r io.Reader, contentLength int64, limit int) ([]byte, error) {
	if contentLength > int64(limit) {
		return dst, openai.ErrBodyTooLarge
	}
	if contentLength > 0 && cap(dst) < int(contentLength) {
		dst = make([]byte, 0, contentLength)
	}
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		n, err := r.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if len(dst) > limit {
			return dst, openai.ErrBodyTooLarge
		}
		if errors.Is(err, io.EOF) {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}

var errBaselineHints = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "invalid_header",
	Message: "the net/http baseline does not take routing hints"}

func writeHTTPError(w http.ResponseWriter, status int, e *openai.Error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(e.AppendJSON(nil))
}

// BenchmarkRouteOnly measures route-only requests per second over loopback:
// the router's fasthttp endpoint against the same routing code behind
// net/http (routeHTTP). Both are driven by the same fasthttp.HostClient from
// parallel goroutines, so the client side costs the same, and both routers
// share one Server, so the index, scheduler and metrics do the same work.
// Each worker caches a different share of the prompt, so the lookup and the
// cost model have real overlaps to weigh.
//
// tokens=1024 and 4096 are the sizes the targets name; tokens=64 shows the
// HTTP stacks with little routing work behind them. Besides req/s, which
// the other tenants of a shared machine disturb, cpu-µs/req is the
// process's CPU time per request.
func BenchmarkRouteOnly(b *testing.B) {
	s := newRouteTestServer(b, 4, "")
	ln := benchListen(b)
	go func() { _ = s.Serve(ln) }()

	nh := &http.Server{Handler: &routeHTTP{s: s}, ReadHeaderTimeout: s.cfg.ReadTimeout, IdleTimeout: s.cfg.IdleTimeout}
	nln := benchListen(b)
	go func() { _ = nh.Serve(nln) }()
	b.Cleanup(func() { _ = nh.Close() })

	for _, tokens := range []int{64, 1024, 4096} {
		body := tokenBody(benchTokens(tokens, 151935), ", ", false)
		blocks := tokens / s.sched.BlockSize()
		for i := range 4 {
			fillRouteIndex(b, s, body, i, blocks*(i+1)/5)
		}
		for _, srv := range []struct{ name, addr string }{
			{"fasthttp", ln.Addr().String()},
			{"nethttp", nln.Addr().String()},
		} {
			b.Run(srv.name+"/tokens="+strconv.Itoa(tokens), func(b *testing.B) {
				client := &fasthttp.HostClient{Addr: srv.addr, MaxConns: 256, ReadTimeout: 10 * time.Second}
				defer client.CloseIdleConnections()
				want := []byte(`"overlap_blocks":` + strconv.Itoa(blocks*4/5))
				checkRoute(b, client, srv.addr, body, want)
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				b.SetParallelism(8) // 16 requests in flight: both cores stay busy
				cpu0 := processCPU(b)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					req, resp := newRouteRequest(srv.addr, body), fasthttp.AcquireResponse()
					defer fasthttp.ReleaseRequest(req)
					defer fasthttp.ReleaseResponse(resp)
					for pb.Next() {
						if err := client.Do(req, resp); err != nil {
							b.Error(err)
							return
						}
						if resp.StatusCode() != fasthttp.StatusOK {
							b.Errorf("status %d: %s", resp.StatusCode(), resp.Body())
							return
						}
					}
				})
				b.StopTimer()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
				// CPU of the whole process, client included; the client's
				// share is the same for both servers, so the difference is
				// what the server stacks cost.
				b.ReportMetric(float64((processCPU(b)-cpu0).Nanoseconds())/1e3/float64(b.N), "cpu-µs/req")
			})
		}
	}
}

// processCPU is the user and system CPU time the process has used so far.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchListen(tb testing.TB) net.Listener {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = ln.Close() })
	return ln
}

func newRouteRequest(addr string, body []byte) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	req.SetRequestURI(PathRouteCompletions)
	req.Header.SetHost(addr)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.SetBody(body)
	return req
}

// checkRoute makes sure a server answers with the expected decision before
// it is timed: a fast wrong answer is no result.
func checkRoute(tb testing.TB, client *fasthttp.HostClient, addr string, body, want []byte) {
	tb.Helper()
	req, resp := newRouteRequest(addr, body), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	if err := client.Do(req, resp); err != nil {
		tb.Fatal(err)
	}
	if resp.StatusCode() != fasthttp.StatusOK || !bytes.Contains(resp.Body(), want) ||
		len(resp.Header.Peek(HeaderWorker)) == 0 || len(resp.Header.Peek(HeaderRequestID)) == 0 {
		tb.Fatalf("status %d, want %s in %s", resp.StatusCode(), want, resp.Body())
	}
}
