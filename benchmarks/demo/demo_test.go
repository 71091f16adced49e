package demo

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvfast/kvfast/benchmarks/replay"
)

func TestParsePolicies(t *testing.T) {
	for _, tc := range []struct {
		in, workload string
		want         string
		bad          bool
	}{
		{in: "all", want: "kv,approx,affinity,round-robin,random,least-loaded"},
		{in: "round-robin, kv", want: "round-robin,kv"},
		{in: "kv,all,kv", want: "kv,approx,affinity,round-robin,random,least-loaded"},
		{in: "all", workload: replay.WorkloadChat, want: "kv-builtin,kv-remote,approx,affinity,round-robin,random,least-loaded"},
		{in: "kv-remote,kv", workload: replay.WorkloadChat, want: "kv-remote,kv"},
		{in: "kv,nope", bad: true},
		{in: "kv-local", workload: replay.WorkloadChat, bad: true},
		{in: "", bad: true},
	} {
		got, err := ParsePolicies(tc.in, tc.workload)
		if (err != nil) != tc.bad || (!tc.bad && strings.Join(got, ",") != tc.want) {
			t.Errorf("ParsePolicies(%q, %q) = %v, %v", tc.in, tc.workload, got, err)
		}
	}
	if got := DefaultPolicies(replay.WorkloadChat); strings.Join(got, ",") != "kv-builtin,kv-remote,approx" {
		t.Errorf("the chat workload compares %v by default", got)
	}
}

// fakeResult builds a replay result of n requests with the given TTFT and
// hit rate, against a bound of 0.5.
func fakeResult(n int, ttft time.Duration, hit float64) *replay.Result {
	r := &replay.Result{Bound: replay.Bound{Tokens: 0.5}, Duration: time.Second}
	for i := range n {
		r.Requests = append(r.Requests, replay.RequestResult{Index: i, Attempted: true, Status: 200,
			TTFT: ttft, Latency: ttft, PromptTokens: 1000, HasUsage: true, UsagePromptTokens: 1000,
			UsageCachedTokens: int(hit * 1000), UsageCompletionTokens: 1, Chunks: 1})
	}
	return r
}

// withLRU gives every run's result the pooled-LRU reference hit.
func withLRU(runs []PolicyRun, hit float64) []PolicyRun {
	for i := range runs {
		runs[i].Result.PooledLRU = &replay.PooledLRU{Bound: replay.Bound{Tokens: hit}, CapacityBlocks: 100, WorkingSetBlocks: 200}
	}
	return runs
}

// zeroBound gives every run's result an infinite-cache bound of 0.
func zeroBound(runs []PolicyRun) []PolicyRun {
	for i := range runs {
		runs[i].Result.Bound = replay.Bound{}
	}
	return runs
}

