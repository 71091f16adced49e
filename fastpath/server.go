package fastpath

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/puzpuzpuz/xsync/v3"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvfast/kvfast/dispatch"
	"github.com/kvfast/kvfast/guard"
	"github.com/kvfast/kvfast/internal/hangup"
	"github.com/kvfast/kvfast/internal/logthrottle"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/prompt"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
)

// Config is the HTTP front end's part of a router: limits, timeouts and
// request-path behaviour. Start from DefaultConfig; a zero field means
// zero, and Validate refuses the zeros that make no sense.
type Config struct {
	// QueueTimeout bounds a request's wait in the admission queue; past it
	// the request is refused with 503 and Retry-After.
	QueueTimeout time.Duration

	// Direct requires every request to name its worker (an external picker
	// already chose); the router only forwards and accounts.
	Direct bool

	// ApproxChunkBytes is the text chunk size of approximate hashing for
	// text and chat prompts.
	ApproxChunkBytes int

	MaxBodyBytes int    // largest request body (413 beyond)
	MaxTokenID   uint32 // largest accepted token id; 0 = any uint32
	// HeaderTimeout bounds the wait for a complete request header, from a
	// new connection's accept or a keep-alive request's first byte: an
	// idle or slow-header connection is closed after it.
	HeaderTimeout time.Duration
	ReadTimeout   time.Duration // the request body, from the end of its header: bounds slow uploads
	IdleTimeout   time.Duration // keep-alive idle
	// WriteTimeout bounds each write to a client: a plain answer whole,
	// and each write of a stream, so that a client that stops reading
	// (a full receive window) is cut and its request released instead of
	// holding its engine and booking for as long as it stays connected.
	WriteTimeout time.Duration
	MaxConns     int // concurrent client connections
	// MaxConnsPerIP bounds one client address's concurrent connections, so
	// that one client cannot take every connection; 0: no bound.
	MaxConnsPerIP int
	// BodyBudgetBytes bounds the request body bytes held in memory at once
	// over all requests; a request whose body does not fit is refused with
	// 503 and Retry-After before its body is read. At least MaxBodyBytes.
	BodyBudgetBytes int64
	MaxRetries      int // re-routes after a refused connection; 0: none

	// APIKeys, when not empty, are the keys the OpenAI endpoints (/v1/...)
	// accept in Authorization: Bearer KEY; others get 401.
	APIKeys []string
	// AdminToken, when not empty, is required as Authorization: Bearer
	// TOKEN by /admin/... and /metrics, on whichever listener serves them.
	AdminToken string
	// AdminOnAPI serves /admin/... and /metrics on the API listener too;
	// otherwise only a listener given to ServeAdmin serves them, and the
	// API listener answers 404.
	AdminOnAPI bool

	// Sessions configures sticky sessions (HeaderSession).
	Sessions SessionConfig
	// Disagg routes requests in two stages, prefill then decode, over
	// workers' roles (disagg.go); its zero value is off.
	Disagg DisaggConfig
	// Encode sends multimodal items to encode workers before the request
	// goes on (encode.go); it runs whenever encoders are present.
	Encode EncodeConfig
}

// DefaultConfig is the front end kvfast serve runs with.
func DefaultConfig() Config {
	return Config{
		QueueTimeout:     30 * time.Second,
		ApproxChunkBytes: radix.DefaultApproxChunkBytes,
		MaxBodyBytes:     openai.DefaultMaxBodyBytes,
		HeaderTimeout:    10 * time.Second,
		ReadTimeout:      30 * time.Second,
		IdleTimeout:      60 * time.Second,
		WriteTimeout:     60 * time.Second,
		MaxConns:         10000,
		MaxConnsPerIP:    DefaultMaxConnsPerIP,
		BodyBudgetBytes:  DefaultBodyBudgetBytes,
		MaxRetries:       2,
		Sessions:         DefaultSessionConfig(),
		// Off until --disagg; the thresholds are what it starts with.
		Disagg: DisaggConfig{MinRemoteTokens: DefaultMinRemoteTokens, LocalCachedFraction: DefaultLocalCachedFraction,
			PrefillTimeout: DefaultPrefillTimeout},
		Encode: DefaultEncodeConfig(),
	}
}

