package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/kvfast/kvfast/benchmarks/demo"
	"github.com/kvfast/kvfast/benchmarks/replay"
)

func init() {
	register("replay", "replay a Mooncake-format trace through a running router and report TTFT and cache hits", runReplay)
}

const replayAbout = `Usage: kvfast replay [flags]

Replays a Mooncake-format trace (JSONL, gzipped or not: timestamp in ms,
which --concurrency does without, input_length, output_length, hash_ids)
through a running router as streaming requests.

--workload tokens (the default) sends each record to /v1/completions as a
token-id prompt: each hash id becomes a fixed pseudo-random block of
tokens, so requests that share hash-id prefixes share token prefixes and
can hit the engines' prefix caches.

--workload chat sends each record to /v1/chat/completions as a
conversation, which the router must tokenize (--tokenizer) to route on
token blocks: each hash id becomes a fixed stretch of --block-tokens words
(pseudo-words from a fixed vocabulary, keyed by --token-seed and the hash
id), the first hash id is the system prompt, each following one an
earlier turn (the user's words and an 8-word assistant reply), and the
last one the new user turn, so that requests sharing hash-id prefixes
share their earlier turns. The infinite-cache bound is still counted in
hash ids of --block-tokens tokens; the engines count real tokens, which
add the chat template's few per message and the replies, so the two
compare only approximately (the demo's tokenizer spends one token per
word).

--workload multimodal is the chat workload with images: one user turn in
twenty (keyed by --token-seed and its hash id, so shared prefixes share
their images) starts with an image_url part, an https URL naming one of
512 images drawn with Zipf popularity (exponent 1), for a router's
encoder stage (kvfast demo --encode).

Requests leave at their trace time divided by --speedup, or, with
--concurrency N, N at a time back to back. The report gives TTFT
p50/p90/p99, inter-token latency, end-to-end latency, throughput, errors,
and the prefix hit rate the engines reported (cached_tokens/prompt_tokens)
next to the best an infinite shared cache could reach on the same requests.
That bound assumes the engines' caches start empty: replayed again against
warm engines, the hit rate exceeds it, and the report says so. Restart the
engines, or POST /reset_prefix_cache to each engine (vLLM, kvfast mock),
between runs.

Without --trace, the last 600 records of the Mooncake synthetic trace,
built into this binary (--trace embedded), are replayed, wherever the
command runs.

Examples:
  kvfast replay --max-requests 200 --speedup 4
  kvfast replay --trace my.jsonl --concurrency 16 --block-tokens 32 --json
  kvfast replay --html report.html --label kv
  kvfast replay --workload chat --block-tokens 128 --max-requests 200 --speedup 4

Exit status: 0 if every request succeeded, 1 if any failed or the replay
was interrupted, 2 for bad flags, an unreadable trace, or a request that
would be larger than --max-body-bytes. An interrupt (Ctrl-C) still prints
the report of what finished; requests it cut short are counted apart, not
as failed.

Flags:
`

func runReplay(args []string) int {
	return replayCommand(args, os.Stdout, os.Stderr, term.IsTerminal(int(os.Stderr.Fd())))
}

