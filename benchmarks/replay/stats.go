package replay

import (
	"encoding/json"
	"math"
	"slices"
	"time"
)

// maxErrorSamples bounds the distinct error messages a Summary keeps.
const maxErrorSamples = 5

// Summary condenses a Result into the figures a report shows.
type Summary struct {
	Source      string
	Workload    string // WorkloadTokens, WorkloadChat or WorkloadMultimodal
	Mode        string
	Speedup     float64
	Concurrency int
	BlockTokens int

	Requests  int // attempted, Interrupted not counted
	Succeeded int
	Errors    int
	// Interrupted were sent and then cut short by the run's end.
	Interrupted int
	// Records is the trace's requests, all of which Bound and PooledLRU
	// cover, attempted or not.
	Records int

	// TTFT and Latency are over the successful requests, zero (and
	// reported n/a) without one.
	TTFTP50, TTFTP90, TTFTP99 time.Duration
	// ITL is over every inter-chunk gap of every successful request
	// (ITLGaps of them), zero (and reported n/a) without one.
	ITLMean, ITLP50, ITLP90, ITLP99 time.Duration
	ITLGaps                         int
	LatencyP50, LatencyP99          time.Duration // end to end

	Duration           time.Duration
	RequestsPerSec     float64 // successful requests per second
	OutputTokens       int64
	OutputTokensPerSec float64

	// UsagePromptTokens and UsageCachedTokens sum what the server reported
	// for successful requests that carried usage (UsageReports of them).
	UsageReports      int
	UsagePromptTokens int64
	UsageCachedTokens int64
	// HitRate is UsageCachedTokens/UsagePromptTokens, NaN without usage.
	HitRate float64
	Bound   Bound
	// PooledLRU is the pooled-LRU reference, nil when not computed.
	PooledLRU *PooledLRU

	// MaxSendLag is the longest a request left after its due time: large
	// values mean the client, not the router, set the pace.
	MaxSendLag time.Duration
	// Workers counts successful requests per WorkerHeader value; requests
	// without the header are not counted.
	Workers map[string]int
	// ErrorSamples holds the first few distinct error messages.
	ErrorSamples []string
}

// LatencyKnown reports whether TTFT and latency were measured: a request
// that failed has neither, so a run without a success has no figures, and
// zeros would read as an infinitely fast router.
func (s *Summary) LatencyKnown() bool { return s.Succeeded > 0 }

// ITLKnown reports whether any inter-token gap was measured.
func (s *Summary) ITLKnown() bool { return s.ITLGaps > 0 }

// HitRateKnown reports whether any response carried usage.
func (s *Summary) HitRateKnown() bool { return s.UsageReports > 0 }

// Comparable reports whether the measured hit rate covers the requests
// the references do: every request of the trace answered with usage. A
// run whose requests failed measured the survivors only, and a request
// that failed cached nothing for those after it, so neither ratio means
// anything then.
func (s *Summary) Comparable() bool { return s.HitRateKnown() && s.UsageReports == s.Records }

// HitFractionOfBound is HitRate/Bound.Tokens, NaN when either is unknown,
// the bound is zero or the run is not Comparable. The bound assumes empty
// caches at the start, so it exceeds 1 when they were warm (WarmCaches).
func (s *Summary) HitFractionOfBound() float64 {
	if !s.Comparable() || s.Bound.Tokens == 0 {
		return math.NaN()
	}
	return s.HitRate / s.Bound.Tokens
}

// warmMargin is how far, in hit-rate points, a measured rate may exceed the
// infinite-cache bound before the caches are said to have been warm: on
// the token workload no cold cache can beat the bound at all, but the chat
// workload's bound counts words, not the template's tokens, so it is only
// approximate there.
const warmMargin = 0.02

// WarmCaches reports whether the measured hit rate beats the
// infinite-cache bound, which only caches that already held some of the
// prompts when the replay started can do (an earlier run's, say).
func (s *Summary) WarmCaches() bool {
	return s.Comparable() && s.HitRate > s.Bound.Tokens+warmMargin
}