// DefaultMaxConnsPerIP leaves room for a busy client's connection pool and
// for a few clients behind one NAT; a router behind a single proxy sees
// one address and needs it raised to MaxConns (or 0).
const DefaultMaxConnsPerIP = 256

// DefaultBodyBudgetBytes holds 16 maximum-size (16 MiB) bodies at once.
const DefaultBodyBudgetBytes = 256 << 20

// Validate reports the first setting the front end cannot run with.
func (c *Config) Validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--queue-timeout", c.QueueTimeout}, {"--header-timeout", c.HeaderTimeout}, {"--read-timeout", c.ReadTimeout}, {"--idle-timeout", c.IdleTimeout}, {"--write-timeout", c.WriteTimeout}} {
		if d.v <= 0 {
			return fmt.Errorf("cannot use %s %v: must be positive", d.name, d.v)
		}
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"approx chunk bytes", c.ApproxChunkBytes}, {"--max-body-bytes", c.MaxBodyBytes}, {"--max-conns", c.MaxConns}} {
		if n.v <= 0 {
			return fmt.Errorf("cannot use %s %d: must be positive", n.name, n.v)
		}
	}
	if c.MaxRetries < 0 {
		return fmt.Errorf("cannot use --max-retries %d: must not be negative", c.MaxRetries)
	}
	if c.MaxConnsPerIP < 0 {
		return fmt.Errorf("cannot use --max-conns-per-ip %d: must not be negative (0: no bound)", c.MaxConnsPerIP)
	}
	if c.BodyBudgetBytes < int64(c.MaxBodyBytes) {
		return fmt.Errorf("cannot use --body-budget-bytes %d: must hold at least one body of --max-body-bytes (%d)", c.BodyBudgetBytes, c.MaxBodyBytes)
	}
	if err := c.Sessions.validate(); err != nil {
		return err
	}
	for i, k := range c.APIKeys {
		if k == "" {
			return fmt.Errorf("cannot use API key %d: it is empty", i+1)
		}
	}
	if err := c.Encode.validate(); err != nil {
		return err
	}
	return c.Disagg.validate()
}

// Deps are the parts of the node the front end routes with. The node owns
// them and their background work; the front end only reads and books.
type Deps struct {
	Index   *radix.Index  // the exact, event-fed index
	Approx  *radix.Approx // the router's own routing history
	Sched   *sched.Scheduler
	Engines *dispatch.Pool
	// UseApprox routes token prompts on Approx too (the approx policy).
	UseApprox bool
	// Silent are the workers that publish no KV events (static engines
	// without zmq=): the index never learns what they cache, so their
	// exact prompts route on Approx as text prompts do.
	Silent workers.Set
	// Segment is the shared-memory segment whose mapping holds Index and
	// Bindings, nil when they live on the heap: a fault in it (a truncated
	// file) is caught around every lookup (shm.Segment.Catch).
	Segment *shm.Segment
	// Bindings is the sticky-session table: the segment's, so that every
	// router on the node agrees; nil gives this router one of its own.
	Bindings *shm.Bindings
	// Renderers gives each model's prompt renderer, which turns text and
	// chat prompts into token ids; nil, or a nil renderer for a model,
	// routes that model's text and chat prompts approximately.
	Renderers Renderers
	// State gives /admin/workers and /metrics the node's snapshot.
	State  State
	Logger *slog.Logger
	// Tracer, if set, traces every request (trace.go): the node's
	// OpenTelemetry tracer, exporting to --otlp-endpoint. nil: tracing is
	// off, and costs the request path nothing.
	Tracer trace.Tracer
	// Settled, if set, is closed once the node's start-up has settled:
	// its configured and registered workers are routable, their models
	// known, and its index is safe to route on. Until then /ready answers
	// 503, and a request naming a model no worker serves yet waits for it
	// (within the queue timeout) rather than getting 404. nil: settled.
	Settled <-chan struct{}
	// ModelsPending reports whether some static worker's model is not
	// known yet (its engine has not answered GET /v1/models): a request
	// for a model no known worker serves may be for it, and gets 503
	// rather than 404. nil: any worker without a model counts.
	ModelsPending func() bool
	// RefreshModels, if set, asks the engines for their models again and
	// waits (boundedly) for their answers; it reports whether they came.
	// A request naming a model no worker is known to serve calls it once
	// before its 404: an adapter loaded at run time is served from its
	// first request. nil: the 404 is answered at once. With a ctx already
	// done it only brings the poll forward.
	RefreshModels func(ctx context.Context) bool
}

