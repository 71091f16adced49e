package replay

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// NamedResult labels one replay, typically with the routing policy it ran
// against.
type NamedResult struct {
	Name   string
	Result *Result
}

// WriteTable writes one row per result, side by side: TTFT and
// inter-token latency percentiles, the end-to-end median, the measured
// hit rate against the trace's bound, and throughput.
func WriteTable(w io.Writer, results []NamedResult) error {
	withLRU := false
	for _, nr := range results {
		withLRU = withLRU || nr.Result.PooledLRU != nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "policy\treqs\terrors\tTTFT p50\tTTFT p90\tTTFT p99\tITL p50\tITL p90\tITL p99\tE2E p50\thit rate\tbound\tof bound\t"
	if withLRU {
		head += "pooled LRU\tof LRU\t"
	}
	fmt.Fprintln(tw, head+"req/s\tout tok/s\t")
	for _, nr := range results {
		s := nr.Result.Summary()
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.3f\t%s\t",
			nr.Name, s.Requests, s.Errors,
			s.latency(s.TTFTP50), s.latency(s.TTFTP90), s.latency(s.TTFTP99),
			s.itl(s.ITLP50), s.itl(s.ITLP90), s.itl(s.ITLP99), s.latency(s.LatencyP50),
			formatRate(s.HitRate, s.HitRateKnown()), s.Bound.Tokens,
			formatPercent(s.HitFractionOfBound()))
		if withLRU {
			fmt.Fprintf(tw, "%s\t%s\t", formatLRU(s.PooledLRU), formatPercent(s.HitFractionOfLRU()))
		}
		fmt.Fprintf(tw, "%.2f\t%.0f\t\n", s.RequestsPerSec, s.OutputTokensPerSec)
	}
	return tw.Flush()
}

// formatLRU prints the pooled-LRU reference's hit rate, or n/a.
func formatLRU(p *PooledLRU) string {
	if p == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.3f", p.Tokens)
}

// WriteText writes a human-readable report of one replay.
func (s *Summary) WriteText(w io.Writer) error {
	var b strings.Builder
	mode := fmt.Sprintf("timestamps at %gx", s.Speedup)
	if s.Mode == ModeConcurrency {
		mode = fmt.Sprintf("concurrency %d", s.Concurrency)
	}
	perID := fmt.Sprintf("%d tokens per hash id", s.BlockTokens)
	if s.Workload != WorkloadTokens {
		perID = fmt.Sprintf("%s, %d words per hash id", s.Workload, s.BlockTokens)
	}
	fmt.Fprintf(&b, "trace       %s (%s, %s)\n", s.Source, perID, mode)
	cut := ""
	if s.Interrupted > 0 {
		cut = fmt.Sprintf(" (%d more cut short by the interrupt, not counted)", s.Interrupted)
	}
	fmt.Fprintf(&b, "requests    %d sent, %d ok, %d failed in %s%s\n", s.Requests, s.Succeeded, s.Errors, s.Duration.Round(time.Millisecond), cut)
	fmt.Fprintf(&b, "TTFT        p50 %s  p90 %s  p99 %s\n", s.latency(s.TTFTP50), s.latency(s.TTFTP90), s.latency(s.TTFTP99))
	fmt.Fprintf(&b, "ITL         mean %s  p50 %s  p90 %s  p99 %s\n", s.itl(s.ITLMean), s.itl(s.ITLP50),
		s.itl(s.ITLP90), s.itl(s.ITLP99))
	fmt.Fprintf(&b, "latency     p50 %s  p99 %s (end to end)\n", s.latency(s.LatencyP50), s.latency(s.LatencyP99))
	fmt.Fprintf(&b, "throughput  %.2f req/s  %.0f output tok/s\n", s.RequestsPerSec, s.OutputTokensPerSec)
	switch {
	case s.Comparable():
		fmt.Fprintf(&b, "prefix hits %.3f of prompt tokens (%s of the infinite-cache bound %.3f)\n",
			s.HitRate, formatPercent(s.HitFractionOfBound()), s.Bound.Tokens)
		if s.WarmCaches() {
			fmt.Fprintf(&b, "warning     the hit rate exceeds the bound, which assumes caches empty at the start: the engines were warm "+
				"(from an earlier run?); restart them, or POST /reset_prefix_cache to each engine (vLLM, kvfast mock) between runs\n")
		}
	case s.HitRateKnown():
		fmt.Fprintf(&b, "prefix hits %.3f of prompt tokens over the %d of %d requests answered with usage; not compared with the bound (%.3f), which covers all of them\n",
			s.HitRate, s.UsageReports, s.Records, s.Bound.Tokens)
	default:
		fmt.Fprintf(&b, "prefix hits n/a: no response reported usage (infinite-cache bound %.3f)\n", s.Bound.Tokens)
	}
	if p := s.PooledLRU; p != nil {
		fmt.Fprintf(&b, "pooled LRU  %.3f of prompt tokens in one LRU cache of %d blocks (working set %d blocks); measured %s of it\n",
			p.Tokens, p.CapacityBlocks, p.WorkingSetBlocks, formatPercent(s.HitFractionOfLRU()))
	}
	if s.MaxSendLag > 50*time.Millisecond {
		fmt.Fprintf(&b, "warning     requests left up to %s late: the client limited the pace\n", formatMillis(s.MaxSendLag))
	}
	if len(s.Workers) > 0 {
		names := make([]string, 0, len(s.Workers))
		for n := range s.Workers {
			names = append(names, n)
		}
		slices.Sort(names)
		b.WriteString("workers    ")
		for _, n := range names {
			fmt.Fprintf(&b, " %s=%d", n, s.Workers[n])
		}
		b.WriteByte('\n')
	}
	for _, e := range s.ErrorSamples {
		fmt.Fprintf(&b, "error       %s\n", e)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// formatMillis prints a duration in milliseconds, the unit TTFT is read in.
func formatMillis(d time.Duration) string {
	ms := float64(d) / 1e6
	switch {
	case ms >= 10000:
		return fmt.Sprintf("%.1fs", ms/1000)
	case ms >= 100:
		return fmt.Sprintf("%.0fms", ms)
	default:
		return fmt.Sprintf("%.1fms", ms)
	}
}

// latency prints a TTFT or latency figure, n/a when none was measured.
func (s *Summary) latency(d time.Duration) string {
	if !s.LatencyKnown() {
		return "n/a"
	}
	return formatMillis(d)
}

// itl prints an inter-token latency figure, n/a when none was measured.
func (s *Summary) itl(d time.Duration) string {
	if !s.ITLKnown() {
		return "n/a"
	}
	return formatMillis(d)
}

func formatRate(r float64, known bool) string {
	if !known || math.IsNaN(r) {
		return "n/a"
	}
	return fmt.Sprintf("%.3f", r)
}

func formatPercent(f float64) string {
	if math.IsNaN(f) {
		return "n/a"
	}
	return fmt.Sprintf("%.0f%%", 100*f)
}
