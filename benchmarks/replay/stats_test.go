package replay

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ms := func(v ...float64) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x * float64(time.Millisecond))
		}
		return out
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one value", ms(7), 0.99, 7 * time.Millisecond},
		{"median of even count interpolates", ms(1, 2, 3, 4), 0.5, 2500 * time.Microsecond},
		{"p90 of four", ms(1, 2, 3, 4), 0.9, 3700 * time.Microsecond},
		{"p0 is the minimum", ms(1, 2, 3, 4), 0, time.Millisecond},
		{"p100 is the maximum", ms(1, 2, 3, 4), 1, 4 * time.Millisecond},
		{"out of range clamps", ms(1, 2), 1.5, 2 * time.Millisecond},
		{"p99 of 1..100", ms(seq(100)...), 0.99, 99010 * time.Microsecond},
		{"p50 of 1..101", ms(seq(101)...), 0.5, 51 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percentile(tt.sorted, tt.p); got != tt.want {
				t.Fatalf("Percentile(p=%v) = %v, want %v", tt.p, got, tt.want)
			}
		})
	}
	if got := Mean(ms(1, 2, 6)); got != 3*time.Millisecond {
		t.Fatalf("Mean = %v", got)
	}
	if Mean(nil) != 0 {
		t.Fatal("Mean of nothing is not 0")
	}
}

func seq(n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = float64(i + 1)
	}
	return out
}

// fakeResult builds a Result without a server, for stats and reports.
func fakeResult(ttftMs []float64, cached, prompt int, failures int) *Result {
	r := &Result{Source: "fake.jsonl", Mode: ModeTimestamps, Speedup: 1, BlockTokens: 512, Duration: 2 * time.Second,
		Bound: Bound{Tokens: 0.6, Blocks: 0.6}}
	for i, v := range ttftMs {
		d := time.Duration(v * float64(time.Millisecond))
		r.Requests = append(r.Requests, RequestResult{
			Index: i, Attempted: true, TTFT: d, Latency: d + 10*time.Millisecond,
			PromptTokens: prompt, HasUsage: prompt > 0, UsagePromptTokens: prompt, UsageCachedTokens: cached,
			UsageCompletionTokens: 5, Chunks: 5, Worker: []string{"a", "b"}[i%2], Status: 200,
		})
		r.Gaps = append(r.Gaps, time.Millisecond, 3*time.Millisecond)
	}
	for i := range failures {
		r.Requests = append(r.Requests, RequestResult{Index: len(ttftMs) + i, Attempted: true, Err: "HTTP 503: busy", Status: 503})
	}
	if failures > 0 {
		r.Requests = append(r.Requests, RequestResult{Index: len(r.Requests)}) // never sent
	}
	return r
}