// Renderers resolves a model's prompt renderer (package prompt's
// Registry). The front end asks when the worker set changes, never per
// request, and then has it forget the models no worker serves any more.
type Renderers interface {
	Renderer(model string) prompt.Renderer
	Forget(keep func(model string) bool)
}

// State is the node's view of itself, as operators see it.
type State interface {
	Snapshot() Snapshot
}

// Server is the HTTP front end: it parses, routes, books and relays.
type Server struct {
	cfg Config
	via []byte // this router's id in HeaderVia
	// throttle keeps lines any client can make repeat (a loop) to one a
	// minute each.
	throttle *logthrottle.Throttle
	log      *slog.Logger
	index    *radix.Index
	segment  *shm.Segment // holds index, or nil
	approx   *radix.Approx
	sched    *sched.Scheduler
	guards   *guard.Pool
	engines  *dispatch.Pool
	state    State
	parser   openai.Parser
	metrics  *metrics
	http     *fasthttp.Server
	// sessions is nil when sticky sessions are off (SessionConfig.TTL 0).
	sessions *sessions
	// encAffinity remembers which encoder has which item; nil when
	// affinity is off.
	encAffinity *encoderAffinity

	// errBodyTooLarge is the 413 of a body over MaxBodyBytes, naming the
	// limit and its flag.
	errBodyTooLarge *openai.Error
	// errTooManyMedia and errMediaTooLarge are prompt's refusals of a
	// request over the media limits, naming the limit and its flag.
	errTooManyMedia, errMediaTooLarge *openai.Error

	useApprox bool
	silent    workers.Set  // Deps.Silent
	tracer    trace.Tracer // Deps.Tracer; nil: off
	renderers Renderers
	settled   <-chan struct{} // Deps.Settled
	seeds     atomic.Pointer[map[string]modelNamespace]
	// modelsPending: some worker's model is not known yet (a static
	// worker whose engine has not answered GET /v1/models); pendingModels,
	// when set (Deps.ModelsPending), says so instead, telling those apart
	// from a publisher that registered without a model.
	modelsPending  atomic.Bool
	pendingModels  func() bool
	refreshModels  func(context.Context) bool // Deps.RefreshModels; nil: none
	refreshWaiters atomic.Int32               // requests in refresh
	// draining is set by Drain: the router is about to shut down and asks
	// to be taken out of rotation while it still serves.
	draining atomic.Bool
	// departed is every model that workers served since start and none
	// serves now (all its engines down or restarting): a request naming
	// one gets 503, which clients retry, not 404 (an adapter, only while
	// its base model is away: departure). Rebuilt with seeds.
	departed atomic.Pointer[map[string]departure]
	modelsMu sync.Mutex         // serialises rebuilds of seeds
	adapters map[string]Adapter // by LoRA adapter name; under modelsMu
	// unlisted are the workers whose engines do not list their model in
	// GET /v1/models (SetModelUnlisted): a workers.Set.
	unlisted atomic.Uint64
	// keyRefused are the workers whose engines refuse the router's
	// credentials (SetKeyRefused): a workers.Set.
	keyRefused atomic.Uint64
	// downIDs are the worker ids of registrations presumed dead (their
	// engines' heartbeat stopped): the scheduler has dropped them, but a
	// pin to one is a 503 to retry, not the 404 of an id never seen.
	downIDs atomic.Pointer[[]uint64]

	metricsOnce sync.Once
	metricsHTTP fasthttp.RequestHandler

	budget bodyBudget
	// Connections per client address, counted apart on the two
	// listeners: clients that fill their address's bound on the API
	// listener must not lock the same address (a Prometheus or a probe
	// beside them, a proxy's or SNAT's shared address) out of /metrics
	// and /health.
	connLimit, adminConnLimit connLimiter
	waits                     waitStats // recent admission-queue waits, for Retry-After
	// apiKeys and adminToken hold SHA-256 digests: comparing digests of
	// one length leaks no key's length through timing.
	apiKeys    []keyDigest
	adminToken []keyDigest // empty: no token

	exchanges sync.Pool
	hangups   *hangup.Watcher                    // nil where client hang-ups cannot be watched
	active    *activity                          // handlers running and streams being relayed
	conns     *xsync.MapOf[net.Conn, *connState] // open client connections, cut at the shutdown deadline
	// cutting is set when Shutdown's deadline passes: a request told of a
	// hang-up from then on was cut by the router (exchange.HangUp), and
	// its client, still there, is told so.
	cutting   atomic.Bool
	connsIdle chan struct{} // cap 1: once cutting, the last request's response was written
	// cut is done when Shutdown cuts. Requests wait under it, not under
	// their RequestCtx, whose Done fasthttp closes when Shutdown begins:
	// a request waiting for a worker (the admission queue) or for the
	// node's models keeps its place while the router drains, and is
	// served if a worker frees up before the deadline.
	cut       context.Context
	cutNow    context.CancelFunc
	requestID atomic.Uint64

	mu      sync.Mutex
	started bool
	closed  bool
	lns     []net.Listener
}

