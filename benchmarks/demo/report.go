package demo

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/kvfast/kvfast/benchmarks/replay"
	"github.com/kvfast/kvfast/prompt"
	"github.com/kvfast/kvfast/workers"
)

// Report is an experiment's outcome: every policy's replay, what the
// engines did, and the targets judged on them.
type Report struct {
	Options Options // as run, ApproxTTL resolved
	Trace   string  // the trace's source
	Runs    []PolicyRun
	Checks  []Check
	// Sweep holds every capacity's runs when Options.Capacities is set;
	// Runs are then the largest capacity's.
	Sweep []SweepPoint
	// Failed: some policy's replay failed around it or had failed requests.
	Failed bool
	// Interrupted: the run ended early (an interrupt); Runs and Sweep hold
	// only what finished, and Checks only the capacities every policy
	// finished (none without a sweep).
	Interrupted bool
	// Images describes the images the multimodal workload sent.
	Images ImageLoad
}

// EngineTotals sums what one policy's engines did.
type EngineTotals struct {
	PromptTokens  uint64  `json:"prompt_tokens"`
	PrefillTokens uint64  `json:"prefill_tokens"` // computed, recomputation included
	BlocksEvicted uint64  `json:"blocks_evicted"`
	Preemptions   uint64  `json:"preemptions"`
	BusyMean      float64 `json:"busy_mean"` // fraction of the replay spent in steps, over engines
	BusyMax       float64 `json:"busy_max"`
	// WaitP50 and WaitP90 are percentiles of TTFT beyond the request's own
	// prefill at the timing model (wall clock), over successful requests.
	WaitP50 time.Duration `json:"wait_p50_ns"`
	WaitP90 time.Duration `json:"wait_p90_ns"`
}

// Totals sums r's engines under the experiment o.
func (r *PolicyRun) Totals(o *Options) EngineTotals {
	var t EngineTotals
	var wall time.Duration
	if r.Result != nil {
		wall = r.Result.Duration
	}
	for _, s := range r.Engines {
		t.PromptTokens += s.PromptTokens
		t.PrefillTokens += s.PrefillTokens
		t.BlocksEvicted += s.BlocksEvicted
		t.Preemptions += s.Preemptions
		if wall > 0 && !math.IsInf(o.EngineSpeedup, 1) {
			busy := s.BusyTime.Seconds() / o.EngineSpeedup / wall.Seconds()
			t.BusyMean += busy / float64(len(r.Engines))
			t.BusyMax = max(t.BusyMax, busy)
		}
	}
	if r.Result != nil {
		waits := waits(r.Result, o)
		t.WaitP50, t.WaitP90 = replay.Percentile(waits, 0.5), replay.Percentile(waits, 0.9)
	}
	return t
}

// waits returns, sorted, each successful request's TTFT minus what its own
// prefill costs at the timing model: the uncached tokens in chunks of at
// most MaxBatchedTokens, one step overhead per chunk, divided by the
// engine speed-up. What remains is time spent behind other requests, or
// sharing steps with them, plus the router's and HTTP's overhead.
func waits(res *replay.Result, o *Options) []time.Duration {
	var waits []time.Duration
	for i := range res.Requests {
		r := &res.Requests[i]
		if !r.OK() || !r.HasUsage {
			continue
		}
		own := time.Duration(0)
		if !math.IsInf(o.EngineSpeedup, 1) {
			// The engine recomputes at least the last prompt token.
			cached := min(r.UsageCachedTokens, r.UsagePromptTokens-1)
			var sim time.Duration
			for done := cached; done < r.UsagePromptTokens; {
				n := min(o.MaxBatchedTokens, r.UsagePromptTokens-done)
				sim += o.Timing.StepOverhead + o.Timing.Prefill(done, n)
				done += n
			}
			own = time.Duration(float64(sim) / o.EngineSpeedup)
		}
		waits = append(waits, max(r.TTFT-own, 0))
	}
	slices.Sort(waits)
	return waits
}

// Check is one routing-quality target, judged on the measured numbers.
type Check struct {
	Target string `json:"target"`
	Detail string `json:"detail"`
	Met    bool   `json:"met"`
	// NotJudged is set, with Met false, when the run cannot tell whether
	// the target was met: Detail says why.
	NotJudged bool `json:"not_judged,omitempty"`
}

