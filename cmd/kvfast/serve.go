package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"net/url"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"

	"github.com/kvfast/kvfast/benchmarks/demo/demotok"
	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/node"
	"github.com/kvfast/kvfast/prompt"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/shm"
)

func init() {
	register("serve", "run the router (OpenAI-compatible front end, KV-aware routing)", runServe)
}

const serveAbout = `Usage: kvfast serve [flags]

Runs the router. Engines join in two ways:
  - through the shm segment (--segment): engines (kvfast mock, or vLLM
    with the kvfast publisher) register there and publish their KV events
    and load; the router discovers them and keeps its index in the segment,
    so a restarted router reattaches to a warm index;
  - statically (--worker, repeatable): engines without a publisher are
    routed on load and on the router's own history only; stock vLLM and
    SGLang publish their KV events over ZMQ, which the router subscribes to
    with zmq=tcp://host:port (and replay=tcp://host:port if the engine has
    a replay socket), e.g. for vLLM started with
      --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
                           "endpoint": "tcp://*:5557", "topic": "kv-events"}'
    use --worker url=http://127.0.0.1:8001,model=NAME,zmq=tcp://127.0.0.1:5557,topic=kv-events

Endpoints: POST /v1/completions, /v1/chat/completions (streaming and not),
POST /v1/route/completions, /v1/route/chat/completions (the decision only),
GET /v1/models, /v1/models/{id}, /health, /ready; on --admin-listen: GET
/metrics, /admin/workers (and /health, /ready).

Text and chat prompts route on exact token blocks for the models given a
tokenizer (--tokenizer): the router renders each one into the token ids
the engine will see, by asking an engine that serves the model
(MODEL=remote), or in process from the model's tokenizer files
(MODEL=DIR, MODEL=hf:ORG/NAME, auto). Other models route them
approximately; the log, GET /admin/workers (tokenizers) and
kvfast_tokenizer_info say which.

Routing hints are request headers: X-Kvfast-Worker and X-Kvfast-Dp-Rank
(pin), X-Kvfast-Allow (allow-list), X-Kvfast-Query-Only, X-Kvfast-Priority,
X-Kvfast-Session-Id (sticky session, with --session-ttl), X-Request-Id
(echoed). Responses name the serving worker in X-Kvfast-Worker and
X-Kvfast-Dp-Rank, and the prefix it was credited in
X-Kvfast-Overlap-Blocks.

Every flag can also be set through the environment: --some-flag is
KVFAST_SOME_FLAG. A flag on the command line wins over the environment.

Admission control is on by default: a worker over a busy threshold
(--busy-decode-fraction, --busy-prefill-tokens) takes no new request; the
request waits in a bounded queue (--queue-capacity) for at most
--queue-timeout, and is refused with 429 or 503 and Retry-After beyond.

/ready answers 503 until start-up has settled: static workers' models
known, and the segment's index repaired (or dropped, if it was damaged
beyond repair; the log says which). The segment must be owned by this
user with mode 0600 unless --allow-foreign-segment.

Exit status: 0 after a clean shutdown (SIGINT or SIGTERM, which drain
in-flight requests first; SIGHUP is logged and ignored), 1 on a runtime
failure, 2 for bad flags.

Flags:
`