// New builds the front end over deps. It starts nothing; call Serve.
func New(cfg Config, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Index == nil || deps.Approx == nil || deps.Sched == nil || deps.Engines == nil || deps.State == nil {
		return nil, errors.New("cannot build the front end: Index, Approx, Sched, Engines and State are required")
	}
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, log: deps.Logger, index: deps.Index, segment: deps.Segment, approx: deps.Approx, sched: deps.Sched,
		engines: deps.Engines, state: deps.State, useApprox: deps.UseApprox, silent: deps.Silent, tracer: deps.Tracer, renderers: deps.Renderers, settled: deps.Settled, pendingModels: deps.ModelsPending, refreshModels: deps.RefreshModels,
		conns: xsync.NewMapOf[net.Conn, *connState](), connsIdle: make(chan struct{}, 1), active: newActivity()}
	s.cut, s.cutNow = context.WithCancel(context.Background())
	s.parser = openai.Parser{MaxBodyBytes: cfg.MaxBodyBytes, MaxTokenID: cfg.MaxTokenID}
	tooLarge := *openai.ErrBodyTooLarge
	tooLarge.Message += fmt.Sprintf(": at most %d bytes (the router's --max-body-bytes)", cfg.MaxBodyBytes)
	s.errBodyTooLarge = &tooLarge
	tooMany, tooBig := *prompt.ErrTooManyMedia, *prompt.ErrMediaTooLarge
	tooMany.Message += fmt.Sprintf(": at most %d (the router's --encode-max-items)", cfg.Encode.MaxItems)
	tooBig.Message += fmt.Sprintf(": at most %d bytes (the router's --encode-max-item-bytes)", cfg.Encode.MaxItemBytes)
	s.errTooManyMedia, s.errMediaTooLarge = &tooMany, &tooBig
	s.via = hex.AppendEncode(nil, binary.LittleEndian.AppendUint64(nil, rand.Uint64()))
	s.throttle = logthrottle.New(time.Minute)
	s.budget.limit = cfg.BodyBudgetBytes
	for _, k := range cfg.APIKeys {
		s.apiKeys = append(s.apiKeys, sha256.Sum256([]byte(k)))
	}
	if cfg.AdminToken != "" {
		s.adminToken = []keyDigest{sha256.Sum256([]byte(cfg.AdminToken))}
	}
	s.metrics = newMetrics(s)
	// The admin listener has a bound of its own, so that a flood of API
	// connections leaves the operator's scrapes and checks their way in.
	s.connLimit.init(cfg.MaxConnsPerIP, cfg.MaxConns, s.metrics.transport[transportConnLimit])
	s.adminConnLimit.init(cfg.MaxConnsPerIP, adminMaxConns, s.metrics.transport[transportConnLimit])
	if !cfg.Encode.Off && cfg.Encode.AffinityItems > 0 {
		s.encAffinity = newEncoderAffinity(cfg.Encode.AffinityItems, cfg.Encode.AffinityTTL)
	}
	if cfg.Sessions.TTL > 0 {
		var err error
		if s.sessions, err = newSessions(s, cfg.Sessions, deps.Bindings); err != nil {
			return nil, err
		}
	}
	s.guards = guard.NewPool(s.sched, guard.Observer{Finished: s.metrics.observeFinished})
	s.exchanges.New = func() any { return newExchange(s) }
	if w, err := hangup.New(); err == nil {
		s.hangups = w
	} else {
		s.log.Warn("clients that leave are noticed only when their answer is written", "err", err)
	}
	s.WorkersChanged()
	s.http = &fasthttp.Server{
		Handler:      s.handle,
		ErrorHandler: s.transportError,
		Logger:       fasthttpLogger{log: s.log, throttle: logthrottle.New(time.Minute)},
		ConnState:    s.trackConn,
		Name:         "kvfast",
		// Bodies are streamed: fasthttp reads a few KiB before the handler,
		// which reads the rest under the body budget (readBody), so that a
		// body that is too large or does not fit is refused unread.
		ReadBufferSize:     readBufferBytes,
		StreamRequestBody:  true,
		MaxRequestBodySize: cfg.MaxBodyBytes,
		// fasthttp's read timeout runs from a connection's accept (or a
		// keep-alive request's first byte) to the end of the header: the
		// header timeout. HeaderReceived then gives the body its own.
		ReadTimeout: cfg.HeaderTimeout,
		// The one-byte body limit makes fasthttp read ahead one byte of a
		// body: beyond it a body is a stream either way, and a larger read
		// ahead would wait for bytes that a client whose body is refused
		// may hold back until it has the answer.
		HeaderReceived: func(*fasthttp.RequestHeader) fasthttp.RequestConfig {
			return fasthttp.RequestConfig{ReadTimeout: cfg.ReadTimeout, MaxRequestBodySize: 1}
		},
		// A client that asks before it sends its body (Expect:
		// 100-continue; curl does past 1 MiB) hears of one over the limit
		// before sending any of it, instead of fasthttp's automatic 100.
		// fasthttp's doc asks the handler not to touch the response, which
		// must stay clean for a request it goes on to read; a refused one
		// is answered with whatever the response holds, so the refusal
		// carries the same OpenAI error as any other oversized body
		// (TestExpectContinue checks this still holds).
		// A client without a valid API key hears so before it sends its
		// body too.
		ExpectHandler: func(ctx *fasthttp.RequestCtx) int {
			if ctx.Request.Header.ContentLength() > cfg.MaxBodyBytes {
				s.metrics.transport[transportTooLarge].Inc()
				writeError(ctx, fasthttp.StatusRequestEntityTooLarge, s.errBodyTooLarge)
				return fasthttp.StatusRequestEntityTooLarge
			}
			if !fromAdminListener(ctx) && keyedPath(ctx.Path()) && !s.apiKeyAccepted(ctx) {
				return fasthttp.StatusUnauthorized
			}
			return fasthttp.StatusContinue
		},
		// A multipart body would be parsed (into memory and temporary
		// files, up to the whole body) before the handler runs, past the
		// body limit, the body budget and the key check: bodies are JSON
		// here, read by the handler under those bounds.
		DisablePreParseMultipartForm: true,
		IdleTimeout:                  cfg.IdleTimeout,
		WriteTimeout:                 cfg.WriteTimeout, // a stream's relay moves it on at each write
		// The listeners bound their connections (connLimiter), answering
		// as the API does; this only backs them up.
		Concurrency: backstopConcurrency(cfg.MaxConns),
		// Errors about a request fasthttp could not parse must not carry
		// its bytes (credentials) into the log.
		SecureErrorLogMessage: true,
		NoDefaultServerHeader: true,
		// Date stays (RFC 9110 §6.6.1 asks it of a server with a clock):
		// fasthttp formats it once a second, not per response.
		CloseOnShutdown: true,
	}
	return s, nil
}

