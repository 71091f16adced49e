package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/kvfast/kvfast/epp"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
)

func init() {
	register("epp", "pick endpoints for a Kubernetes inference gateway (Gateway API Inference Extension, Envoy ext_proc)", runEPP)
}

const eppAbout = `Usage: kvfast epp [flags]

Runs kvfast as the endpoint picker (EPP) of an InferencePool: the gateway
(Envoy with the Gateway API Inference Extension) asks it over ext_proc
gRPC which engine pod gets each request, and forwards there. The picker
reads the request body, matches the prompt against what each pod caches
(the pods' KV events, over ZMQ, as vLLM and SGLang publish them), chooses
with kvfast's scheduler, and names the pod in the
x-gateway-destination-endpoint header and the envoy.lb dynamic metadata.
It never carries the traffic itself.

Behind a cluster gateway, the endpoints may themselves be kvfast routers,
one per node (kvfast serve in front of the node's engines): with
--query-nodes the picker asks each, per request, what it caches of the
prompt, and the node's router then picks the engine.

Endpoints come from one of:
  - the InferencePool (--pool NAME): its selector's Ready pods, at its
    target port, read from the API server with the pod's service account
    (needs get on inferencepools and list on pods in --pool-namespace);
    each pod publishes KV events on --events-port (vLLM:
    --kv-events-config '{"enable_kv_cache_events": true, "publisher":
    "zmq", "endpoint": "tcp://*:5557", "topic": "kv-events"}');
  - a static list (--endpoint, repeatable), e.g.
    10.0.0.5:8000,zmq=tcp://10.0.0.5:5557 (replay=tcp://... if the
    engine has a replay socket).

The gateway's ext_proc filter should send the request body in
FULL_DUPLEX_STREAMED mode (GIE's gateways do), or BUFFERED; Envoy says
which on each stream, and --request-body-mode is assumed when it does not.
No eligible pod: 503; every pod busy and the queue full: 429; a body the
picker cannot parse: 400 (so is a completions prompt listing several
prompts, batch_not_supported; a list of one is that prompt).

ext_proc is served over TLS (--secure-serving, self-signed unless
--cert-path), as GIE's own picker serves it, so that gateways set up for
that picker connect unchanged. The gRPC health services "liveness",
"readiness" and envoy.service.ext_proc.v3.ExternalProcessor (ready once
the endpoints are known, and, with --leader-elect, while holding the
Lease) are served there and, in plain text for the kubelet's probes, on
--health-listen. Metrics: GET /metrics on --metrics-listen.
docs/epp.md has the protocol, its sources and the deployments.

Every flag can also be set through the environment: --some-flag is
KVFAST_EPP_SOME_FLAG (kvfast serve's KVFAST_SOME_FLAG variables, which
the container image sets, are not read). A flag on the command line wins
over the environment.

Exit status: 0 after a clean shutdown (SIGINT or SIGTERM), 1 on a runtime
failure, 2 for bad flags.

Flags:
`

// eppOptions are the command line's settings beside the picker's own.
type eppOptions struct {
	listeners          epp.Listeners
	pool, namespace    string
	eventsPort, replay int
	static             endpointFlags
	bodyMode           string
	log                logOptions
	elect              bool
	lease              epp.Elector
	secure             bool
	certPath           string
	engineToken        string // file of the engines' API key
}

