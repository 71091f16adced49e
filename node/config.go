package node

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/kvfast/kvfast/dispatch"
	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/feed"
	"github.com/kvfast/kvfast/internal/keyvals"
	"github.com/kvfast/kvfast/internal/redact"
	"github.com/kvfast/kvfast/internal/tracing"
	"github.com/kvfast/kvfast/prompt"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
)

// Config is one router on one host. DefaultConfig is the only source of
// defaults: the command line binds its flags to a DefaultConfig, and a
// library user starts from one. A zero field means zero (no retries, no
// queue, a disabled check), never "the default"; Validate refuses the
// zeros that make no sense.
type Config struct {
	// Listen is the API address (host:port) Run listens on.
	Listen string
	// AdminListen is the address (host:port) Run serves /admin/... and
	// /metrics on, apart from the API; "" serves them on the API listener
	// (HTTP.AdminOnAPI), where HTTP.AdminToken should then guard them.
	AdminListen string

	Segment SegmentConfig

	// Static lists engines that are not in the segment's registry: they
	// publish no events, or publish them over ZMQ (StaticWorker.Events).
	Static []StaticWorker
	// RegistryPoll is how often the segment's registry and load pages are
	// read into the worker set.
	RegistryPoll time.Duration
	// HeartbeatGrace: a registered engine silent this long is marked down.
	HeartbeatGrace time.Duration
	// DownRetention is how long the index keeps the blocks of an engine
	// marked down, in case it was only paused and resumes (0: dropped at
	// the mark).
	DownRetention time.Duration
	// DiscoveryTimeout bounds how long start-up waits for static workers
	// configured without a model to say which they serve (GET /v1/models)
	// before the router calls itself ready without them.
	DiscoveryTimeout time.Duration

	// Policy picks how a worker is chosen: kv, approx, round-robin, random
	// or least-loaded (sched.ParsePolicy).
	Policy string
	Approx ApproxConfig

	Sched    sched.Config
	Dispatch dispatch.Config
	HTTP     fastpath.Config
	// Tokenizers says, per model, how text and chat prompts become the
	// token ids the engine will see, so that they route on exact blocks
	// (--tokenizer); models it does not cover route them approximately.
	Tokenizers prompt.Config

	// ShutdownTimeout is how long Run lets in-flight streams finish after
	// its context ends, before it cuts them.
	ShutdownTimeout time.Duration
	// ShutdownDelay is how long Run keeps serving after its context ends,
	// with /ready answering 503 (fastpath.Server.Drain), before the
	// drain: the time a balancer takes to stop sending. 0: none.
	ShutdownDelay time.Duration

	// Tracing exports a span tree per request to an OpenTelemetry
	// collector (--otlp-endpoint); off while its Endpoint is empty.
	Tracing tracing.Config

	Logger *slog.Logger
}

// SegmentConfig names the shared-memory segment that holds the index and
// the engines' event feed. An empty Path runs without one: a heap index
// that only ZMQ feeds and the router's own history fill.
type SegmentConfig struct {
	Path string
	// IndexCapacity is the distinct KV blocks the index holds; with a
	// segment it applies when the segment is created.
	IndexCapacity int
	// IndexWorkerShare is the most of the index one worker's blocks may
	// take (radix.Index.SetWorkerShare), so that a publisher that never
	// evicts cannot fill it for every other worker. This router's setting
	// while it ingests, not the segment's.
	IndexWorkerShare float64
	// RingBytes sizes each worker's event ring at creation (0: shm's
	// default).
	RingBytes int
	// Recreate formats a fresh segment even over a valid one.
	Recreate bool
	// AllowForeign attaches to a segment another user owns or that group
	// or others may access (shm.Options.AllowForeign); without it such a
	// segment is refused.
	AllowForeign bool
	// Sessions is how many sticky sessions the bindings table holds: the
	// segment's (set when it is created), or this router's own without one.
	Sessions int
}

// ApproxConfig tunes the approximate index: the router's own routing
// history, used for text and chat prompts and by the approx policy.
type ApproxConfig struct {
	TTL      time.Duration // how long a routing decision is trusted
	Capacity int           // (worker, block) pairs remembered at most
}