// bindServeFlags binds the flags of `kvfast serve` to cfg, which holds
// the defaults (node.DefaultConfig): the help text shows the same values
// the router runs with when a flag is not given.
func bindServeFlags(fs *flag.FlagSet, cfg *node.Config, lo *logOptions, sec *securityFiles) {
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "address the router listens on (host:port); use 0.0.0.0:8000 to serve other hosts (then set --api-key-file)")
	fs.StringVar(&cfg.AdminListen, "admin-listen", cfg.AdminListen, `address of the admin listener (host:port), which alone serves /admin/... and /metrics; "" serves them on the API listener (then set --admin-token-file)`)
	fs.StringVar(&sec.adminToken, "admin-token-file", "", "file holding the token /admin/... and /metrics require as Authorization: Bearer TOKEN, on its one line (none: no token; read at start-up only)")
	fs.StringVar(&sec.engineToken, "engine-api-key-file", "", "file holding the API key the engines were started with (vLLM's or SGLang's --api-key), on its one line: every request to an engine then carries Authorization: Bearer KEY in place of the client's (none: the client's Authorization is forwarded; read at start-up only)")
	fs.StringVar(&sec.apiKeys, "api-key-file", "", "file of API keys, one per line (a line starting with # is a comment), that the OpenAI endpoints require as Authorization: Bearer KEY (none: no check; read at start-up only: restart to add or revoke a key)")
	fs.StringVar(&cfg.Segment.Path, "segment", cfg.Segment.Path, `shared-memory segment holding the index and the engines' event feed; "none" runs without one (static workers only)`)
	fs.BoolVar(&cfg.Segment.Recreate, "recreate-segment", cfg.Segment.Recreate, "format a fresh segment even if a valid one exists (drops the warm index); a file at the path that is not a kvfast segment is never overwritten")
	fs.BoolVar(&cfg.Segment.AllowForeign, "allow-foreign-segment", cfg.Segment.AllowForeign, "attach to a segment another user owns or that group or others may access (refused otherwise: whoever can write it can register engines and rewrite the index)")
	fs.IntVar(&cfg.Segment.IndexCapacity, "index-capacity", cfg.Segment.IndexCapacity, "distinct KV blocks the index holds at least (each shard has headroom for uneven hashing, so it may hold more; set when the segment is created, and a router attaching to it must give the same); about 70 bytes each with the engine-hash map")
	fs.Float64Var(&cfg.Segment.IndexWorkerShare, "index-worker-share", cfg.Segment.IndexWorkerShare, "the most of the index one worker's blocks may take, so that an engine that never reports evictions cannot crowd out the others' (refusals: kvfast_worker_index_refused_total); 1: no bound")
	fs.IntVar(&cfg.Segment.RingBytes, "ring-bytes", cfg.Segment.RingBytes, "bytes of each worker's event ring when the segment is created (0: shm's default, 1 MiB, or, attaching, whatever the segment has)")
	fs.IntVar(&cfg.Sched.BlockSize, "block-size", cfg.Sched.BlockSize, "tokens per KV block; must equal the engines' block size")
	fs.Var((*workerFlags)(&cfg.Static), "worker", `a static engine, repeatable: "[url=]http://host:port[,id=N][,rank=N][,model=NAME][,kv-blocks=N][,role=prefill|decode|encode|both][,bootstrap-port=N][,zmq=tcp://host:port[,replay=tcp://host:port][,topic=T]]" (id: the worker id, by default the flag's position, 0, 1, ..., which must differ from the ids of engines registering in the segment; zmq: the engine's KV-event PUB socket, vLLM/SGLang wire format; needs model; role: its part in disaggregated serving, see --disagg; bootstrap-port: an SGLang prefill engine's --disaggregation-bootstrap-port, when it is not --disagg-bootstrap-port; encode workers take chat requests' images, audio and video first, see --encode-max-items)`)
	fs.StringVar(&cfg.Policy, "policy", cfg.Policy, "routing policy: kv (cache-aware cost model), approx (cache-aware from the router's own history, no events), affinity (longest prefix on the router's own history, load only as a tie-break), round-robin, random, least-loaded")
	cost := cfg.Sched.Cost
	fs.Float64Var(&cost.OverlapCredit, "overlap-credit", cost.OverlapCredit, "weight of a worker's cached prefix blocks against its prefill cost (0 ignores the cache)")
	fs.Var(prefillLoadScaleFlag{&cost.PrefillLoadScale, &cost.AutoPrefillLoadScale}, "prefill-load-scale", prefillLoadScaleUsage)
	fs.Float64Var(&cost.HostTierWeight, "host-tier-weight", cost.HostTierWeight, "credit for a cached block a worker holds only in host memory (vLLM CPU offloading, SGLang HiCache), as a fraction of one on its GPU; 0 ignores host copies")
	fs.Float64Var(&cost.DiskTierWeight, "disk-tier-weight", cost.DiskTierWeight, "credit for a cached block a worker holds only on storage (vLLM STORAGE, SGLang DISK and EXTERNAL), as a fraction of one on its GPU; 0 ignores them")
	fs.Float64Var(&cost.Temperature, "temperature", cost.Temperature, "0 picks the cheapest worker; above 0 samples from a softmax over normalised costs")
	fs.BoolVar(&cost.CreditInFlight, "credit-in-flight", cost.CreditInFlight, "credit prompt blocks that requests in flight on a worker already hold as cached, not only blocks its engine has reported stored")
	fs.Float64Var(&cost.EvictionWeight, "eviction-weight", cost.EvictionWeight, "once a worker's cache is full, charge each prompt block it does not cache this many prefill blocks more, for the cached block computing it evicts; 0 ignores eviction (Dynamo's model). 30 raised kv's hit rate to 97-100% of a pooled LRU when caches were full (BENCHMARKS.md)")
	fs.DurationVar(&cost.StallAfter, "stall-after", cost.StallAfter, "a worker that keeps requests waiting this long in all without answering any (a first token, a whole answer when not streamed, or a 4xx; requests given up on pause the clock, they do not reset it) is stalled: its in-flight prompts stop earning cache credit and its free cache memory stops counting, so a hung engine does not draw traffic (kvfast_worker_stalled). 0: never stalled; an engine that has never answered has its free memory priced as full while requests wait on it either way")
	fs.BoolVar(&cost.TrackOutputBlocks, "track-output-blocks", cost.TrackOutputBlocks, "count output blocks as generation grows, decayed toward max_tokens")
	fs.Float64Var(&cfg.Sched.Busy.DecodeBlocksFraction, "busy-decode-fraction", cfg.Sched.Busy.DecodeBlocksFraction, "admission: a worker whose decode blocks (or its engine's reported KV usage) exceed this fraction of its KV capacity takes no new request, which queues (0: off)")
	fs.Int64Var(&cfg.Sched.Busy.PrefillTokens, "busy-prefill-tokens", cfg.Sched.Busy.PrefillTokens, "admission: a worker with more prompt tokens than this awaiting their first token takes no new request, which queues (0: off)")
	fs.IntVar(&cfg.Sched.QueueCapacity, "queue-capacity", cfg.Sched.QueueCapacity, "requests that may wait when every worker is busy; beyond it they get 429 with Retry-After (0: no queue)")
	fs.DurationVar(&cfg.HTTP.QueueTimeout, "queue-timeout", cfg.HTTP.QueueTimeout, "longest wait in the admission queue; past it the request gets 503 with Retry-After")
	fs.Uint64Var(&cfg.Sched.Seed, "seed", cfg.Sched.Seed, "seed of tie-breaking and softmax sampling, for reproducible decisions (0: from the clock)")
	fs.BoolVar(&cfg.HTTP.Direct, "direct", cfg.HTTP.Direct, "direct mode: every request must name its worker in X-Kvfast-Worker (an external picker chose)")
	fs.DurationVar(&cfg.Approx.TTL, "approx-ttl", cfg.Approx.TTL, "how long the approximate index trusts that a routed prompt is still cached")
	fs.IntVar(&cfg.HTTP.MaxBodyBytes, "max-body-bytes", cfg.HTTP.MaxBodyBytes, "largest request body accepted (413 beyond)")
	fs.Func("max-token-id", "largest token id accepted in a prompt, usually vocabulary size - 1 (0: any uint32)", func(v string) error {
		id, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return errors.New("want a whole number from 0 to 4294967295")
		}
		cfg.HTTP.MaxTokenID = uint32(id)
		return nil
	})
	fs.DurationVar(&cfg.HTTP.HeaderTimeout, "header-timeout", cfg.HTTP.HeaderTimeout, "time allowed for a complete request header, from a connection's accept or a keep-alive request's first byte (cuts idle and slow-header connections)")
	fs.DurationVar(&cfg.HTTP.ReadTimeout, "read-timeout", cfg.HTTP.ReadTimeout, "time allowed to read a request body, after its header (cuts slow uploads)")
	fs.DurationVar(&cfg.HTTP.IdleTimeout, "idle-timeout", cfg.HTTP.IdleTimeout, "keep-alive connections idle this long are closed")
	fs.DurationVar(&cfg.HTTP.WriteTimeout, "write-timeout", cfg.HTTP.WriteTimeout, "time allowed for each write to a client (a plain answer whole, each write of a stream): a client that stops reading is cut and its request released")
	fs.IntVar(&cfg.HTTP.MaxConns, "max-conns", cfg.HTTP.MaxConns, "concurrent connections to the API listener, beyond which a connection gets 503 too_many_connections (the admin listener has its own bound of 256)")
	fs.IntVar(&cfg.HTTP.MaxRetries, "max-retries", cfg.HTTP.MaxRetries, "re-routes to another worker when an engine refuses or resets the connection or answers 5xx (or 401/403 to --engine-api-key-file's key), before any byte reaches the client; 0 disables")
	fs.DurationVar(&cfg.HTTP.Sessions.TTL, "session-ttl", cfg.HTTP.Sessions.TTL, "sticky sessions (X-Kvfast-Session-Id): a session's binding to its worker expires after this long without a request (0: sticky sessions off)")
	fs.IntVar(&cfg.Segment.Sessions, "session-capacity", cfg.Segment.Sessions, "sticky sessions the bindings table holds (set when the segment is created, and a router attaching to it must give the same; the least recently used binding in a full bucket is evicted)")
	fs.DurationVar(&cfg.HTTP.Sessions.BusyUnbindAfter, "session-busy-unbind", cfg.HTTP.Sessions.BusyUnbindAfter, "move a session off its worker once that worker has stayed over a busy threshold this long; shorter overload is transient and the session's requests queue for their worker, until it has been busy this long (0: never)")
	fs.DurationVar(&cfg.HTTP.Sessions.ControlTimeout, "session-control-timeout", cfg.HTTP.Sessions.ControlTimeout, "bound on one SGLang open_session or close_session call (session_control)")
	dis := &cfg.HTTP.Disagg
	fs.StringVar(&dis.Protocol, "disagg", dis.Protocol, "route requests in two stages, prefill on a prefill worker then decode on a decode worker (workers' role=), in the engines' `protocol`: vllm (the NixlConnector's kv_transfer_params; not vLLM's Mooncake, P2pNccl or LMCache connectors) or sglang (bootstrap_host/port/room); empty: off")
	fs.IntVar(&dis.MinRemoteTokens, "disagg-min-remote-tokens", dis.MinRemoteTokens, "with --disagg: prefill on the decode worker when the part of the prompt it does not cache is shorter than this many tokens")
	fs.Float64Var(&dis.LocalCachedFraction, "disagg-local-cached-fraction", dis.LocalCachedFraction, "with --disagg: prefill on the decode worker when it caches at least this fraction of the prompt (0: off)")
	fs.DurationVar(&dis.PrefillTimeout, "disagg-prefill-timeout", dis.PrefillTimeout, "with --disagg: bound on the wait for a prefill worker's answer (its headers, and a streamed answer's first bytes; the rest of that stream then has --stream-idle-timeout); past it a vLLM prefill is tried on another prefill worker, or the decode worker prefills, and an SGLang request fails with 502 prefill_failed (0: --first-byte-timeout)")
	fs.Func("disagg-bootstrap-port", "with --disagg sglang: the bootstrap `port` of the prefill engines (their --disaggregation-bootstrap-port) where a worker gives no bootstrap-port=; unset or 0 sends none, and each engine takes its own (SGLang's default, 8998); http: the prefill worker's HTTP port, where kvfast mock serves its bootstrap", func(v string) error {
		if v == "http" {
			dis.BootstrapPort = fastpath.BootstrapHTTPPort
			return nil
		}
		p, err := strconv.ParseUint(v, 10, 16)
		if err != nil {
			return errors.New("want a port from 1 to 65535, 0 for the engines' own, or http")
		}
		dis.BootstrapPort = int(p)
		return nil
	})
	enc := &cfg.HTTP.Encode
	fs.BoolVar(&enc.Off, "encode-off", enc.Off, "never send multimodal items to encode workers (role=encode): every engine encodes its own requests' images (the stage runs whenever encode workers are present, except under --disagg sglang, whose engines call their encoders themselves)")
	fs.DurationVar(&enc.Timeout, "encode-timeout", enc.Timeout, "bound on the wait for an encode worker's answer; past it the item goes to another encoder or the engine encodes it itself (0: --first-byte-timeout)")
	fs.IntVar(&enc.MaxItems, "encode-max-items", enc.MaxItems, "multimodal content parts (image_url, audio_url, input_audio, video_url) one chat request may carry when encode workers are present (400 beyond)")
	fs.IntVar(&enc.MaxItemBytes, "encode-max-item-bytes", enc.MaxItemBytes, "decoded bytes of one inline item (a data: URL, input_audio), or length of one item's URL, when encode workers are present (413 beyond); the router never downloads a URL")
	fs.IntVar(&enc.AffinityItems, "encoder-affinity-items", enc.AffinityItems, "recently encoded items remembered per encoder, to send an item again to the encoder whose cache has it (0: choose encoders by load only)")
	fs.DurationVar(&enc.AffinityTTL, "encoder-affinity-ttl", enc.AffinityTTL, "how long an encoder is trusted to still have an item it encoded")
	oc := &cfg.Dispatch.Outlier
	fs.IntVar(&oc.Consecutive, "eject-consecutive", oc.Consecutive, "eject an engine from routing after this many failed requests in a row (refused or reset connection, timeout, 5xx; a 5xx of a request that every engine it was retried on answered 5xx counts only if this engine served nothing else within --eject-window; 0: off)")
	fs.IntVar(&oc.FailurePercent, "eject-failure-percent", oc.FailurePercent, "eject an engine whose requests failed at least this percentage within --eject-window, once it saw --eject-min-requests there, failures counted as for --eject-consecutive (0: off)")
	fs.IntVar(&oc.MinRequests, "eject-min-requests", oc.MinRequests, "requests within --eject-window before --eject-failure-percent applies")
	fs.DurationVar(&oc.Window, "eject-window", oc.Window, "window of --eject-failure-percent, and how recently an engine must have served for a request every engine failed with 5xx to count not against it")
	fs.DurationVar(&oc.BaseEjection, "eject-base-time", oc.BaseEjection, "first ejection's length; the n-th in a row lasts n times as long")
	fs.DurationVar(&oc.MaxEjection, "eject-max-time", oc.MaxEjection, "longest ejection")
	fs.IntVar(&oc.MaxEjectedPercent, "eject-max-percent", oc.MaxEjectedPercent, "at most this percentage of the engines of each role (both, prefill, decode, encode; rounded down) is ejected at once, so that below 100 a lone engine of its role never is (0: no ejection)")
	fs.IntVar(&cfg.HTTP.MaxConnsPerIP, "max-conns-per-ip", cfg.HTTP.MaxConnsPerIP, "concurrent connections from one client address, beyond which it gets 429, counted apart on the API and admin listeners (0: no bound; behind one proxy, raise it to --max-conns)")
	fs.Int64Var(&cfg.HTTP.BodyBudgetBytes, "body-budget-bytes", cfg.HTTP.BodyBudgetBytes, "request body bytes held in memory at once over all requests; charged as bodies arrive (64 KiB at once, then fourfold); a body that does not fit gets 503 with Retry-After (at least --max-body-bytes)")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", cfg.ShutdownTimeout, "on SIGTERM, how long in-flight requests and streams, and requests waiting in the admission queue, may finish before they are cut")
	fs.DurationVar(&cfg.ShutdownDelay, "shutdown-delay", cfg.ShutdownDelay, "on SIGTERM, how long to go on serving first, /ready answering 503 and every answer closing its connection, so that a balancer stops sending before the listeners close (Kubernetes: a few seconds; 0: close at once)")
	fs.IntVar(&cfg.Dispatch.MaxResponseBodySize, "max-response-bytes", cfg.Dispatch.MaxResponseBodySize, "largest non-streaming engine response relayed (502 engine_response_too_large beyond; refused from its Content-Length when it has one), and largest single event of a stream (the stream ends with that error event)")
	fs.Int64Var(&cfg.Dispatch.ResponseBudgetBytes, "response-budget-bytes", cfg.Dispatch.ResponseBudgetBytes, "non-streaming engine response bytes being read at once over all requests, beyond the relay buffers; a response that does not fit gets 503 response_budget_exceeded (a read answer's copy in its client's response is not counted)")
	fs.DurationVar(&cfg.Dispatch.Timeouts.Connect, "connect-timeout", cfg.Dispatch.Timeouts.Connect, "time to connect to an engine (0: no limit)")
	fs.DurationVar(&cfg.Dispatch.Timeouts.Write, "engine-write-timeout", cfg.Dispatch.Timeouts.Write, "time an engine may take to read a whole request from the router; past it, 504 engine_timeout (0: no limit)")
	fs.IntVar(&cfg.Dispatch.MaxConnsPerEngine, "max-conns-per-engine", cfg.Dispatch.MaxConnsPerEngine, "connections, so requests in flight, the router opens to one engine; a request finding them all in use goes to another worker, or gets 503 engine_connections_exhausted with Retry-After")
	fs.DurationVar(&cfg.Dispatch.Timeouts.FirstByte, "first-byte-timeout", cfg.Dispatch.Timeouts.FirstByte, "time from forwarding to the engine's response headers, and for a stream to its body's first bytes (vLLM sends a stream's headers at once, its first event after queueing and prefill) (0: no limit)")
	fs.DurationVar(&cfg.Dispatch.Timeouts.Idle, "stream-idle-timeout", cfg.Dispatch.Timeouts.Idle, "longest pause inside an engine's response once under way (after a stream's first bytes), and longest one event of a stream, or a plain answer's body, may take to arrive whole from its first byte (0: no limit)")
	fs.DurationVar(&cfg.Dispatch.Health.Interval, "health-interval", cfg.Dispatch.Health.Interval, "how often engines' /health is checked (0: never)")
	fs.DurationVar(&cfg.HeartbeatGrace, "heartbeat-grace", cfg.HeartbeatGrace, "a registered engine silent this long is marked down and its in-flight requests failed (those that sent the client nothing yet go to another worker); its blocks are kept for --down-retention")
	fs.DurationVar(&cfg.DownRetention, "down-retention", cfg.DownRetention, "how long the index keeps the blocks of an engine marked down, in case it was only paused (stopped, swapped out) and resumes with its cache, which it will not announce again; 0: dropped at once")
	fs.DurationVar(&cfg.DiscoveryTimeout, "discovery-timeout", cfg.DiscoveryTimeout, "at start-up, how long /ready stays 503 (and requests naming an unknown model wait) for static workers configured without model= to say which they serve")
	fs.Var((*tokenizerFlags)(&cfg.Tokenizers.Specs), "tokenizer", `how a model's text and chat prompts become token ids, so that they route on exact blocks; repeatable: `+
		`"MODEL=remote" (ask an engine serving it: vLLM's render endpoint, else /tokenize), "MODEL=DIR" (tokenizer.json and tokenizer_config.json), `+
		`"MODEL=hf:ORG/NAME" (those files in the local Hugging Face cache), "MODEL=demo" (the built-in demo tokenizer of kvfast mock --tokenizer demo), `+
		`"auto" (every served model whose files are in that cache); `+
		`models without one route text and chat approximately`)
	fs.DurationVar(&cfg.Tokenizers.Timeout, "tokenize-timeout", cfg.Tokenizers.Timeout, "longest wait for an engine to render a prompt (MODEL=remote); past it the request routes approximately")
	fs.Int64Var(&cfg.Tokenizers.PrefixCacheBytes, "tokenize-cache-bytes", cfg.Tokenizers.PrefixCacheBytes, "per built-in tokenizer, bytes of tokenized prompt prefixes kept so that a conversation's next turn tokenizes only its tail (0: no cache)")
	fs.IntVar(&cfg.Tokenizers.MaxRenderBytes, "tokenize-max-bytes", cfg.Tokenizers.MaxRenderBytes, "largest request body (and rendered prompt) the built-in tokenizer tokenizes; larger requests route approximately")
	fs.Int64Var(&cfg.Tokenizers.MaxRenderInFlightBytes, "tokenize-inflight-bytes", cfg.Tokenizers.MaxRenderInFlightBytes, "request bytes the built-in tokenizers render at once, all models together, 2 MiB per CPU unless set; past it a request routes approximately "+
		`(kvfast_tokenize_total{outcome="busy"}) rather than queue its rendering ahead of the router's other work; one request at a time is always rendered`)
	fs.IntVar(&cfg.Tokenizers.MaxResponseBytes, "tokenize-max-response-bytes", cfg.Tokenizers.MaxResponseBytes, "largest render or tokenize answer accepted from an engine (MODEL=remote)")
	tr := &cfg.Tracing
	fs.StringVar(&tr.Endpoint, "otlp-endpoint", tr.Endpoint, "export a span tree per request (route: hash, lookup, select; queue; dispatch; first token; prefill and encode stages) to this OpenTelemetry collector over OTLP/HTTP: http://host:4318 or https://...; an empty path means /v1/traces (empty: tracing off, at no cost)")
	fs.StringVar(&tr.ServiceName, "otlp-service-name", tr.ServiceName, "service.name of the exported spans")
	fs.Float64Var(&tr.SampleRatio, "trace-sample-ratio", tr.SampleRatio, "share of requests traced among those arriving without a traceparent (a client's sampled flag is always followed)")
	lo.bind(fs)
}