// Checks judges the targets of the routing-quality benchmark that the
// policies run allow, for each policy that routes on exact token blocks
// (kv; in the chat workload, kv-builtin and kv-remote): its hit rate
// against the bound, its TTFT p50 against round-robin's, and it against
// approx.
func Checks(workload string, runs []PolicyRun) []Check {
	sums := map[string]replay.Summary{}
	for _, r := range runs {
		sums[r.Policy] = r.Result.Summary()
	}
	exact := []string{"kv"}
	bound := "the infinite-cache bound"
	if workload == replay.WorkloadChat || workload == replay.WorkloadMultimodal {
		exact = []string{PolicyKVBuiltin, PolicyKVRemote}
		// The bound counts a hash id's words, the engines the template's
		// tokens too.
		bound = "the infinite-cache bound (approximate for chat)"
	}
	var checks []Check
	for _, name := range exact {
		kv, ok := sums[name]
		if !ok {
			continue
		}
		if kv.HitRateKnown() && !kv.Comparable() {
			checks = append(checks, Check{
				Target:    fmt.Sprintf("%s prefix hit rate >= 90%% of %s", name, bound),
				Detail:    fmt.Sprintf("not judged: %d of %d requests answered with usage", kv.UsageReports, kv.Records),
				NotJudged: true,
			})
		} else if kv.HitRateKnown() && kv.Bound.Tokens == 0 {
			// No request repeats an earlier one's prefix, so no policy
			// can hit and there is no fraction to judge.
			checks = append(checks, Check{
				Target:    fmt.Sprintf("%s prefix hit rate >= 90%% of %s", name, bound),
				Detail:    fmt.Sprintf("not judged: the bound is 0, no request repeats an earlier one's prefix (hit rate %.3f)", kv.HitRate),
				NotJudged: true,
			})
		} else if kv.HitRateKnown() {
			f := kv.HitFractionOfBound()
			checks = append(checks, Check{
				Target: fmt.Sprintf("%s prefix hit rate >= 90%% of %s", name, bound),
				Detail: fmt.Sprintf("%.3f of %.3f = %.1f%%", kv.HitRate, kv.Bound.Tokens, 100*f),
				Met:    f >= 0.9,
			})
		}
		if rr, ok := sums["round-robin"]; ok && kv.TTFTP50 > 0 {
			ratio := float64(rr.TTFTP50) / float64(kv.TTFTP50)
			checks = append(checks, Check{
				Target: fmt.Sprintf("%s TTFT p50 at least 3x better than round-robin", name),
				Detail: fmt.Sprintf("%s vs %s = %.1fx", millis(kv.TTFTP50), millis(rr.TTFTP50), ratio),
				Met:    ratio >= 3,
			})
		}
		if lru := kv.PooledLRU; lru != nil && kv.Comparable() && lru.Tokens > 0 {
			f := kv.HitFractionOfLRU()
			checks = append(checks, Check{
				Target: fmt.Sprintf("%s prefix hit rate >= 95%% of the pooled-LRU reference", name),
				Detail: fmt.Sprintf("%.3f of %.3f = %.1f%% (one LRU cache of %d blocks, working set %d)", kv.HitRate, lru.Tokens, 100*f,
					lru.CapacityBlocks, lru.WorkingSetBlocks),
				Met: f >= 0.95,
			})
		}
		if af, ok := sums["affinity"]; ok && kv.HitRateKnown() && af.HitRateKnown() {
			checks = append(checks, Check{
				Target: fmt.Sprintf("%s beats affinity (hit rate at least as high, TTFT p99 no higher)", name),
				Detail: fmt.Sprintf("hit rate %.3f vs %.3f, TTFT p99 %s vs %s", kv.HitRate, af.HitRate, millis(kv.TTFTP99), millis(af.TTFTP99)),
				Met:    kv.HitRate >= af.HitRate && kv.TTFTP99 <= af.TTFTP99,
			})
		}
		if ap, ok := sums["approx"]; ok {
			// Repeated runs of one policy on a quiet machine spread by about a
			// point of hit rate either way, so a smaller lead is a tie.
			checks = append(checks, Check{
				Target: fmt.Sprintf("%s beats approx (hit rate %.0f+ points higher, lower TTFT p50 and p90)", name, 100*hitMargin),
				Detail: fmt.Sprintf("TTFT p50 %s vs %s, p90 %s vs %s, hit rate %.3f vs %.3f",
					millis(kv.TTFTP50), millis(ap.TTFTP50), millis(kv.TTFTP90), millis(ap.TTFTP90), kv.HitRate, ap.HitRate),
				Met: kv.TTFTP50 < ap.TTFTP50 && kv.TTFTP90 < ap.TTFTP90 && kv.HitRate >= ap.HitRate+hitMargin,
			})
		}
	}
	return checks
}