// StaticWorker is an engine named in configuration rather than the registry.
type StaticWorker struct {
	ID       uint64
	DPRank   uint32
	Endpoint string // host:port or http://host:port
	Model    string
	KVBlocks uint64
	// Role is the worker's part in disaggregated serving (role=prefill,
	// decode, encode or both; both when absent).
	Role workers.Role
	// BootstrapPort is an SGLang prefill engine's bootstrap port
	// (bootstrap-port=N), 0 for the router's --disagg-bootstrap-port.
	BootstrapPort int

	// Events is the engine's ZMQ KV-event PUB socket (tcp://host:port),
	// for engines that publish vLLM's wire format (stock vLLM and SGLang);
	// "" means the engine publishes no events. Replay is its optional
	// replay ROUTER socket, and Topic the subscription prefix.
	Events string
	Replay string
	Topic  string
}

// DefaultConfig is a router on 127.0.0.1:8000 with the segment at
// shm.DefaultPath("kvfast"), the kv policy with in-flight crediting, and
// every limit at its production default.
func DefaultConfig() Config {
	cost := sched.DefaultCostParams()
	// The engines report a prefix stored only after computing it; crediting
	// blocks in flight closes that window for follow-up requests.
	cost.CreditInFlight = true
	// No one number suits every model and GPU: each worker's is measured
	// (sched/calibrate.go); --prefill-load-scale N pins it.
	cost.AutoPrefillLoadScale = true
	// An engine that keeps requests waiting without a first token loses
	// that credit (sched/stall.go), and with it the pull the eviction term
	// would give a worker that swallows requests and never answers.
	cost.StallAfter = sched.DefaultStallAfter
	// Once caches are full, a placement is charged for the cached blocks
	// it evicts (sched/capacity.go; --eviction-weight 0 turns it off).
	cost.EvictionWeight = sched.DefaultEvictionWeight
	return Config{
		Listen:      "127.0.0.1:8000",
		AdminListen: DefaultAdminListen,
		Segment: SegmentConfig{
			Path:             shm.DefaultPath("kvfast"),
			IndexCapacity:    1 << 20,
			IndexWorkerShare: radix.DefaultWorkerShare,
			Sessions:         shm.DefaultBindings,
		},
		RegistryPoll:     100 * time.Millisecond,
		HeartbeatGrace:   feed.DefaultHeartbeatGrace,
		DownRetention:    feed.DefaultDownRetention,
		DiscoveryTimeout: 30 * time.Second,
		Policy:           "kv",
		Approx:           ApproxConfig{TTL: 2 * time.Minute, Capacity: 1 << 20},
		Sched: sched.Config{
			BlockSize:    radix.DefaultBlockSize,
			ActiveBlocks: sched.DefaultActiveBlocks,
			Cost:         &cost,
			// Admission control is on by default: a worker over either
			// threshold takes no new request, which then waits in the
			// queue (bounded, and by --queue-timeout) for the first worker
			// to drop under, instead of piling onto engines that would
			// preempt or queue it themselves, blind to the other engines.
			Busy:          sched.DefaultBusy,
			QueueCapacity: sched.DefaultQueueCapacity,
			PriorityBump:  sched.DefaultPriorityBump,
			RetryAfterMin: sched.DefaultRetryAfterMin,
			RetryAfterMax: sched.DefaultRetryAfterMax,
		},
		Dispatch:        dispatch.DefaultConfig(),
		HTTP:            fastpath.DefaultConfig(),
		Tokenizers:      prompt.DefaultConfig(),
		ShutdownTimeout: 30 * time.Second,
		Tracing:         tracing.DefaultConfig(),
	}
}

// DefaultAdminListen keeps the admin endpoints on loopback, on a port of
// their own.
const DefaultAdminListen = "127.0.0.1:8089"

