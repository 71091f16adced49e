package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvfast/kvfast/benchmarks/demo/demotok"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/prompt"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
)

func init() {
	register("mock", "run one or more simulated engines (OpenAI API, KV cache, KV events)", runMock)
}

const mockAbout = `Usage: kvfast mock [flags]

Runs simulated inference engines that stand in for vLLM ranks. Each serves
POST /v1/completions and /v1/chat/completions (streaming or not), GET
/v1/models, GET /health, POST /reset_prefix_cache, GET /mock/stats, and
vLLM's POST /v1/completions/render, /v1/chat/completions/render and
/tokenize, which a router with --tokenizer MODEL=remote asks for the prompt
ids the engine computes.

Each engine keeps a paged KV cache (--kv-blocks blocks of --block-size
tokens) with prefix caching and LRU eviction, batches continuously within
--max-batched-tokens per step, preempts when the cache is full, and takes
simulated time to prefill and decode: prefill grows with the prompt tokens
not already cached, a decode step with batch size and context. --engine-speedup
divides that time ("inf" for none at all). Replies report
usage.prompt_tokens_details.cached_tokens.

Text and chat prompts are tokenized by a toy tokenizer (one token per
word, a fixed chat template) unless --tokenizer names a real one: a
directory holding tokenizer.json and tokenizer_config.json, hf:ORG/NAME
(found in the local Hugging Face cache), or "demo", the small tokenizer
built into kvfast for kvfast demo (benchmarks/demo/demotok). The engines
then compute, cache and publish that tokenizer's ids, and answer render
and tokenize with them, so that a router can be checked against them with
--tokenizer MODEL=remote or with the same files (MODEL=DIR; for the
demo tokenizer, MODEL=demo). Generated
tokens stay the toy tokenizer's.

With --segment, each engine registers in the router's shm segment and
publishes every block stored and evicted, its load, and a heartbeat.

With --publish zmq, each engine publishes its KV events as a stock vLLM
(v0.26) does with KV events enabled: a PUB socket on --zmq-listen sending
[topic, 8-byte big-endian seq, msgpack batch] with map-tagged events, and,
with --zmq-replay, a ROUTER replay socket answering [topic, seq, payload]
and the end marker. --publish zmq-sglang speaks SGLang's format instead:
array events, int64 block hashes, replies [seq, payload]. A router follows
such an engine with a static worker whose zmq= (and replay=) name these
endpoints. --zmq-drop-every N loses every Nth batch from the live stream,
kept for replay, to watch a router repair gaps.

--host-blocks N gives each engine a CPU tier of N blocks, as vLLM's
OffloadingConnector and SGLang's HiCache do: a block the GPU evicts is
copied there (least recently used copies making room) and loaded back,
at --host-load-per-block each, for a request whose prefix continues there.
On ZMQ the copies are announced as each engine does (vLLM: token-less
BlockStored, medium CPU; SGLang: with tokens, medium CPU_PINNED); shm
records cannot name a tier and leave them out.

--sliding-window TOKENS makes each engine a hybrid model, as vLLM's hybrid
KV-cache manager runs one: a second KV-cache group of sliding-window
attention caches every block and frees it as soon as no running request's
window covers it, and a cached prefix is reused only if that group still
holds the window before its end. Events name their group (group_idx,
kv_cache_spec_kind), so it needs --publish zmq, and not --host-blocks.

--lora-adapters names LoRA adapters the engines serve, as vLLM's
--lora-modules does: a request naming one as its model, or carrying
cache_salt, caches its blocks in that namespace, published on ZMQ as the
engine does (shm records cannot carry a namespace and leave them out).

Engine i listens on the --listen port plus i (port 0: a free port each;
likewise the --zmq-listen and --zmq-replay ports)
and gets worker id --worker-id plus i, or, with --ranks-as-dp, the same
worker id and DP rank --dp-rank plus i. Its URL is printed on start.

Examples:
  kvfast mock --engines 4 --listen 127.0.0.1:8100
  kvfast mock --engines 8 --listen 127.0.0.1:8100 --segment /dev/shm/kvfast --engine-speedup 10
  kvfast mock --kv-blocks 2048 --block-size 16 --engine-speedup inf
  kvfast mock --engines 2 --publish zmq --zmq-listen tcp://127.0.0.1:5557 --zmq-replay tcp://127.0.0.1:5657
  kvfast mock --engines 2 --listen 127.0.0.1:8100 --tokenizer demo
  kvfast mock --engines 2 --publish zmq --zmq-listen tcp://127.0.0.1:5557 --kv-blocks 512 --host-blocks 4096
  kvfast mock --publish zmq --zmq-listen tcp://127.0.0.1:5557 --sliding-window 1024

Exit status: 0 after SIGINT or SIGTERM, 1 if an engine or the tokenizer
cannot start, 2 for bad flags.

Flags:
`