func millis(d time.Duration) string {
	return fmt.Sprintf("%.1fms", float64(d)/1e6)
}

func (rep *Report) named() []replay.NamedResult {
	named := make([]replay.NamedResult, len(rep.Runs))
	for i, r := range rep.Runs {
		named[i] = replay.NamedResult{Name: r.Policy, Result: r.Result}
	}
	return named
}

// WriteHTML writes the self-contained HTML report: a TTFT CDF per policy
// and hit-rate bars.
func (rep *Report) WriteHTML(w io.Writer) error {
	var sweeps []replay.CapacitySweep
	if len(rep.Sweep) > 0 {
		sweeps = append(sweeps, rep.capacitySweep())
	}
	var tables []replay.HTMLTable
	if rep.Options.Workload == replay.WorkloadMultimodal {
		tables = rep.encodeHTMLTables()
	}
	return replay.WriteHTMLWith(w, rep.named(), sweeps, tables)
}

// WriteText writes the replay table, the engines' table, the targets, any
// timing warning and a line recalling the setup.
func (rep *Report) WriteText(w io.Writer) error {
	o := &rep.Options
	if rep.Interrupted {
		judged := "no target is judged"
		if len(rep.Sweep) > 0 {
			judged = "targets are judged at the capacities every policy finished"
		}
		fmt.Fprintf(w, "interrupted: only what finished is shown, and %s\n\n", judged)
	}
	if len(rep.Sweep) > 0 {
		if err := rep.writeSweep(w); err != nil {
			return err
		}
		fmt.Fprintf(w, "\nat the largest capacity, %d KV blocks per engine:\n", o.KVBlocks)
	}
	if err := replay.WriteTable(w, rep.named()); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tprompt tok\tprefilled tok\twait p50\twait p90\tbusy mean\tbusiest\tevicted blocks\tpreemptions\t")
	for i := range rep.Runs {
		t := rep.Runs[i].Totals(o)
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%.0f%%\t%.0f%%\t%d\t%d\t\n", rep.Runs[i].Policy, t.PromptTokens, t.PrefillTokens,
			millis(t.WaitP50), millis(t.WaitP90), 100*t.BusyMean, 100*t.BusyMax, t.BlocksEvicted, t.Preemptions)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if o.Disagg.Enabled() {
		if err := rep.writeRoles(w); err != nil {
			return err
		}
		fmt.Fprintln(w)
	}
	if o.Workload == replay.WorkloadMultimodal {
		if err := rep.writeEncode(w); err != nil {
			return err
		}
		fmt.Fprintf(w, "\n%s\n\n", rep.imagesLine())
	}
	for _, c := range rep.Checks {
		verdict := "met    "
		switch {
		case c.NotJudged:
			verdict = "n/a    "
		case !c.Met:
			verdict = "NOT met"
		}
		fmt.Fprintf(w, "target %s  %s: %s\n", verdict, c.Target, c.Detail)
	}
	for _, r := range rep.Runs {
		if line := r.tokenizerLine(); line != "" {
			fmt.Fprintln(w, line)
		}
	}
	for _, r := range rep.Runs {
		if lag := r.Result.Summary().MaxSendLag; lag > lagWarning {
			fmt.Fprintf(w, "warning %s: requests left up to %s late; the machine was too busy to keep time, so this policy's latencies are unreliable\n",
				r.Policy, millis(lag))
		}
	}
	speed := fmt.Sprintf("%gx real time", o.EngineSpeedup)
	if math.IsInf(o.EngineSpeedup, 1) {
		speed = "no waiting"
	}
	workload := fmt.Sprintf("%d tokens per hash id", o.BlockTokens)
	if o.Workload == replay.WorkloadChat {
		tok := o.Tokenizer
		if tok == "" {
			tok = "the demo tokenizer"
		}
		workload = fmt.Sprintf("as conversations of %d words per hash id, engines tokenizing with %s", o.BlockTokens, tok)
	}
	if o.Workload == replay.WorkloadMultimodal {
		workload = fmt.Sprintf("as conversations with images of %d words per hash id, engines tokenizing with the mock's tokenizer", o.BlockTokens)
	}
	engines := fmt.Sprintf("%d engines", o.Engines)
	if o.Disagg.Enabled() {
		engines = fmt.Sprintf("%d engines (aggregated: all both; %s: %d prefill + %d decode, vLLM protocol, "+
			"local prefill under %d uncached tokens or at %g cached)", o.Engines, o.Disagg, o.Disagg.Prefill, o.Disagg.Decode,
			o.DisaggMinRemoteTokens, o.DisaggLocalCachedFraction)
	}
	pace := fmt.Sprintf("trace at %gx", o.Speedup)
	if o.Concurrency > 0 {
		pace = fmt.Sprintf("trace at concurrency %d", o.Concurrency)
	}
	_, err := fmt.Fprintf(w, "\n%s x %d KV blocks of %d tokens, %s; %s, %s; "+
		"cost model prefill-load-scale %s, overlap-credit %g, temperature %g, eviction-weight %g; approx TTL %v. Durations are wall-clock.\n",
		engines, o.KVBlocks, o.BlockSize, speed, pace, workload,
		o.prefillLoadScaleText(), o.OverlapCredit, o.Temperature, o.EvictionWeight, o.ApproxTTL)
	return err
}