// libraryConfigs maps the node's literal zeros onto the conventions of
// sched and dispatch, whose constructors read a zero as "my default" for
// library callers that set only what they care about. Here every field
// already holds its value (DefaultConfig filled it), so a zero an operator
// wrote means off: no admission queue, no timeout, no health checks.
func (c *Config) libraryConfigs() (sched.Config, dispatch.Config) {
	s, d := c.Sched, c.Dispatch
	if s.QueueCapacity == 0 {
		s.QueueCapacity = -1
	}
	for _, t := range []*time.Duration{&d.Timeouts.Connect, &d.Timeouts.Write, &d.Timeouts.FirstByte, &d.Timeouts.Idle, &d.Health.Interval} {
		if *t == 0 {
			*t = -1
		}
	}
	for _, v := range []*int{&d.Outlier.Consecutive, &d.Outlier.FailurePercent, &d.Outlier.MaxEjectedPercent} {
		if *v == 0 {
			*v = -1
		}
	}
	return s, d
}

// sameListener reports whether two listen addresses (both valid) would
// take one port: the same port, not 0 (any free one), on the same host
// or with either on every interface. Which names one host (localhost and
// 127.0.0.1) is not resolved; the bind then fails as it would.
func sameListener(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	ha, pa, _ := net.SplitHostPort(a)
	hb, pb, _ := net.SplitHostPort(b)
	na, _ := net.LookupPort("tcp", pa)
	nb, _ := net.LookupPort("tcp", pb)
	every := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	return na != 0 && na == nb && (ha == hb || every(ha) || every(hb))
}