func TestChecks(t *testing.T) {
	ms := time.Millisecond
	runs := func(kvTTFT time.Duration, kvHit float64, others ...any) []PolicyRun {
		out := []PolicyRun{{Policy: "kv", Result: fakeResult(10, kvTTFT, kvHit)}}
		for i := 0; i < len(others); i += 3 {
			out = append(out, PolicyRun{Policy: others[i].(string), Result: fakeResult(10, others[i+1].(time.Duration), others[i+2].(float64))})
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		workload string
		runs     []PolicyRun
		met      []bool // hit-rate target, then round-robin, pooled LRU, affinity, approx, for the checks present
	}{
		{"all met", "", runs(10*ms, 0.47, "round-robin", 30*ms, 0.1, "approx", 11*ms, 0.44), []bool{true, true, true}},
		{"approx within noise", "", runs(10*ms, 0.46, "approx", 11*ms, 0.45), []bool{true, false}},
		{"hit rate below 90% of bound", "", runs(10*ms, 0.44, "round-robin", 31*ms, 0.1), []bool{false, true}},
		{"less than 3x round-robin", "", runs(10*ms, 0.5, "round-robin", 29*ms, 0.1), []bool{true, false}},
		{"approx as fast", "", runs(10*ms, 0.5, "approx", 10*ms, 0.4), []bool{true, false}},
		{"approx hits more", "", runs(10*ms, 0.45, "approx", 20*ms, 0.46), []bool{true, false}},
		{"no kv, no checks", "", []PolicyRun{{Policy: "random", Result: fakeResult(3, ms, 0)}}, nil},
		// Then the pooled-LRU reference (0.45 when set), then affinity.
		{"pooled LRU and affinity met", "", withLRU(runs(10*ms, 0.44, "affinity", 20*ms, 0.44), 0.45), []bool{false, true, true}},
		{"below 95% of the pooled LRU", "", withLRU(runs(10*ms, 0.42, "affinity", 20*ms, 0.41), 0.45), []bool{false, false, true}},
		{"affinity hits more", "", runs(10*ms, 0.44, "affinity", 20*ms, 0.45), []bool{false, false}},
		{"affinity has the shorter tail", "", runs(30*ms, 0.46, "affinity", 20*ms, 0.45), []bool{true, false}},
		{"chat: each exact kv variant, plain kv not", replay.WorkloadChat,
			[]PolicyRun{{Policy: "kv", Result: fakeResult(10, ms, 0.5)}, {Policy: PolicyKVBuiltin, Result: fakeResult(10, 10*ms, 0.47)},
				{Policy: PolicyKVRemote, Result: fakeResult(10, 12*ms, 0.40)}, {Policy: "approx", Result: fakeResult(10, 11*ms, 0.4)}},
			[]bool{true, true, false, false}},
		// A trace in which nothing repeats has a bound of 0: no fraction
		// of it to judge, so the target is neither met nor missed.
		{"bound of zero", "", zeroBound(runs(10*ms, 0.0, "round-robin", 30*ms, 0.0)), []bool{false, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checks := Checks(tc.workload, tc.runs)
			if tc.name == "bound of zero" && (!checks[0].NotJudged || strings.Contains(checks[0].Detail, "NaN")) {
				t.Errorf("check %q (%s) is judged", checks[0].Target, checks[0].Detail)
			}
			if len(checks) != len(tc.met) {
				t.Fatalf("checks %+v, want %d", checks, len(tc.met))
			}
			for i, c := range checks {
				if c.Met != tc.met[i] {
					t.Errorf("check %q (%s): met %v, want %v", c.Target, c.Detail, c.Met, tc.met[i])
				}
			}
		})
	}
}

func TestOptions(t *testing.T) {
	o := DefaultOptions()
	if err := o.Validate(); err != nil {
		t.Fatalf("DefaultOptions does not validate: %v", err)
	}
	o.Policies[0] = "changed"
	if AllPolicies[0] != "kv" {
		t.Fatal("DefaultOptions shares its policy list with AllPolicies")
	}
	tr, err := LoadTrace(EmbeddedTrace, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	o = DefaultOptions()
	if err := o.CheckFits(tr); err != nil {
		t.Errorf("the default experiment does not fit the embedded trace: %v", err)
	}
	o.KVBlocks = 64
	if err := o.CheckFits(tr); err == nil || !strings.Contains(err.Error(), "longest request") {
		t.Errorf("64 blocks per engine: %v", err)
	}
	// A capacity sweep's points are checked before any is run: at 0.01x
	// of the working set the longest request fits no engine.
	o = DefaultOptions()
	o.Capacities = []float64{1, 0.01}
	if err := o.CheckFits(tr); err == nil || !strings.Contains(err.Error(), "at 0.01x capacity") {
		t.Errorf("a sweep down to 0.01x: %v", err)
	}
	// And the engines each point asks for: at 10^5 times the working set,
	// more blocks than a mock engine allocates.
	o.Capacities = []float64{1, 1e5}
	if err := o.CheckFits(tr); err == nil || !strings.Contains(err.Error(), "at 100000x capacity") {
		t.Errorf("a sweep up to 1e5x: %v", err)
	}
	for _, bad := range []func(*Options){
		func(o *Options) { o.Policies = nil },
		func(o *Options) { o.Policies = []string{"fastest"} },
		func(o *Options) { o.Engines = 0 },
		func(o *Options) { o.Speedup = 0 },
		func(o *Options) { o.EngineSpeedup = -1 },
		func(o *Options) { o.Temperature = -1 },
		func(o *Options) { o.EvictionWeight = -1 },
		func(o *Options) { o.Capacities = []float64{0.5, 0.25} },
		func(o *Options) { o.Capacities = []float64{0} },
		func(o *Options) { o.Capacities, o.Workload = []float64{1}, replay.WorkloadChat },
		func(o *Options) { o.Timing.StepOverhead = -time.Second },
		// 0 had the report's wait loop step by nothing, for ever.
		func(o *Options) { o.MaxBatchedTokens = 0 },
		func(o *Options) { o.MaxSeqs = 0 },
		func(o *Options) { o.BlockSize = 100000 },
		func(o *Options) { o.KVBlocks = 1 << 40 },
		func(o *Options) { o.Workload = "images" },
		func(o *Options) { o.Tokenizer = "/some/dir" },
		func(o *Options) { o.Policies = []string{PolicyKVRemote} },
		func(o *Options) { o.Workload, o.Tokenizer = replay.WorkloadChat, "remote" },
		func(o *Options) { o.Disagg, o.Engines, o.Policies = DisaggSpec{2, 6}, 7, []string{"kv"} },
		func(o *Options) { o.Disagg = DisaggSpec{2, 6} }, // every policy
		func(o *Options) { o.Disagg, o.Engines, o.Policies = DisaggSpec{0, 8}, 8, []string{"kv"} },
		func(o *Options) {
			o.Disagg, o.Policies, o.DisaggLocalCachedFraction = DisaggSpec{2, 6}, []string{"kv"}, 1.5
		},
	} {
		o := DefaultOptions()
		bad(&o)
		if err := o.Validate(); err == nil {
			t.Errorf("%+v validates", o)
		}
		// Run refuses them too, before starting anything.
		if _, err := Run(t.Context(), o, tr); err == nil {
			t.Errorf("Run accepted %+v", o)
		}
	}
}

func TestParseDisagg(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want DisaggSpec
		bad  bool
	}{
		{in: "2P6D", want: DisaggSpec{2, 6}},
		{in: "1p1d", want: DisaggSpec{1, 1}},
		{in: " 10P22D ", want: DisaggSpec{10, 22}},
		{in: "0P8D", bad: true},
		{in: "2P0D", bad: true},
		{in: "P6D", bad: true},
		{in: "2P6", bad: true},
		{in: "2D6P", bad: true},
		{in: "", bad: true},
	} {
		got, err := ParseDisagg(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("ParseDisagg(%q) = %v, %v", tc.in, got, err)
		}
	}
	if d := (DisaggSpec{2, 3}); d.String() != "2P3D" || d.Engines() != 5 || fmt.Sprint(d.Roles()) != "[prefill prefill decode decode decode]" {
		t.Errorf("%v: %d engines, roles %v", d, d.Engines(), d.Roles())
	}
}

// TestDisaggRun replays a few requests aggregated and then disaggregated
// on one prefill and one decode engine, with conditional disaggregation
// off so that every prompt goes through the prefill engine: both runs
// complete, every booking is released, the decode engine pulls the
// prompts' blocks, and the table shows the latency percentiles side by
// side with the engines by role.
func TestDisaggRun(t *testing.T) {
	p, tr := tinyTrace(t)
	o := DefaultOptions()
	o.Trace, o.Policies, o.Engines, o.Disagg = p, []string{"kv"}, 2, DisaggSpec{Prefill: 1, Decode: 1}
	o.DisaggMinRemoteTokens, o.DisaggLocalCachedFraction = 0, 0
	o.BlockTokens, o.KVBlocks, o.EngineSpeedup, o.Concurrency = 16, 256, math.Inf(1), 2
	o.SegmentDir = t.TempDir()
	rep, err := Run(t.Context(), o, tr)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Failed || len(rep.Runs) != 2 || len(rep.Checks) != 0 {
		t.Fatalf("failed %v, %d runs, checks %+v", rep.Failed, len(rep.Runs), rep.Checks)
	}
	for i, want := range []string{"kv aggregated", "kv 1P1D"} {
		run := &rep.Runs[i]
		if s := run.Result.Summary(); run.Policy != want || s.Succeeded != 6 || s.Errors != 0 || !run.Released {
			t.Errorf("run %d: %q, %d ok, %d errors, bookings released %v", i, run.Policy, s.Succeeded, s.Errors, run.Released)
		}
	}
	if agg := rep.Runs[0].RoleTotals(&o); len(agg) != 1 || agg[0].Role != "both" || agg[0].Engines != 2 || agg[0].BlocksTransferred != 0 {
		t.Errorf("aggregated by role: %+v", agg)
	}
	dis := rep.Runs[1].RoleTotals(&o)
	if len(dis) != 2 || dis[0].Role != "prefill" || dis[0].Requests != 6 || dis[1].Role != "decode" || dis[1].BlocksTransferred == 0 {
		t.Errorf("disaggregated by role: %+v", dis)
	}
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"TTFT p50", "TTFT p90", "TTFT p99", "ITL p50", "ITL p90", "ITL p99", "E2E p50", "hit rate", "out tok/s",
		"kv aggregated", "kv 1P1D", "transferred blocks", "1 prefill + 1 decode"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, text.String())
		}
	}
	var html strings.Builder
	if err := rep.WriteHTML(&html); err != nil || !strings.Contains(html.String(), "<th>ITL p90</th>") || !strings.Contains(html.String(), "kv 1P1D") {
		t.Errorf("HTML report (%v) lacks the ITL percentiles or the disaggregated run", err)
	}
}

