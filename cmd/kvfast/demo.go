package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/term"

	"github.com/kvfast/kvfast/benchmarks/demo"
	"github.com/kvfast/kvfast/benchmarks/demo/demotok"
	"github.com/kvfast/kvfast/benchmarks/replay"
)

func init() {
	register("demo", "replay the shipped trace against N mock engines once per routing policy and compare", runDemo)
}

const demoAbout = `Usage: kvfast demo [flags]

Shows what KV-aware routing buys, in one command and one process. For each
routing policy in turn (--policies), the demo creates a fresh shm segment
in a temporary directory, starts a fresh router on it and --engines mock
engines that register in the segment and publish their KV events there,
replays the trace through the router, and shuts everything down, so that
no policy inherits another's warm caches. Then it prints two tables side
by side, checks the routing-quality targets, and writes a self-contained
HTML report (a TTFT CDF per policy, hit-rate bars) whose path it prints.

The first table is the replay's: TTFT and inter-token latency p50/p90/p99,
end-to-end latency, the prefix hit rate the engines reported
(cached_tokens/prompt_tokens) against the trace's infinite-cache bound
and against the pooled-LRU reference (one LRU cache of all the engines'
blocks together, simulated on the same prompts: what a perfect pooling
of the engines' memory would hit when it cannot hold the working set),
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
  --engine-speedup 2   142 s play in 18 s per policy and all six in about
                       2 minutes. Engines run 2x faster than real time,
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
  --prefill-load-scale auto
                       The router's cost model weighs prefill blocks
                       (uncached prompt plus prefill already queued)
                       against decode blocks in flight. As in kvfast
                       serve, the router measures the engines' prefill
                       time per token and decode time per sequence from
                       the TTFTs and token gaps it relays and derives the
                       weight from them (docs/routing.md): here it
                       settles at about 10 to 25, because a prefill block
                       costs the engine 0.8 ms while a block of decoding
                       context costs it microseconds. At Dynamo's default
                       of 1 (--prefill-load-scale 1 pins it), one
                       in-flight request of a few hundred blocks
                       outweighs a cached prefix of the same size, and kv
                       routing sends follow-ups away from their cache even
                       at moderate load. Until it could be measured the
                       demo pinned 10, which auto matches (BENCHMARKS.md,
                       "Calibration sweep"); the kv run's note shows the
                       fitted scale.
  --approx-ttl         The approx policy forgets a routing decision after
                       2 minutes of trace time (serve's default TTL at
                       real-time arrivals), 15 s of wall time at 8x. On
                       this trace no prefix is reused more than 2 minutes
                       after its last use, so the TTL costs approx no hit
                       here; on the full trace it would. The affinity
                       policy (longest prefix on the same history, load
                       only as a tie-break, as vLLM production-stack's
                       prefixaware router) uses the same TTL.

--capacities 0.25,0.5,0.75,1 sweeps the engines' KV capacity instead of
--kv-blocks: at each fraction of the replayed prompts' working set
(distinct KV blocks; 30k for the embedded trace at --block-tokens 64),
split evenly over the engines, every policy is replayed, and a table and
a chart in the HTML report show hit rate against capacity, one line per
policy, with the pooled-LRU reference and the bound. At 0.25x the longest
embedded prompt must still fit one engine: run it with --engines 4
--block-tokens 64 (scripts/bench-issue15.sh does). --trace gen:low and
gen:high generate multi-turn traces of low and high reuse instead.

--workload chat replays the same trace as chat conversations instead
of token-id prompts (see kvfast replay --help: each hash id becomes a
stretch of --block-tokens words, the earlier turns of a conversation are
the prefix it shares), sent to /v1/chat/completions. A router must then
turn a conversation into the engines' token ids before it can route on
their KV blocks, and the engines tokenize with a real Hugging Face
tokenizer: by default a small one built into kvfast (byte-level BPE
trained on the workload's words, one token per word, and a ChatML chat
template; benchmarks/demo/demotok), or --tokenizer DIR|hf:ORG/NAME. The
policies compared by default are then
  kv-builtin  kv routing, the router tokenizing with its built-in
              tokenizer from the engines' tokenizer files
              (kvfast serve --tokenizer mock=DIR)
  kv-remote   kv routing, the router asking an engine to render each
              request (vLLM's render endpoints; --tokenizer mock=remote)
  approx      routing on text chunks and the router's own history
and any other policy may be added (plain kv routes chat requests
approximately: it has no tokenizer). The hit rate's bound is counted in
hash ids of --block-tokens tokens; the engines count real tokens, which
add the template's five per message and the replies, so for chat the
bound is approximate. Those make the prompts 14% longer than the token
workload's (3.49M prompt tokens against 3.07M), so the default
--kv-blocks, sized for the token workload, leaves the engines less
headroom: the same caches evict about twice as much (BENCHMARKS.md).
A line per tokenizing policy counts
the requests it tokenized and those it routed approximately because
rendering failed.

--disagg NPMD (2P6D, say) compares aggregated with disaggregated
serving instead of policies: the one policy (--policies, default kv)
runs first on N+M engines of role both, then on fresh engines with N
started as prefill and M as decode engines and the router disaggregating
in vLLM's protocol (kvfast serve --disagg vllm, with its conditional
disaggregation: --disagg-min-remote-tokens, --disagg-local-cached-fraction),
same trace, same seeds. --engines defaults to N+M and must equal it. The
two runs are the rows of the tables and of the HTML report, and a third
table has a line per run and role: requests the engines received (a
prefill engine's are remote prefills), tokens they prefilled, blocks the
decode engines pulled, and how busy each pool was. The routing targets
compare policies and are not judged.

The point of disaggregating is inter-token latency: an aggregated
engine's decode step that carries a prefill chunk takes as long as the
chunk (the mock's step costs the sum of its prefill chunks and its
decodes, as a vLLM step with chunked prefill does), so every sequence
decoding beside a long prefill waits for it. So --disagg replays at
  --concurrency 32     32 requests in flight, timestamps ignored (unless
                       --speedup or --concurrency is given). Every
                       engine then stays busy with about four requests
                       decoding while others' prompts keep arriving, and
                       between 1% and 10% of the aggregated engines'
                       inter-token gaps wait for a prefill chunk: ITL
                       p99 shows it (138 ms against 3.7 ms disaggregated
                       in BENCHMARKS.md), p90 does not. At the default
                       --speedup 8 by timestamps the engines are half
                       idle, about one request decodes at a time, and
                       under 1% of gaps meet a prefill: no percentile
                       shows interference. A
                       closed loop also bounds the queue of a prefill
                       pool too small for the load (2 of 8 engines
                       compute most prompts), which by timestamps at a
                       higher speedup grows without bound.

--workload multimodal is the chat workload with images (kvfast replay
--help): one user turn in twenty (--image-turn-rate) starts with an
image_url part naming one of 512 images (--images) drawn with Zipf
popularity of exponent 1 (--image-exponent), keyed by the turn's hash id
so that shared prefixes share their images: about two images per
request, 151 distinct on the embedded trace. Web and media popularity is
Zipf-like with an exponent near 1, and the images in use outnumber what
one encoder's cache holds (--encoder-cache-items 32, about what vLLM's
default encoder cache budget of 8192 embedding tokens holds), so where an
image is encoded decides whether it is encoded again. The engines tokenize with the mock's own tokenizer (each
image is 20 placeholder tokens under its hash), so the policies are
kv-remote (exact KV routing, images' blocks included) and approx; every
engine encodes each image it is sent, at --encode-per-item (20 ms).

--encode NE (2E, say) with --workload multimodal compares where images
are encoded: the one policy (default kv-remote) runs on --engines
aggregated engines that encode their own images, then with N of them as
encode engines (vLLM's ec_producer, an encoder cache of
--encoder-cache-items images each) and the rest aggregated, the router
sending each image to an encoder first (kvfast serve's encoder stage),
to the encoder that encoded it last unless it is busy (affinity), and
then to the least loaded encoder alone (--encoder-affinity-items 0). A
table gives each run's TTFT p50 and p90 beside the encoders' cache hit
rate, the images encoded on encoders and locally, and the router's
affinity hits. The routing targets are not judged.

Examples:
  kvfast demo
  kvfast demo --disagg 2P6D
  kvfast demo --workload multimodal --encode 2E
  kvfast demo --workload chat
  kvfast demo --policies kv,round-robin --max-requests 200
  kvfast demo --engines 4 --html /tmp/report.html --json
  kvfast demo --trace ../shared/traces/mooncake_synthetic.jsonl --kv-blocks 49152

Exit status: 0 if every request of every policy succeeded (whether or not
the targets were met), 1 if any failed or the run was interrupted, 2 for
bad flags or an unreadable trace. An interrupt (Ctrl-C) still prints the
policies that finished before it, without the HTML report.

Flags:
`

