package demo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/kvfast/kvfast/benchmarks/demo/demotok"
	"github.com/kvfast/kvfast/benchmarks/replay"
	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/internal/rig"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
	"github.com/kvfast/kvfast/prompt"
	"github.com/kvfast/kvfast/workers"
)

// PolicyRun is one policy's replay with what the engines counted during it.
type PolicyRun struct {
	// Policy names the run: the routing policy, or with Options.Disagg
	// the policy and the deployment ("kv aggregated", "kv 2P6D").
	Policy  string
	Result  *replay.Result
	Engines []mocker.Stats
	// Roles is each engine's role, in the order of Engines.
	Roles []workers.Role
	// Disaggregated: the router ran with disaggregation on.
	Disaggregated bool
	// Released: once the replay ended, the router held no booking on any
	// worker (every stage's booking was released).
	Released bool
	// Tokenizer is how the router tokenized the model's text and chat
	// prompts, with its outcome counts; nil when it did not.
	Tokenizer *prompt.ModelStatus
	// Encode is each engine's multimodal counters, in the order of
	// Engines, with the multimodal workload (EncodeTotals sums them).
	Encode       []mocker.EncodeStats
	routerEncode EncodeTotals // the router's encoder-stage metrics
}

// tokenizer is the chat workload's tokenizer: the engines' renderer, and
// where kv-builtin's router loads the same files from.
type tokenizer struct {
	engines mocker.Renderer
	source  prompt.Source
	name    string // as reports show it
}

// Run replays tr once per policy, each against a fresh segment, router and
// engines, and judges the results. It stops with an error when a policy
// could not be replayed at all or ctx ended; in the second case it also
// returns the report of the policies that finished before, marked
// Interrupted and not judged. A policy whose replay ran but failed around
// it (or whose requests failed) marks the report Failed, and the demo
// goes on.
func Run(ctx context.Context, o Options, tr *replay.Trace) (*Report, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if len(o.Capacities) > 0 {
		return runSweep(ctx, o, tr)
	}
	if err := o.CheckFits(tr); err != nil {
		return nil, err
	}
	if o.ApproxTTL == 0 {
		// kvfast serve's TTL assumes requests arrive in real time; the
		// demo keeps it in trace time.
		o.ApproxTTL = time.Duration(float64(node.DefaultConfig().Approx.TTL) / o.Speedup)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	replayed := tr.Head(o.MaxRequests)
	pace := fmt.Sprintf("%v of trace time at %gx (about %v each)", replayed.Span().Round(time.Second), o.Speedup,
		time.Duration(float64(replayed.Span())/o.Speedup).Round(time.Second))
	if o.Concurrency > 0 {
		pace = fmt.Sprintf("at concurrency %d", o.Concurrency)
	}
	var tok *tokenizer
	if o.Workload == replay.WorkloadChat {
		var cleanup func()
		var err error
		if tok, cleanup, err = o.openTokenizer(); err != nil {
			return nil, err
		}
		defer cleanup()
		o.notef("%d requests from %s as conversations, %d words per hash id, %s; engines tokenize with %s", replayed.Len(), tr.Source,
			o.BlockTokens, pace, tok.name)
	} else if o.Workload == replay.WorkloadMultimodal {
		o.notef("%d requests from %s as conversations with images, %d words per hash id, %s; engines tokenize with the mock's tokenizer",
			replayed.Len(), tr.Source, o.BlockTokens, pace)
	} else {
		o.notef("%d requests from %s, %d tokens per hash id, %s", replayed.Len(), tr.Source, o.BlockTokens, pace)
	}
	o.notef("%d engines x %d KV blocks of %d tokens at %gx; policies %s", o.Engines, o.KVBlocks, o.BlockSize,
		o.EngineSpeedup, strings.Join(o.Policies, ", "))

	if o.Disagg.Enabled() {
		o.notef("%s aggregated on %d engines, then disaggregated on %s (vLLM protocol)", o.Policies[0], o.Engines, o.Disagg)
	}

	rep := &Report{Options: o, Trace: tr.Source}
	if o.Workload == replay.WorkloadMultimodal {
		rep.Images = o.imageLoad(tr)
		o.notef("%s", rep.imagesLine())
	}
	for _, spec := range o.runSpecs() {
		began := time.Now()
		run, err := runPolicy(ctx, &o, spec, tr, tok)
		if ctx.Err() != nil {
			// The policy cut short is left out; the ones before it stand.
			rep.Interrupted = true
			if err == nil {
				err = context.Cause(ctx)
			}
			return rep, fmt.Errorf("%s: %w", spec.name, err)
		}
		if err != nil {
			if run.Result == nil {
				return nil, fmt.Errorf("%s: %w", spec.name, err)
			}
			o.warnf("%s: %v", spec.name, err)
			rep.Failed = true
		}
		s := run.Result.Summary()
		o.notef("%-12s done in %v: TTFT p50 %s, ITL p99 %s, hit rate %.3f, %d errors", spec.name, time.Since(began).Round(100*time.Millisecond),
			millis(s.TTFTP50), millis(s.ITLP99), s.HitRate, s.Errors)
		if s.Errors > 0 {
			rep.Failed = true
			for _, e := range s.ErrorSamples {
				o.notef("%s: error: %s", spec.name, e)
			}
		}
		rep.Runs = append(rep.Runs, run)
	}
	if !o.Disagg.Enabled() && !o.Encode.Enabled() {
		// The targets compare policies; a disaggregation run has one.
		rep.Checks = Checks(o.Workload, rep.Runs)
	}
	return rep, nil
}

// runSpec is one replay of an experiment: a name, the router's policy, the
// engines' roles (nil: all both) and whether the router disaggregates.
type runSpec struct {
	name, policy string
	roles        []workers.Role
	disagg       bool
	encodeByLoad bool // the router chooses encoders by load only
}

// runSpecs lists the experiment's replays: one per policy, or with Disagg
// the policy aggregated and then disaggregated.
func (o *Options) runSpecs() []runSpec {
	if o.Encode.Enabled() {
		return o.encodeRunSpecs()
	}
	if o.Disagg.Enabled() {
		p := o.Policies[0]
		both := make([]workers.Role, o.Engines)
		return []runSpec{
			{name: p + " aggregated", policy: p, roles: both},
			{name: p + " " + o.Disagg.String(), policy: p, roles: o.Disagg.Roles(), disagg: true},
		}
	}
	specs := make([]runSpec, len(o.Policies))
	for i, p := range o.Policies {
		specs[i] = runSpec{name: p, policy: p}
	}
	return specs
}

// openTokenizer loads the chat workload's tokenizer for the engines and
// says where kv-builtin's router finds its files: the demo's own, written
// to a temporary directory that cleanup removes, or o.Tokenizer's.
func (o *Options) openTokenizer() (_ *tokenizer, cleanup func(), err error) {
	tok := &tokenizer{name: o.Tokenizer}
	cleanup = func() {}
	if o.Tokenizer == "" {
		var dir string
		if dir, err = os.MkdirTemp("", "kvfast-demo-tokenizer-"); err != nil {
			return nil, nil, fmt.Errorf("cannot write the demo tokenizer: %w", err)
		}
		cleanup = func() { os.RemoveAll(dir) }
		tok.source, tok.name = prompt.Source{Kind: prompt.SourceDir, Path: dir}, "the demo tokenizer"
		err = demotok.WriteDir(dir)
	} else {
		tok.source, err = prompt.ParseSource(o.Tokenizer)
	}
	if err == nil {
		tok.engines, err = prompt.Open(replay.DefaultModel, tok.source.String(), prompt.DefaultConfig(), 0)
	}
	if err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("cannot load the engines' tokenizer: %w", err)
	}
	return tok, cleanup, nil
}