// RoleTotals sums what one role's engines did in a run.
type RoleTotals struct {
	Role              string  `json:"role"`
	Engines           int     `json:"engines"`
	Requests          uint64  `json:"requests"` // requests the engines received (a remote prefill counts on both engines)
	PrefillTokens     uint64  `json:"prefill_tokens"`
	BlocksTransferred uint64  `json:"blocks_transferred"` // pulled from a prefill engine
	BusyMean          float64 `json:"busy_mean"`
	BusyMax           float64 `json:"busy_max"`
}

// RoleTotals sums r's engines by role, in the order prefill, decode, both,
// leaving out roles no engine had.
func (r *PolicyRun) RoleTotals(o *Options) []RoleTotals {
	var wall time.Duration
	if r.Result != nil {
		wall = r.Result.Duration
	}
	var out []RoleTotals
	for _, role := range []workers.Role{workers.RolePrefill, workers.RoleDecode, workers.RoleBoth} {
		t := RoleTotals{Role: workers.Role(role).String()} // shm numbers roles as sched does
		for i, s := range r.Engines {
			if r.Roles[i] != role {
				continue
			}
			t.Engines++
			t.Requests += s.Requests
			t.PrefillTokens += s.PrefillTokens
			t.BlocksTransferred += s.BlocksTransferred
			if wall > 0 && !math.IsInf(o.EngineSpeedup, 1) {
				busy := s.BusyTime.Seconds() / o.EngineSpeedup / wall.Seconds()
				t.BusyMean += busy
				t.BusyMax = max(t.BusyMax, busy)
			}
		}
		if t.Engines > 0 {
			t.BusyMean /= float64(t.Engines)
			out = append(out, t)
		}
	}
	return out
}

// writeRoles writes the engines by role: where the prompts were computed,
// how many requests the prefill pool served (remote prefills) and the
// blocks the decode pool pulled.
func (rep *Report) writeRoles(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "run	role	engines	requests	prefilled tok	transferred blocks	busy mean	busiest	")
	for i := range rep.Runs {
		for _, t := range rep.Runs[i].RoleTotals(&rep.Options) {
			fmt.Fprintf(tw, "%s	%s	%d	%d	%d	%d	%.0f%%	%.0f%%	\n", rep.Runs[i].Policy, t.Role, t.Engines, t.Requests,
				t.PrefillTokens, t.BlocksTransferred, 100*t.BusyMean, 100*t.BusyMax)
		}
	}
	return tw.Flush()
}

// tokenizerLine says how the policy's router tokenized chat requests, and
// how many it sent on approximately because its renderer failed; "" when
// it had no tokenizer.
func (r *PolicyRun) tokenizerLine() string {
	t := r.Tokenizer
	if t == nil {
		return ""
	}
	line := fmt.Sprintf("tokenizer %s: %s (%s)", r.Policy, t.Mode, t.Source)
	if o := t.Outcomes; o != nil {
		failed := o.Timeout + o.EngineError + o.Rejected + o.Unsupported + o.BadResponse + o.NoEngine + o.Cancelled
		line += fmt.Sprintf(", %d requests tokenized, %d routed approximately", o.OK, failed)
		if failed > 0 {
			line += fmt.Sprintf(" (timeout %d, engine error %d, rejected %d, unsupported %d, bad response %d, no engine %d, cancelled %d)",
				o.Timeout, o.EngineError, o.Rejected, o.Unsupported, o.BadResponse, o.NoEngine, o.Cancelled)
		}
	}
	return line
}