// securityFiles are the flags naming files of secrets: a secret on the
// command line would show in every process listing.
type securityFiles struct{ adminToken, apiKeys, engineToken string }

// load reads the files into cfg.
func (sec securityFiles) load(cfg *node.Config) error {
	if sec.adminToken != "" {
		t, err := readToken("admin token", sec.adminToken)
		if err != nil {
			return err
		}
		cfg.HTTP.AdminToken = t
	}
	if sec.engineToken != "" {
		t, err := readToken("engine API key", sec.engineToken)
		if err != nil {
			return err
		}
		cfg.Dispatch.EngineToken = t
	}
	if sec.apiKeys != "" {
		keys, err := readAPIKeys(sec.apiKeys)
		if err != nil {
			return err
		}
		cfg.HTTP.APIKeys = keys
	}
	return nil
}

// readAPIKeys reads an --api-key-file: a key per line, blank lines and
// lines starting with # ignored. It holds at least one key.
func readAPIKeys(path string) ([]string, error) {
	b, err := readSecretFile("API keys", path)
	if err != nil {
		return nil, err
	}
	var keys []string
	n := 0
	for line := range strings.Lines(string(b)) {
		n++
		k := strings.TrimSpace(line)
		if k == "" || strings.HasPrefix(k, "#") {
			continue
		}
		if strings.ContainsAny(k, " \t") {
			// "KEY # note" would be taken whole as the key, which no
			// client sends: every request with the key refused.
			// The line number, never the line: it holds a secret.
			return nil, fmt.Errorf("cannot use API key file %s: line %d holds a space; a key is the whole line, and a comment a line of its own that starts with #", path, n)
		}
		if strings.IndexFunc(k, func(r rune) bool { return r < ' ' || r == 0x7f }) >= 0 {
			// No header could carry it: every request with it would fail.
			return nil, fmt.Errorf("cannot use API key file %s: line %d holds a control character", path, n)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("cannot use API key file %s: it holds no key", path)
	}
	return keys, nil
}

// readSecretFile reads a file of secrets. A name it cannot open is not
// repeated: an operator who gave the key itself where its file's path
// belongs would otherwise find it in the log ("open sk-...: no such
// file"). A file that opens is a path, and later errors may name it.
//
// Only a regular file or a pipe (a named one, or a shell's <(...)) is
// read, and at most maxSecretFileBytes of it: /dev/zero given by mistake
// filled memory, and a FIFO nobody writes held start-up silently (opened
// without blocking, it reads as empty and is refused as such).
func readSecretFile(what, path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		if pe, ok := errors.AsType[*fs.PathError](err); ok {
			return nil, fmt.Errorf("cannot read the %s: %s %w (the file name given is not repeated, in case it is the secret itself)", what, pe.Op, pe.Err)
		}
		return nil, fmt.Errorf("cannot read the %s: %w", what, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("cannot read the %s file %s: %w", what, path, err)
	}
	if m := st.Mode(); !m.IsRegular() && m&fs.ModeNamedPipe == 0 {
		return nil, fmt.Errorf("cannot read the %s file %s: it is not a regular file or a pipe (mode %s)", what, path, m.Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read the %s file %s: %w", what, path, err)
	}
	if len(b) > maxSecretFileBytes {
		return nil, fmt.Errorf("cannot use the %s file %s: it is larger than %d bytes", what, path, maxSecretFileBytes)
	}
	return b, nil
}

// maxSecretFileBytes bounds a key or token file: tens of thousands of
// keys, one per line.
const maxSecretFileBytes = 1 << 20

// readToken reads a file holding one token on its one line.
func readToken(what, path string) (string, error) {
	b, err := readSecretFile(what, path)
	if err != nil {
		return "", err
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("cannot use %s file %s: it is empty", what, path)
	}
	if strings.ContainsAny(t, "\r\n") {
		// No header could carry a token with a line break in it.
		return "", fmt.Errorf("cannot use %s file %s: it holds more than one line; the token is its one line", what, path)
	}
	if strings.IndexFunc(t, func(r rune) bool { return r < ' ' || r == 0x7f }) >= 0 {
		// Nor one with a control character: every request carrying it
		// would fail, and look like a network fault.
		return "", fmt.Errorf("cannot use %s file %s: it holds a control character", what, path)
	}
	return t, nil
}

// tokenizerFlags collects repeated --tokenizer values.
type tokenizerFlags []prompt.Spec

func (f *tokenizerFlags) String() string { return fmt.Sprintf("%d tokenizers", len(*f)) }

func (f *tokenizerFlags) Set(v string) error {
	s, err := prompt.ParseSpec(v)
	if err != nil {
		return err
	}
	*f = append(*f, s)
	return nil
}

// logOptions are the logging flags every long-running command shares.
type logOptions struct{ level, format string }

func (lo *logOptions) bind(fs *flag.FlagSet) {
	fs.StringVar(&lo.level, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&lo.format, "log-format", "text", "text or json")
}

// workerFlags collects repeated --worker values.
type workerFlags []node.StaticWorker

func (w *workerFlags) String() string { return fmt.Sprintf("%d workers", len(*w)) }

func (w *workerFlags) Set(v string) error {
	sw, err := node.ParseStaticWorker(v, uint64(len(*w)))
	if err != nil {
		return err
	}
	// One engine and rank given twice would be two workers, each booking
	// part of what the engine runs, so that neither sees its real load.
	// Entries naming different models are let through: one server may
	// serve several (a gateway, Ollama), each its own worker.
	key := engineURL(sw.Endpoint)
	for i, o := range *w {
		differentModels := o.Model != "" && sw.Model != "" && o.Model != sw.Model
		if o.DPRank == sw.DPRank && engineURL(o.Endpoint) == key && !differentModels {
			return fmt.Errorf("cannot add engine %s rank %d twice: it is --worker number %d already, and two workers on one engine "+
				"would split its load accounting; give each rank behind one URL its own rank=, or drop the repeat", key, sw.DPRank, i+1)
		}
	}
	*w = append(*w, sw)
	return nil
}

// engineURL is the engine a --worker url= names, as the router dials it:
// scheme http (the only one ParseStaticWorker takes), the host lowercased
// and the port as a number. The path is left out because the router drops
// it: http://h:1/a and http://h:1/b are one engine.
func engineURL(endpoint string) string {
	hostport := endpoint
	if strings.Contains(endpoint, "://") {
		u, err := url.Parse(endpoint)
		if err != nil {
			return endpoint
		}
		hostport = u.Host
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return endpoint
	}
	if p, err := strconv.ParseUint(port, 10, 16); err == nil {
		port = strconv.FormatUint(p, 10)
	}
	return "http://" + net.JoinHostPort(strings.ToLower(host), port)
}

// Environment prefixes: kvfast serve reads KVFAST_<FLAG>, kvfast epp
// KVFAST_EPP_<FLAG>, so that the router's environment (the container
// image's KVFAST_LISTEN, a systemd env file) does not configure a picker
// started beside it, nor the picker's the router.
const (
	serveEnvPrefix = "KVFAST_"
	eppEnvPrefix   = "KVFAST_EPP_"
)

// withEnvNote adds to err which flags it may owe to the environment (the
// variables applyEnv applied): an error naming --policy for a value the
// command line never gave sends the operator looking in the wrong place.
func withEnvNote(err error, applied []string) error {
	if len(applied) == 0 {
		return err
	}
	return fmt.Errorf("%w (set from the environment: %s)", err, strings.Join(applied, ", "))
}

// applyEnv sets every flag not given on the command line from
// prefix<FLAG_NAME>, so that containers can configure the command through
// the environment. It returns the variables of the prefix that name no
// flag (a misspelling, which would silently change nothing), for the
// caller to warn about in its log, except the publishers' own
// (publisherEnv) and, for serve, the picker's; and those it applied, for
// an error about a flag's value to say where the value came from.
func applyEnv(fs *flag.FlagSet, prefix string) (unknown, applied []string, err error) {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok || publisherEnv[name] || prefix == serveEnvPrefix && strings.HasPrefix(name, eppEnvPrefix) {
			continue
		}
		if fs.Lookup(strings.ToLower(strings.ReplaceAll(rest, "_", "-"))) == nil {
			unknown = append(unknown, name)
		}
	}
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		env := prefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok {
			applied = append(applied, env)
			if err := fs.Set(f.Name, v); err != nil {
				// A free-text value is not repeated (withoutFreeText).
				hint, shown := typeHint(f), fmt.Sprintf("%s=%q", env, v)
				if hint == "" {
					hint, shown = " (its --help line says what it takes)", env
				}
				errs = append(errs, errors.New(redactCredentials(fmt.Sprintf("cannot use %s as --%s: %v%s", shown, f.Name, err, hint))))
			}
		}
	})
	return unknown, applied, errors.Join(errs...)
}