// adminMaxConns bounds the admin listener's connections: Prometheus, the
// health checks and an operator need a few.
const adminMaxConns = 256

// backstopConcurrency is fasthttp's bound on connections served at once:
// above both listeners' own (connLimiter), so never what refuses one.
// Validate keeps maxConns positive.
func backstopConcurrency(maxConns int) int { return maxConns + adminMaxConns }

// readBufferBytes is each connection's read buffer, which also bounds a
// request's header. fasthttp's default of 4 KiB takes two reads for a
// 1K-token prompt (about 7.5 KB of JSON): with 8 KiB one read brings the
// whole request, one syscall fewer per request, measured as 2.0 reads a
// request before and 1.07 after under wrk (BENCHMARKS.md, "Router CPU
// per request under external load"). The buffer lives as long as its
// connection, so --max-conns connections hold up to that many times 8 KiB
// (78 MiB at the default 10000; 39 MiB before). A header that does not
// fit is answered 431 (TestHeaderLimit).
const readBufferBytes = 8 << 10

// Drain takes the router out of rotation without refusing anything:
// /ready answers 503 "draining" and every answer closes its connection, so
// that balancers stop sending and keep-alive clients dial again (reaching
// another router) while requests still in flight, and new ones that come
// meanwhile, are served. Shutdown then stops accepting. Drain is for the
// time between a SIGTERM and the moment a balancer has seen the router
// go: Kubernetes removes a terminating pod's endpoints while the pod
// already has its SIGTERM.
func (s *Server) Drain() { s.draining.Store(true) }

