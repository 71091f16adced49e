package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/kvfast/kvfast/benchmarks/replay"
	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
)

func init() {
	register("demo", "replay the shipped trace against N mock engines once per routing policy and compare", runDemo)
}

// demoPolicies is every routing policy, in the order the demo runs them.
var demoPolicies = []string{"kv", "approx", "round-robin", "random", "least-loaded"}

// Demo defaults; demoAbout gives the reasoning behind each.
const (
	demoDefaultEngines          = 8
	demoDefaultSpeedup          = 8
	demoDefaultEngineSpeedup    = 2
	demoDefaultBlockTokens      = 128
	demoDefaultKVBlocks         = 8192
	demoDefaultPrefillLoadScale = 10
	// demoApproxTTLTraceTime is the approx policy's TTL in trace time:
	// kvfast serve's default, which assumes requests arrive in real time.
	demoApproxTTLTraceTime = 2 * time.Minute
	// demoLagWarning is the send lag beyond which a replay's timings are
	// the machine's, not the simulation's.
	demoLagWarning = 100 * time.Millisecond
	// demoHitMargin is the hit-rate lead over approx that counts as beating
	// it rather than as run-to-run noise.
	demoHitMargin = 0.02
)

const demoAbout = `Usage: kvfast demo [flags]

Shows what KV-aware routing buys, in one command and one process. For each
routing policy in turn (--policies), the demo creates a fresh shm segment
in a temporary directory, starts a fresh router on it and --engines mock
engines that register in the segment and publish their KV events there,
replays the trace through the router, and shuts everything down, so that
no policy inherits another's warm caches. Then it prints two tables side
by side, checks the routing-quality targets, and writes a self-contained
HTML report (a TTFT CDF per policy, hit-rate bars) whose path it prints.

The first table is the replay's: TTFT p50/p90/p99, inter-token latency,
end-to-end latency, the prefix hit rate the engines reported
(cached_tokens/prompt_tokens) against the trace's infinite-cache bound,
and throughput. The second is the engines': prompt tokens received and
actually prefilled, how busy they were, blocks evicted, preemptions, and
"wait", the part of each TTFT beyond the request's own prefill at the
timing model, i.e. the time it queued behind, or shared steps with, other
requests.

The workload is the tail of the Mooncake synthetic trace compiled into the
binary (its last 600 records: 142 s of trace time, 7.9k distinct hash ids,
infinite-cache bound 0.68 of prompt tokens), or --trace. The defaults,
and why:

  --block-tokens 128   Mooncake hash ids stand for 512 tokens (prompts
                       average 20k tokens). 128 per hash id keeps the
                       trace's sharing structure, which requests share
                       which prefixes, with prompts 4x shorter (5k tokens
                       on average, 48k at most), so that one process on
                       2 cores can play 8 engines, the router and the
                       client without becoming the bottleneck.
  --speedup 8          Requests arrive 8x faster than in the trace, so the
  --engine-speedup 2   142 s play in 18 s per policy and all five in about
                       95 s. Engines run 2x faster than real time,
                       so in the engines' simulated time arrivals are 4x
                       the trace's rate while prompts are 4x shorter: the
                       prefill work offered is exactly the trace's own,
                       about 60% of 8 engines' capacity with no cache hits
                       and 20% with all the hits the bound allows. That
                       is a load at which a router that loses the hits
                       (round-robin, random, least-loaded) queues in its
                       tail, while one that keeps them stays idle.
                       Every duration shown is wall-clock time: with
                       --engine-speedup F, multiply by F to read it as
                       simulated engine time.
  timing               mocker.DefaultTiming, roughly an 8B model on one
                       H100-class GPU: prefill dominates at 50 us per
                       uncached token (a cold 5k-token prompt takes 0.27 s
                       of engine time, the same prompt with 4k tokens
                       cached 0.06 s); a decode step costs 3 ms plus
                       0.12 ms per sequence.
  --kv-blocks 8192     Per engine, in blocks of 16 tokens: the 8 engines
                       hold 1.05M tokens, just over the replay's working
                       set (0.98M distinct prompt tokens and 31k output
                       tokens). Enough for a router that keeps each prefix
                       in one place; not for one that copies prefixes to
                       every engine, which has to evict.
  --prefill-load-scale 10
                       The router's cost model weighs prefill blocks
                       (uncached prompt plus prefill already queued)
                       against decode blocks in flight. kvfast serve
                       defaults to 1, Dynamo's default, under which one
                       in-flight request of a few hundred blocks
                       outweighs a cached prefix of the same size, so kv
                       routing sends follow-ups away from their cache
                       even at moderate load. Under this timing model a
                       prefill block costs the engine 0.8 ms while a
                       block of decoding context costs it microseconds,
                       so the demo weighs prefill 10x: still well under
                       the engines' true ratio, leaving the decode term
                       to balance load. Run with --prefill-load-scale 1
                       to see serve's default.
  --approx-ttl         The approx policy forgets a routing decision after
                       2 minutes of trace time (serve's default TTL at
                       real-time arrivals), 15 s of wall time at 8x. On
                       this trace no prefix is reused more than 2 minutes
                       after its last use, so the TTL costs approx no hit
                       here; on the full trace it would.

Examples:
  kvfast demo
  kvfast demo --policies kv,round-robin --max-requests 200
  kvfast demo --engines 4 --out /tmp/report.html --json
  kvfast demo --trace ../shared/traces/mooncake_synthetic.jsonl --kv-blocks 49152

Exit status: 0 if every request of every policy succeeded (whether or not
the targets were met), 1 if any failed or the run was interrupted, 2 for
bad flags or an unreadable trace.

Flags:
`