// printUnknownEnv is warnUnknownEnv for a start that fails before there
// is a log: a plain line each, since a misspelt variable may be why it
// failed.
func printUnknownEnv(w io.Writer, command string, unknown []string) {
	for _, name := range unknown {
		fmt.Fprintf(w, "kvfast %s: warning: ignoring %s: no flag --%s (kvfast %s --help lists them)\n", command, name, envFlagName(name), command)
	}
}

// envFlagName is the flag a KVFAST_ or KVFAST_EPP_ variable would set.
func envFlagName(name string) string {
	return strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(strings.TrimPrefix(name, eppEnvPrefix), serveEnvPrefix), "_", "-"))
}

// warnUnknownEnv logs the variables applyEnv found naming no flag of
// command, in the log's own format (a plain line before JSON ones broke
// a log shipper's parsing).
func warnUnknownEnv(log *slog.Logger, command string, unknown []string) {
	for _, name := range unknown {
		log.Warn("ignoring an environment variable that names no flag (kvfast "+command+" --help lists them)",
			"variable", name, "flag", "--"+envFlagName(name))
	}
}

// publisherEnv is the KVFAST_ variables that are no flag's: the engines'
// publishers' (publishers/python), which may share an environment with
// the router, the systemd unit's KVFAST_ARGS (deploy/systemd), and the
// test set-up's KVFAST_INSTALL_DEPS (scripts/setup-test-deps.sh), which
// CI exports.
var publisherEnv = map[string]bool{"KVFAST_WORKER_ID": true, "KVFAST_MODEL": true, "KVFAST_ENDPOINT": true,
	"KVFAST_KV_BLOCKS": true, "KVFAST_HEARTBEAT_S": true, "KVFAST_ARGS": true,
	"KVFAST_INSTALL_DEPS": true}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("cannot use log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		// A duration as the flags and the text format write it ("30s"),
		// not slog's JSON default of integer nanoseconds, which an
		// operator reading a log line misreads by orders of magnitude.
		opts.ReplaceAttr = func(_ []string, a slog.Attr) slog.Attr {
			if a.Value.Kind() == slog.KindDuration {
				a.Value = slog.StringValue(a.Value.Duration().String())
			}
			return a
		}
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("cannot use log format %q: want text or json", format)
}