// replayCommand is runReplay with its outputs injected; progress is drawn
// on stderr only when stderrIsTTY.
func replayCommand(args []string, stdout, stderr io.Writer, stderrIsTTY bool) int {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		router      = fs.String("router", replay.DefaultRouterURL, "router base `URL`; /v1/completions (chat: /v1/chat/completions) is appended")
		workload    = fs.String("workload", replay.WorkloadTokens, "what each record becomes: tokens (token-id prompts), chat (conversations) or multimodal (conversations with images)")
		tracePath   = fs.String("trace", "", "trace `file` (JSONL; - for the standard input), \"embedded\", or a generated trace, gen:low or gen:high, as kvfast demo's (default: embedded, the last 600 records of the Mooncake synthetic trace)")
		traceBlock  = fs.Int("trace-block-size", replay.DefaultTraceBlockSize, "tokens per hash id in the trace")
		maxRequests = fs.Int("max-requests", 0, "replay only the first `N` records (0: all)")
		speedup     = fs.Float64("speedup", 1, "divide trace time by `factor` (timestamp mode)")
		concurrency = fs.Int("concurrency", 0, "keep `N` requests in flight and ignore timestamps (0: timestamp mode)")
		maxInFlight = fs.Int("max-in-flight", replay.DefaultMaxInFlight, "cap on concurrent requests in timestamp mode")
		blockTokens = fs.Int("block-tokens", 0, "tokens (chat: words) to send per hash id, to shrink prompts (0: the trace block size)")
		maxOutput   = fs.Int("max-output-tokens", 0, "cap max_tokens, which is the trace's output_length (0: no cap)")
		model       = fs.String("model", replay.DefaultModel, "model name to send")
		maxBody     = fs.Int("max-body-bytes", replay.DefaultMaxBodyBytes, "largest request body to send, the router's --max-body-bytes: a trace with a larger request is refused before the run")
		keyFile     = fs.String("api-key-file", "", "`file` holding an API key, sent as Authorization: Bearer KEY, for a router started with --api-key-file: that file serves (its first key is sent)")
		seed        = fs.Uint64("token-seed", 0, "seed of the hash-id-to-token (chat: to-text) mapping")
		vocab       = fs.Uint("vocab", replay.DefaultVocab, "token ids are drawn from [0, vocab) (tokens workload)")
		timeout     = fs.Duration("timeout", 5*time.Minute, "bound on one request, from send to end of stream (0: none)")
		jsonOut     = fs.Bool("json", false, "print the summary as JSON instead of text")
		quiet       = fs.Bool("quiet", false, "no progress bar or notes on stderr")
		label       = fs.String("label", "replay", "name of this run in the HTML report")
		htmlPath    = fs.String("html", "", "also write a self-contained HTML report to `file`")
		requestsOut = fs.String("requests-out", "", "also write one JSON line per request (timings, usage, worker) to `file`")
	)
	if err := parseFlags(fs, args, replayAbout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kvfast replay: %s\n", extraArgument(fs))
		return 2
	}
	if *vocab < minVocab || *vocab > 1<<32-1 {
		// Fewer ids make distinct hash ids' blocks alike: the engines
		// would cache what the trace says is new, and the bound mislead.
		fmt.Fprintf(stderr, "kvfast replay: --vocab %d: want %d..%d\n", *vocab, minVocab, uint32(1<<32-1))
		return 2
	}
	if !slices.Contains(replay.Workloads, *workload) {
		fmt.Fprintf(stderr, "kvfast replay: --workload %q: want one of %v\n", *workload, replay.Workloads)
		return 2
	}
	if !(*speedup > 0) {
		fmt.Fprintf(stderr, "kvfast replay: --speedup %v: want a positive factor\n", *speedup)
		return 2
	}
	if err := replay.CheckRouterURL(*router); err != nil {
		fmt.Fprintf(stderr, "kvfast replay: --router: %v\n", err)
		return 2
	}
	for flagName, path := range map[string]string{"html": *htmlPath, "requests-out": *requestsOut} {
		if err := checkWritable(path); err != nil {
			fmt.Fprintf(stderr, "kvfast replay: --%s: %v\n", flagName, err)
			return 2
		}
	}
	notef := func(format string, a ...any) {
		if !*quiet {
			fmt.Fprintf(stderr, "kvfast replay: "+format+"\n", a...)
		}
	}

	apiKey := ""
	if *keyFile != "" {
		var err error
		// The router's own key file serves: its first key is sent.
		keys, err := readAPIKeys(*keyFile)
		if err != nil {
			fmt.Fprintf(stderr, "kvfast replay: %v\n", err)
			return 2
		}
		apiKey = keys[0]
	}

	tr, err := loadReplayTrace(*tracePath, replay.TraceOptions{BlockSize: *traceBlock, Untimed: *concurrency > 0}, notef)
	if err != nil {
		fmt.Fprintf(stderr, "kvfast replay: %v\n", err)
		return 2
	}
	cfg := replay.Config{
		RouterURL:       *router,
		Trace:           tr,
		MaxRequests:     *maxRequests,
		Speedup:         *speedup,
		Concurrency:     *concurrency,
		MaxInFlight:     *maxInFlight,
		Workload:        *workload,
		Tokens:          replay.TokenSynth{BlockTokens: *blockTokens, Vocab: uint32(*vocab), Seed: *seed},
		Chat:            replay.ChatSynth{BlockWords: *blockTokens, Seed: *seed},
		MaxOutputTokens: *maxOutput,
		Model:           *model,
		MaxBodyBytes:    *maxBody,
		APIKey:          apiKey,
		Timeout:         *timeout,
		ProgressLabel:   *label,
	}
	if *workload == replay.WorkloadMultimodal {
		cfg.Chat.Images, _ = replay.NewImageSet(replay.ImageSynth{Seed: *seed}) // the defaults compile
	}
	if !*quiet && stderrIsTTY {
		cfg.Progress = stderr
	}
	replayed := tr.Head(*maxRequests)
	if *concurrency > 0 {
		notef("%d requests from %s at concurrency %d", replayed.Len(), tr.Source, *concurrency)
	} else {
		notef("%d requests from %s over %v of trace time at %gx (about %v)", replayed.Len(), tr.Source,
			replayed.Span().Round(time.Second), *speedup, time.Duration(float64(replayed.Span()) / *speedup).Round(time.Second))
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, runErr := replay.Run(ctx, cfg)
	if res == nil {
		fmt.Fprintf(stderr, "kvfast replay: %v\n", runErr)
		return 2
	}
	sum := res.Summary()
	if *jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(sum)
	} else {
		err = sum.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvfast replay: cannot write the report: %v\n", err)
		return 1
	}
	status := 0
	if *htmlPath != "" {
		if err := replayWriteFile(*htmlPath, func(w io.Writer) error {
			return replay.WriteHTML(w, []replay.NamedResult{{Name: *label, Result: res}})
		}); err != nil {
			fmt.Fprintf(stderr, "kvfast replay: %v\n", err)
			status = 1
		} else {
			notef("HTML report written to %s", *htmlPath)
		}
	}
	if *requestsOut != "" {
		if err := replayWriteFile(*requestsOut, func(w io.Writer) error {
			enc := json.NewEncoder(w)
			for i := range res.Requests {
				if err := enc.Encode(&res.Requests[i]); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			fmt.Fprintf(stderr, "kvfast replay: %v\n", err)
			status = 1
		}
	}
	if runErr != nil {
		fmt.Fprintf(stderr, "kvfast replay: %v\n", runErr)
		return 1
	}
	if sum.Errors > 0 {
		notef("%d of %d requests failed", sum.Errors, sum.Requests)
		return 1
	}
	return status
}

// loadReplayTrace resolves --trace: a path, "embedded", or empty for the
// embedded one. The default does not depend on the working directory: a
// replay run from elsewhere must replay the same requests.
func loadReplayTrace(path string, opts replay.TraceOptions, notef func(string, ...any)) (*replay.Trace, error) {
	switch path {
	case "embedded":
		return replay.EmbeddedTrace(opts)
	case "":
		notef("no --trace given: replaying the embedded trace, the last 600 records of the Mooncake synthetic trace; --trace FILE replays another")
		return replay.EmbeddedTrace(opts)
	}
	if strings.HasPrefix(path, demo.GeneratedTracePrefix) {
		// The demo's generated traces, by the same names.
		return demo.LoadTrace(path, opts.BlockSize, opts.Untimed)
	}
	return replay.LoadTrace(path, opts)
}

// checkWritable reports whether path ("": none) can be created, before a
// run of minutes whose report would otherwise be lost at its end. It
// leaves the file system as it was: a file it had to create is removed,
// an existing one is not truncated until the report is written.
func checkWritable(path string) error {
	if path == "" {
		return nil
	}
	_, statErr := os.Stat(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o666)
	if err != nil {
		return fmt.Errorf("cannot create %s: %w", path, err)
	}
	_ = f.Close()
	if errors.Is(statErr, fs.ErrNotExist) {
		_ = os.Remove(path)
	}
	return nil
}

// replayWriteFile writes a file through a buffer, reporting close errors,
// which is where a full disk shows up.
func replayWriteFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("cannot create %s: %w", path, err)
	}
	bw := bufio.NewWriter(f)
	err = write(bw)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("cannot write %s: %w", path, err)
	}
	return nil
}

// minVocab is the smallest --vocab: with fewer token ids, blocks of
// distinct hash ids come out alike too often for the trace's sharing to
// be the prompts'.
const minVocab = 256