// Validate reports the first setting a router cannot run with.
func (c *Config) Validate() error {
	for _, l := range []struct{ flag, addr string }{{"--listen", c.Listen}, {"--admin-listen", c.AdminListen}} {
		if l.addr == "" {
			continue // no admin listener; a library caller serving on listeners of its own
		}
		// Checked here, not at the first Listen: a typo is a usage error
		// (exit 2) that says which flag, not a router that stopped. A
		// port may be named (http), as net.Listen takes it.
		_, port, err := net.SplitHostPort(l.addr)
		if _, perr := net.LookupPort("tcp", port); err != nil || perr != nil {
			return fmt.Errorf("cannot listen on %s %q: want host:port, a port from 0 to 65535 (as 127.0.0.1:8000 or :8000)", l.flag, l.addr)
		}
	}
	if sameListener(c.Listen, c.AdminListen) {
		return fmt.Errorf("cannot listen on --listen %q and --admin-listen %q: they name one port; the admin endpoints need a listener of their own (or --admin-listen '' to serve them on the API listener, behind --admin-token-file)", c.Listen, c.AdminListen)
	}
	if c.Sched.QueueCapacity < 0 {
		return fmt.Errorf("cannot use --queue-capacity %d: must not be negative (0: no queue)", c.Sched.QueueCapacity)
	}
	if _, err := shm.BindingsRegionSize(c.Segment.Sessions); err != nil {
		// A usage error, not a router that stopped at start-up.
		return fmt.Errorf("cannot use --session-capacity %d: must be %d to %d", c.Segment.Sessions, shm.MinBindings, shm.MaxBindings)
	}
	for _, t := range []struct {
		name string
		v    time.Duration
	}{
		{"--connect-timeout", c.Dispatch.Timeouts.Connect},
		{"--engine-write-timeout", c.Dispatch.Timeouts.Write},
		{"--first-byte-timeout", c.Dispatch.Timeouts.FirstByte},
		{"--stream-idle-timeout", c.Dispatch.Timeouts.Idle},
		{"--health-interval", c.Dispatch.Health.Interval},
	} {
		if t.v < 0 {
			return fmt.Errorf("cannot use %s %v: must not be negative (0: none)", t.name, t.v)
		}
	}
	o := &c.Dispatch.Outlier
	for _, n := range []struct {
		name string
		v    int
	}{{"--eject-failure-percent", o.FailurePercent}, {"--eject-max-percent", o.MaxEjectedPercent}} {
		if n.v < 0 || n.v > 100 {
			return fmt.Errorf("cannot use %s %d: must be a percentage, 0 (off) to 100", n.name, n.v)
		}
	}
	if c.Dispatch.MaxConnsPerEngine <= 0 {
		return fmt.Errorf("cannot use --max-conns-per-engine %d: must be positive", c.Dispatch.MaxConnsPerEngine)
	}
	if o.Consecutive < 0 {
		return fmt.Errorf("cannot use --eject-consecutive %d: must be a count of failures, 0 (off) or more", o.Consecutive)
	}
	if o.FailurePercent > 0 && o.MinRequests <= 0 {
		return fmt.Errorf("cannot use --eject-min-requests %d: must be positive", o.MinRequests)
	}
	if d := &c.Dispatch; d.MaxResponseBodySize <= 0 || d.ResponseBudgetBytes < int64(d.MaxResponseBodySize) {
		return fmt.Errorf("cannot use --max-response-bytes %d and --response-budget-bytes %d: both must be positive, the budget at least the max", d.MaxResponseBodySize, d.ResponseBudgetBytes)
	}
	positive := []struct {
		name string
		v    time.Duration
	}{
		{"--eject-window", o.Window},
		{"--eject-base-time", o.BaseEjection},
		{"--eject-max-time", o.MaxEjection},
		{"registry poll", c.RegistryPoll},
		{"--heartbeat-grace", c.HeartbeatGrace},
		{"--discovery-timeout", c.DiscoveryTimeout},
		{"--approx-ttl", c.Approx.TTL},
		{"--shutdown-timeout", c.ShutdownTimeout},
	}
	for _, p := range positive {
		if p.v <= 0 {
			return fmt.Errorf("cannot use %s %v: must be positive", p.name, p.v)
		}
	}
	if c.ShutdownDelay < 0 {
		return fmt.Errorf("cannot use --shutdown-delay %v: must be 0 (none) or more", c.ShutdownDelay)
	}
	if c.DownRetention < 0 {
		return fmt.Errorf("cannot use --down-retention %v: must be 0 (none) or more", c.DownRetention)
	}
	if r := c.Segment.RingBytes; r != 0 && (r < shm.MinRingBytes || r > shm.MaxRingBytes || r&(r-1) != 0) {
		return fmt.Errorf("cannot use --ring-bytes %d: want 0 (the default) or a power of two from %d to %d", r, shm.MinRingBytes, shm.MaxRingBytes)
	}
	if c.Segment.IndexCapacity <= 0 {
		return fmt.Errorf("cannot use --index-capacity %d: must be positive", c.Segment.IndexCapacity)
	}
	if s := c.Segment.IndexWorkerShare; !(s > 0 && s <= 1) {
		return fmt.Errorf("cannot use --index-worker-share %v: want more than 0 and at most 1 (1: no bound)", s)
	}
	if c.Approx.Capacity <= 0 {
		return fmt.Errorf("cannot use approx capacity %d: must be positive", c.Approx.Capacity)
	}
	if c.Sched.BlockSize <= 0 {
		return fmt.Errorf("cannot use --block-size %d: must be positive", c.Sched.BlockSize)
	}
	if r := c.Segment.RingBytes; r != 0 && shm.BlocksPerRecord(r, c.Sched.BlockSize) < 1 {
		return fmt.Errorf("cannot use ring size %d bytes with block size %d: no engine could publish one block of it (a record takes at most a quarter of the ring); give a larger --ring-bytes", r, c.Sched.BlockSize)
	}
	if len(c.Static) > workers.Max {
		return fmt.Errorf("cannot configure %d static workers: at most %d", len(c.Static), workers.Max)
	}
	seen := make(map[[2]uint64]int, len(c.Static))
	for i, w := range c.Static {
		key := [2]uint64{w.ID, uint64(w.DPRank)}
		if j, dup := seen[key]; dup {
			return fmt.Errorf("cannot configure static workers %d and %d: both are worker id %d rank %d (give each --worker its own id= or rank=)", j+1, i+1, w.ID, w.DPRank)
		}
		seen[key] = i
		if err := checkModelName(w.Model); err != nil {
			return fmt.Errorf("static worker %d: %w", i+1, err)
		}
	}
	if _, _, err := sched.ParsePolicy(c.Policy); err != nil {
		return fmt.Errorf("--policy: %w", err)
	}
	if err := c.Sched.Validate(); err != nil {
		return err
	}
	if err := c.Tokenizers.Validate(); err != nil {
		return err
	}
	if err := c.Tracing.Validate(); err != nil {
		return err
	}
	return c.HTTP.Validate()
}