// serveConfig parses serve's command line (and environment) into a node
// configuration. It returns the exit status to use when parsing stops
// the command (2 for bad flags, 0 for --help).
func serveConfig(args []string, stderr io.Writer) (node.Config, int, bool) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := node.DefaultConfig()
	var lo logOptions
	var sec securityFiles
	bindServeFlags(fs, &cfg, &lo, &sec)
	if err := parseFlags(fs, args, serveAbout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, 0, false
		}
		return cfg, 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kvfast serve: %s\n", extraArgument(fs))
		return cfg, 2, false
	}
	unknownEnv, fromEnv, err := applyEnv(fs, serveEnvPrefix)
	if err != nil {
		printUnknownEnv(stderr, "serve", unknownEnv)
		fmt.Fprintln(stderr, "kvfast serve:", err)
		return cfg, 2, false
	}
	if cfg.Segment.Path == "none" {
		cfg.Segment.Path = ""
	}
	if err := sec.load(&cfg); err != nil {
		printUnknownEnv(stderr, "serve", unknownEnv)
		fmt.Fprintln(stderr, "kvfast serve:", err)
		return cfg, 2, false
	}
	log, err := newLogger(stderr, lo.level, lo.format)
	if err != nil {
		printUnknownEnv(stderr, "serve", unknownEnv)
		fmt.Fprintln(stderr, "kvfast serve:", err)
		return cfg, 2, false
	}
	warnUnknownEnv(log, "serve", unknownEnv)
	cfg.Logger = log
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(stderr, "kvfast serve:", withEnvNote(err, fromEnv))
		return cfg, 2, false
	}
	if fi, err := os.Stat(cfg.Segment.Path); cfg.Segment.Path != "" && err == nil && fi.IsDir() {
		// A bare "is a directory" from the open would not say what to give.
		fmt.Fprintln(stderr, "kvfast serve:", withEnvNote(fmt.Errorf("--segment %s is a directory: give the segment file itself (default %s), or none",
			cfg.Segment.Path, shm.DefaultPath("kvfast")), fromEnv))
		return cfg, 2, false
	}
	if cfg.Segment.Path == "" && len(cfg.Static) == 0 {
		log.Warn("no segment and no --worker: no engine can join this router, and every request gets 503 until it is restarted with --worker url=... (or with a segment engines register in)")
	}
	if se := cfg.HTTP.Sessions; se.TTL > 0 && se.BusyUnbindAfter > 0 && cfg.HTTP.QueueTimeout > 0 && cfg.HTTP.QueueTimeout < se.BusyUnbindAfter {
		log.Warn("a sticky session's turn that queues behind its busy worker gets 503 at --queue-timeout before --session-busy-unbind would move it to an idle worker; "+
			"set --session-busy-unbind at most --queue-timeout", "queue_timeout", cfg.HTTP.QueueTimeout, "session_busy_unbind", se.BusyUnbindAfter)
	}
	return cfg, 0, true
}