// demoOptions are the demo's flags after parsing.
type demoOptions struct {
	engines       int
	policies      []string
	trace         string
	maxRequests   int
	speedup       float64
	engineSpeedup float64
	concurrency   int
	blockTokens   int
	blockSize     int
	kvBlocks      int
	maxBatched    int
	maxSeqs       int
	maxOutput     int
	seed          uint64
	overlapCredit float64
	prefillScale  float64
	temperature   float64
	approxTTL     time.Duration
	timing        mocker.Timing
	out           string
	jsonOut       bool
	quiet         bool
	logLevel      string
	timeout       time.Duration
	segmentDir    string
}

// demoRun is one policy's replay with what the engines counted during it.
type demoRun struct {
	Policy  string
	Result  *replay.Result
	Engines []mocker.Stats
}

func runDemo(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return demoCommand(ctx, args, os.Stdout, os.Stderr, term.IsTerminal(int(os.Stderr.Fd())))
}

// demoCommand is runDemo with its context and outputs injected; progress
// bars are drawn on stderr only when stderrIsTTY.
func demoCommand(ctx context.Context, args []string, stdout, stderr io.Writer, stderrIsTTY bool) int {
	o, code := parseDemoFlags(args, stderr)
	if code >= 0 {
		return code
	}
	notef := func(format string, a ...any) {
		if !o.quiet {
			fmt.Fprintf(stderr, "kvfast demo: "+format+"\n", a...)
		}
	}
	tr, err := loadDemoTrace(o.trace)
	if err != nil {
		fmt.Fprintf(stderr, "kvfast demo: %v\n", err)
		return 2
	}
	replayed := tr.Head(o.maxRequests)
	synth := replay.TokenSynth{TraceBlockSize: tr.BlockSize, BlockTokens: o.blockTokens, Seed: o.seed}
	if longest := demoLongestRequest(replayed, synth, o.maxOutput); longest > o.kvBlocks*o.blockSize {
		fmt.Fprintf(stderr, "kvfast demo: the longest request needs %d tokens but an engine holds %d (--kv-blocks %d x %d): raise --kv-blocks or lower --block-tokens\n",
			longest, o.kvBlocks*o.blockSize, o.kvBlocks, o.blockSize)
		return 2
	}
	if o.approxTTL == 0 {
		o.approxTTL = time.Duration(float64(demoApproxTTLTraceTime) / o.speedup)
	}
	logger, err := newLogger(stderr, o.logLevel, "text")
	if err != nil {
		fmt.Fprintf(stderr, "kvfast demo: %v\n", err)
		return 2
	}
	pace := fmt.Sprintf("%v of trace time at %gx (about %v each)", replayed.Span().Round(time.Second), o.speedup,
		time.Duration(float64(replayed.Span())/o.speedup).Round(time.Second))
	if o.concurrency > 0 {
		pace = fmt.Sprintf("at concurrency %d", o.concurrency)
	}
	notef("%d requests from %s, %d tokens per hash id, %s", replayed.Len(), tr.Source, synth.BlockTokens, pace)
	notef("%d engines x %d KV blocks of %d tokens at %gx; policies %s", o.engines, o.kvBlocks, o.blockSize,
		o.engineSpeedup, strings.Join(o.policies, ", "))

	var runs []demoRun
	failed := false
	for _, policy := range o.policies {
		began := time.Now()
		run, err := runDemoPolicy(ctx, o, policy, tr, logger, stderr, stderrIsTTY)
		if err != nil {
			fmt.Fprintf(stderr, "kvfast demo: %s: %v\n", policy, err)
			if run.Result == nil || ctx.Err() != nil {
				return 1
			}
			failed = true
		}
		s := run.Result.Summary()
		notef("%-12s done in %v: TTFT p50 %s, hit rate %.3f, %d errors", policy, time.Since(began).Round(100*time.Millisecond),
			demoMillis(s.TTFTP50), s.HitRate, s.Errors)
		if s.Errors > 0 {
			failed = true
			for _, e := range s.ErrorSamples {
				notef("%s: error: %s", policy, e)
			}
		}
		runs = append(runs, run)
	}

	named := make([]replay.NamedResult, len(runs))
	for i, r := range runs {
		named[i] = replay.NamedResult{Name: r.Policy, Result: r.Result}
	}
	status := 0
	if o.out != "" {
		if err := replayWriteFile(o.out, func(w io.Writer) error { return replay.WriteHTML(w, named) }); err != nil {
			fmt.Fprintf(stderr, "kvfast demo: %v\n", err)
			status = 1
		}
	}
	checks := demoChecks(runs)
	if o.jsonOut {
		err = writeDemoJSON(stdout, o, tr.Source, runs, checks)
	} else {
		err = writeDemoText(stdout, runs, checks, o)
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvfast demo: cannot write the report: %v\n", err)
		return 1
	}
	if o.out != "" && status == 0 {
		abs, err := filepath.Abs(o.out)
		if err != nil {
			abs = o.out
		}
		if o.jsonOut {
			notef("HTML report: %s", abs)
		} else {
			fmt.Fprintf(stdout, "\nHTML report: %s\n", abs)
		}
	}
	if failed {
		return 1
	}
	return status
}