// ErrServerClosed is what Serve returns when Shutdown came first: the
// caller asked for the stop, so it is not a failure.
var ErrServerClosed = errors.New("kvfast: front end shut down")

// Serve accepts API connections on ln until Shutdown: the OpenAI
// endpoints, /health and /ready, and the admin endpoints too when
// Config.AdminOnAPI is set.
func (s *Server) Serve(ln net.Listener) error { return s.serve(ln, false) }

// ServeAdmin accepts admin connections on ln until Shutdown: /admin/...,
// /metrics, /health and /ready. It may run beside Serve, on its own
// listener (by default a loopback address).
func (s *Server) ServeAdmin(ln net.Listener) error { return s.serve(ln, true) }

func (s *Server) serve(ln net.Listener, admin bool) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = ln.Close() // as net/http does: a listener Serve will not serve is closed
		return ErrServerClosed
	}
	s.started = true
	s.lns = append(s.lns, ln)
	s.mu.Unlock()
	limit := &s.connLimit
	if admin {
		limit = &s.adminConnLimit
	}
	err := s.http.Serve(edgeListener{Listener: ln, admin: admin, limit: limit, tlsRefused: s.tlsRefused})
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// ErrNotDrained is what Shutdown returns when handlers or streams were
// still running after it cut every connection and waited streamCutGrace:
// they wait on a silent engine and their engine calls could not be aborted,
// which happens only where client hang-ups cannot be watched
// (internal/hangup). Their guards still release their
// bookings when they end, but the node must keep what they read (the
// segment) mapped.
var ErrNotDrained = errors.New("kvfast: requests still running after shutdown cut their connections")

// Shutdown stops accepting connections and lets in-flight requests and
// streams finish until ctx ends, then cuts them and waits at most three
// times streamCutGrace more: for the cut requests to end, for their
// answers to be written, and for what is left after the connections are
// closed. It returns nil only when nothing is running any more, so that the
// caller may free what requests read. Releasing every reservation is the
// guards' job and happens on every path, cut or not.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		if !s.drainAgain() {
			return ErrNotDrained
		}
		return nil
	}
	s.closed = true
	started, lns := s.started, s.lns
	s.mu.Unlock()
	defer s.cutNow() // whatever waits under it is over by now
	if !started {
		s.hangups.Close()
		return nil
	}
	defer s.hangups.Close() // after the drain: the requests it cut stop their watches
	if s.sessions != nil {
		// The session calls' kept-alive connections to engines go with
		// the server, not at the idle timeout.
		defer s.sessions.client.CloseIdleConnections()
	}
	// fasthttp counts a connection that has not yet carried a request as
	// busy for its first five seconds: a client's or balancer's spare dial
	// would hold the shutdown that long.
	s.conns.Range(func(c net.Conn, cs *connState) bool {
		if !cs.used.Load() {
			_ = c.Close()
		}
		return true
	})
	err := s.http.ShutdownWithContext(ctx)
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		// fasthttp's wait for open connections ended with the drain's
		// deadline: whether requests were left running is said once,
		// below.
		err = nil
	}
	// A Serve that has not yet handed its listener to fasthttp left it
	// nothing to close, and would then accept forever: close them ourselves.
	for _, ln := range lns {
		_ = ln.Close()
	}
	if s.active.wait(ctx) {
		return err
	}
	err = errors.Join(err, fmt.Errorf("cannot drain in-flight requests: %w", ctx.Err()))
	// Cut them: every request still running is told (exchange.HangUp),
	// which aborts its guard and cuts its engine call, so that a handler
	// or relay waiting on an engine returns at once, a stream's client
	// getting an error event and the end of its stream, a waiting one a
	// 503. Once they have, or after streamCutGrace, the client
	// connections are closed.
	s.cutting.Store(true)
	s.cutNow()
	s.hangups.HangUpAll()
	s.drainAgain()
	s.responsesWritten(streamCutGrace)
	s.conns.Range(func(c net.Conn, _ *connState) bool { _ = c.Close(); return true })
	if !s.drainAgain() {
		s.log.Warn("shutdown returns with requests still waiting on silent engines")
		return errors.Join(err, ErrNotDrained)
	}
	return err
}

