package demo

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvfast/kvfast/benchmarks/replay"
	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
	"github.com/kvfast/kvfast/prompt"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/workers"
)

// AllPolicies is every routing policy, in the order the demo runs them on
// the token workload.
var AllPolicies = []string{"kv", "approx", "affinity", "round-robin", "random", "least-loaded"}

// The kv policy's variants for the chat workload, which differ in how the
// router turns a conversation into the engines' token ids: a kv router
// with neither routes chat requests approximately, as approx does.
const (
	// PolicyKVBuiltin tokenizes in the router, with the built-in tokenizer
	// loaded from the engines' own tokenizer files (--tokenizer MODEL=DIR).
	PolicyKVBuiltin = "kv-builtin"
	// PolicyKVRemote asks an engine to render each request
	// (--tokenizer MODEL=remote).
	PolicyKVRemote = "kv-remote"
)

// ChatPolicies is the chat workload's default comparison: kv with each way
// of tokenizing exactly, against approx.
var ChatPolicies = []string{PolicyKVBuiltin, PolicyKVRemote, "approx"}

// allChatPolicies is "all" for the chat workload.
var allChatPolicies = []string{PolicyKVBuiltin, PolicyKVRemote, "approx", "affinity", "round-robin", "random", "least-loaded"}

// DefaultPolicies is the comparison a workload runs by default.
func DefaultPolicies(workload string) []string {
	switch workload {
	case replay.WorkloadChat:
		return slices.Clone(ChatPolicies)
	case replay.WorkloadMultimodal:
		return slices.Clone(MultimodalPolicies)
	}
	return slices.Clone(AllPolicies)
}

// policyVariant splits a policy name of the demo into the router's
// routing policy and its tokenizer for text and chat prompts
// (prompt.ModeBuiltin, prompt.ModeRemote, or "" for none).
func policyVariant(name string) (policy, tokenizer string, err error) {
	switch name {
	case PolicyKVBuiltin:
		return "kv", prompt.ModeBuiltin, nil
	case PolicyKVRemote:
		return "kv", prompt.ModeRemote, nil
	}
	if _, _, err := sched.ParsePolicy(name); err != nil {
		return "", "", fmt.Errorf("%w, or %s or %s with --workload chat", err, PolicyKVBuiltin, PolicyKVRemote)
	}
	return name, "", nil
}

