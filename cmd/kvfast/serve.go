package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvfast/kvfast/dispatch"
	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/feed"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
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
GET /v1/models, /metrics, /health, /ready, /admin/workers.

Routing hints are request headers: X-Kvfast-Worker and X-Kvfast-Dp-Rank
(pin), X-Kvfast-Allow (allow-list), X-Kvfast-Query-Only, X-Kvfast-Priority,
X-Request-Id (echoed). Responses name the serving worker in
X-Kvfast-Worker and X-Kvfast-Dp-Rank.

Every flag can also be set through the environment: --some-flag is
KVFAST_SOME_FLAG. A flag on the command line wins over the environment.

Exit status: 0 after a clean shutdown (SIGINT or SIGTERM), 1 on a runtime
failure, 2 for bad flags.

Flags:
`

// serveOptions are the flags of `kvfast serve`, shared with `kvfast demo`.
type serveOptions struct {
	listen          string
	segment         string
	recreate        bool
	indexCapacity   int
	ringBytes       int
	blockSize       int
	workers         workerFlags
	policy          string
	overlapCredit   float64
	prefillScale    float64
	temperature     float64
	trackOutput     bool
	creditInFlight  bool
	busyDecode      float64
	busyPrefill     int64
	queueCapacity   int
	queueTimeout    time.Duration
	seed            uint64
	direct          bool
	approxTTL       time.Duration
	maxBodyBytes    int
	maxTokenID      uint
	readTimeout     time.Duration
	idleTimeout     time.Duration
	maxConns        int
	maxRetries      int
	shutdownTimeout time.Duration
	connectTimeout  time.Duration
	firstByte       time.Duration
	streamIdle      time.Duration
	healthInterval  time.Duration
	heartbeatGrace  time.Duration
	logLevel        string
	logFormat       string
}

func (o *serveOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8000", "address the router listens on (host:port); use 0.0.0.0:8000 to serve other hosts")
	fs.StringVar(&o.segment, "segment", shm.DefaultPath("kvfast"), `shared-memory segment holding the index and the engines' event feed; "none" runs without one (static workers only)`)
	fs.BoolVar(&o.recreate, "recreate-segment", false, "format a fresh segment even if a valid one exists (drops the warm index)")
	fs.IntVar(&o.indexCapacity, "index-capacity", 1<<20, "distinct KV blocks the index holds (set when the segment is created); about 70 bytes each with the engine-hash map")
	fs.IntVar(&o.ringBytes, "ring-bytes", 0, "bytes of each worker's event ring when the segment is created (0: the default, 1 MiB)")
	fs.IntVar(&o.blockSize, "block-size", radix.DefaultBlockSize, "tokens per KV block; must equal the engines' block size")
	fs.Var(&o.workers, "worker", `a static engine, repeatable: "url=http://host:port[,id=N][,rank=N][,model=NAME][,kv-blocks=N][,zmq=tcp://host:port[,replay=tcp://host:port][,topic=T]]" (zmq: the engine's KV-event PUB socket, vLLM/SGLang wire format; needs model)`)
	fs.StringVar(&o.policy, "policy", "kv", "routing policy: kv (cache-aware cost model), approx (cache-aware from the router's own history, no events), round-robin, random, least-loaded")
	fs.Float64Var(&o.overlapCredit, "overlap-credit", 1, "weight of a worker's cached prefix blocks against its prefill cost (0 ignores the cache)")
	fs.Float64Var(&o.prefillScale, "prefill-load-scale", 1, "weight of the prefill term against the decode term in the cost")
	fs.Float64Var(&o.temperature, "temperature", 0, "0 picks the cheapest worker; above 0 samples from a softmax over normalised costs")
	fs.BoolVar(&o.creditInFlight, "credit-in-flight", true, "credit prompt blocks that requests in flight on a worker already hold as cached, not only blocks its engine has reported stored")
	fs.BoolVar(&o.trackOutput, "track-output-blocks", false, "count output blocks as generation grows, decayed toward max_tokens")
	fs.Float64Var(&o.busyDecode, "busy-decode-fraction", 0, "a worker whose decode blocks exceed this fraction of its KV capacity takes no new request (0: off)")
	fs.Int64Var(&o.busyPrefill, "busy-prefill-tokens", 0, "a worker with more prompt tokens than this awaiting first token takes no new request (0: off)")
	fs.IntVar(&o.queueCapacity, "queue-capacity", sched.DefaultQueueCapacity, "requests that may wait when every worker is busy; beyond it they get 429 with Retry-After (negative: no queue)")
	fs.DurationVar(&o.queueTimeout, "queue-timeout", 30*time.Second, "longest wait in the admission queue; past it the request gets 503 with Retry-After")
	fs.Uint64Var(&o.seed, "seed", 0, "seed of tie-breaking and softmax sampling, for reproducible decisions (0: from the clock)")
	fs.BoolVar(&o.direct, "direct", false, "direct mode: every request must name its worker in X-Kvfast-Worker (an external picker chose)")
	fs.DurationVar(&o.approxTTL, "approx-ttl", 2*time.Minute, "how long the approximate index trusts that a routed prompt is still cached")
	fs.IntVar(&o.maxBodyBytes, "max-body-bytes", fastpath.DefaultMaxBodyBytes, "largest request body accepted (413 beyond)")
	fs.UintVar(&o.maxTokenID, "max-token-id", 0, "largest token id accepted in a prompt, usually vocabulary size - 1 (0: any uint32)")
	fs.DurationVar(&o.readTimeout, "read-timeout", 30*time.Second, "time allowed to read a whole request, headers and body (cuts slow clients)")
	fs.DurationVar(&o.idleTimeout, "idle-timeout", 60*time.Second, "keep-alive connections idle this long are closed")
	fs.IntVar(&o.maxConns, "max-conns", 10000, "concurrent client connections")
	fs.IntVar(&o.maxRetries, "max-retries", 2, "re-routes when the chosen engine refuses the connection (before any byte reaches the client); 0 disables")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long in-flight streams may finish before they are cut")
	fs.DurationVar(&o.connectTimeout, "connect-timeout", 2*time.Second, "time to connect to an engine")
	fs.DurationVar(&o.firstByte, "first-byte-timeout", 10*time.Minute, "time from forwarding to the engine's response headers")
	fs.DurationVar(&o.streamIdle, "stream-idle-timeout", 2*time.Minute, "longest pause inside an engine's response stream")
	fs.DurationVar(&o.healthInterval, "health-interval", 2*time.Second, "how often engines' /health is checked (negative: never)")
	fs.DurationVar(&o.heartbeatGrace, "heartbeat-grace", 5*time.Second, "a registered engine silent this long is marked down and its blocks dropped")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "text", "text or json")
}