func TestCapacitySweepRun(t *testing.T) {
	p, tr := tinyTrace(t)
	o := DefaultOptions()
	o.Trace, o.Policies, o.Engines, o.Capacities = p, []string{"kv", "affinity"}, 2, []float64{1, 2}
	o.BlockTokens, o.EngineSpeedup, o.Concurrency = 16, math.Inf(1), 2
	o.SegmentDir = t.TempDir()
	// 16 tokens per hash id in blocks of 16: ids 1 and 1,2 shared, one
	// block of each record's own; 8 blocks, 4 per engine at 1x.
	if ws := tr.WorkingSetBlocks(o.BlockTokens, o.BlockSize); ws != 8 {
		t.Fatalf("working set %d blocks, want 8", ws)
	}
	rep, err := Run(t.Context(), o, tr)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Failed || len(rep.Sweep) != 2 || rep.Sweep[0].KVBlocks != 4 || rep.Sweep[1].KVBlocks != 8 || rep.Options.KVBlocks != 8 {
		t.Fatalf("failed %v, sweep %+v, options' KV blocks %d", rep.Failed, rep.Sweep, rep.Options.KVBlocks)
	}
	for _, pt := range rep.Sweep {
		for _, r := range pt.Runs {
			s := r.Result.Summary()
			if s.Succeeded != 6 || s.PooledLRU == nil || s.PooledLRU.CapacityBlocks != 2*pt.KVBlocks {
				t.Errorf("at %gx, %s: %d ok, pooled LRU %+v", pt.Fraction, r.Policy, s.Succeeded, s.PooledLRU)
			}
		}
	}
	var text, html, js strings.Builder
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"capacity", "pooled LRU", "affinity p99", "at 1x capacity, kv", "eviction-weight 30"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, text.String())
		}
	}
	if err := rep.WriteHTML(&html); err != nil || !strings.Contains(html.String(), "Hit rate against capacity") ||
		!strings.Contains(html.String(), `data-series="pooled LRU"`) {
		t.Errorf("HTML report (%v) lacks the sweep chart", err)
	}
	if err := rep.WriteJSON(&js, ""); err != nil || !strings.Contains(js.String(), `"capacity_sweep"`) {
		t.Errorf("JSON report (%v) lacks the sweep", err)
	}
}