func runMock(args []string) int {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	stop := make(chan struct{})
	go func() {
		<-sig
		close(stop)
	}()
	return mockCommand(args, os.Stdout, os.Stderr, stop)
}

// mockCommand is runMock with its outputs and its stop signal injected.
func mockCommand(args []string, stdout, stderr io.Writer, stop <-chan struct{}) int {
	fs := flag.NewFlagSet("mock", flag.ContinueOnError)
	fs.SetOutput(stderr)
	d := mocker.DefaultTiming
	var (
		listen     = fs.String("listen", "127.0.0.1:8100", "base listen `address` (host:port); engine i uses the port plus i (port 0: a free port per engine)")
		engines    = fs.Int("engines", 1, fmt.Sprintf("number of engines to run, 1 to %d", workers.Max))
		model      = fs.String("model", mocker.DefaultModel, "served model `name`")
		blockSize  = fs.Int("block-size", radix.DefaultBlockSize, "tokens per KV block (must equal the router's)")
		kvBlocks   = fs.Int("kv-blocks", mocker.DefaultKVBlocks, fmt.Sprintf("KV cache capacity per engine, in blocks (at most %d: the cache is allocated whole at start, about 115 bytes a block)", mocker.MaxKVBlocks))
		maxBatched = fs.Int("max-batched-tokens", mocker.DefaultMaxBatchedTokens, "token budget of one step (prefill chunks and decodes)")
		maxSeqs    = fs.Int("max-seqs", mocker.DefaultMaxSeqs, "running sequences per engine at most")
		maxLen     = fs.Int("max-model-len", 0, "prompt plus max_tokens at most (0: the KV capacity in tokens)")
		defMax     = fs.Int("default-max-tokens", mocker.DefaultMaxTokens, "max_tokens of requests that set none")
		speedup    = fs.Float64("engine-speedup", 1, "divide simulated time by `factor` (inf: no waiting at all)")
		segment    = fs.String("segment", "", "shm segment `path` to register in and publish KV events to (the router creates it, and the engines wait until it has; unset or \"none\": no segment, \"none\" as kvfast serve spells it)")
		publish    = fs.String("publish", "", "KV-event `transport`: shm (the default with --segment), zmq (vLLM's wire format) or zmq-sglang (SGLang's)")
		zmqListen  = fs.String("zmq-listen", "tcp://127.0.0.1:5557", "with --publish zmq*: engine 0's KV-event PUB `endpoint`; engine i uses the port plus i (port 0: a free port each)")
		zmqReplay  = fs.String("zmq-replay", "", "with --publish zmq*: engine 0's replay ROUTER `endpoint`, numbered like --zmq-listen (\"\": no replay socket)")
		zmqTopic   = fs.String("zmq-topic", "", "with --publish zmq*: the topic frame of every message (vLLM's default is empty)")
		adapters   = fs.String("lora-adapters", "", "comma-separated LoRA adapter `names` each engine serves (listed by GET /v1/models with the model as parent; their requests, like salted ones, cache in their own namespace)")
		hostBlocks = fs.Int("host-blocks", 0, "CPU tier per engine, in `blocks`: evicted blocks are kept there and loaded back (0: none)")
		window     = fs.Int("sliding-window", 0, "make each engine a hybrid model with a sliding-window KV-cache group of `tokens` (needs --publish zmq; 0: none)")
		zmqDrop    = fs.Int("zmq-drop-every", 0, "with --publish zmq*: lose every `N`th batch from the live stream (it stays replayable)")
		workerID   = fs.Uint64("worker-id", 0, "worker id of engine 0")
		dpRank     = fs.Uint("dp-rank", 0, "DP rank of engine 0")
		ranksAsDP  = fs.Bool("ranks-as-dp", false, "engines share --worker-id and take consecutive DP ranks")
		tokenizer  = fs.String("tokenizer", "", "tokenize text and chat prompts with the tokenizer in `DIR`, hf:ORG/NAME, or \""+demotok.Name+"\" (the demo's); empty: the toy tokenizer")
		keyFile    = fs.String("api-key-file", "", "`file` holding an API key on its one line: every engine then wants Authorization: Bearer KEY on paths under /v1, as vLLM started with --api-key does (401 otherwise)")
		noRender   = fs.Bool("no-render", false, "answer /v1/completions/render and /v1/chat/completions/render with 404, as an engine without them does (a router then asks /tokenize)")
		heartbeat  = fs.Duration("heartbeat", mocker.DefaultHeartbeatInterval, "heartbeat and load refresh period (wall clock)")
		stepOver   = fs.Duration("step-overhead", d.StepOverhead, "timing: fixed cost of every step")
		preTok     = fs.Duration("prefill-per-token", d.PrefillPerToken, "timing: cost per prefilled token")
		preAttn    = fs.Duration("prefill-attention-per-1k", d.PrefillAttentionPer1K, "timing: cost per prefilled token per 1024 tokens it attends to")
		decSeq     = fs.Duration("decode-per-seq", d.DecodePerSequence, "timing: cost per sequence in a decode step")
		decAttn    = fs.Duration("decode-attention-per-1k", d.DecodeAttentionPer1K, "timing: cost per 1024 context tokens read in a decode step")
		hostLoad   = fs.Duration("host-load-per-block", d.HostLoadPerBlock, "timing: cost of loading a block back from the CPU tier (--host-blocks)")
		role       = fs.String("role", "both", "disaggregated serving `role` of every engine: prefill (keeps a prompt's KV for a remote decode: vLLM kv_transfer_params do_remote_decode), decode (pulls it: do_remote_prefill), encode (encodes chat requests' images and saves them to --ec-store: vLLM's ec_producer) or both; registered in the segment")
		encItem    = fs.Duration("encode-per-item", d.EncodePerItem, "timing: cost of encoding one image, paid by an encode engine on an encoder-cache miss and by any other engine for an image not found in --ec-store")
		encCache   = fs.Int("encoder-cache-items", mocker.DefaultEncoderCacheItems, "an encode engine's encoder cache, in images (least recently used out first)")
		ecStore    = fs.String("ec-store", "", "`directory` of the encoder-cache store shared with engines in other processes (an entry per mm_hash, as vLLM's example EC connector keeps a file per mm_hash); default: shared by this process's engines only")
		sglang     = fs.Bool("sglang-bootstrap", false, "simulate SGLang's disaggregation instead of vLLM's: requests with bootstrap_host/port/room pair a prefill and a decode engine by room (the bootstrap server is the engine's HTTP port: run the router with --disagg-bootstrap-port http)")
		xferBlock  = fs.Duration("transfer-per-block", d.TransferPerBlock, "timing: cost of pulling one block's KV from a remote prefill engine")
		xferTTL    = fs.Duration("transfer-timeout", mocker.DefaultTransferTimeout, "how long a prefill engine keeps a finished prompt's blocks for a decode that does not pull them")
	)
	if err := parseFlags(fs, args, mockAbout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kvfast mock: %s\n", extraArgument(fs))
		return 2
	}
	host, portStr, err := net.SplitHostPort(*listen)
	if err != nil {
		fmt.Fprintf(stderr, "kvfast mock: cannot parse --listen %q: %v\n", *listen, err)
		return 2
	}
	basePort, err := strconv.Atoi(portStr)
	if err != nil {
		fmt.Fprintf(stderr, "kvfast mock: cannot parse the port of --listen %q: %v\n", *listen, err)
		return 2
	}
	switch {
	case *engines < 1 || *engines > workers.Max:
		fmt.Fprintf(stderr, "kvfast mock: --engines %d is outside [1, %d]\n", *engines, workers.Max)
		return 2
	case basePort < 0 || (basePort > 0 && basePort+*engines-1 > 65535):
		fmt.Fprintf(stderr, "kvfast mock: ports %d..%d are out of range\n", basePort, basePort+*engines-1)
		return 2
	case *dpRank > math.MaxUint32-uint(*engines):
		fmt.Fprintf(stderr, "kvfast mock: --dp-rank %d is out of range\n", *dpRank)
		return 2
	case *kvBlocks < 1:
		// The library reads 0 as its default; on the command line it
		// is a mistake, not a request for 16384.
		fmt.Fprintf(stderr, "kvfast mock: --kv-blocks %d: want at least 1\n", *kvBlocks)
		return 2
	case *blockSize < 1:
		// As --kv-blocks: 0 is the library's default, 16, which a router
		// started with another --block-size (serve refuses 0) would not
		// route to.
		fmt.Fprintf(stderr, "kvfast mock: --block-size %d: want at least 1 (the router's --block-size)\n", *blockSize)
		return 2
	case !(*speedup > 0):
		fmt.Fprintf(stderr, "kvfast mock: --engine-speedup %v: want a factor > 0 (inf: no waiting)\n", *speedup)
		return 2
	case *maxBatched < 1 || *maxSeqs < 1 || *defMax < 1 || *heartbeat <= 0:
		// As --kv-blocks: the library reads 0 as its default, which on the
		// command line would silently be another value than the one given.
		fmt.Fprintf(stderr, "kvfast mock: --max-batched-tokens %d, --max-seqs %d, --default-max-tokens %d and --heartbeat %v: want each above 0\n",
			*maxBatched, *maxSeqs, *defMax, *heartbeat)
		return 2
	}

	engineRole, err := workers.ParseRole(*role)
	if err != nil {
		fmt.Fprintf(stderr, "kvfast mock: --role: %v\n", err)
		return 2
	}
	if *segment == "none" {
		*segment = "" // kvfast serve's spelling of no segment
	}
	zmqFormat, err := publishMode(*publish, *segment)
	if err != nil {
		fmt.Fprintf(stderr, "kvfast mock: %v\n", err)
		return 2
	}
	switch {
	case *window > 0 && *publish != "zmq":
		fmt.Fprintln(stderr, "kvfast mock: --sliding-window needs vLLM's events (--publish zmq): shm records and SGLang's events cannot name KV-cache groups")
		return 2
	case *window > 0 && *hostBlocks > 0:
		fmt.Fprintln(stderr, "kvfast mock: --sliding-window and --host-blocks are exclusive: offloading a hybrid model is not simulated")
		return 2
	}
	zmqOn := *publish == "zmq" || *publish == "zmq-sglang"
	var zmqEndpoints, replayEndpoints []string
	if zmqOn {
		if zmqEndpoints, err = numberedEndpoints(*zmqListen, *engines); err == nil && *zmqReplay != "" {
			replayEndpoints, err = numberedEndpoints(*zmqReplay, *engines)
		}
		if err != nil {
			fmt.Fprintf(stderr, "kvfast mock: %v\n", err)
			return 2
		}
	}
	apiKey := ""
	if *keyFile != "" {
		if apiKey, err = readToken("API key", *keyFile); err != nil {
			fmt.Fprintf(stderr, "kvfast mock: %v\n", err)
			return 2
		}
	}
	var renderer mocker.Renderer
	tokenizerName := "toy tokenizer"
	if *tokenizer != "" {
		var err error
		if *tokenizer == demotok.Name {
			renderer, err = demotok.Open(*model)
		} else {
			renderer, err = prompt.Open(*model, *tokenizer, prompt.DefaultConfig(), 0)
		}
		if err != nil {
			fmt.Fprintf(stderr, "kvfast mock: cannot load --tokenizer %s: %v\n", *tokenizer, err)
			return 1
		}
		tokenizerName = "tokenizer " + *tokenizer
	}

	store := mocker.NewECStore()
	if *ecStore != "" {
		if store, err = mocker.OpenECStore(*ecStore); err != nil {
			fmt.Fprintf(stderr, "kvfast mock: --ec-store: %v\n", err)
			return 1
		}
	}

	if *segment != "" {
		switch there, err := awaitSegment(*segment, stderr, stop); {
		case err != nil:
			fmt.Fprintf(stderr, "kvfast mock: %v\n", err)
			return 1
		case !there:
			return 0 // stopped while waiting
		}
	}
	var started []*mocker.Engine
	closeAll := func() int {
		code := 0
		for _, e := range started {
			if err := e.Close(); err != nil {
				fmt.Fprintf(stderr, "kvfast mock: %v\n", err)
				code = 1
			}
		}
		return code
	}
	for i := range *engines {
		p := 0
		if basePort > 0 {
			p = basePort + i
		}
		cfg := mocker.Config{
			Listen:            net.JoinHostPort(host, strconv.Itoa(p)),
			Model:             *model,
			BlockSize:         *blockSize,
			KVBlocks:          *kvBlocks,
			MaxBatchedTokens:  *maxBatched,
			MaxSeqs:           *maxSeqs,
			MaxModelLen:       *maxLen,
			DefaultMaxTokens:  *defMax,
			Speedup:           *speedup,
			HeartbeatInterval: *heartbeat,
			Timing: mocker.Timing{
				StepOverhead: *stepOver, PrefillPerToken: *preTok, PrefillAttentionPer1K: *preAttn,
				DecodePerSequence: *decSeq, DecodeAttentionPer1K: *decAttn, HostLoadPerBlock: *hostLoad,
				TransferPerBlock: *xferBlock, EncodePerItem: *encItem,
			},
			ECStore:           store,
			EncoderCacheItems: *encCache,
			Role:              engineRole,
			SGLangBootstrap:   *sglang,
			TransferTimeout:   *xferTTL,
			HostBlocks:        *hostBlocks,
			SlidingWindow:     *window,
			Renderer:          renderer,
			DisableRender:     *noRender,
			APIKey:            apiKey,
			LoRAAdapters:      loraAdapters(*adapters),
			Segment:           *segment,
			WorkerID:          *workerID + uint64(i),
			DPRank:            uint32(*dpRank),
		}
		if zmqOn {
			cfg.ZMQ = mocker.ZMQConfig{Listen: zmqEndpoints[i], Format: zmqFormat, Topic: *zmqTopic, DropEvery: *zmqDrop}
			if replayEndpoints != nil {
				cfg.ZMQ.Replay = replayEndpoints[i]
			}
		}
		if *ranksAsDP {
			cfg.WorkerID, cfg.DPRank = *workerID, uint32(*dpRank)+uint32(i)
		}
		if err := cfg.Check(); err != nil {
			// A value no engine takes is the flags' fault, told apart
			// from an engine that cannot start (a port in use).
			fmt.Fprintf(stderr, "kvfast mock: %v\n", err)
			closeAll()
			return 2
		}
		e, err := mocker.Start(cfg)
		if err != nil {
			fmt.Fprintf(stderr, "kvfast mock: engine %d: %v\n", i, err)
			closeAll()
			return 1
		}
		started = append(started, e)
		c := e.Config()
		speed := "x" + strconv.FormatFloat(c.Speedup, 'g', -1, 64)
		if math.IsInf(c.Speedup, 1) {
			speed = "no waiting"
		}
		events := "no events"
		switch {
		case c.Segment != "":
			events = "events to " + c.Segment
		case e.ZMQEndpoint() != "":
			events = "events zmq " + c.ZMQ.Format.String() + " " + e.ZMQEndpoint()
			if r := e.ZMQReplayEndpoint(); r != "" {
				events += " replay " + r
			}
		}
		kv := fmt.Sprintf("%dx%d", c.KVBlocks, c.BlockSize)
		if c.HostBlocks > 0 {
			kv += fmt.Sprintf(" host=%d", c.HostBlocks)
		}
		if c.SlidingWindow > 0 {
			kv += fmt.Sprintf(" sliding-window=%d", c.SlidingWindow)
		}
		fmt.Fprintf(stdout, "engine %d: %s worker=%d rank=%d model=%q kv=%s speed %s, %s, %s\n",
			i, e.URL(), c.WorkerID, c.DPRank, c.Model, kv, speed, events, tokenizerName)
	}
	fmt.Fprintf(stdout, "kvfast mock: %d engine(s) running; interrupt to stop\n", len(started))
	<-stop
	return closeAll()
}