// drainAgain waits streamCutGrace for the last handlers and streams. A
// second Shutdown (or Close during a Shutdown) gets the same answer the
// first would: whether everything has stopped.
func (s *Server) drainAgain() bool {
	ctx, cancel := context.WithTimeout(context.Background(), streamCutGrace)
	defer cancel()
	return s.active.wait(ctx)
}

// streamCutGrace bounds Shutdown's wait for the streams it cut.
const streamCutGrace = time.Second

// trackConn keeps the set of open client connections, for Shutdown to cut
// the streams still running at its deadline.
// Between requests only the flag moves: the entry is made once per
// connection, so that a request costs no allocation here.
func (s *Server) trackConn(c net.Conn, st fasthttp.ConnState) {
	switch st {
	case fasthttp.StateNew:
		s.conns.Store(c, new(connState))
	case fasthttp.StateActive, fasthttp.StateIdle:
		if cs, ok := s.conns.Load(c); ok {
			cs.serving.Store(st == fasthttp.StateActive)
			cs.used.Store(true)
		}
		if st == fasthttp.StateIdle {
			s.noteIdle()
		}
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		s.conns.Delete(c)
		s.noteIdle()
	}
}

// connState is what trackConn knows of an open connection.
type connState struct{ serving, used atomic.Bool }

// serving reports whether a connection is still serving a request.
func (s *Server) serving() (busy bool) {
	s.conns.Range(func(_ net.Conn, cs *connState) bool {
		busy = cs.serving.Load()
		return !busy
	})
	return busy
}

// noteIdle tells responsesWritten when, once Shutdown cuts, no connection
// serves a request any more.
func (s *Server) noteIdle() {
	if s.cutting.Load() && !s.serving() {
		select {
		case s.connsIdle <- struct{}{}:
		default:
		}
	}
}

// responsesWritten waits up to d for every connection to finish its
// response. A cut request's relay returns before fasthttp has written the
// end of its response (the error event, the last chunk): closing the
// connections at once would cut those tails.
func (s *Server) responsesWritten(d time.Duration) {
	if !s.serving() {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.connsIdle:
	case <-t.C:
	}
}

// transportError answers requests fasthttp could not even read: a
// connection that sent no complete header within the header timeout,
// garbage, a body over the limit. They are not requests to an OpenAI
// endpoint, so they are counted apart from kvfast_requests_total
// (kvfast_http_transport_errors_total), and logged at debug level with
// the reason (and, for a body too large, the method, path and declared
// size), never their bytes.
func (s *Server) transportError(ctx *fasthttp.RequestCtx, err error) {
	var status int
	var e *openai.Error
	reason := transportMalformed
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		status, e, reason = fasthttp.StatusRequestEntityTooLarge, s.errBodyTooLarge, transportTooLarge
		lingerOnClose(ctx)
	case isTimeout(err):
		status, e, reason = fasthttp.StatusRequestTimeout, errRequestTimeout, transportTimeout
	case errors.As(err, new(*fasthttp.ErrSmallBuffer)):
		// The header outgrew the connection's read buffer: RFC 6585's
		// 431 tells the client what to shorten, where 400 says nothing.
		status, e, reason = fasthttp.StatusRequestHeaderFieldsTooLarge, errHeaderTooLarge, transportHeaderTooLarge
	default:
		status, e = fasthttp.StatusBadRequest, errUnreadableRequest
	}
	s.metrics.transport[reason].Inc()
	if s.log.Enabled(context.Background(), slog.LevelDebug) {
		args := []any{"reason", reason, "err", withoutQuotes(err.Error()), "remote", ctx.RemoteAddr().String()}
		if reason == transportTooLarge {
			// Only a body too large comes after a header that was read;
			// otherwise the header holds fasthttp's defaults (GET /),
			// which would misname the request.
			h := &ctx.Request.Header
			args = append(args, "method", string(h.Method()), "path", string(ctx.URI().Path()), "content_length", h.ContentLength())
		}
		s.log.Debug("refused a request that could not be read", args...)
	}
	writeError(ctx, status, e)
	ctx.SetConnectionClose()
}