func TestGeneratedTraceNames(t *testing.T) {
	for _, name := range []string{"gen:low", "gen:high"} {
		if tr, err := LoadTrace(name, 0, false); err != nil || tr.Len() == 0 {
			t.Errorf("LoadTrace(%q): %v", name, err)
		}
	}
	if _, err := LoadTrace("gen:medium", 0, false); err == nil || !strings.Contains(err.Error(), "low, high") && !strings.Contains(err.Error(), "high, low") {
		t.Errorf("LoadTrace(gen:medium): %v", err)
	}
}

// TestTraceBlockSize: a trace file whose hash ids stand for another
// number of tokens than 512 is read at the size given; the embedded and
// generated traces keep their own and refuse another.
func TestTraceBlockSize(t *testing.T) {
	p := filepath.Join(t.TempDir(), "bs16.jsonl")
	if err := os.WriteFile(p, []byte(`{"timestamp":0,"input_length":40,"output_length":2,"hash_ids":[1,2,3]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTrace(p, 0, false); err == nil {
		t.Error("3 hash ids for 40 tokens read at 512 tokens per id")
	}
	if tr, err := LoadTrace(p, 16, false); err != nil || tr.BlockSize != 16 {
		t.Errorf("at 16 tokens per id: %v", err)
	}
	for _, name := range []string{EmbeddedTrace, "gen:low"} {
		if _, err := LoadTrace(name, 16, false); err == nil {
			t.Errorf("%s read at 16 tokens per id", name)
		}
		if _, err := LoadTrace(name, replay.DefaultTraceBlockSize, false); err != nil {
			t.Errorf("%s at its own block size: %v", name, err)
		}
	}
}

// TestUntimedTrace: records without timestamps load for a replay at a
// fixed concurrency, as kvfast replay loads them, and are refused for one
// that keeps the trace's time.
func TestUntimedTrace(t *testing.T) {
	p := filepath.Join(t.TempDir(), "untimed.jsonl")
	if err := os.WriteFile(p, []byte(`{"input_length":600,"output_length":4,"hash_ids":[1,2]}`+"\n"+
		`{"input_length":600,"output_length":4,"hash_ids":[1,3]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTrace(p, 0, false); err == nil {
		t.Error("records without timestamps loaded for a timed replay")
	}
	if tr, err := LoadTrace(p, 0, true); err != nil || tr.Len() != 2 {
		t.Errorf("untimed: %v", err)
	}
}

// TestInterruptedRunKeepsFinishedPolicies interrupts a run as soon as its
// first policy (or its first capacity's policies) finish: the report keeps
// what finished, says it was interrupted, and judges only whole capacities.
func TestInterruptedRunKeepsFinishedPolicies(t *testing.T) {
	p, tr := tinyTrace(t)
	for _, tc := range []struct {
		name       string
		capacities []float64
		finished   int // policies done before the interrupt
		wantRuns   int
		wantSweep  int
		judged     bool // the finished capacity's targets
	}{
		{name: "policies", finished: 1, wantRuns: 1},
		{name: "capacities", capacities: []float64{1, 2}, finished: 2, wantRuns: 2, wantSweep: 1, judged: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := DefaultOptions()
			o.Trace, o.Policies, o.Engines, o.Capacities = p, []string{"kv", "affinity"}, 2, tc.capacities
			o.BlockTokens, o.EngineSpeedup, o.Concurrency, o.KVBlocks = 16, math.Inf(1), 2, 64
			o.SegmentDir = t.TempDir()
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			done := 0
			o.Notef = func(format string, a ...any) {
				if strings.Contains(format, "done in") {
					if done++; done == tc.finished {
						cancel()
					}
				}
			}
			rep, err := Run(ctx, o, tr)
			if !errors.Is(err, context.Canceled) || rep == nil {
				t.Fatalf("Run: %v, report %v; want the interrupt and a report", err, rep)
			}
			if !rep.Interrupted || len(rep.Runs) != tc.wantRuns || len(rep.Sweep) != tc.wantSweep || (len(rep.Checks) > 0) != tc.judged {
				t.Fatalf("interrupted %v, %d runs, %d sweep points, checks %+v", rep.Interrupted, len(rep.Runs), len(rep.Sweep), rep.Checks)
			}
			if s := rep.Runs[0].Result.Summary(); rep.Runs[0].Policy != "kv" || s.Succeeded != 6 {
				t.Errorf("first run %s: %d ok, want kv with 6", rep.Runs[0].Policy, s.Succeeded)
			}
			var text, js strings.Builder
			if err := rep.WriteText(&text); err != nil || !strings.HasPrefix(text.String(), "interrupted:") {
				t.Errorf("text report (%v) does not begin by saying it was interrupted:\n%s", err, text.String())
			}
			if err := rep.WriteJSON(&js, ""); err != nil || !strings.Contains(js.String(), `"interrupted": true`) {
				t.Errorf("JSON report (%v) lacks the interrupt:\n%s", err, js.String())
			}
		})
	}
}

// tinyTrace writes six requests 50 ms apart that share their first two
// hash ids and differ in the third, and loads them.
func tinyTrace(t *testing.T) (string, *replay.Trace) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tiny.jsonl")
	var b strings.Builder
	for i := range 6 {
		fmt.Fprintf(&b, `{"timestamp":%d,"input_length":1536,"output_length":4,"hash_ids":[1,2,%d]}`+"\n", 50*i, 10+i)
	}
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	tr, err := LoadTrace(p, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	return p, tr
}