func bindEPPFlags(fs *flag.FlagSet, cfg *epp.Config, o *eppOptions) {
	fs.StringVar(&o.listeners.GRPC, "listen", ":9002", "address of the ext_proc gRPC service (host:port); 9002 is the conventional port: name it in the InferencePool's endpointPickerRef")
	fs.StringVar(&o.listeners.Health, "health-listen", ":9003", `address of the gRPC health services alone, in plain text, for the kubelet's grpc probes (host:port; "" for none)`)
	fs.BoolVar(&o.secure, "secure-serving", true, "serve ext_proc over TLS, as GIE's own picker does by default (with a self-signed certificate unless --cert-path; gateways connect without verifying it); false: plain HTTP/2")
	fs.StringVar(&o.certPath, "cert-path", "", "with --secure-serving: directory of tls.crt and tls.key (a mounted TLS secret) instead of a self-signed certificate")
	fs.StringVar(&o.listeners.Metrics, "metrics-listen", ":9090", `address of GET /metrics (host:port; "" for none)`)
	fs.DurationVar(&o.listeners.Poll, "poll", 5*time.Second, "how often the endpoints are listed again")
	fs.DurationVar(&o.listeners.Drain, "drain-timeout", 30*time.Second, "at shutdown, how long open requests may take to finish before they are cut")
	fs.StringVar(&cfg.Model, "model", cfg.Model, "the base model the pool serves (required): it seeds the block hashes; a request naming another model is taken to name one of its LoRA adapters")
	fs.StringVar(&o.pool, "pool", "", "InferencePool whose pods are the endpoints (in-cluster); exclusive with --endpoint")
	fs.StringVar(&o.namespace, "pool-namespace", "", "the InferencePool's namespace (default: the picker's own)")
	fs.IntVar(&o.eventsPort, "events-port", 5557, "with --pool: every pod's ZMQ KV-event port, that of the engine at the pool's first target port; the i-th target port's engine publishes on this plus i, as vLLM offsets it by rank (0: the pods publish none; the picker then routes on its own history, --policy approx)")
	fs.IntVar(&o.replay, "replay-port", 0, "with --pool: every pod's ZMQ replay port, offset as --events-port is for further target ports (0: none)")
	fs.StringVar(&o.engineToken, "engine-api-key-file", "", "file holding the API key the engines were started with (vLLM's --api-key), on its one line: the picker sends it when it asks each endpoint's GET /v1/models for its LoRA adapters (none: it asks without; read at start-up only)")
	fs.StringVar(&cfg.Topic, "topic", cfg.Topic, "ZMQ subscription prefix of the KV events (vLLM's kv-events-config topic)")
	fs.Var(&o.static, "endpoint", `a static endpoint, repeatable: "ip:port[,zmq=tcp://ip:port[,replay=tcp://ip:port]]" (zmq: the engine's KV-event PUB socket, vLLM/SGLang wire format); exclusive with --pool`)
	fs.BoolVar(&cfg.QueryNodes, "query-nodes", cfg.QueryNodes, "the endpoints are kvfast routers, one per node: ask each, per request, what it caches of the prompt (its route-only endpoint, which books nothing) instead of following engines' events (use with --events-port 0)")
	fs.DurationVar(&cfg.QueryTimeout, "query-timeout", cfg.QueryTimeout, "with --query-nodes: how long a request waits for the nodes' answers; a node that has not answered counts as caching nothing")
	fs.StringVar(&cfg.Policy, "policy", cfg.Policy, "routing policy: kv (cache-aware cost model), approx (cache-aware from the picker's own history, no events), affinity (longest prefix on the picker's own history, load only as a tie-break), round-robin, random, least-loaded")
	fs.IntVar(&cfg.Sched.BlockSize, "block-size", cfg.Sched.BlockSize, "tokens per KV block; must equal the engines' block size (0: 16)")
	fs.IntVar(&cfg.IndexCapacity, "index-capacity", cfg.IndexCapacity, "distinct KV blocks the index holds at least, over every pod (each shard has headroom for uneven hashing, so it may hold more)")
	fs.Float64Var(&cfg.IndexWorkerShare, "index-worker-share", cfg.IndexWorkerShare, "the most of the index one pod's blocks may take, so that a pod that never reports evictions cannot crowd out the others'; 1: no bound")
	fs.IntVar(&cfg.Fallbacks, "fallbacks", cfg.Fallbacks, "further endpoints, cheapest first, listed after the chosen one for a gateway that retries (0 to 8)")
	fs.StringVar(&o.bodyMode, "request-body-mode", "full-duplex", "the gateway's request (and response) body mode, assumed when Envoy does not say: full-duplex, buffered, buffered-partial, or none or streamed (route on headers only)")
	fs.IntVar(&cfg.MaxBodyBytes, "max-body-bytes", cfg.MaxBodyBytes, "largest request body the picker reads (413 beyond)")
	fs.DurationVar(&cfg.BodyTimeout, "body-timeout", cfg.BodyTimeout, "longest wait for the whole of a request body the picker has begun to read, however steadily it arrives (408 past it), so that a body trickling a byte per --body-idle-timeout does not hold its share of --body-budget-bytes")
	fs.DurationVar(&cfg.BodyIdleTimeout, "body-idle-timeout", cfg.BodyIdleTimeout, "longest wait for the next part of a request body the picker has begun to read (408 past it), so that a stalled body does not hold its share of --body-budget-bytes")
	fs.DurationVar(&cfg.ResponseTimeout, "response-timeout", cfg.ResponseTimeout, "longest a routed request's booking waits on the gateway, for the response's headers or to take one of the picker's answers; past it the booking is released (its endpoint's load freed) and the stream left for the gateway to end")
	fs.Int64Var(&cfg.BodyBudgetBytes, "body-budget-bytes", cfg.BodyBudgetBytes, "request body bytes buffered at once over every stream, at least --max-body-bytes; a body that does not fit gets 503 with Retry-After")
	fs.IntVar(&cfg.Sched.QueueCapacity, "queue-capacity", cfg.Sched.QueueCapacity, "requests that may wait when every endpoint is busy; beyond it they get 429 (0: no queue)")
	fs.DurationVar(&cfg.QueueTimeout, "queue-timeout", cfg.QueueTimeout, "longest wait in the admission queue; past it the request gets 503")
	fs.Float64Var(&cfg.Sched.Busy.DecodeBlocksFraction, "busy-decode-fraction", cfg.Sched.Busy.DecodeBlocksFraction, "admission: an endpoint whose decode blocks exceed this fraction of its KV capacity takes no new request (0: off)")
	fs.Int64Var(&cfg.Sched.Busy.PrefillTokens, "busy-prefill-tokens", cfg.Sched.Busy.PrefillTokens, "admission: an endpoint with more prompt tokens than this awaiting their first token takes no new request (0: off)")
	fs.StringVar(&cfg.DestinationNamespace, "destination-namespace", cfg.DestinationNamespace, "dynamic-metadata namespace of the chosen endpoint")
	fs.StringVar(&cfg.SubsetNamespace, "subset-namespace", cfg.SubsetNamespace, "filter-metadata namespace of the gateway's subset hint")
	fs.Uint64Var(&cfg.Sched.Seed, "seed", cfg.Sched.Seed, "seed of tie-breaking, for reproducible decisions (0: from the clock)")
	fs.BoolVar(&o.elect, "leader-elect", false, "active-standby: hold a Lease in --pool-namespace, and answer readiness only while holding it (run two or more replicas, all following the pods' events)")
	fs.StringVar(&o.lease.Name, "lease-name", "kvfast-epp", "with --leader-elect: the Lease's name")
	fs.DurationVar(&o.lease.Duration, "lease-duration", 15*time.Second, "with --leader-elect: how long a claim lasts unrenewed; a standby takes over within it when the leader dies (at once when it stops)")
	fs.StringVar(&o.lease.Identity, "lease-identity", "", "with --leader-elect: this replica's name in the Lease (default: the host name, which is the pod's)")
	o.log.bind(fs)
}

