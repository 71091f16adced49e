package fastpath

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v3"
	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/dispatch"
	"github.com/kvfast/kvfast/guard"
	"github.com/kvfast/kvfast/internal/hangup"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/prompt"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
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

	MaxBodyBytes int           // largest request body (413 beyond)
	MaxTokenID   uint32        // largest accepted token id; 0 = any uint32
	ReadTimeout  time.Duration // whole request, headers and body: bounds slow clients
	IdleTimeout  time.Duration // keep-alive idle
	MaxConns     int           // concurrent client connections
	MaxRetries   int           // re-routes after a refused connection; 0: none
}

// DefaultConfig is the front end kvfast serve runs with.
func DefaultConfig() Config {
	return Config{
		QueueTimeout:     30 * time.Second,
		ApproxChunkBytes: radix.DefaultApproxChunkBytes,
		MaxBodyBytes:     openai.DefaultMaxBodyBytes,
		ReadTimeout:      30 * time.Second,
		IdleTimeout:      60 * time.Second,
		MaxConns:         10000,
		MaxRetries:       2,
	}
}

// Validate reports the first setting the front end cannot run with.
func (c *Config) Validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"queue timeout", c.QueueTimeout}, {"read timeout", c.ReadTimeout}, {"idle timeout", c.IdleTimeout}} {
		if d.v <= 0 {
			return fmt.Errorf("cannot use %s %v: must be positive", d.name, d.v)
		}
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"approx chunk bytes", c.ApproxChunkBytes}, {"max body bytes", c.MaxBodyBytes}, {"max conns", c.MaxConns}} {
		if n.v <= 0 {
			return fmt.Errorf("cannot use %s %d: must be positive", n.name, n.v)
		}
	}
	if c.MaxRetries < 0 {
		return fmt.Errorf("cannot use max retries %d: must not be negative", c.MaxRetries)
	}
	return nil
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
	// Renderers gives each model's prompt renderer, which turns text and
	// chat prompts into token ids; nil, or a nil renderer for a model,
	// routes that model's text and chat prompts approximately.
	Renderers Renderers
	// State gives /admin/workers and /metrics the node's snapshot.
	State  State
	Logger *slog.Logger
	// Settled, if set, is closed once the node's start-up has settled:
	// its configured and registered workers are routable, their models
	// known, and its index is safe to route on. Until then /ready answers
	// 503, and a request naming a model no worker serves yet waits for it
	// (within the queue timeout) rather than getting 404. nil: settled.
	Settled <-chan struct{}
}

// Renderers resolves a model's prompt renderer (package prompt's
// Registry). The front end asks when the worker set changes, never per
// request.
type Renderers interface {
	Renderer(model string) prompt.Renderer
}

// State is the node's view of itself, as operators see it.
type State interface {
	Snapshot() Snapshot
}

// Server is the HTTP front end: it parses, routes, books and relays.
type Server struct {
	cfg     Config
	log     *slog.Logger
	index   *radix.Index
	approx  *radix.Approx
	sched   *sched.Scheduler
	guards  *guard.Pool
	engines *dispatch.Pool
	state   State
	parser  openai.Parser
	metrics *metrics
	http    *fasthttp.Server

	useApprox bool
	renderers Renderers
	settled   <-chan struct{} // Deps.Settled
	seeds     atomic.Pointer[map[string]modelNamespace]
	modelsMu  sync.Mutex        // serialises rebuilds of seeds
	adapters  map[string]string // LoRA adapter -> base model; under modelsMu

	metricsOnce sync.Once
	metricsHTTP fasthttp.RequestHandler

	exchanges sync.Pool
	hangups   *hangup.Watcher                  // nil where client hang-ups cannot be watched
	active    *activity                        // handlers running and streams being relayed
	conns     *xsync.MapOf[net.Conn, struct{}] // open client connections, cut at the shutdown deadline
	requestID atomic.Uint64

	mu      sync.Mutex
	started bool
	closed  bool
	ln      net.Listener
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
	s := &Server{cfg: cfg, log: deps.Logger, index: deps.Index, approx: deps.Approx, sched: deps.Sched,
		engines: deps.Engines, state: deps.State, useApprox: deps.UseApprox, renderers: deps.Renderers, settled: deps.Settled,
		conns: xsync.NewMapOf[net.Conn, struct{}](), active: newActivity()}
	s.parser = openai.Parser{MaxBodyBytes: cfg.MaxBodyBytes, MaxTokenID: cfg.MaxTokenID}
	s.metrics = newMetrics(s)
	s.guards = guard.NewPool(s.sched, guard.Observer{Finished: s.metrics.observeFinished})
	s.exchanges.New = func() any { return newExchange(s) }
	if w, err := hangup.New(); err == nil {
		s.hangups = w
	} else {
		s.log.Warn("clients that leave are noticed only when their answer is written", "err", err)
	}
	s.WorkersChanged()
	s.http = &fasthttp.Server{
		Handler:               s.handle,
		ErrorHandler:          s.transportError,
		Logger:                fasthttpLogger{s.log},
		ConnState:             s.trackConn,
		Name:                  "kvfast",
		MaxRequestBodySize:    cfg.MaxBodyBytes,
		ReadTimeout:           cfg.ReadTimeout,
		IdleTimeout:           cfg.IdleTimeout,
		Concurrency:           cfg.MaxConns,
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		CloseOnShutdown:       true,
	}
	return s, nil
}