// runPolicy replays the trace once on a fresh rig as spec says, and
// tears the rig down. The result is returned even with an error when the
// replay itself ran.
func runPolicy(ctx context.Context, o *Options, spec runSpec, tr *replay.Trace, tok *tokenizer) (run PolicyRun, err error) {
	run.Policy, run.Disaggregated = spec.name, spec.disagg
	cfg, err := routerConfig(o, spec.policy, tok)
	if err != nil {
		return run, err
	}
	if spec.disagg {
		cfg.HTTP.Disagg.Protocol = fastpath.DisaggVLLM
		cfg.HTTP.Disagg.MinRemoteTokens = o.DisaggMinRemoteTokens
		cfg.HTTP.Disagg.LocalCachedFraction = o.DisaggLocalCachedFraction
	}
	// The router remembers as many images per encoder as its cache
	// holds, or none: load only.
	if o.EncoderCacheItems > 0 {
		cfg.HTTP.Encode.AffinityItems = o.EncoderCacheItems
	}
	if spec.encodeByLoad {
		cfg.HTTP.Encode.AffinityItems = 0
	}
	// The rig's router listens on loopback only; collectEncode reads its
	// /metrics there.
	cfg.HTTP.AdminOnAPI = true
	var engineTok mocker.Renderer
	if tok != nil {
		engineTok = tok.engines
	}
	r, err := rig.Start(ctx, rig.Config{
		Node:       cfg,
		SegmentDir: o.SegmentDir,
		Engines:    o.Engines,
		Engine:     o.engineConfig(engineTok),
		Roles:      spec.roles,
	})
	if err != nil {
		return run, err
	}
	defer func() { err = errors.Join(err, r.Close()) }()

	rcfg := replay.Config{
		RouterURL:       r.URL,
		Trace:           tr,
		MaxRequests:     o.MaxRequests,
		Speedup:         o.Speedup,
		Concurrency:     o.Concurrency,
		Workload:        o.Workload,
		Tokens:          replay.TokenSynth{BlockTokens: o.BlockTokens, Seed: o.Seed},
		Chat:            replay.ChatSynth{BlockWords: o.BlockTokens, Seed: o.Seed, Images: o.images()},
		MaxOutputTokens: o.MaxOutputTokens,
		// The reference: one LRU cache of every engine's blocks.
		PooledCapacityBlocks: o.Engines * o.KVBlocks,
		EngineBlockSize:      o.BlockSize,
		Model:                replay.DefaultModel,
		Timeout:              o.Timeout,
		ProgressLabel:        fmt.Sprintf("%-12s", spec.name),
		Progress:             o.Progress,
	}
	res, err := replay.Run(ctx, rcfg)
	run.Result = res
	if res != nil {
		// A stream's bookings are released on the router's relay
		// goroutine just after the client's last byte; a booking still
		// held once that has had ample time is a leak.
		var v fastpath.Snapshot
		werr := rig.WaitFor(ctx, 10*time.Second, "every booking released", func() bool {
			v = r.Node.Snapshot()
			return bookingsReleased(&v)
		})
		run.Released = werr == nil
		o.noteCalibration(spec.name, &v)
		if werr != nil && ctx.Err() == nil {
			// Cut short by the run's end (an interrupt) the wait says
			// nothing of a leak, and the interrupt is reported already.
			err = errors.Join(err, fmt.Errorf("cannot see every booking released (queue %+v): %w", v.Queue, werr))
		}
	}
	for i, e := range r.Engines {
		run.Engines = append(run.Engines, e.Stats())
		role := workers.RoleBoth
		if spec.roles != nil {
			role = spec.roles[i]
		}
		run.Roles = append(run.Roles, role)
	}
	if o.Workload == replay.WorkloadMultimodal {
		err = errors.Join(err, run.collectEncode(ctx, r))
	}
	for _, st := range r.Node.Snapshot().Tokenizers {
		if st.Model == replay.DefaultModel && st.Mode != prompt.ModeNone {
			run.Tokenizer = &st
		}
	}
	return run, err
}