// workerFlags collects repeated --worker values.
type workerFlags []fastpath.StaticWorker

func (w *workerFlags) String() string { return fmt.Sprintf("%d workers", len(*w)) }

func (w *workerFlags) Set(v string) error {
	sw := fastpath.StaticWorker{ID: uint64(len(*w))}
	for _, kv := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return fmt.Errorf("cannot parse %q: want key=value pairs", kv)
		}
		var err error
		switch k {
		case "url", "endpoint":
			sw.Endpoint = val
		case "id":
			sw.ID, err = strconv.ParseUint(val, 10, 64)
		case "rank", "dp-rank":
			var r uint64
			r, err = strconv.ParseUint(val, 10, 32)
			sw.DPRank = uint32(r)
		case "model":
			sw.Model = val
		case "kv-blocks":
			sw.KVBlocks, err = strconv.ParseUint(val, 10, 64)
		case "zmq", "events":
			sw.Events, err = val, feed.CheckZMQEndpoint(val)
		case "replay":
			sw.Replay, err = val, feed.CheckZMQEndpoint(val)
		case "topic":
			sw.Topic = val
		default:
			return fmt.Errorf("cannot use key %q: want url, id, rank, model, kv-blocks, zmq, replay or topic", k)
		}
		if err != nil {
			return fmt.Errorf("cannot parse %s=%q: %w", k, val, err)
		}
	}
	if sw.Endpoint == "" {
		return errors.New("a static worker needs url=http://host:port")
	}
	if sw.Events == "" && (sw.Replay != "" || sw.Topic != "") {
		return errors.New("replay= and topic= belong to a worker's zmq= event feed")
	}
	if sw.Events != "" && sw.Model == "" {
		return errors.New("a worker with zmq= needs model=NAME: the model seeds the block hashes")
	}
	*w = append(*w, sw)
	return nil
}