// publishMode checks --publish against --segment and returns the ZMQ wire
// format it names.
func publishMode(publish, segment string) (mocker.ZMQFormat, error) {
	switch publish {
	case "":
		return 0, nil
	case "shm":
		if segment == "" {
			return 0, errors.New("--publish shm needs --segment")
		}
		return 0, nil
	case "zmq", "zmq-sglang":
		if segment != "" {
			return 0, fmt.Errorf("--publish %s and --segment are exclusive", publish)
		}
		if publish == "zmq-sglang" {
			return mocker.ZMQSGLang, nil
		}
		return mocker.ZMQVLLM, nil
	}
	return 0, fmt.Errorf("--publish %q: want shm, zmq or zmq-sglang", publish)
}

// numberedEndpoints returns engine i's endpoint for each of n engines:
// base's port plus i, or port 0 (a free port) for all when base's is 0.
func numberedEndpoints(base string, n int) ([]string, error) {
	addr, ok := strings.CutPrefix(base, "tcp://")
	host, portStr, err := net.SplitHostPort(addr)
	port, perr := strconv.Atoi(portStr)
	if !ok || err != nil || perr != nil || port < 0 {
		return nil, fmt.Errorf("cannot use ZMQ endpoint %q: want tcp://host:port", base)
	}
	if port > 0 && port+n-1 > 65535 {
		return nil, fmt.Errorf("ZMQ ports %d..%d are out of range", port, port+n-1)
	}
	eps := make([]string, n)
	for i := range eps {
		p := port
		if p > 0 {
			p += i
		}
		eps[i] = "tcp://" + net.JoinHostPort(host, strconv.Itoa(p))
	}
	return eps, nil
}

// loraAdapters splits --lora-adapters.
func loraAdapters(list string) []string {
	var names []string
	for _, n := range strings.Split(list, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	return names
}

// awaitSegment waits until the segment file at path exists, as the
// engines find it again when the router recreates it: started together
// with the router (a script, a unit each), the engines must not lose the
// race for its creation. The router creates the file whole (written
// aside, then renamed into place), so one that exists can be attached.
// It reports false when stop comes first, and an error when no router
// could create it: its directory does not exist.
func awaitSegment(path string, stderr io.Writer, stop <-chan struct{}) (bool, error) {
	const poll = 100 * time.Millisecond
	told := false
	for {
		if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
			return true, nil // there, or unreadable: registration says which
		}
		if _, err := os.Stat(filepath.Dir(path)); err != nil {
			return false, fmt.Errorf("cannot wait for the segment %s: %w", path, err)
		}
		if !told {
			fmt.Fprintf(stderr, "kvfast mock: waiting for a router to create the segment %s (kvfast serve --segment %s)\n", path, path)
			told = true
		}
		select {
		case <-stop:
			return false, nil
		case <-time.After(poll):
		}
	}
}