// ParseStaticWorker reads the --worker syntax:
// "[url=]http://host:port[,id=N][,rank=N][,model=NAME][,kv-blocks=N][,role=prefill|decode|encode|both][,bootstrap-port=N][,zmq=tcp://host:port[,replay=tcp://host:port][,topic=T]]".
// id defaults to defaultID. A first item without '=' is the url, as in
// kvfast epp's --endpoint and as an operator first writes it.
func ParseStaticWorker(v string, defaultID uint64) (StaticWorker, error) {
	sw := StaticWorker{ID: defaultID}
	first, _, _ := strings.Cut(v, ",")
	first = strings.ToLower(strings.TrimSpace(first))
	if first != "" && !strings.Contains(first, "=") || strings.HasPrefix(first, "http://") || strings.HasPrefix(first, "https://") {
		// A URL's query may hold '=' too: it is refused as a query, below.
		v = "url=" + strings.TrimSpace(v)
	}
	pairs, err := keyvals.Split(v, map[string]string{"endpoint": "url", "dp-rank": "rank", "events": "zmq", "bootstrap_port": "bootstrap-port"})
	if err != nil {
		// The value is not quoted: any part of it may be a secret.
		return sw, fmt.Errorf("cannot parse the value: %w (credentials in a URL are refused anyway: give the engines' key with --engine-api-key-file)", err)
	}
	for i, kv := range pairs {
		k, val := kv.Key, kv.Value
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
		case "role":
			sw.Role, err = workers.ParseRole(val)
		case "bootstrap-port", "bootstrap_port":
			var p uint64
			if p, err = strconv.ParseUint(val, 10, 16); err == nil && p == 0 {
				err = errors.New("port 0")
			}
			sw.BootstrapPort = int(p)
		default:
			// Neither the key nor the value is shown: an item may be the
			// rest of a password cut at a comma.
			return sw, fmt.Errorf("cannot use the key of item %d: want url, id, rank, model, kv-blocks, role, bootstrap-port, zmq, replay or topic", i+1)
		}
		if err != nil {
			switch k {
			case "zmq", "events", "replay":
				return sw, fmt.Errorf("cannot parse %s=: %w", k, err) // the error shows the endpoint redacted
			}
			return sw, fmt.Errorf("cannot parse the value of %s= (item %d): %s", k, i+1, valueWanted[k])
		}
	}
	if sw.Endpoint == "" {
		return sw, errors.New("a static worker needs url=http://host:port")
	}
	if u, err := url.Parse(sw.Endpoint); err == nil && (u.User != nil || u.RawQuery != "" || u.Fragment != "") {
		// The router dials host:port and would drop them without a word:
		// an engine's key goes in --engine-api-key-file.
		return sw, fmt.Errorf("cannot use url=%s: credentials, a query or a fragment in a worker's URL are not sent; give the engines' key with --engine-api-key-file", redact.Endpoint(sw.Endpoint))
	} else if err == nil && u.Host != "" && !rootPath(u.Path) {
		// Nor is a path: the router calls /v1/... at the host's root, so
		// an engine behind a path prefix was never reached. (An OpenAI
		// base URL's /v1 is that root's API, and taken for it.)
		return sw, fmt.Errorf("cannot use url=%s: a path in a worker's URL is not sent (the router calls /v1/... at the engine's root); give http://host:port", redact.Endpoint(sw.Endpoint))
	}
	if _, err := hostPort(sw.Endpoint); err != nil {
		return sw, err
	}
	if sw.BootstrapPort != 0 && sw.Role != workers.RolePrefill {
		return sw, errors.New("bootstrap-port= belongs to a prefill worker (role=prefill): the SGLang engine whose bootstrap server it names")
	}
	if sw.Events == "" && (sw.Replay != "" || sw.Topic != "") {
		return sw, errors.New("replay= and topic= belong to a worker's zmq= event feed")
	}
	if sw.Events != "" && sw.Model == "" {
		return sw, errors.New("a worker with zmq= needs model=NAME: the model seeds the block hashes")
	}
	if sw.Replay != "" && sw.Replay == sw.Events {
		return sw, errors.New("replay= must be the engine's replay socket (vLLM's replay_endpoint), not its zmq= event socket")
	}
	return sw, nil
}

// rootPath reports whether a worker URL's path names the engine's root:
// none, "/", or the OpenAI base URL's "/v1".
func rootPath(p string) bool {
	switch p {
	case "", "/", "/v1", "/v1/":
		return true
	}
	return false
}