// chatTemplateTokens is about what the chat template adds per message in
// tokens (the demo tokenizer's ChatML spends five: <|im_start|>, the role,
// a newline, <|im_end|> and a newline), and once more for the BOS token
// and the generation prompt.
const chatTemplateTokens = 5

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
	// Workload is what each trace record becomes: replay.WorkloadTokens,
	// a token-id prompt, replay.WorkloadChat, a conversation that the
	// engines tokenize with Tokenizer, or replay.WorkloadMultimodal, a
	// conversation with images (multimodal.go).
	Workload string
	// Trace is a Mooncake JSONL file, or EmbeddedTrace.
	Trace string
	// TraceBlockSize is the tokens one hash id of a Trace file stands for
	// (0: replay.DefaultTraceBlockSize); the embedded and generated traces
	// have their own.
	TraceBlockSize int
	MaxRequests    int // replay only the first N records (0: all)
	// Capacities, when set, sweeps the engines' capacity instead of
	// using KVBlocks: for each fraction of the replayed prompts' working
	// set (distinct KV blocks), KVBlocks becomes that share of it per
	// engine and every policy is replayed (sweep.go).
	Capacities []float64

	Speedup       float64 // divides the trace's inter-arrival times
	EngineSpeedup float64 // divides the engines' simulated time (+Inf: no waiting)
	Concurrency   int     // keep N requests in flight, ignoring timestamps (0: timestamps)

	// Tokenizer is the engines' tokenizer in the chat workload, which
	// kv-builtin's router loads too: "" for the demo's own (package
	// demotok), or a directory or hf:ORG/NAME as --tokenizer names one.
	Tokenizer string

	BlockTokens      int    // tokens (chat: words) sent per trace hash id
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
	// AutoPrefillLoadScale fits the scale per engine instead
	// (--prefill-load-scale auto), ignoring PrefillLoadScale.
	AutoPrefillLoadScale bool
	EvictionWeight       float64
	// ApproxTTL is the approx policy's wall-clock TTL (0: two minutes of
	// trace time, i.e. 2m / Speedup).
	ApproxTTL time.Duration

	// Disagg, when set, turns the experiment into aggregated against
	// disaggregated serving: the one policy in Policies runs on Engines
	// engines of role both, then with the router's vLLM disaggregation on
	// Disagg.Prefill prefill and Disagg.Decode decode engines (Engines
	// must be their sum), same trace, same seeds.
	Disagg DisaggSpec
	// The router's conditional disaggregation (fastpath.DisaggConfig).
	DisaggMinRemoteTokens     int
	DisaggLocalCachedFraction float64

	// Encode, when set, turns the multimodal experiment into aggregated
	// against encoder-disaggregated serving (multimodal.go): the one
	// policy runs on Engines aggregated engines, then with Encode.Encoders
	// of them as encode engines and the router's encoder stage choosing
	// encoders by affinity, then by load alone; same trace, same seeds.
	Encode EncodeSpec
	// Images are the multimodal workload's images (their Seed is Seed's).
	Images replay.ImageSynth
	// EncoderCacheItems is each engine's encoder cache, in images (0: the
	// mock's default; DefaultOptions: DefaultEncoderCacheItems).
	EncoderCacheItems int

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
	serve := node.DefaultConfig().Sched.Cost // the cost model as kvfast serve runs it
	return Options{
		Engines:          8,
		Policies:         slices.Clone(AllPolicies),
		Workload:         replay.WorkloadTokens,
		Trace:            EmbeddedTrace,
		Speedup:          8,
		EngineSpeedup:    2,
		BlockTokens:      128,
		BlockSize:        radix.DefaultBlockSize,
		KVBlocks:         8192,
		MaxBatchedTokens: mocker.DefaultMaxBatchedTokens,
		MaxSeqs:          mocker.DefaultMaxSeqs,
		OverlapCredit:    serve.OverlapCredit,
		PrefillLoadScale: serve.PrefillLoadScale,
		// auto: the demo pinned 10 until the scale could be measured.
		AutoPrefillLoadScale: serve.AutoPrefillLoadScale,
		EvictionWeight:       sched.DefaultEvictionWeight,
		Timing:               mocker.DefaultTiming,
		Timeout:              2 * time.Minute,

		DisaggMinRemoteTokens:     fastpath.DefaultMinRemoteTokens,
		DisaggLocalCachedFraction: fastpath.DefaultLocalCachedFraction,
		EncoderCacheItems:         DefaultEncoderCacheItems,
	}
}

// DisaggSpec is a disaggregated deployment: Prefill prefill engines and
// Decode decode engines, written "2P6D". The zero value is aggregated
// serving only.
type DisaggSpec struct{ Prefill, Decode int }

// Enabled reports whether the spec names a disaggregated deployment.
func (d DisaggSpec) Enabled() bool { return d != DisaggSpec{} }

// Engines is the deployment's engine count.
func (d DisaggSpec) Engines() int { return d.Prefill + d.Decode }

func (d DisaggSpec) String() string { return fmt.Sprintf("%dP%dD", d.Prefill, d.Decode) }

// Roles is each engine's role in rig slot order: the prefill engines
// first.
func (d DisaggSpec) Roles() []workers.Role {
	roles := make([]workers.Role, 0, d.Engines())
	for range d.Prefill {
		roles = append(roles, workers.RolePrefill)
	}
	for range d.Decode {
		roles = append(roles, workers.RoleDecode)
	}
	return roles
}

