package demo

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kvfast/kvfast/benchmarks/replay"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/workers"
)

// AllPolicies is every routing policy, in the order the demo runs them.
var AllPolicies = []string{"kv", "approx", "round-robin", "random", "least-loaded"}

// EmbeddedTrace names the trace compiled into the binary: the last 600
// records of the Mooncake synthetic trace.
const EmbeddedTrace = "embedded"

const (
	// lagWarning is the send lag beyond which a replay's timings are the
	// machine's, not the simulation's.
	lagWarning = 100 * time.Millisecond
	// hitMargin is the hit-rate lead over approx that counts as beating it
	// rather than as run-to-run noise.
	hitMargin = 0.02
)

// Options describe one experiment. kvfast demo --help gives the reasoning
// behind each default.
type Options struct {
	Engines  int      // mock engines per policy
	Policies []string // routing policies, run in this order
	// Trace is a Mooncake JSONL file, or EmbeddedTrace.
	Trace       string
	MaxRequests int // replay only the first N records (0: all)

	Speedup       float64 // divides the trace's inter-arrival times
	EngineSpeedup float64 // divides the engines' simulated time (+Inf: no waiting)
	Concurrency   int     // keep N requests in flight, ignoring timestamps (0: timestamps)

	BlockTokens      int    // tokens sent per trace hash id
	BlockSize        int    // tokens per KV block, engines and router
	KVBlocks         int    // KV cache capacity per engine, in blocks
	MaxBatchedTokens int    // engine step budget
	MaxSeqs          int    // engine running sequences at most
	MaxOutputTokens  int    // cap on each request's max_tokens (0: none)
	Seed             uint64 // the hash-id-to-token mapping
	RouterSeed       uint64 // the routers' tie-breaking (0: from the clock)

	// The router's cost model.
	OverlapCredit    float64
	PrefillLoadScale float64
	Temperature      float64
	// ApproxTTL is the approx policy's wall-clock TTL (0: two minutes of
	// trace time, i.e. 2m / Speedup).
	ApproxTTL time.Duration

	Timing  mocker.Timing // the engines' step cost model
	Timeout time.Duration // bound on one request, from send to end of stream

	// SegmentDir is where each run's segment gets a fresh temporary
	// directory ("": /dev/shm if present, else the system temp dir).
	SegmentDir string

	// Logger receives the routers' logs (nil: discarded).
	Logger *slog.Logger
	// Progress, if set, shows each replay's progress bar.
	Progress io.Writer
	// Notef, if set, receives progress notes: what is replayed, and each
	// policy's headline numbers and failed requests.
	Notef func(format string, args ...any)
	// Warnf, if set, receives a policy's failure that the demo goes on
	// past (its replay ran, but something failed around it).
	Warnf func(format string, args ...any)
}

// DefaultOptions is kvfast demo's experiment: the embedded trace, all
// policies, 8 engines, and a load at which routing that loses cache hits
// queues while routing that keeps them does not.
func DefaultOptions() Options {
	return Options{
		Engines:          8,
		Policies:         slices.Clone(AllPolicies),
		Trace:            EmbeddedTrace,
		Speedup:          8,
		EngineSpeedup:    2,
		BlockTokens:      128,
		BlockSize:        radix.DefaultBlockSize,
		KVBlocks:         8192,
		MaxBatchedTokens: mocker.DefaultMaxBatchedTokens,
		MaxSeqs:          mocker.DefaultMaxSeqs,
		OverlapCredit:    node.DefaultConfig().Sched.Cost.OverlapCredit,
		PrefillLoadScale: 10,
		Timing:           mocker.DefaultTiming,
		Timeout:          2 * time.Minute,
	}
}