// registeredAddr is hostPort for an endpoint an engine registered in the
// segment, which any process that can write the segment chooses: only
// http://host:port (a trailing slash allowed) or host:port, with a port
// from 1 to 65535. Credentials, a path, a query or a fragment would be
// dropped by the router without a word (and credentials logged), so they
// are refused instead.
func registeredAddr(endpoint string) (string, error) {
	if strings.Contains(endpoint, "://") {
		u, err := url.Parse(endpoint)
		if err != nil {
			return "", fmt.Errorf("cannot parse endpoint %q", redact.Endpoint(endpoint))
		}
		if u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
			return "", fmt.Errorf("cannot use endpoint %q: want http://host:port, without credentials, path or query", redact.Endpoint(endpoint))
		}
	}
	addr, err := hostPort(endpoint)
	if err != nil {
		return "", fmt.Errorf("cannot use endpoint %q: want http://host:port", redact.Endpoint(endpoint))
	}
	host, port, _ := net.SplitHostPort(addr)
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 || host == "" || strings.ContainsAny(host, "@/?#") {
		return "", fmt.Errorf("cannot use endpoint %q: want a host and a port from 1 to 65535", redact.Endpoint(endpoint))
	}
	return addr, nil
}

// checkModelName refuses a registered model name no client could send
// and no operator could read: blank, padded with spaces, or holding a
// control or separator character (a newline, U+2028). "" is allowed (and
// warned about: noModelMessage).
func checkModelName(model string) error {
	if model == "" {
		return nil
	}
	if strings.TrimSpace(model) != model || strings.IndexFunc(model, func(r rune) bool { return !unicode.IsGraphic(r) }) >= 0 {
		return fmt.Errorf("cannot use model name %s: blank, padded, or holding a control or line-separator character", strconv.QuoteToASCII(model))
	}
	return nil
}

// valueWanted says what a --worker key takes, for an error that must not
// show the value it refused.
var valueWanted = map[string]string{
	"id": "want a whole number", "rank": "want a whole number", "dp-rank": "want a whole number",
	"kv-blocks": "want a whole number", "role": "want prefill, decode, encode or both", "bootstrap-port": "want a port from 1 to 65535", "bootstrap_port": "want a port from 1 to 65535",
}

// hostPort accepts "host:port" or an http URL and returns "host:port".
func hostPort(endpoint string) (string, error) {
	// The errors show the endpoint as it may be logged: a scheme-less
	// user:password@host is no URL the parser redacts.
	if strings.Contains(endpoint, "://") {
		u, err := url.Parse(endpoint)
		if err != nil {
			return "", fmt.Errorf("cannot parse endpoint %q (want http://host:port)", redact.Endpoint(endpoint))
		}
		if u.Scheme != "http" {
			return "", fmt.Errorf("cannot use endpoint %q: only http engines are supported", redact.Endpoint(endpoint))
		}
		endpoint = u.Host
	}
	host, port, err := net.SplitHostPort(endpoint)
	if err != nil || strings.Contains(endpoint, "@") {
		return "", fmt.Errorf("cannot use endpoint %q: want host:port or http://host:port", redact.Endpoint(endpoint))
	}
	// Checked here, so that a typo (http//host:port, port 99999) stops
	// the start instead of failing every health check once it runs.
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", fmt.Errorf("cannot use endpoint %q: the port must be a number from 1 to 65535", redact.Endpoint(endpoint))
	}
	// An empty host dials this machine; an IPv6 address may carry a zone
	// (fe80::1%eth0).
	addr, _, _ := strings.Cut(host, "%")
	if host != "" && net.ParseIP(addr) == nil && !validHostname(host) {
		return "", fmt.Errorf("cannot use endpoint %q: %q is neither an IP address nor a host name", redact.Endpoint(endpoint), host)
	}
	return endpoint, nil
}

// validHostname: dot-separated labels of letters, digits, '-' and '_'
// (which some DNS names carry), none empty or longer than 63 bytes.
func validHostname(host string) bool {
	if host == "" || len(host) > 253 {
		return false
	}
	for label := range strings.SplitSeq(strings.TrimSuffix(host, "."), ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, c := range []byte(label) {
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}