// parseDemoFlags returns the options, or an exit code >= 0 when the
// command must stop (help, bad flags).
func parseDemoFlags(args []string, stderr io.Writer) (*demoOptions, int) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	d := mocker.DefaultTiming
	o := &demoOptions{}
	var policies string
	fs.IntVar(&o.engines, "engines", demoDefaultEngines, "mock engines to start for each policy")
	fs.StringVar(&policies, "policies", "all", "comma-separated `list` of routing policies to compare: kv, approx, round-robin, random, least-loaded, or all")
	fs.StringVar(&o.trace, "trace", "embedded", "trace `file` (Mooncake JSONL), or \"embedded\" for the last 600 records of the shipped trace")
	fs.IntVar(&o.maxRequests, "max-requests", 0, "replay only the first `N` records of the trace (0: all)")
	fs.Float64Var(&o.speedup, "speedup", demoDefaultSpeedup, "divide the trace's inter-arrival times by `factor`")
	fs.Float64Var(&o.engineSpeedup, "engine-speedup", demoDefaultEngineSpeedup, "divide the engines' simulated time by `factor` (inf: engines never wait); load grows with --speedup / --engine-speedup")
	fs.IntVar(&o.concurrency, "concurrency", 0, "keep `N` requests in flight and ignore timestamps (0: replay timestamps at --speedup)")
	fs.IntVar(&o.blockTokens, "block-tokens", demoDefaultBlockTokens, "tokens sent per trace hash id (the trace's own is 512); fewer make shorter prompts with the same sharing")
	fs.IntVar(&o.blockSize, "block-size", radix.DefaultBlockSize, "tokens per KV block, in the engines and the router")
	fs.IntVar(&o.kvBlocks, "kv-blocks", demoDefaultKVBlocks, "KV cache capacity of each engine, in blocks")
	fs.IntVar(&o.maxBatched, "max-batched-tokens", mocker.DefaultMaxBatchedTokens, "engine: token budget of one step")
	fs.IntVar(&o.maxSeqs, "max-seqs", mocker.DefaultMaxSeqs, "engine: running sequences at most")
	fs.IntVar(&o.maxOutput, "max-output-tokens", 0, "cap each request's max_tokens, which is the trace's output_length (0: no cap)")
	fs.Uint64Var(&o.seed, "seed", 0, "seed of the hash-id-to-token mapping")
	fs.Float64Var(&o.overlapCredit, "overlap-credit", 1, "router cost model: weight of a worker's cached prefix blocks against its prefill cost")
	fs.Float64Var(&o.prefillScale, "prefill-load-scale", demoDefaultPrefillLoadScale, "router cost model: weight of the prefill term against the decode term (kvfast serve's default is 1)")
	fs.Float64Var(&o.temperature, "temperature", 0, "router cost model: 0 picks the cheapest worker, above 0 samples a softmax over costs")
	fs.DurationVar(&o.approxTTL, "approx-ttl", 0, "wall-clock TTL of the approx policy's routing history (0: 2 minutes of trace time, i.e. 2m / --speedup)")
	fs.DurationVar(&o.timing.StepOverhead, "step-overhead", d.StepOverhead, "engine timing: fixed cost of every step")
	fs.DurationVar(&o.timing.PrefillPerToken, "prefill-per-token", d.PrefillPerToken, "engine timing: cost per prefilled (uncached) token")
	fs.DurationVar(&o.timing.PrefillAttentionPer1K, "prefill-attention-per-1k", d.PrefillAttentionPer1K, "engine timing: cost per prefilled token per 1024 tokens it attends to")
	fs.DurationVar(&o.timing.DecodePerSequence, "decode-per-seq", d.DecodePerSequence, "engine timing: cost per sequence in a decode step")
	fs.DurationVar(&o.timing.DecodeAttentionPer1K, "decode-attention-per-1k", d.DecodeAttentionPer1K, "engine timing: cost per 1024 context tokens read in a decode step")
	fs.StringVar(&o.out, "out", filepath.Join(os.TempDir(), "kvfast-demo.html"), "write the HTML report to `file` (empty: none)")
	fs.BoolVar(&o.jsonOut, "json", false, "print the results as JSON instead of tables")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress bars or notes on stderr")
	fs.StringVar(&o.logLevel, "log-level", "warn", "router log level: debug, info, warn or error")
	fs.StringVar(&o.segmentDir, "segment-dir", "", "`directory` in which each run's segment gets a fresh temporary directory (default: /dev/shm if present, else the system temp dir)")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Minute, "bound on one request, from send to end of stream")
	fs.Usage = func() { replayFlagHelp(fs.Output(), fs, demoAbout) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, 0
		}
		return nil, 2
	}
	bad := func(format string, a ...any) (*demoOptions, int) {
		fmt.Fprintf(stderr, "kvfast demo: "+format+"\n", a...)
		return nil, 2
	}
	if fs.NArg() > 0 {
		return bad("unexpected argument %q", fs.Arg(0))
	}
	var err error
	if o.policies, err = parseDemoPolicies(policies); err != nil {
		return bad("--policies: %v", err)
	}
	switch {
	case o.engines < 1 || o.engines > radix.MaxWorkers:
		return bad("--engines %d: want 1..%d", o.engines, radix.MaxWorkers)
	case !(o.speedup > 0) || math.IsInf(o.speedup, 1):
		return bad("--speedup %v: want a positive factor", o.speedup)
	case !(o.engineSpeedup > 0):
		return bad("--engine-speedup %v: want a positive factor or inf", o.engineSpeedup)
	case o.blockTokens < 1:
		return bad("--block-tokens %d: want at least 1", o.blockTokens)
	case o.blockSize < 1:
		return bad("--block-size %d: want at least 1", o.blockSize)
	case o.kvBlocks < 1:
		return bad("--kv-blocks %d: want at least 1", o.kvBlocks)
	case o.maxRequests < 0 || o.concurrency < 0 || o.maxOutput < 0 || o.approxTTL < 0:
		return bad("--max-requests, --concurrency, --max-output-tokens and --approx-ttl cannot be negative")
	}
	cost := sched.CostParams{OverlapCredit: o.overlapCredit, PrefillLoadScale: o.prefillScale, Temperature: o.temperature}
	if err := cost.Validate(); err != nil {
		return bad("%v", err)
	}
	for _, d := range []time.Duration{o.timing.StepOverhead, o.timing.PrefillPerToken, o.timing.PrefillAttentionPer1K,
		o.timing.DecodePerSequence, o.timing.DecodeAttentionPer1K} {
		if d < 0 {
			return bad("timing durations cannot be negative")
		}
	}
	return o, -1
}