// writeDemoTokenizer gives every --tokenizer MODEL=demo the files of the
// demo tokenizer the mock engines use (kvfast mock --tokenizer demo),
// written to a temporary directory that cleanup removes. "demo" names the
// built-in whatever the working directory holds, as it does for kvfast
// mock and kvfast tokenize: a tokenizer directory named demo is ./demo.
func writeDemoTokenizer(cfg *node.Config) (cleanup func(), err error) {
	cleanup = func() {}
	dir := ""
	for i, s := range cfg.Tokenizers.Specs {
		if s.Source.Kind != prompt.SourceDir || s.Source.Path != demotok.Name {
			continue
		}
		if dir == "" {
			if dir, err = os.MkdirTemp("", "kvfast-demotok-"); err != nil {
				return cleanup, fmt.Errorf("cannot write the demo tokenizer: %w", err)
			}
			cleanup = func() { _ = os.RemoveAll(dir) }
			if err := demotok.WriteDir(dir); err != nil {
				cleanup()
				return func() {}, err
			}
		}
		cfg.Tokenizers.Specs[i].Source.Path = dir
	}
	return cleanup, nil
}

// baselineMemory is what the router's Go heap needs besides request
// bodies (its indexes, pools and buffers at the default sizes), with room
// left under the 300 MiB the resident size may take beyond the budget for
// what the runtime does not count (stacks, the binary). fasthttp's
// per-connection buffers are heap: the 8 KiB read buffer each open
// connection holds comes to 78 MiB if all 10000 of --max-conns are open
// at once, which leaves the limit's room for the rest thinner, not gone;
// the limit is soft, so the collector works harder rather than fail.
const baselineMemory = 224 << 20