// demoOutput is what the command does with a report, beside the
// experiment itself (demo.Options).
type demoOutput struct {
	out      string // HTML report file ("": none)
	json     bool
	quiet    bool
	logLevel string
}

func runDemo(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return demoCommand(ctx, args, os.Stdout, os.Stderr, term.IsTerminal(int(os.Stderr.Fd())))
}

// demoCommand is runDemo with its context and outputs injected; progress
// bars are drawn on stderr only when stderrIsTTY.
func demoCommand(ctx context.Context, args []string, stdout, stderr io.Writer, stderrIsTTY bool) int {
	o, out, code := parseDemoFlags(args, stderr)
	if code >= 0 {
		return code
	}
	say := func(format string, a ...any) { fmt.Fprintf(stderr, "kvfast demo: "+format+"\n", a...) }
	tr, err := demo.LoadTrace(o.Trace, o.TraceBlockSize, o.Concurrency > 0)
	if err == nil {
		err = o.CheckFits(tr)
	}
	if err == nil {
		o.Logger, err = newLogger(stderr, out.logLevel, "text")
	}
	if err != nil {
		say("%v", err)
		return 2
	}
	o.Warnf = say
	if !out.quiet {
		o.Notef = say
		if stderrIsTTY {
			o.Progress = stderr
		}
	}
	rep, err := demo.Run(ctx, o, tr)
	if err != nil {
		say("%v", err)
		if rep == nil || len(rep.Runs) == 0 {
			return 1
		}
		// What finished before an interrupt is still worth its minutes:
		// printed, but no HTML report, which has no place to say it is
		// partial.
		say("interrupted: the report holds only what finished")
		out.out = ""
	}

	status := 0
	if rep.Interrupted {
		status = 1
	}
	html := ""
	if out.out != "" {
		if err := replayWriteFile(out.out, rep.WriteHTML); err != nil {
			say("%v", err)
			status = 1
		}
		if html, err = filepath.Abs(out.out); err != nil {
			html = out.out
		}
	}
	if out.json {
		err = rep.WriteJSON(stdout, html)
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		say("cannot write the report: %v", err)
		return 1
	}
	if html != "" && status == 0 {
		if !out.json {
			fmt.Fprintf(stdout, "\nHTML report: %s\n", html)
		} else if !out.quiet {
			say("HTML report: %s", html)
		}
	}
	if rep.Failed {
		return 1
	}
	return status
}