// jsonReport is the machine-readable report.
type jsonReport struct {
	Trace            string           `json:"trace"`
	Workload         string           `json:"workload"`
	Tokenizer        string           `json:"tokenizer,omitempty"` // the chat workload's; "" is the demo's own
	Engines          int              `json:"engines"`
	KVBlocks         int              `json:"kv_blocks"`
	BlockSize        int              `json:"block_size"`
	BlockTokens      int              `json:"block_tokens"`
	Speedup          float64          `json:"speedup"`
	EngineSpeedup    *float64         `json:"engine_speedup"` // null: no waiting
	PrefillLoadScale float64          `json:"prefill_load_scale"`
	AutoLoadScale    bool             `json:"auto_prefill_load_scale,omitempty"` // prefill_load_scale is then unused
	OverlapCredit    float64          `json:"overlap_credit"`
	Temperature      float64          `json:"temperature"`
	EvictionWeight   float64          `json:"eviction_weight"`
	ApproxTTL        float64          `json:"approx_ttl_s"`
	Timing           map[string]int64 `json:"timing_ns"`
	Disagg           string           `json:"disagg,omitempty"` // NPMD; the policies are then the aggregated and the disaggregated run
	Encode           string           `json:"encode,omitempty"` // NE; the policies are then aggregated, encoders by affinity, encoders by load
	Images           *ImageLoad       `json:"images,omitempty"` // the multimodal workload's
	Policies         []jsonPolicy     `json:"policies"`
	Checks           []Check          `json:"checks"`
	Sweep            []jsonSweepPoint `json:"capacity_sweep,omitempty"`
	Report           string           `json:"report,omitempty"`
	Interrupted      bool             `json:"interrupted,omitempty"` // only what finished is here
}

type jsonPolicy struct {
	Policy    string              `json:"policy"`
	Summary   replay.Summary      `json:"summary"`
	Engines   EngineTotals        `json:"engines"`
	Tokenizer *prompt.ModelStatus `json:"tokenizer,omitempty"`
	Roles     []RoleTotals        `json:"roles,omitempty"`  // with disagg
	Encode    *EncodeTotals       `json:"encode,omitempty"` // the multimodal workload's
	Released  bool                `json:"bookings_released"`
}

// WriteJSON writes the report as one indented JSON object; htmlPath, if
// not empty, is recorded as where the HTML report is.
func (rep *Report) WriteJSON(w io.Writer, htmlPath string) error {
	o := &rep.Options
	out := jsonReport{Trace: rep.Trace, Workload: o.Workload, Tokenizer: o.Tokenizer, Engines: o.Engines, KVBlocks: o.KVBlocks, BlockSize: o.BlockSize,
		BlockTokens: o.BlockTokens, Speedup: o.Speedup, PrefillLoadScale: o.PrefillLoadScale, AutoLoadScale: o.AutoPrefillLoadScale,
		OverlapCredit: o.OverlapCredit, Temperature: o.Temperature, EvictionWeight: o.EvictionWeight,
		ApproxTTL: o.ApproxTTL.Seconds(), Checks: rep.Checks,
		Report: htmlPath, Interrupted: rep.Interrupted,
		Timing: map[string]int64{
			"step_overhead": int64(o.Timing.StepOverhead), "prefill_per_token": int64(o.Timing.PrefillPerToken),
			"prefill_attention_per_1k": int64(o.Timing.PrefillAttentionPer1K),
			"decode_per_seq":           int64(o.Timing.DecodePerSequence), "decode_attention_per_1k": int64(o.Timing.DecodeAttentionPer1K),
		}}
	if !math.IsInf(o.EngineSpeedup, 1) {
		out.EngineSpeedup = &o.EngineSpeedup
	}
	if o.Disagg.Enabled() {
		out.Disagg = o.Disagg.String()
	}
	if o.Encode.Enabled() {
		out.Encode = o.Encode.String()
	}
	if o.Workload == replay.WorkloadMultimodal {
		out.Images = &rep.Images
	}
	if out.Checks == nil {
		out.Checks = []Check{}
	}
	for i := range rep.Runs {
		jp := jsonPolicy{Policy: rep.Runs[i].Policy, Summary: rep.Runs[i].Result.Summary(),
			Engines: rep.Runs[i].Totals(o), Tokenizer: rep.Runs[i].Tokenizer, Released: rep.Runs[i].Released}
		if o.Disagg.Enabled() {
			jp.Roles = rep.Runs[i].RoleTotals(o)
		}
		if o.Workload == replay.WorkloadMultimodal {
			t := rep.Runs[i].EncodeTotals()
			jp.Encode = &t
		}
		out.Policies = append(out.Policies, jp)
	}
	out.Sweep = rep.jsonSweep()
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