// applyEnv sets every flag not given on the command line from
// KVFAST_<FLAG_NAME>, so that containers can configure the router through
// the environment.
func applyEnv(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		env := "KVFAST_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("cannot use %s=%q: %w", env, v, err))
			}
		}
	})
	return errors.Join(errs...)
}

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
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("cannot use log format %q: want text or json", format)
}

// router is a built router with what must be closed after it.
type router struct {
	srv *fastpath.Server
	seg *shm.Segment
}

func (r *router) close() {
	if r.seg != nil {
		_ = r.seg.Close()
	}
}

func buildRouter(o *serveOptions, log *slog.Logger) (*router, error) {
	if o.blockSize <= 0 {
		return nil, fmt.Errorf("cannot use block size %d: must be positive", o.blockSize)
	}
	if o.maxTokenID > 1<<32-1 {
		return nil, fmt.Errorf("cannot use max token id %d: must fit in 32 bits", o.maxTokenID)
	}
	r := &router{}
	cfg := fastpath.Config{
		IndexCapacity: o.indexCapacity,
		Sched: sched.Config{
			BlockSize: o.blockSize,
			Cost: &sched.CostParams{OverlapCredit: o.overlapCredit, PrefillLoadScale: o.prefillScale,
				Temperature: o.temperature, TrackOutputBlocks: o.trackOutput, CreditInFlight: o.creditInFlight},
			Busy:          sched.BusyThresholds{DecodeBlocksFraction: o.busyDecode, PrefillTokens: o.busyPrefill},
			QueueCapacity: o.queueCapacity,
			Seed:          o.seed,
		},
		Dispatch: dispatch.Config{
			Timeouts: dispatch.Timeouts{Connect: o.connectTimeout, FirstByte: o.firstByte, Idle: o.streamIdle},
			Health:   dispatch.HealthConfig{Interval: o.healthInterval},
		},
		Policy:          o.policy,
		ApproxTTL:       o.approxTTL,
		Static:          o.workers,
		Direct:          o.direct,
		QueueTimeout:    o.queueTimeout,
		MaxBodyBytes:    o.maxBodyBytes,
		MaxTokenID:      uint32(o.maxTokenID),
		ReadTimeout:     o.readTimeout,
		IdleTimeout:     o.idleTimeout,
		MaxConns:        o.maxConns,
		MaxRetries:      retriesConfig(o.maxRetries),
		ShutdownTimeout: o.shutdownTimeout,
		Logger:          log,
	}
	if o.segment != "" && o.segment != "none" {
		seg, err := shm.Open(o.segment, shm.Options{Index: radix.Config{Capacity: o.indexCapacity},
			RingBytes: o.ringBytes, Recreate: o.recreate})
		if err != nil {
			return nil, err
		}
		r.seg = seg
		cfg.Segment = seg
		cfg.Ingester = feed.New(seg, feed.Config{HeartbeatGrace: o.heartbeatGrace})
	}
	srv, err := fastpath.New(cfg)
	if err != nil {
		r.close()
		return nil, err
	}
	r.srv = srv
	return r, nil
}

// retriesConfig maps the flag (0 disables re-routing) onto the library's
// convention (0 is the default, negative disables).
func retriesConfig(flagValue int) int {
	if flagValue <= 0 {
		return -1
	}
	return flagValue
}

func runServe(args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), serveAbout)
		fs.PrintDefaults()
	}
	var o serveOptions
	o.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "kvfast serve: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if err := applyEnv(fs); err != nil {
		fmt.Fprintln(os.Stderr, "kvfast serve:", err)
		return 2
	}
	log, err := newLogger(os.Stderr, o.logLevel, o.logFormat)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvfast serve:", err)
		return 2
	}
	r, err := buildRouter(&o, log)
	if err != nil {
		log.Error("cannot start the router", "err", err)
		return 1
	}
	defer r.close()
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		log.Error("cannot listen", "addr", o.listen, "err", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- r.srv.Serve(ln) }()
	select {
	case err := <-served:
		if err != nil {
			log.Error("router stopped", "err", err)
			return 1
		}
		return 0
	case <-ctx.Done():
	}
	log.Info("shutting down: draining in-flight requests", "deadline", o.shutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
	defer cancel()
	if err := r.srv.Shutdown(sctx); err != nil {
		log.Warn("shutdown cut in-flight requests", "err", err)
	}
	<-served
	log.Info("router stopped")
	return 0
}