// parseDemoFlags binds the flags to demo.DefaultOptions and returns the
// options, or an exit code >= 0 when the command must stop (help, bad
// flags).
func parseDemoFlags(args []string, stderr io.Writer) (demo.Options, demoOutput, int) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := demo.DefaultOptions()
	out := demoOutput{out: filepath.Join(os.TempDir(), "kvfast-demo.html"), logLevel: "warn"}
	policies, disagg, encode := "", "", ""
	fs.StringVar(&disagg, "disagg", disagg, "compare aggregated with disaggregated serving on the same engines and trace: `NPMD` prefill and decode engines, such as 2P6D (see above)")
	fs.IntVar(&o.DisaggMinRemoteTokens, "disagg-min-remote-tokens", o.DisaggMinRemoteTokens, "with --disagg: the router prefills on the decode engine when the part of the prompt it does not cache is shorter than this")
	fs.Float64Var(&o.DisaggLocalCachedFraction, "disagg-local-cached-fraction", o.DisaggLocalCachedFraction, "with --disagg: the router prefills on the decode engine when it caches at least this fraction of the prompt (0: off)")
	fs.StringVar(&encode, "encode", encode, "with --workload multimodal: compare aggregated serving with `N`E of the engines as encoders, choosing them by affinity and then by load, such as 2E (see above)")
	fs.IntVar(&o.Images.Images, "images", replay.DefaultImages, "multimodal workload: images in the set the user turns' images are drawn from")
	fs.Float64Var(&o.Images.Exponent, "image-exponent", replay.DefaultImageExponent, "multimodal workload: Zipf exponent of the images' popularity")
	fs.Float64Var(&o.Images.TurnRate, "image-turn-rate", replay.DefaultImageTurnRate, "multimodal workload: fraction of user turns that carry an image")
	fs.IntVar(&o.EncoderCacheItems, "encoder-cache-items", o.EncoderCacheItems, "multimodal workload: each encode engine's encoder cache, in images")
	fs.DurationVar(&o.Timing.EncodePerItem, "encode-per-item", o.Timing.EncodePerItem, "engine timing: cost of encoding one image")
	fs.IntVar(&o.Engines, "engines", o.Engines, "mock engines to start for each policy")
	fs.StringVar(&policies, "policies", policies, "comma-separated `list` of routing policies to compare: kv, approx, affinity, round-robin, random, least-loaded, with --workload chat kv-builtin and kv-remote, or all (default: all for tokens, kv-builtin,kv-remote,approx for chat)")
	fs.StringVar(&o.Workload, "workload", o.Workload, "what each trace record becomes: tokens (a token-id prompt), chat (a conversation) or multimodal (a conversation with images)")
	fs.StringVar(&o.Tokenizer, "tokenizer", o.Tokenizer, "chat workload: the engines' tokenizer, a `DIR` or hf:ORG/NAME (default, or demo: the demo's own)")
	fs.StringVar(&o.Trace, "trace", o.Trace, "trace `file` (Mooncake JSONL; - for the standard input), \"embedded\" for the last 600 records of the shipped trace, or gen:low or gen:high for a generated trace of low or high reuse")
	fs.IntVar(&o.TraceBlockSize, "trace-block-size", replay.DefaultTraceBlockSize, "tokens one hash id of a --trace file stands for (the embedded and generated traces have their own)")
	fs.IntVar(&o.MaxRequests, "max-requests", o.MaxRequests, "replay only the first `N` records of the trace (0: all)")
	fs.Float64Var(&o.Speedup, "speedup", o.Speedup, "divide the trace's inter-arrival times by `factor`")
	fs.Float64Var(&o.EngineSpeedup, "engine-speedup", o.EngineSpeedup, "divide the engines' simulated time by `factor` (inf: engines never wait); load grows with --speedup / --engine-speedup")
	fs.IntVar(&o.Concurrency, "concurrency", o.Concurrency, "keep `N` requests in flight and ignore timestamps (0: replay timestamps at --speedup)")
	fs.IntVar(&o.BlockTokens, "block-tokens", o.BlockTokens, "tokens (chat: words) sent per trace hash id (the trace's own is 512); fewer make shorter prompts with the same sharing")
	fs.IntVar(&o.BlockSize, "block-size", o.BlockSize, "tokens per KV block, in the engines and the router")
	fs.IntVar(&o.KVBlocks, "kv-blocks", o.KVBlocks, "KV cache capacity of each engine, in blocks")
	fs.Func("capacities", "sweep the engines' capacity instead of --kv-blocks: comma-separated `fractions` of the replayed prompts' working set (such as 0.25,0.5,1), every policy replayed at each, with the pooled-LRU reference; the table and HTML report show hit rate against capacity", func(v string) error {
		o.Capacities = nil
		for _, f := range strings.Split(v, ",") {
			x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil {
				return fmt.Errorf("cannot read capacity fraction %q: %w", f, err)
			}
			o.Capacities = append(o.Capacities, x)
		}
		return nil
	})
	fs.IntVar(&o.MaxBatchedTokens, "max-batched-tokens", o.MaxBatchedTokens, "engine: token budget of one step")
	fs.IntVar(&o.MaxSeqs, "max-seqs", o.MaxSeqs, "engine: running sequences at most")
	fs.IntVar(&o.MaxOutputTokens, "max-output-tokens", o.MaxOutputTokens, "cap each request's max_tokens, which is the trace's output_length (0: no cap)")
	fs.Uint64Var(&o.Seed, "token-seed", o.Seed, "seed of the hash-id-to-token mapping")
	fs.Uint64Var(&o.RouterSeed, "seed", o.RouterSeed, "seed of the routers' tie-breaking, as kvfast serve --seed (0: from the clock)")
	fs.Float64Var(&o.OverlapCredit, "overlap-credit", o.OverlapCredit, "router cost model: weight of a worker's cached prefix blocks against its prefill cost")
	fs.Var(prefillLoadScaleFlag{&o.PrefillLoadScale, &o.AutoPrefillLoadScale}, "prefill-load-scale", "router cost model: weight of the prefill term against the decode term, `auto` (fitted from the engines' measured timing, as kvfast serve does) or a number that pins it")
	fs.Float64Var(&o.Temperature, "temperature", o.Temperature, "router cost model: 0 picks the cheapest worker, above 0 samples a softmax over costs")
	fs.Float64Var(&o.EvictionWeight, "eviction-weight", o.EvictionWeight, "router cost model: once a worker's cache is full, extra prefill blocks charged per prompt block it does not cache (kvfast serve --eviction-weight; 0: Dynamo's model)")
	fs.DurationVar(&o.ApproxTTL, "approx-ttl", o.ApproxTTL, "wall-clock TTL of the approx policy's routing history (0: 2 minutes of trace time, i.e. 2m / --speedup)")
	fs.DurationVar(&o.Timing.StepOverhead, "step-overhead", o.Timing.StepOverhead, "engine timing: fixed cost of every step")
	fs.DurationVar(&o.Timing.PrefillPerToken, "prefill-per-token", o.Timing.PrefillPerToken, "engine timing: cost per prefilled (uncached) token")
	fs.DurationVar(&o.Timing.PrefillAttentionPer1K, "prefill-attention-per-1k", o.Timing.PrefillAttentionPer1K, "engine timing: cost per prefilled token per 1024 tokens it attends to")
	fs.DurationVar(&o.Timing.DecodePerSequence, "decode-per-seq", o.Timing.DecodePerSequence, "engine timing: cost per sequence in a decode step")
	fs.DurationVar(&o.Timing.DecodeAttentionPer1K, "decode-attention-per-1k", o.Timing.DecodeAttentionPer1K, "engine timing: cost per 1024 context tokens read in a decode step")
	fs.StringVar(&out.out, "html", out.out, "write the HTML report to `file` (empty: none)")
	fs.BoolVar(&out.json, "json", out.json, "print the results as JSON instead of tables")
	fs.BoolVar(&out.quiet, "quiet", out.quiet, "no progress bars or notes on stderr, and only the routers' errors unless --log-level says otherwise")
	fs.StringVar(&out.logLevel, "log-level", out.logLevel, "router log level: debug, info, warn or error")
	fs.StringVar(&o.SegmentDir, "segment-dir", o.SegmentDir, "`directory` in which each run's segment gets a fresh temporary directory (default: /dev/shm if present, else the system temp dir)")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "bound on one request, from send to end of stream")
	if err := parseFlags(fs, args, demoAbout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, out, 0
		}
		return o, out, 2
	}
	bad := func(format string, a ...any) (demo.Options, demoOutput, int) {
		fmt.Fprintf(stderr, "kvfast demo: "+format+"\n", a...)
		return o, out, 2
	}
	if fs.NArg() > 0 {
		return bad("%s", extraArgument(fs))
	}
	var err error
	if policies == "" {
		o.Policies = demo.DefaultPolicies(o.Workload)
	} else if o.Policies, err = demo.ParsePolicies(policies, o.Workload); err != nil {
		return bad("--policies: %v", err)
	}
	if disagg != "" {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if o.Disagg, err = demo.ParseDisagg(disagg); err != nil {
			return bad("--disagg: %v", err)
		}
		if !set["engines"] {
			o.Engines = o.Disagg.Engines()
		}
		if policies == "" {
			o.Policies = o.Policies[:1]
		}
		if !set["speedup"] && !set["concurrency"] {
			o.Concurrency = demo.DisaggConcurrency
		}
	}
	if encode != "" {
		if o.Encode, err = demo.ParseEncode(encode); err != nil {
			return bad("--encode: %v", err)
		}
		if policies == "" {
			o.Policies = o.Policies[:1]
		}
	}
	if o.Tokenizer == demotok.Name {
		o.Tokenizer = "" // the default, by the name kvfast mock and tokenize know it by
	}
	if err := o.Validate(); err != nil {
		return bad("%v", err)
	}
	if out.quiet {
		// Each run's router starts before its engines, and says so at warn
		// level: quiet means the routers' errors only, unless asked.
		set := false
		fs.Visit(func(f *flag.Flag) { set = set || f.Name == "log-level" })
		if !set {
			out.logLevel = "error"
		}
	}
	if err := checkWritable(out.out); err != nil {
		return bad("--html: %v", err)
	}
	return o, out, -1
}