// HitFractionOfLRU is HitRate over the pooled-LRU reference's, NaN when
// either is unknown, the reference is zero or the run is not Comparable.
func (s *Summary) HitFractionOfLRU() float64 {
	if !s.Comparable() || s.PooledLRU == nil || s.PooledLRU.Tokens == 0 {
		return math.NaN()
	}
	return s.HitRate / s.PooledLRU.Tokens
}

// Summary computes the summary of r.
func (r *Result) Summary() Summary {
	s := Summary{
		Source:      r.Source,
		Workload:    r.Workload,
		Mode:        r.Mode,
		Speedup:     r.Speedup,
		Concurrency: r.Concurrency,
		BlockTokens: r.BlockTokens,
		Duration:    r.Duration,
		Bound:       r.Bound,
		PooledLRU:   r.PooledLRU,
		HitRate:     math.NaN(),
		Workers:     map[string]int{},
		Records:     len(r.Requests),
	}
	ttft := make([]time.Duration, 0, len(r.Requests))
	lat := make([]time.Duration, 0, len(r.Requests))
	for i := range r.Requests {
		q := &r.Requests[i]
		if !q.Attempted {
			continue
		}
		if q.Interrupted {
			s.Interrupted++
			continue
		}
		s.Requests++
		s.MaxSendLag = max(s.MaxSendLag, q.Sent-q.Scheduled)
		if !q.OK() {
			s.Errors++
			if len(s.ErrorSamples) < maxErrorSamples && !slices.Contains(s.ErrorSamples, q.Err) {
				s.ErrorSamples = append(s.ErrorSamples, q.Err)
			}
			continue
		}
		s.Succeeded++
		ttft = append(ttft, q.TTFT)
		lat = append(lat, q.Latency)
		s.OutputTokens += int64(q.OutputTokens())
		if q.HasUsage {
			s.UsageReports++
			s.UsagePromptTokens += int64(q.UsagePromptTokens)
			s.UsageCachedTokens += int64(q.UsageCachedTokens)
		}
		if q.Worker != "" {
			s.Workers[q.Worker]++
		}
	}
	slices.Sort(ttft)
	slices.Sort(lat)
	s.TTFTP50, s.TTFTP90, s.TTFTP99 = Percentile(ttft, 0.50), Percentile(ttft, 0.90), Percentile(ttft, 0.99)
	s.LatencyP50, s.LatencyP99 = Percentile(lat, 0.50), Percentile(lat, 0.99)
	gaps := slices.Clone(r.Gaps)
	slices.Sort(gaps)
	s.ITLGaps = len(gaps)
	s.ITLMean = Mean(gaps)
	s.ITLP50, s.ITLP90, s.ITLP99 = Percentile(gaps, 0.50), Percentile(gaps, 0.90), Percentile(gaps, 0.99)
	if secs := r.Duration.Seconds(); secs > 0 {
		s.RequestsPerSec = float64(s.Succeeded) / secs
		s.OutputTokensPerSec = float64(s.OutputTokens) / secs
	}
	if s.UsagePromptTokens > 0 {
		s.HitRate = float64(s.UsageCachedTokens) / float64(s.UsagePromptTokens)
	}
	return s
}

// TTFTs returns the sorted TTFTs of the successful requests.
func (r *Result) TTFTs() []time.Duration {
	out := make([]time.Duration, 0, len(r.Requests))
	for i := range r.Requests {
		if r.Requests[i].OK() {
			out = append(out, r.Requests[i].TTFT)
		}
	}
	slices.Sort(out)
	return out
}

// Percentile returns the p-quantile (0 <= p <= 1) of sorted values,
// interpolating linearly between the two nearest ranks (the method numpy
// and most dashboards use by default). It returns 0 for no values.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	p = min(max(p, 0), 1)
	rank := p * float64(n-1)
	lo := int(rank)
	if lo >= n-1 {
		return sorted[n-1]
	}
	frac := rank - float64(lo)
	return sorted[lo] + time.Duration(math.Round(frac*float64(sorted[lo+1]-sorted[lo])))
}

// Mean returns the mean of values, 0 for none.
func Mean(values []time.Duration) time.Duration {
	if len(values) == 0 {
		return 0
	}
	var sum float64
	for _, v := range values {
		sum += float64(v)
	}
	return time.Duration(math.Round(sum / float64(len(values))))
}