var bodyModes = map[string]epp.BodyMode{
	"full-duplex":      extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED,
	"buffered":         extprocfilter.ProcessingMode_BUFFERED,
	"buffered-partial": extprocfilter.ProcessingMode_BUFFERED_PARTIAL,
	"none":             extprocfilter.ProcessingMode_NONE,
	"streamed":         extprocfilter.ProcessingMode_STREAMED,
}

// eppConfig parses epp's command line (and environment). It returns the
// exit status to use when parsing stops the command.
func eppConfig(args []string, stderr io.Writer) (epp.Config, eppOptions, epp.Source, int, bool) {
	fs := flag.NewFlagSet("epp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := epp.DefaultConfig()
	var o eppOptions
	bindEPPFlags(fs, &cfg, &o)
	fail := func(err error) (epp.Config, eppOptions, epp.Source, int, bool) {
		fmt.Fprintln(stderr, "kvfast epp:", err)
		return cfg, o, nil, 2, false
	}
	if err := parseFlags(fs, args, eppAbout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, o, nil, 0, false
		}
		return cfg, o, nil, 2, false
	}
	if fs.NArg() > 0 {
		return fail(errors.New(extraArgument(fs)))
	}
	unknownEnv, fromEnv, err := applyEnv(fs, eppEnvPrefix)
	if err != nil {
		printUnknownEnv(stderr, "epp", unknownEnv)
		return fail(err)
	}
	mode, ok := bodyModes[o.bodyMode]
	if !ok {
		printUnknownEnv(stderr, "epp", unknownEnv)
		return fail(fmt.Errorf("cannot use request body mode %q: want full-duplex, buffered, buffered-partial, none or streamed", o.bodyMode))
	}
	cfg.RequestBodyMode = mode
	log, err := newLogger(stderr, o.log.level, o.log.format)
	if err != nil {
		printUnknownEnv(stderr, "epp", unknownEnv)
		return fail(err)
	}
	warnUnknownEnv(log, "epp", unknownEnv)
	cfg.Logger = log
	if o.engineToken != "" {
		if cfg.EngineToken, err = readToken("engine API key", o.engineToken); err != nil {
			return fail(err)
		}
	}
	if cfg.Sched.BlockSize < 0 || cfg.Sched.QueueCapacity < 0 {
		return fail(fmt.Errorf("cannot use --block-size %d and --queue-capacity %d: neither may be negative", cfg.Sched.BlockSize, cfg.Sched.QueueCapacity))
	}
	if cfg.Sched.QueueCapacity == 0 {
		cfg.Sched.QueueCapacity = -1 // no queue, as kvfast serve reads 0; sched reads 0 as its default
	}
	if err := cfg.Validate(); err != nil {
		return fail(withEnvNote(err, fromEnv))
	}
	src, err := eppSource(o)
	if err != nil {
		return fail(err)
	}
	if o.listeners.Poll <= 0 || o.listeners.Drain <= 0 {
		return fail(errors.New("--poll and --drain-timeout must be positive"))
	}
	if o.elect {
		if err := eppElector(&o, log); err != nil {
			return fail(err)
		}
	}
	if o.secure {
		var err error
		if o.certPath != "" {
			o.listeners.TLS, err = epp.CertDirTLS(o.certPath)
		} else {
			o.listeners.TLS, err = epp.SelfSignedTLS("kvfast-epp")
		}
		if err != nil {
			return fail(err)
		}
	}
	return cfg, o, src, 0, true
}