// Validate reports the first option the demo cannot run with.
func (o *Options) Validate() error {
	switch {
	case len(o.Policies) == 0:
		return errors.New("cannot run without a policy")
	case o.Engines < 1 || o.Engines > workers.Max:
		return fmt.Errorf("cannot run %d engines: want 1..%d", o.Engines, workers.Max)
	case !(o.Speedup > 0) || math.IsInf(o.Speedup, 1):
		return fmt.Errorf("cannot use speedup %v: want a positive factor", o.Speedup)
	case !(o.EngineSpeedup > 0):
		return fmt.Errorf("cannot use engine speedup %v: want a positive factor or inf", o.EngineSpeedup)
	case o.BlockTokens < 1:
		return fmt.Errorf("cannot send %d tokens per hash id: want at least 1", o.BlockTokens)
	case o.BlockSize < 1:
		return fmt.Errorf("cannot use block size %d: want at least 1", o.BlockSize)
	case o.KVBlocks < 1:
		return fmt.Errorf("cannot give engines %d KV blocks: want at least 1", o.KVBlocks)
	case o.MaxRequests < 0 || o.Concurrency < 0 || o.MaxOutputTokens < 0 || o.ApproxTTL < 0:
		return errors.New("cannot use a negative request count, concurrency, output cap or approx TTL")
	}
	for _, p := range o.Policies {
		if _, _, err := sched.ParsePolicy(p); err != nil {
			return err
		}
	}
	cost := sched.CostParams{OverlapCredit: o.OverlapCredit, PrefillLoadScale: o.PrefillLoadScale, Temperature: o.Temperature}
	if err := cost.Validate(); err != nil {
		return err
	}
	for _, d := range []time.Duration{o.Timing.StepOverhead, o.Timing.PrefillPerToken, o.Timing.PrefillAttentionPer1K,
		o.Timing.DecodePerSequence, o.Timing.DecodeAttentionPer1K} {
		if d < 0 {
			return errors.New("cannot use negative timing durations")
		}
	}
	return nil
}

// ParsePolicies splits a comma-separated list, expanding "all" and
// checking every name against the scheduler's own parser.
func ParsePolicies(list string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(list, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, errors.New("empty policy name")
		}
		names := []string{p}
		if p == "all" {
			names = AllPolicies
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

// LoadTrace reads the trace at path, or the embedded one.
func LoadTrace(path string) (*replay.Trace, error) {
	if path == EmbeddedTrace || path == "" {
		return replay.EmbeddedTrace(replay.TraceOptions{})
	}
	return replay.LoadTrace(path, replay.TraceOptions{})
}

// CheckFits reports whether every request the demo replays from tr fits
// in an empty engine: an engine refuses a request longer than its cache.
func (o *Options) CheckFits(tr *replay.Trace) error {
	synth := o.tokens(tr)
	longest := 0
	replayed := tr.Head(o.MaxRequests)
	for i := range replayed.Records {
		r := &replayed.Records[i]
		out := r.OutputLength
		if o.MaxOutputTokens > 0 && out > o.MaxOutputTokens {
			out = o.MaxOutputTokens
		}
		longest = max(longest, synth.PromptLen(r)+out)
	}
	if capacity := o.KVBlocks * o.BlockSize; longest > capacity {
		return fmt.Errorf("cannot fit the longest request: it needs %d tokens but an engine holds %d (%d KV blocks x %d): "+
			"raise the KV blocks or lower the tokens per hash id", longest, capacity, o.KVBlocks, o.BlockSize)
	}
	return nil
}

// tokens is how the replay turns tr's hash ids into token prompts.
func (o *Options) tokens(tr *replay.Trace) replay.TokenSynth {
	return replay.TokenSynth{TraceBlockSize: tr.BlockSize, BlockTokens: o.BlockTokens, Seed: o.Seed}
}

func (o *Options) notef(format string, args ...any) {
	if o.Notef != nil {
		o.Notef(format, args...)
	}
}

func (o *Options) warnf(format string, args ...any) {
	if o.Warnf != nil {
		o.Warnf(format, args...)
	}
}