// bookingsReleased reports whether the router holds no booking: none
// counted on any worker, and as many released as booked.
func bookingsReleased(v *fastpath.Snapshot) bool {
	for _, w := range v.Workers {
		if w.Requests != 0 || w.ActiveBlocks != 0 || w.PrefillTokens != 0 || w.OutputBlocks != 0 {
			return false
		}
	}
	return v.Queue.Booked == v.Queue.Released && v.Queue.Waiting == 0
}

// routerConfig is kvfast serve's configuration with the demo's policy,
// tokenizer, block size and cost model.
func routerConfig(o *Options, name string, tok *tokenizer) (node.Config, error) {
	cfg := node.DefaultConfig()
	policy, mode, err := policyVariant(name)
	if err != nil {
		return cfg, err
	}
	cfg.Policy = policy
	switch {
	case mode == prompt.ModeBuiltin && tok != nil:
		cfg.Tokenizers.Specs = []prompt.Spec{{Model: replay.DefaultModel, Source: tok.source}}
	case mode == prompt.ModeRemote:
		cfg.Tokenizers.Specs = []prompt.Spec{{Model: replay.DefaultModel, Source: prompt.Source{Kind: prompt.SourceRemote}}}
	case mode != "":
		return cfg, fmt.Errorf("cannot run %s without the chat workload's tokenizer", name)
	}
	cfg.Sched.BlockSize = o.BlockSize
	cfg.Sched.Cost.OverlapCredit = o.OverlapCredit
	cfg.Sched.Cost.PrefillLoadScale = o.PrefillLoadScale
	cfg.Sched.Cost.AutoPrefillLoadScale = o.AutoPrefillLoadScale
	cfg.Sched.Cost.Temperature = o.Temperature
	cfg.Sched.Cost.EvictionWeight = o.EvictionWeight
	cfg.Sched.Seed = o.RouterSeed
	cfg.Approx.TTL = o.ApproxTTL
	// The engines live in this process: a heartbeat that stops means the
	// whole process stalled on a busy machine, not that an engine died,
	// and dropping the engines' blocks for it would measure the machine
	// rather than the routing.
	cfg.HeartbeatGrace = max(cfg.HeartbeatGrace, 30*time.Second)
	// Every block of every engine must fit, or the index would forget
	// blocks the engines hold and understate kv routing.
	cfg.Segment.IndexCapacity = max(cfg.Segment.IndexCapacity, 2*o.Engines*o.KVBlocks)
	cfg.Logger = o.Logger
	return cfg, nil
}

// engineConfig is the mock engines' configuration.
func (o *Options) engineConfig(tok mocker.Renderer) mocker.Config {
	return mocker.Config{
		Model:            replay.DefaultModel,
		BlockSize:        o.BlockSize,
		KVBlocks:         o.KVBlocks,
		MaxBatchedTokens: o.MaxBatchedTokens,
		MaxSeqs:          o.MaxSeqs,
		Timing:           o.Timing,
		Speedup:          o.EngineSpeedup,
		Renderer:         tok,
		// Encode engines only.
		EncoderCacheItems: o.EncoderCacheItems,
	}
}