// ParseDisagg reads "NPMD" (case-insensitive): N prefill engines and M
// decode engines, each at least one.
func ParseDisagg(s string) (DisaggSpec, error) {
	var d DisaggSpec
	var p, dd string
	up := strings.ToUpper(strings.TrimSpace(s))
	i := strings.IndexByte(up, 'P')
	if i > 0 && strings.HasSuffix(up, "D") {
		p, dd = up[:i], up[i+1:len(up)-1]
	}
	var err1, err2 error
	d.Prefill, err1 = strconv.Atoi(p)
	d.Decode, err2 = strconv.Atoi(dd)
	if err1 != nil || err2 != nil || d.Prefill < 1 || d.Decode < 1 {
		return DisaggSpec{}, fmt.Errorf("cannot read disaggregation %q: want NPMD, N prefill and M decode engines, such as 2P6D", s)
	}
	return d, nil
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
	case o.BlockSize < 1 || o.BlockSize > workers.MaxBlockSize:
		return fmt.Errorf("cannot use block size %d: want 1..%d", o.BlockSize, workers.MaxBlockSize)
	case o.KVBlocks < 1:
		return fmt.Errorf("cannot give engines %d KV blocks: want at least 1", o.KVBlocks)
	case o.MaxRequests < 0 || o.Concurrency < 0 || o.MaxOutputTokens < 0 || o.ApproxTTL < 0:
		return errors.New("cannot use a negative request count, concurrency, output cap or approx TTL")
	case o.MaxBatchedTokens < 1 || o.MaxSeqs < 1:
		// 0 is no engine default here: the report's waits divide prompts
		// into steps of MaxBatchedTokens.
		return fmt.Errorf("cannot give engines steps of %d tokens and %d sequences: want at least 1 of each", o.MaxBatchedTokens, o.MaxSeqs)
	}
	if err := o.engineConfig(nil).Check(); err != nil {
		return err
	}
	for i, f := range o.Capacities {
		if !(f > 0) || math.IsInf(f, 1) || i > 0 && f <= o.Capacities[i-1] {
			return fmt.Errorf("cannot sweep capacities %v: want positive fractions of the working set in ascending order", o.Capacities)
		}
	}
	if len(o.Capacities) > 0 && (o.Disagg.Enabled() || o.Workload != replay.WorkloadTokens) {
		return errors.New("cannot sweep capacities with --disagg or the chat workload: the pooled-LRU reference needs token prompts")
	}
	if o.Disagg.Enabled() {
		switch {
		case o.Disagg.Prefill < 1 || o.Disagg.Decode < 1:
			return fmt.Errorf("cannot disaggregate onto %s: want at least one prefill and one decode engine", o.Disagg)
		case o.Disagg.Engines() != o.Engines:
			return fmt.Errorf("cannot compare %d aggregated engines with %s: the same engines run both ways, want %d", o.Engines, o.Disagg, o.Disagg.Engines())
		case len(o.Policies) != 1:
			return fmt.Errorf("cannot compare disaggregation under %d policies: name one", len(o.Policies))
		}
		if o.DisaggMinRemoteTokens < 0 || !(o.DisaggLocalCachedFraction >= 0 && o.DisaggLocalCachedFraction <= 1) {
			return fmt.Errorf("cannot use disaggregation thresholds %d tokens, %v cached: want tokens >= 0 and a fraction in [0, 1]",
				o.DisaggMinRemoteTokens, o.DisaggLocalCachedFraction)
		}
	}
	switch o.Workload {
	case replay.WorkloadTokens:
		if o.Tokenizer != "" {
			return errors.New("cannot use a tokenizer with the token workload, which sends token ids: use the chat workload")
		}
	case replay.WorkloadChat:
		if o.Tokenizer != "" {
			if src, err := prompt.ParseSource(o.Tokenizer); err != nil {
				return err
			} else if src.Kind == prompt.SourceRemote {
				return errors.New("cannot give the engines a remote tokenizer: name a directory or hf:ORG/NAME")
			}
		}
	case replay.WorkloadMultimodal:
	default:
		return fmt.Errorf("cannot run workload %q: want one of %v", o.Workload, replay.Workloads)
	}
	for _, p := range o.Policies {
		_, tok, err := policyVariant(p)
		if err != nil {
			return err
		}
		if err := policyFitsWorkload(p, tok, o.Workload); err != nil {
			return err
		}
	}
	if err := o.validateMultimodal(); err != nil {
		return err
	}
	cost := sched.CostParams{OverlapCredit: o.OverlapCredit, PrefillLoadScale: o.PrefillLoadScale, Temperature: o.Temperature,
		EvictionWeight: o.EvictionWeight}
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