// tlsRefused counts a connection that began a TLS handshake on a
// plain-HTTP listener, and warns (once a minute, any client can repeat it)
// with the client's address, so that an operator can find the client
// configured with https://.
func (s *Server) tlsRefused(remote net.Addr, admin bool) {
	s.metrics.transport[transportTLS].Inc()
	listener := "api"
	if admin {
		listener = "admin"
	}
	s.throttle.Log(s.log, slog.LevelWarn, "tls-on-plain-http",
		"a client began a TLS handshake on a plain-HTTP listener and was refused: its URL should be http://, or TLS terminated in front of the router",
		"listener", listener, "remote", remote.String())
}

// Reasons of kvfast_http_transport_errors_total.
const (
	transportTimeout   = "header_timeout"
	transportTooLarge  = "body_too_large"
	transportMalformed = "malformed"
	// transportHeaderTooLarge is a header that does not fit the read
	// buffer (431).
	transportHeaderTooLarge = "header_too_large"
	// transportConnLimit is exported from the listeners' connLimiters.
	transportConnLimit = "too_many_connections"
	// transportTLS is a connection that began a TLS handshake.
	transportTLS = "tls_handshake"
)

// fasthttpLogger hands fasthttp's own reports (connections it could not
// serve, the connection limit reached) to the router's structured log,
// with any credential they quote redacted. Any client can make fasthttp
// report (a garbage request line is enough, and each is also counted in
// kvfast_http_transport_errors_total), so warnings about connections are
// written at most once a minute, with the count held back.
type fasthttpLogger struct {
	log      *slog.Logger
	throttle *logthrottle.Throttle
}

func (l fasthttpLogger) Printf(format string, args ...any) {
	if format == fasthttpConnError && len(args) == 3 {
		// A client that left, or a connection the router closed itself (a
		// hang-up, a refused body, the shutdown cut), is routine: worth a
		// debug line, not a warning an operator must read.
		level := slog.LevelWarn
		if err, ok := args[2].(error); ok && clientWentAway(err) {
			level = slog.LevelDebug
		}
		// The error quotes the bytes fasthttp could not parse, which may
		// be a credential's header line: log only what went wrong.
		attrs := []any{"component", "fasthttp", "local", fmt.Sprint(args[0]),
			"remote", fmt.Sprint(args[1]), "err", withoutQuotes(fmt.Sprint(args[2]))}
		if level == slog.LevelWarn {
			l.throttle.Log(l.log, level, "connection", "cannot serve a connection", attrs...)
		} else {
			l.log.Log(context.Background(), level, "cannot serve a connection", attrs...)
		}
		return
	}
	l.log.Warn(redact(fmt.Sprintf(format, args...)), "component", "fasthttp")
}

// clientWentAway reports whether err only says that the connection was
// gone by the time fasthttp wrote to it.
func clientWentAway(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)
}

// fasthttpConnError is the format of fasthttp's report of a connection it
// stopped serving on an error (its worker pool's).
const fasthttpConnError = "error when serving connection %q<->%q: %v"

// withoutQuotes cuts an error message at its first quoted part: fasthttp
// quotes the request bytes it could not parse there.
func withoutQuotes(msg string) string {
	if i := strings.IndexByte(msg, '"'); i >= 0 {
		msg = strings.TrimRight(msg[:i], ": ") + ": (request bytes not logged)"
	}
	return redact(msg)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

var (
	errRequestTimeout    = &openai.Error{Message: "the request header was not received within the header timeout", Type: openai.TypeInvalidRequest, Code: "request_timeout"}
	errHeaderTooLarge    = &openai.Error{Message: fmt.Sprintf("the request header does not fit the router's %d KiB read buffer", readBufferBytes>>10), Type: openai.TypeInvalidRequest, Code: "header_too_large"}
	errUnreadableRequest = &openai.Error{Message: "the request could not be read as HTTP", Type: openai.TypeInvalidRequest, Code: "bad_request"}
)