// ErrServerClosed is what Serve returns when Shutdown came first: the
// caller asked for the stop, so it is not a failure.
var ErrServerClosed = errors.New("kvfast: front end shut down")

// Serve accepts connections on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.started || s.closed {
		closed := s.closed
		s.mu.Unlock()
		_ = ln.Close() // as net/http does: a listener Serve will not serve is closed
		if closed {
			return ErrServerClosed
		}
		return errors.New("cannot serve: the front end is already serving")
	}
	s.started = true
	s.ln = ln
	s.mu.Unlock()
	err := s.http.Serve(ln)
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
// streams finish until ctx ends, then cuts them and waits streamCutGrace
// more. It returns nil only when nothing is running any more, so that the
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
	started, ln := s.started, s.ln
	s.mu.Unlock()
	if !started {
		s.hangups.Close()
		return nil
	}
	defer s.hangups.Close() // after the drain: the requests it cut stop their watches
	err := s.http.ShutdownWithContext(ctx)
	// A Serve that has not yet handed ln to fasthttp left it nothing to
	// close, and would then accept forever: close ln ourselves.
	_ = ln.Close()
	if s.active.wait(ctx) {
		return err
	}
	err = errors.Join(err, fmt.Errorf("cannot drain in-flight requests: %w", ctx.Err()))
	// Cut them: every request still running is told its client is gone
	// (exchange.HangUp), which aborts its guard and its engine call, so
	// that a handler or relay waiting on a silent engine returns at once;
	// then the client connections are closed.
	s.hangups.HangUpAll()
	s.conns.Range(func(c net.Conn, _ struct{}) bool { _ = c.Close(); return true })
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
func (s *Server) trackConn(c net.Conn, st fasthttp.ConnState) {
	switch st {
	case fasthttp.StateNew:
		s.conns.Store(c, struct{}{})
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		s.conns.Delete(c)
	}
}

// transportError answers requests fasthttp could not even read: a body over
// the limit, a timeout reading a slow client's headers, garbage.
func (s *Server) transportError(ctx *fasthttp.RequestCtx, err error) {
	var status int
	var e *openai.Error
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		status, e = fasthttp.StatusRequestEntityTooLarge, openai.ErrBodyTooLarge
	case isTimeout(err):
		status, e = fasthttp.StatusRequestTimeout, errRequestTimeout
	default:
		status, e = fasthttp.StatusBadRequest, errUnreadableRequest
	}
	s.metrics.count(openai.APICompletions, statusClientError)
	writeError(ctx, status, e)
	ctx.SetConnectionClose()
}

// fasthttpLogger hands fasthttp's own reports (connections it could not
// serve, the connection limit reached) to the router's structured log.
type fasthttpLogger struct{ log *slog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	l.log.Warn(fmt.Sprintf(format, args...), "component", "fasthttp")
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

var (
	errRequestTimeout    = &openai.Error{Message: "the request was not received within the read timeout", Type: openai.TypeInvalidRequest, Code: "request_timeout"}
	errUnreadableRequest = &openai.Error{Message: "the request could not be read as HTTP", Type: openai.TypeInvalidRequest, Code: "bad_request"}
)