// setMemoryLimit gives the Go runtime a soft memory limit of 224 MiB
// plus the body and response budgets, unless GOMEMLIMIT sets one: under a
// flood of large bodies the collector then runs before the heap doubles
// over the garbage of finished ones, which is what keeps the resident
// size near the budgets rather than twice them.
//
// The limit also counts what the configuration puts on the heap beyond
// the defaults: the event-fed index itself when it lives in memory
// (--segment none) rather than in the mapped segment, and a prefix-token
// cache per model named with --tokenizer. A limit below the live heap
// makes the collector run back to back: with a 16M-block index in
// memory, 1,000 small requests ran hundreds of collections under the bare
// limit and none with the index counted (BENCHMARKS.md,
// scripts/gc-heap-index.sh).
func setMemoryLimit(cfg node.Config) { applyMemoryLimit(memoryLimit(cfg), cfg.Logger) }

// applyMemoryLimit sets limit as the runtime's soft memory limit, unless
// GOMEMLIMIT sets one.
func applyMemoryLimit(limit int64, log *slog.Logger) {
	if _, set := os.LookupEnv("GOMEMLIMIT"); set {
		return
	}
	debug.SetMemoryLimit(limit)
	log.Debug("memory limit set", "bytes", limit)
}

// memoryLimit is the soft limit setMemoryLimit sets for cfg.
func memoryLimit(cfg node.Config) int64 {
	// Saturating: budgets of math.MaxInt64 (meant as "no bound") wrapped
	// the sum to a few hundred MiB, or below zero.
	limit := addSat(baselineMemory, cfg.HTTP.BodyBudgetBytes)
	limit = addSat(limit, cfg.Dispatch.ResponseBudgetBytes)
	if cfg.Segment.Path == "" {
		if n, err := radix.RegionSize(radix.Config{Capacity: cfg.Segment.IndexCapacity}); err == nil {
			limit = addSat(limit, int64(min(n, math.MaxInt64)))
		}
	}
	for _, spec := range cfg.Tokenizers.Specs {
		if !spec.Auto && spec.Source.Kind != prompt.SourceRemote {
			limit = addSat(limit, cfg.Tokenizers.PrefixCacheBytes)
		}
	}
	return limit
}

// addSat adds two non-negative sizes, stopping at math.MaxInt64.
func addSat(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

func runServe(args []string) int {
	cfg, code, ok := serveConfig(args, os.Stderr)
	if !ok {
		return code
	}
	cleanup, err := writeDemoTokenizer(&cfg)
	if err != nil {
		cfg.Logger.Error("cannot start the router", "err", err)
		return 1
	}
	defer cleanup()
	setMemoryLimit(cfg)
	if err := node.Run(context.Background(), cfg); err != nil {
		cfg.Logger.Error("router stopped", "err", err)
		return 1
	}
	return 0
}