// eppSource is where the endpoints come from: the pool, or the list.
func eppSource(o eppOptions) (epp.Source, error) {
	switch {
	case o.pool != "" && len(o.static) > 0:
		return nil, errors.New("--pool and --endpoint are exclusive: the endpoints come from the pool or from the list")
	case o.pool != "":
		k, err := epp.InCluster(o.namespace, o.pool)
		if err != nil {
			return nil, err
		}
		k.EventsPort, k.ReplayPort = o.eventsPort, o.replay
		return k, nil
	case len(o.static) == 0:
		return nil, errors.New("no endpoints: give --pool NAME (in-cluster) or --endpoint ip:port,zmq=... (repeatable)")
	case len(o.static) > workers.Max:
		// Past the slots the picker would drop some endpoint, not
		// necessarily the last given, and only log it.
		return nil, fmt.Errorf("%d --endpoint values: the picker routes to at most %d endpoints", len(o.static), workers.Max)
	}
	return epp.Static(o.static), nil
}

// eppElector readies the Lease of --leader-elect, through the API server
// the pod's service account reaches.
func eppElector(o *eppOptions, log *slog.Logger) error {
	if o.lease.Duration < 3*time.Second || o.lease.Name == "" {
		return errors.New("--lease-duration must be at least 3s and --lease-name set")
	}
	k, err := epp.InCluster(o.namespace, o.pool)
	if err != nil {
		return fmt.Errorf("cannot elect a leader: %w", err)
	}
	if o.lease.Identity == "" {
		if o.lease.Identity, err = os.Hostname(); err != nil {
			return fmt.Errorf("cannot name this replica in the lease: %w", err)
		}
	}
	o.lease.Kube, o.lease.Logger = k, log
	o.listeners.Elector = &o.lease
	return nil
}

func runEPP(args []string) int {
	cfg, o, src, code, ok := eppConfig(args, os.Stderr)
	if !ok {
		return code
	}
	applyMemoryLimit(eppMemoryLimit(cfg), cfg.Logger)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// A hang-up (a closed terminal, a reload) must not cut the gateway's
	// streams: there is nothing to reload.
	signal.Ignore(syscall.SIGHUP)
	if err := epp.Run(ctx, cfg, src, o.listeners); err != nil {
		cfg.Logger.Error("endpoint picker stopped", "err", err)
		return 1
	}
	return 0
}

// eppMemoryLimit is the picker's soft memory limit, as serve's
// (memoryLimit): the baseline and the body budget, and the picker's two
// indexes, which live on the heap. Without it a flood of large bodies
// leaves the heap to grow to several times the body budget over finished
// ones before the collector runs.
func eppMemoryLimit(cfg epp.Config) int64 {
	limit := baselineMemory + cfg.BodyBudgetBytes
	if n, err := radix.RegionSize(radix.Config{Capacity: cfg.IndexCapacity}); err == nil {
		limit += int64(n)
	}
	if n, err := radix.ApproxMemory(radix.Config{Capacity: cfg.ApproxCapacity}); err == nil {
		limit += int64(n)
	}
	return limit
}

// endpointFlags collects repeated --endpoint values.
type endpointFlags epp.Static

func (f *endpointFlags) String() string { return fmt.Sprintf("%d endpoints", len(*f)) }

func (f *endpointFlags) Set(v string) error {
	e, err := epp.ParseEndpoint(v)
	if err != nil {
		return err
	}
	*f = append(*f, e)
	return nil
}