// parseDemoPolicies splits a comma-separated list, expanding "all" and
// checking every name against the scheduler's own parser.
func parseDemoPolicies(list string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(list, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, errors.New("empty policy name")
		}
		names := []string{p}
		if p == "all" {
			names = demoPolicies
		} else if _, _, err := sched.ParsePolicy(p); err != nil {
			return nil, err
		}
		for _, n := range names {
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	return out, nil
}

func loadDemoTrace(path string) (*replay.Trace, error) {
	if path == "embedded" || path == "" {
		return replay.EmbeddedTrace(replay.TraceOptions{})
	}
	return replay.LoadTrace(path, replay.TraceOptions{})
}

// demoLongestRequest is the most tokens one request of tr occupies in an
// engine's cache: its prompt plus its output.
func demoLongestRequest(tr *replay.Trace, synth replay.TokenSynth, maxOutput int) int {
	longest := 0
	for i := range tr.Records {
		r := &tr.Records[i]
		out := r.OutputLength
		if maxOutput > 0 && out > maxOutput {
			out = maxOutput
		}
		longest = max(longest, synth.PromptLen(r)+out)
	}
	return longest
}

// runDemoPolicy replays the trace once against a fresh segment, router and
// engines running policy, and tears them all down. The result is returned
// even with an error when the replay itself ran.
func runDemoPolicy(ctx context.Context, o *demoOptions, policy string, tr *replay.Trace, logger *slog.Logger,
	stderr io.Writer, stderrIsTTY bool) (run demoRun, err error) {
	run.Policy = policy
	dir, err := os.MkdirTemp(demoSegmentBase(o.segmentDir), "kvfast-demo-")
	if err != nil {
		return run, fmt.Errorf("cannot create a directory for the segment: %w", err)
	}
	defer os.RemoveAll(dir)

	so, err := demoServeOptions(o, policy, filepath.Join(dir, "kvfast.shm"))
	if err != nil {
		return run, err
	}
	r, err := buildRouter(so, logger)
	if err != nil {
		return run, fmt.Errorf("cannot build the router: %w", err)
	}
	defer r.close()
	var engines []*mocker.Engine
	var served chan error
	defer func() {
		// Router first, so that nothing is forwarded to a closed engine;
		// engines before the segment (r.close), which they publish into.
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if serr := r.srv.Shutdown(sctx); serr != nil {
			err = errors.Join(err, fmt.Errorf("cannot shut the router down cleanly: %w", serr))
		}
		if served != nil {
			if serr := <-served; serr != nil {
				err = errors.Join(err, fmt.Errorf("router stopped: %w", serr))
			}
		}
		for _, e := range engines {
			if cerr := e.Close(); cerr != nil {
				err = errors.Join(err, cerr)
			}
		}
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return run, fmt.Errorf("cannot listen: %w", err)
	}
	served = make(chan error, 1)
	go func() { served <- r.srv.Serve(ln) }()

	for i := range o.engines {
		e, err := mocker.Start(mocker.Config{
			Model:            replay.DefaultModel,
			BlockSize:        o.blockSize,
			KVBlocks:         o.kvBlocks,
			MaxBatchedTokens: o.maxBatched,
			MaxSeqs:          o.maxSeqs,
			Timing:           o.timing,
			Speedup:          o.engineSpeedup,
			WorkerID:         uint64(i),
			SegmentHandle:    r.seg,
		})
		if err != nil {
			return run, fmt.Errorf("cannot start engine %d: %w", i, err)
		}
		engines = append(engines, e)
	}
	if err := waitForWorkers(ctx, r.srv, o.engines, 10*time.Second); err != nil {
		return run, err
	}

	cfg := replay.Config{
		RouterURL:       "http://" + ln.Addr().String(),
		Trace:           tr,
		MaxRequests:     o.maxRequests,
		Speedup:         o.speedup,
		Concurrency:     o.concurrency,
		Tokens:          replay.TokenSynth{BlockTokens: o.blockTokens, Seed: o.seed},
		MaxOutputTokens: o.maxOutput,
		Model:           replay.DefaultModel,
		Timeout:         o.timeout,
		ProgressLabel:   fmt.Sprintf("%-12s", policy),
	}
	if !o.quiet && stderrIsTTY {
		cfg.Progress = stderr
	}
	res, rerr := replay.Run(ctx, cfg)
	run.Result = res
	for _, e := range engines {
		run.Engines = append(run.Engines, e.Stats())
	}
	return run, rerr
}

// demoSegmentBase picks where segments go: memory-backed /dev/shm when
// there is one, since a segment on a disk-backed file system makes the
// kernel write the index back to disk while the engines publish, which
// shows up as stalls in the measurements.
func demoSegmentBase(dir string) string {
	if dir != "" {
		return dir
	}
	if f, err := os.CreateTemp("/dev/shm", ".kvfast-probe-"); err == nil {
		f.Close()
		os.Remove(f.Name())
		return "/dev/shm"
	}
	return os.TempDir()
}

// demoServeOptions are kvfast serve's defaults with the demo's segment,
// policy, block size and cost model.
func demoServeOptions(o *demoOptions, policy, segment string) (*serveOptions, error) {
	so := &serveOptions{}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	so.register(fs)
	if err := fs.Parse(nil); err != nil {
		return nil, fmt.Errorf("BUG: serve defaults do not parse: %w", err)
	}
	so.segment = segment
	so.recreate = true
	so.policy = policy
	so.blockSize = o.blockSize
	so.overlapCredit = o.overlapCredit
	so.prefillScale = o.prefillScale
	so.temperature = o.temperature
	so.approxTTL = o.approxTTL
	// The engines live in this process: a heartbeat that stops means the
	// whole process stalled on a busy machine, not that an engine died,
	// and dropping the engines' blocks for it would measure the machine
	// rather than the routing.
	so.heartbeatGrace = max(so.heartbeatGrace, 30*time.Second)
	// Every block of every engine must fit, or the index would forget
	// blocks the engines hold and understate kv routing.
	so.indexCapacity = max(so.indexCapacity, 2*o.engines*o.kvBlocks)
	return so, nil
}

// waitForWorkers waits until the router routes to n healthy workers
// discovered in the segment's registry.
func waitForWorkers(ctx context.Context, srv *fastpath.Server, n int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		healthy := 0
		for _, w := range srv.Admin().Workers {
			if w.Healthy {
				healthy++
			}
		}
		if healthy >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cannot see the engines: %d of %d registered after %v", healthy, n, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// demoEngineTotals sums what one policy's engines did.
type demoEngineTotals struct {
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

func (r *demoRun) totals(o *demoOptions) demoEngineTotals {
	var t demoEngineTotals
	var wall time.Duration
	if r.Result != nil {
		wall = r.Result.Duration
	}
	for _, s := range r.Engines {
		t.PromptTokens += s.PromptTokens
		t.PrefillTokens += s.PrefillTokens
		t.BlocksEvicted += s.BlocksEvicted
		t.Preemptions += s.Preemptions
		if wall > 0 && !math.IsInf(o.engineSpeedup, 1) {
			busy := s.BusyTime.Seconds() / o.engineSpeedup / wall.Seconds()
			t.BusyMean += busy / float64(len(r.Engines))
			t.BusyMax = max(t.BusyMax, busy)
		}
	}
	if r.Result != nil {
		waits := demoWaits(r.Result, o)
		t.WaitP50, t.WaitP90 = replay.Percentile(waits, 0.5), replay.Percentile(waits, 0.9)
	}
	return t
}

// demoWaits returns, sorted, each successful request's TTFT minus what its
// own prefill costs at the timing model: the uncached tokens in chunks of
// at most max-batched-tokens, one step overhead per chunk, divided by the
// engine speed-up. What remains is time spent behind other requests, or
// sharing steps with them, plus the router's and HTTP's overhead.
func demoWaits(res *replay.Result, o *demoOptions) []time.Duration {
	var waits []time.Duration
	for i := range res.Requests {
		r := &res.Requests[i]
		if !r.OK() || !r.HasUsage {
			continue
		}
		own := time.Duration(0)
		if !math.IsInf(o.engineSpeedup, 1) {
			// The engine recomputes at least the last prompt token.
			cached := min(r.UsageCachedTokens, r.UsagePromptTokens-1)
			var sim time.Duration
			for done := cached; done < r.UsagePromptTokens; {
				n := min(o.maxBatched, r.UsagePromptTokens-done)
				sim += o.timing.StepOverhead + o.timing.Prefill(done, n)
				done += n
			}
			own = time.Duration(float64(sim) / o.engineSpeedup)
		}
		waits = append(waits, max(r.TTFT-own, 0))
	}
	slices.Sort(waits)
	return waits
}

// demoCheck is one routing-quality target, judged on the measured numbers.
type demoCheck struct {
	Target string `json:"target"`
	Detail string `json:"detail"`
	Met    bool   `json:"met"`
}

// demoChecks judges the targets of the routing-quality benchmark that the
// policies run allow: kv's hit rate against the bound, kv's TTFT p50
// against round-robin's, and kv against approx.
func demoChecks(runs []demoRun) []demoCheck {
	sums := map[string]replay.Summary{}
	for _, r := range runs {
		sums[r.Policy] = r.Result.Summary()
	}
	kv, ok := sums["kv"]
	if !ok {
		return nil
	}
	var checks []demoCheck
	if kv.HitRateKnown() {
		f := kv.HitFractionOfBound()
		checks = append(checks, demoCheck{
			Target: "kv prefix hit rate >= 90% of the infinite-cache bound",
			Detail: fmt.Sprintf("%.3f of %.3f = %.1f%%", kv.HitRate, kv.Bound.Tokens, 100*f),
			Met:    f >= 0.9,
		})
	}
	if rr, ok := sums["round-robin"]; ok && kv.TTFTP50 > 0 {
		ratio := float64(rr.TTFTP50) / float64(kv.TTFTP50)
		checks = append(checks, demoCheck{
			Target: "kv TTFT p50 at least 3x better than round-robin",
			Detail: fmt.Sprintf("%s vs %s = %.1fx", demoMillis(kv.TTFTP50), demoMillis(rr.TTFTP50), ratio),
			Met:    ratio >= 3,
		})
	}
	if ap, ok := sums["approx"]; ok {
		// Repeated runs of one policy on a quiet machine spread by about a
		// point of hit rate either way, so a smaller lead is a tie.
		checks = append(checks, demoCheck{
			Target: fmt.Sprintf("kv beats approx (hit rate %.0f+ points higher, lower TTFT p50 and p90)", 100*demoHitMargin),
			Detail: fmt.Sprintf("TTFT p50 %s vs %s, p90 %s vs %s, hit rate %.3f vs %.3f",
				demoMillis(kv.TTFTP50), demoMillis(ap.TTFTP50), demoMillis(kv.TTFTP90), demoMillis(ap.TTFTP90), kv.HitRate, ap.HitRate),
			Met: kv.TTFTP50 < ap.TTFTP50 && kv.TTFTP90 < ap.TTFTP90 && kv.HitRate >= ap.HitRate+demoHitMargin,
		})
	}
	return checks
}

func demoMillis(d time.Duration) string {
	return fmt.Sprintf("%.1fms", float64(d)/1e6)
}

func writeDemoText(w io.Writer, runs []demoRun, checks []demoCheck, o *demoOptions) error {
	named := make([]replay.NamedResult, len(runs))
	for i, r := range runs {
		named[i] = replay.NamedResult{Name: r.Policy, Result: r.Result}
	}
	if err := replay.WriteTable(w, named); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tprompt tok\tprefilled tok\twait p50\twait p90\tbusy mean\tbusiest\tevicted blocks\tpreemptions\t")
	for i := range runs {
		t := runs[i].totals(o)
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%.0f%%\t%.0f%%\t%d\t%d\t\n", runs[i].Policy, t.PromptTokens, t.PrefillTokens,
			demoMillis(t.WaitP50), demoMillis(t.WaitP90), 100*t.BusyMean, 100*t.BusyMax, t.BlocksEvicted, t.Preemptions)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, c := range checks {
		verdict := "met    "
		if !c.Met {
			verdict = "NOT met"
		}
		fmt.Fprintf(w, "target %s  %s: %s\n", verdict, c.Target, c.Detail)
	}
	for _, r := range runs {
		if lag := r.Result.Summary().MaxSendLag; lag > demoLagWarning {
			fmt.Fprintf(w, "warning %s: requests left up to %s late; the machine was too busy to keep time, so this policy's latencies are unreliable\n",
				r.Policy, demoMillis(lag))
		}
	}
	speed := fmt.Sprintf("%gx real time", o.engineSpeedup)
	if math.IsInf(o.engineSpeedup, 1) {
		speed = "no waiting"
	}
	_, err := fmt.Fprintf(w, "\n%d engines x %d KV blocks of %d tokens, %s; trace at %gx, %d tokens per hash id; "+
		"cost model prefill-load-scale %g, overlap-credit %g, temperature %g; approx TTL %v. Durations are wall-clock.\n",
		o.engines, o.kvBlocks, o.blockSize, speed, o.speedup, o.blockTokens,
		o.prefillScale, o.overlapCredit, o.temperature, o.approxTTL)
	return err
}

// demoJSON is the machine-readable output of the demo.
type demoJSON struct {
	Trace            string           `json:"trace"`
	Engines          int              `json:"engines"`
	KVBlocks         int              `json:"kv_blocks"`
	BlockSize        int              `json:"block_size"`
	BlockTokens      int              `json:"block_tokens"`
	Speedup          float64          `json:"speedup"`
	EngineSpeedup    *float64         `json:"engine_speedup"` // null: no waiting
	PrefillLoadScale float64          `json:"prefill_load_scale"`
	OverlapCredit    float64          `json:"overlap_credit"`
	Temperature      float64          `json:"temperature"`
	ApproxTTL        float64          `json:"approx_ttl_s"`
	Timing           map[string]int64 `json:"timing_ns"`
	Policies         []demoPolicyJSON `json:"policies"`
	Checks           []demoCheck      `json:"checks"`
	Report           string           `json:"report,omitempty"`
}

type demoPolicyJSON struct {
	Policy  string           `json:"policy"`
	Summary replay.Summary   `json:"summary"`
	Engines demoEngineTotals `json:"engines"`
}

func writeDemoJSON(w io.Writer, o *demoOptions, source string, runs []demoRun, checks []demoCheck) error {
	out := demoJSON{Trace: source, Engines: o.engines, KVBlocks: o.kvBlocks, BlockSize: o.blockSize,
		BlockTokens: o.blockTokens, Speedup: o.speedup, PrefillLoadScale: o.prefillScale,
		OverlapCredit: o.overlapCredit, Temperature: o.temperature, ApproxTTL: o.approxTTL.Seconds(), Checks: checks,
		Timing: map[string]int64{
			"step_overhead": int64(o.timing.StepOverhead), "prefill_per_token": int64(o.timing.PrefillPerToken),
			"prefill_attention_per_1k": int64(o.timing.PrefillAttentionPer1K),
			"decode_per_seq":           int64(o.timing.DecodePerSequence), "decode_attention_per_1k": int64(o.timing.DecodeAttentionPer1K),
		}}
	if !math.IsInf(o.engineSpeedup, 1) {
		out.EngineSpeedup = &o.engineSpeedup
	}
	if out.Checks == nil {
		out.Checks = []demoCheck{}
	}
	if o.out != "" {
		if abs, err := filepath.Abs(o.out); err == nil {
			out.Report = abs
		}
	}
	for i := range runs {
		out.Policies = append(out.Policies, demoPolicyJSON{Policy: runs[i].Policy, Summary: runs[i].Result.Summary(),
			Engines: runs[i].totals(o)})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