// ParsePolicies splits a comma-separated list, expanding "all" (every
// policy the workload can run) and checking every name against the
// scheduler's own parser or the kv variants.
func ParsePolicies(list, workload string) ([]string, error) {
	all := AllPolicies
	if workload == replay.WorkloadChat {
		all = allChatPolicies
	} else if mm := multimodalPolicies(workload); mm != nil {
		all = mm
	}
	var out []string
	for _, p := range strings.Split(list, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, errors.New("empty policy name")
		}
		names := []string{p}
		if p == "all" {
			names = all
		} else if _, _, err := policyVariant(p); err != nil {
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

// GeneratedTracePrefix names a generated trace (replay.GeneratedTraces):
// "gen:low" or "gen:high".
const GeneratedTracePrefix = "gen:"

// LoadTrace reads the trace at path, with traceBlockSize tokens per hash
// id (0: the default), the embedded one, or generates one named gen:NAME;
// those two have their own block size, and traceBlockSize must be 0.
// untimed accepts a file's records without timestamps, for a replay at a
// fixed concurrency (--concurrency), as kvfast replay does.
func LoadTrace(path string, traceBlockSize int, untimed bool) (*replay.Trace, error) {
	tr, err := loadBuiltinTrace(path)
	switch {
	case err != nil:
		return nil, err
	case tr == nil:
		return replay.LoadTrace(path, replay.TraceOptions{BlockSize: traceBlockSize, Untimed: untimed})
	case traceBlockSize != 0 && traceBlockSize != cmp.Or(tr.BlockSize, replay.DefaultTraceBlockSize):
		return nil, fmt.Errorf("cannot give the %s trace %d tokens per hash id: it has its own, %d; a trace block size is for a trace file",
			cmp.Or(path, EmbeddedTrace), traceBlockSize, cmp.Or(tr.BlockSize, replay.DefaultTraceBlockSize))
	}
	return tr, nil
}

// loadBuiltinTrace returns the embedded trace or a generated one, or nil
// for a path that names neither.
func loadBuiltinTrace(path string) (*replay.Trace, error) {
	if path == EmbeddedTrace || path == "" {
		return replay.EmbeddedTrace(replay.TraceOptions{})
	}
	if name, ok := strings.CutPrefix(path, GeneratedTracePrefix); ok {
		cfg, ok := replay.GeneratedTraces[name]
		if !ok {
			return nil, fmt.Errorf("cannot generate trace %q: want %s followed by one of %s", path, GeneratedTracePrefix,
				strings.Join(replay.GeneratedTraceNames(), ", "))
		}
		return replay.Generate(cfg)
	}
	return nil, nil
}

// CheckFits reports whether every request the demo replays from tr fits
// in an empty engine: an engine refuses a request longer than its cache.
func (o *Options) CheckFits(tr *replay.Trace) error {
	synth, chat, images := o.tokens(tr), o.chat(tr), o.images()
	var ranks []int
	longest := 0
	replayed := tr.Head(o.MaxRequests)
	for i := range replayed.Records {
		r := &replayed.Records[i]
		out := r.OutputLength
		if o.MaxOutputTokens > 0 && out > o.MaxOutputTokens {
			out = o.MaxOutputTokens
		}
		prompt := synth.PromptLen(r)
		if o.Workload != replay.WorkloadTokens {
			words, messages := chat.PromptLen(r)
			prompt = words + chatTemplateTokens*(messages+1)
		}
		if images != nil {
			ranks = images.AppendImages(ranks[:0], chat, r)
			prompt += len(ranks) * mocker.ImageTokens
		}
		longest = max(longest, prompt+out)
	}
	if len(o.Capacities) == 0 {
		return o.fits(longest, o.KVBlocks)
	}
	// A capacity sweep sizes the engines from the working set: each
	// point is checked now, before the first is run.
	ws := replayed.WorkingSetBlocks(o.BlockTokens, o.BlockSize)
	for _, f := range o.Capacities {
		kv := sweepKVBlocks(f, ws, o.Engines)
		err := o.fits(longest, kv)
		if err == nil {
			at := *o
			at.KVBlocks = kv
			err = at.engineConfig(nil).Check()
		}
		if err != nil {
			return fmt.Errorf("at %gx capacity: %w", f, err)
		}
	}
	return nil
}

// fits reports whether a request of longest tokens fits an engine of
// kvBlocks blocks.
func (o *Options) fits(longest, kvBlocks int) error {
	if capacity := kvBlocks * o.BlockSize; longest > capacity {
		raise := "raise --kv-blocks"
		if len(o.Capacities) > 0 {
			// The sweep sizes the engines itself: --kv-blocks is not read.
			raise = "raise the smallest of --capacities, or use fewer --engines"
		}
		return fmt.Errorf("cannot fit the longest request: it needs %d tokens but an engine holds %d (%d KV blocks x %d): "+
			"%s, or lower --block-tokens", longest, capacity, kvBlocks, o.BlockSize, raise)
	}
	return nil
}

// tokens is how the replay turns tr's hash ids into token prompts.
func (o *Options) tokens(tr *replay.Trace) replay.TokenSynth {
	return replay.TokenSynth{TraceBlockSize: tr.BlockSize, BlockTokens: o.BlockTokens, Seed: o.Seed}
}

// chat is how the replay turns tr's hash ids into conversations.
func (o *Options) chat(tr *replay.Trace) replay.ChatSynth {
	return replay.ChatSynth{TraceBlockSize: tr.BlockSize, BlockWords: o.BlockTokens, Seed: o.Seed}
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

// DisaggConcurrency is kvfast demo --disagg's load, in requests kept in
// flight, unless --speedup or --concurrency says otherwise: see the
// command's help for why.
const DisaggConcurrency = 32