// MarshalJSON writes durations as milliseconds and an unknown hit rate or
// latency as null, so that the output is easy to consume from any language.
func (s Summary) MarshalJSON() ([]byte, error) {
	ms := func(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }
	msIf := func(d time.Duration, known bool) *float64 {
		if !known {
			return nil
		}
		v := ms(d)
		return &v
	}
	lat, itl := s.LatencyKnown(), s.ITLKnown()
	var hit, ofBound, ofLRU *float64
	if s.HitRateKnown() {
		h := s.HitRate
		hit = &h
		if f := s.HitFractionOfBound(); !math.IsNaN(f) {
			ofBound = &f
		}
		if f := s.HitFractionOfLRU(); !math.IsNaN(f) {
			ofLRU = &f
		}
	}
	// records is the trace's requests, which bound and pooled_lru cover;
	// comparable, that every one reported usage, so that hit_rate may be
	// set against them (not after an interrupt).
	return json.Marshal(struct {
		Source             string         `json:"source"`
		Workload           string         `json:"workload"`
		Mode               string         `json:"mode"`
		Speedup            float64        `json:"speedup,omitempty"`
		Concurrency        int            `json:"concurrency,omitempty"`
		BlockTokens        int            `json:"block_tokens"`
		Records            int            `json:"records"`
		Requests           int            `json:"requests"`
		Succeeded          int            `json:"succeeded"`
		Errors             int            `json:"errors"`
		Interrupted        int            `json:"interrupted,omitempty"`
		Comparable         bool           `json:"comparable"`
		TTFTP50            *float64       `json:"ttft_p50_ms"`
		TTFTP90            *float64       `json:"ttft_p90_ms"`
		TTFTP99            *float64       `json:"ttft_p99_ms"`
		ITLMean            *float64       `json:"itl_mean_ms"`
		ITLP50             *float64       `json:"itl_p50_ms"`
		ITLP90             *float64       `json:"itl_p90_ms"`
		ITLP99             *float64       `json:"itl_p99_ms"`
		LatencyP50         *float64       `json:"latency_p50_ms"`
		LatencyP99         *float64       `json:"latency_p99_ms"`
		Duration           float64        `json:"duration_s"`
		RequestsPerSec     float64        `json:"requests_per_s"`
		OutputTokens       int64          `json:"output_tokens"`
		OutputTokensPerSec float64        `json:"output_tokens_per_s"`
		UsageReports       int            `json:"usage_reports"`
		UsagePromptTokens  int64          `json:"usage_prompt_tokens"`
		UsageCachedTokens  int64          `json:"usage_cached_tokens"`
		HitRate            *float64       `json:"hit_rate"`
		Bound              Bound          `json:"bound"`
		HitFractionOfBound *float64       `json:"hit_rate_of_bound"`
		PooledLRU          *PooledLRU     `json:"pooled_lru,omitempty"`
		HitFractionOfLRU   *float64       `json:"hit_rate_of_pooled_lru,omitempty"`
		MaxSendLag         float64        `json:"max_send_lag_ms"`
		Workers            map[string]int `json:"workers"`
		ErrorSamples       []string       `json:"error_samples,omitempty"`
	}{
		s.Source, s.Workload, s.Mode, s.Speedup, s.Concurrency, s.BlockTokens,
		s.Records, s.Requests, s.Succeeded, s.Errors, s.Interrupted, s.Comparable(),
		msIf(s.TTFTP50, lat), msIf(s.TTFTP90, lat), msIf(s.TTFTP99, lat),
		msIf(s.ITLMean, itl), msIf(s.ITLP50, itl), msIf(s.ITLP90, itl), msIf(s.ITLP99, itl),
		msIf(s.LatencyP50, lat), msIf(s.LatencyP99, lat),
		s.Duration.Seconds(), s.RequestsPerSec, s.OutputTokens, s.OutputTokensPerSec,
		s.UsageReports, s.UsagePromptTokens, s.UsageCachedTokens,
		hit, s.Bound, ofBound, s.PooledLRU, ofLRU, ms(s.MaxSendLag), s.Workers, s.ErrorSamples,
	})
}