func TestSummary(t *testing.T) {
	s := fakeResult([]float64{40, 10, 30, 20}, 30, 100, 2).Summary()
	if s.Requests != 6 || s.Succeeded != 4 || s.Errors != 2 {
		t.Fatalf("counts %d/%d/%d", s.Requests, s.Succeeded, s.Errors)
	}
	if s.TTFTP50 != 25*time.Millisecond || s.LatencyP50 != 35*time.Millisecond {
		t.Fatalf("p50s %v, %v", s.TTFTP50, s.LatencyP50)
	}
	// Gaps 1,1,1,1,3,3,3,3 ms: the median interpolates between the two
	// middle ranks.
	if s.ITLMean != 2*time.Millisecond || s.ITLP50 != 2*time.Millisecond || s.ITLP90 != 3*time.Millisecond || s.ITLP99 != 3*time.Millisecond {
		t.Fatalf("ITL mean %v, p50 %v, p90 %v, p99 %v", s.ITLMean, s.ITLP50, s.ITLP90, s.ITLP99)
	}
	// Two requests failed and one was never sent: the hit rate is the
	// survivors', which the bound over all of them does not compare with.
	if s.HitRate != 0.3 || s.Comparable() || !math.IsNaN(s.HitFractionOfBound()) {
		t.Fatalf("hit rate %v (%v of bound), comparable %v", s.HitRate, s.HitFractionOfBound(), s.Comparable())
	}
	all := fakeResult([]float64{40, 10}, 30, 100, 0).Summary()
	if !all.Comparable() || math.Abs(all.HitFractionOfBound()-0.5) > 1e-12 {
		t.Fatalf("every request answered: %v of bound", all.HitFractionOfBound())
	}
	// A second run against warm engines: every prompt hits, far above the
	// bound of 0.6, which assumes cold caches.
	warm := fakeResult([]float64{40, 10}, 95, 100, 0).Summary()
	var warmText strings.Builder
	if err := warm.WriteText(&warmText); err != nil || !warm.WarmCaches() ||
		!strings.Contains(warmText.String(), "the engines were warm") || !strings.Contains(warmText.String(), "/reset_prefix_cache") {
		t.Fatalf("warm caches: %v, text %q, %v", warm.WarmCaches(), warmText.String(), err)
	}
	var coldText strings.Builder
	if err := all.WriteText(&coldText); err != nil || all.WarmCaches() || strings.Contains(coldText.String(), "warm") {
		t.Fatalf("cold caches: %v, text %q, %v", all.WarmCaches(), coldText.String(), err)
	}
	if s.RequestsPerSec != 2 || s.OutputTokensPerSec != 10 {
		t.Fatalf("throughput %v req/s, %v tok/s", s.RequestsPerSec, s.OutputTokensPerSec)
	}
	if s.Workers["a"] != 2 || s.Workers["b"] != 2 || len(s.ErrorSamples) != 1 {
		t.Fatalf("workers %v, errors %v", s.Workers, s.ErrorSamples)
	}

	js, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if back["ttft_p50_ms"] != 25.0 || back["itl_p50_ms"] != 2.0 || back["itl_p90_ms"] != 3.0 || back["hit_rate"] != 0.3 || back["errors"] != 2.0 {
		t.Fatalf("JSON %s", js)
	}
	// Not every record reported usage: the JSON says so, as the text does.
	if back["comparable"] != false || back["records"] != float64(s.Records) {
		t.Fatalf("records and comparable: JSON %s", js)
	}
	if js, err := json.Marshal(all); err != nil || !strings.Contains(string(js), `"comparable":true`) {
		t.Fatalf("every request answered: JSON %s, %v", js, err)
	}

	noUsage := fakeResult([]float64{1}, 0, 0, 0).Summary()
	if noUsage.HitRateKnown() || !math.IsNaN(noUsage.HitFractionOfBound()) {
		t.Fatal("hit rate known without usage")
	}
	js, err = json.Marshal(noUsage)
	if err != nil || !strings.Contains(string(js), `"hit_rate":null`) {
		t.Fatalf("JSON without usage: %s, %v", js, err)
	}
	var text strings.Builder
	if err := noUsage.WriteText(&text); err != nil || !strings.Contains(text.String(), "prefix hits n/a") {
		t.Fatalf("text: %q, %v", text.String(), err)
	}

	// Every request failed: no TTFT or latency was measured, and a zero
	// would read as an instant answer.
	failed := fakeResult(nil, 0, 0, 2).Summary()
	js, err = json.Marshal(failed)
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"ttft_p50_ms", "ttft_p99_ms", "itl_mean_ms", "itl_p50_ms", "latency_p50_ms", "latency_p99_ms"} {
		if !strings.Contains(string(js), `"`+field+`":null`) {
			t.Fatalf("%s is not null when every request failed: %s", field, js)
		}
	}
	text.Reset()
	if err := failed.WriteText(&text); err != nil || strings.Contains(text.String(), "0.0ms") ||
		!strings.Contains(text.String(), "TTFT        p50 n/a") || !strings.Contains(text.String(), "latency     p50 n/a") {
		t.Fatalf("text when every request failed: %q, %v", text.String(), err)
	}
}

func TestWriteTable(t *testing.T) {
	var b strings.Builder
	err := WriteTable(&b, []NamedResult{
		{"kv", fakeResult([]float64{10, 20}, 60, 100, 0)},
		{"round-robin", fakeResult([]float64{100, 200}, 0, 0, 1)},
	})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "TTFT p50") || !strings.Contains(lines[0], "ITL p90") {
		t.Fatalf("table:\n%s", b.String())
	}
	if f := strings.Fields(lines[1]); f[0] != "kv" || f[3] != "15.0ms" || f[6] != "2.0ms" || f[10] != "0.600" || f[12] != "100%" {
		t.Fatalf("kv row %q", f)
	}
	if f := strings.Fields(lines[2]); f[0] != "round-robin" || f[2] != "1" || f[10] != "n/a" {
		t.Fatalf("round-robin row %q", f)
	}
}
