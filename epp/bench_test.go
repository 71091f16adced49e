package epp_test

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvfast/kvfast/epp"
)

// BenchmarkDecision measures what a gateway waits for per request: one
// ext_proc stream over loopback gRPC carrying a completion's headers and
// body (full duplex), answered with the destination and the body, then
// closed; 4 endpoints cache 20–80% of the prompt. As BenchmarkRouteOnly
// does for the HTTP route-only endpoint, parallel reports decisions/s
// with 16 streams in flight and the process's CPU per decision (the
// client's share included); sequential, the p50 and p99 of one
// decision's round trip with nothing else in flight.
func BenchmarkDecision(b *testing.B) {
	eps := endpoints(4)
	r := startEPP(b, epp.DefaultConfig(), eps...)
	for _, n := range []int{64, 1024, 4096} {
		prompt := tokens(1, n)
		blocks := n / 16
		for i, e := range eps {
			cache(b, r, e.Address, prompt, blocks*(i+1)/5)
		}
		body := completionBody(b, prompt, true)
		// Alone, the request goes where most of its prompt is cached;
		// with 16 in flight, their load spreads them.
		if dest := decideOnce(b, r, body); dest != eps[3].Address {
			b.Fatalf("routed to %s, want %s", dest, eps[3].Address)
		}
		b.Run("parallel/tokens="+strconv.Itoa(n), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			b.SetParallelism(8) // 16 streams in flight: both cores stay busy
			cpu0 := processCPU(b)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if decideOnce(b, r, body) == "" {
						b.Error("no destination")
						return
					}
				}
			})
			b.StopTimer()
			cpu := float64((processCPU(b) - cpu0).Nanoseconds()) / 1e3 / float64(b.N)
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
			b.ReportMetric(cpu, "cpu-µs/decision")
			b.ReportMetric(1e6/cpu, "decisions/s/core")
		})
		b.Run("sequential/tokens="+strconv.Itoa(n), func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			for b.Loop() {
				t0 := time.Now()
				decideOnce(b, r, body)
				lat = append(lat, time.Since(t0))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
		})
	}
}

// decideOnce runs one request's request phase on its own stream and
// returns the endpoint chosen.
func decideOnce(b *testing.B, r *eppRig, body []byte) string {
	st := r.open(b, duplexMode())
	defer st.cancel()
	st.requestHeaders("/v1/completions", false, nil)
	st.requestBody(body, true)
	hr := st.recv()
	dest := string(hr.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()[0].GetHeader().GetRawValue())
	for {
		br := st.recv().Response.(*extprocv3.ProcessingResponse_RequestBody)
		if br.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
			break
		}
	}
	st.closeAndWaitEOF()
	return dest
}

// processCPU is the user and system CPU time the process has used so far.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkScanEvents scans one response chunk of blank lines (each pair
// an event boundary, the scan's most events per byte) at two sizes: the
// time per byte should not grow with the chunk (ns/byte), as it did when
// each event moved the rest of the chunk.
func BenchmarkScanEvents(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("bytes=%d", size), func(b *testing.B) {
			chunk := bytes.Repeat([]byte("\n"), size)
			b.SetBytes(int64(size))
			for b.Loop() {
				epp.ScanChunk(chunk)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(size), "ns/byte")
		})
	}
}
