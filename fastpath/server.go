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
	"github.com/kvfast/kvfast/feed"
	"github.com/kvfast/kvfast/guard"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/shm"
)

// Config assembles a router. The zero value of every optional field is a
// sane default; see cmd/kvfast serve for the operator-facing flags.
type Config struct {
	// Index answers "which worker caches this prefix". With a segment it is
	// the segment's index, fed by engines' events; nil means a heap index
	// of IndexCapacity blocks that only static configuration feeds.
	Segment *shm.Segment
	// Ingester, when set, applies the segment's event rings to the index;
	// the server runs it (as ingester or standby) for its lifetime.
	Ingester      *feed.Ingester
	IndexCapacity int

	Sched    sched.Config
	Dispatch dispatch.Config

	// Policy picks how a worker is chosen: kv (default), approx,
	// round-robin, random or least-loaded.
	Policy string
	// ApproxTTL is how long the approximate index trusts a routing decision
	// (default 2 minutes); ApproxCapacity bounds its assumptions (default
	// 1M (worker, block) pairs); ApproxChunkBytes is the text chunk size
	// for text and chat prompts (default 64).
	ApproxTTL        time.Duration
	ApproxCapacity   int
	ApproxChunkBytes int

	// Static lists engines that are not in the segment's registry: they
	// publish no events, or publish them over ZMQ (StaticWorker.Events).
	Static []StaticWorker
	// RegistryPoll is how often the segment's registry and load pages are
	// read into the worker set (default 100 ms).
	RegistryPoll time.Duration

	// QueueTimeout bounds a request's wait in the admission queue (default
	// 30s); past it the request is refused with 503 and Retry-After.
	QueueTimeout time.Duration

	// Direct requires every request to name its worker (an external picker
	// already chose); the router only forwards and accounts.
	Direct bool

	// Limits.
	MaxBodyBytes    int           // default 16 MiB
	MaxTokenID      uint32        // largest accepted token id; 0 = any uint32
	ReadTimeout     time.Duration // whole request, headers and body (default 30s): bounds slow clients
	IdleTimeout     time.Duration // keep-alive idle (default 60s)
	MaxConns        int           // concurrent client connections (default 10000)
	MaxRetries      int           // re-routes after a refused connection: 0 means the default 2, negative means none
	ShutdownTimeout time.Duration // drain deadline for in-flight streams (default 30s)

	Logger *slog.Logger
}

// StaticWorker is an engine named in configuration rather than the registry.
type StaticWorker struct {
	ID       uint64
	DPRank   uint32
	Endpoint string // host:port or http://host:port
	Model    string
	KVBlocks uint64

	// Events is the engine's ZMQ KV-event PUB socket (tcp://host:port),
	// for engines that publish vLLM's wire format (stock vLLM and SGLang);
	// "" means the engine publishes no events. Replay is its optional
	// replay ROUTER socket, and Topic the subscription prefix.
	Events string
	Replay string
	Topic  string
}

func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.ApproxTTL, 2*time.Minute)
	def(&c.RegistryPoll, 100*time.Millisecond)
	def(&c.ReadTimeout, 30*time.Second)
	def(&c.IdleTimeout, 60*time.Second)
	def(&c.ShutdownTimeout, 30*time.Second)
	def(&c.QueueTimeout, 30*time.Second)
	if c.ApproxCapacity <= 0 {
		c.ApproxCapacity = 1 << 20
	}
	if c.ApproxChunkBytes <= 0 {
		c.ApproxChunkBytes = DefaultApproxChunkBytes
	}
	if c.IndexCapacity <= 0 {
		c.IndexCapacity = 1 << 20
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 10000
	}
	if c.MaxRetries < 0 {
		c.MaxRetries = 0
	} else if c.MaxRetries == 0 {
		c.MaxRetries = 2
	}
	if c.Policy == "" {
		c.Policy = "kv"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Server is the router: the HTTP front end and everything behind it.
type Server struct {
	cfg      Config
	log      *slog.Logger
	index    *radix.Index
	approx   *radix.Approx
	ingester *feed.Ingester
	seg      *shm.Segment
	sched    *sched.Scheduler
	guards   *guard.Pool
	engines  *dispatch.Pool
	parser   Parser
	metrics  *metrics
	http     *fasthttp.Server

	useApprox atomic.Bool // policy "approx": route on the router's own history
	seeds     atomic.Pointer[map[string]modelNamespace]
	static    radix.WorkerSet                       // slots configured statically
	zmq       [radix.MaxWorkers]*feed.ZMQSubscriber // static workers' event feeds, by slot

	metricsOnce sync.Once
	metricsHTTP fasthttp.RequestHandler

	exchanges sync.Pool
	inflight  sync.WaitGroup                   // streams still being relayed
	conns     *xsync.MapOf[net.Conn, struct{}] // open client connections, cut at the shutdown deadline
	requestID atomic.Uint64

	stop     context.CancelFunc
	bg       sync.WaitGroup
	mu       sync.Mutex
	started  bool
	closed   bool
	ln       net.Listener
	regState [radix.MaxWorkers]regEntry
}

// New builds a router from cfg. It starts nothing; call Serve.
func New(cfg Config) (*Server, error) {
	cfg = cfg.withDefaults()
	s := &Server{cfg: cfg, log: cfg.Logger, seg: cfg.Segment, ingester: cfg.Ingester,
		conns: xsync.NewMapOf[net.Conn, struct{}]()}
	policy, approx, err := sched.ParsePolicy(cfg.Policy)
	if err != nil {
		return nil, err
	}
	cfg.Sched.Policy = policy
	s.useApprox.Store(approx)
	if s.seg != nil {
		s.index = s.seg.Index()
	} else {
		if s.index, err = radix.NewHeap(radix.Config{Capacity: cfg.IndexCapacity}); err != nil {
			return nil, fmt.Errorf("cannot create the index: %w", err)
		}
	}
	if s.approx, err = radix.NewApprox(radix.Config{Capacity: cfg.ApproxCapacity}, cfg.ApproxTTL); err != nil {
		return nil, fmt.Errorf("cannot create the approximate index: %w", err)
	}
	if s.sched, err = sched.New(cfg.Sched); err != nil {
		return nil, err
	}
	s.parser = Parser{MaxBodyBytes: cfg.MaxBodyBytes, MaxTokenID: cfg.MaxTokenID}
	s.metrics = newMetrics(s)
	s.guards = guard.NewPool(s.sched, guard.Observer{Finished: s.metrics.observeFinished})
	dcfg := cfg.Dispatch
	userHook := dcfg.Health.OnChange
	dcfg.Health.OnChange = func(slot radix.WorkerSlot, addr string, healthy bool) {
		s.sched.SetHealthy(slot, healthy)
		s.log.Warn("engine health changed", "slot", slot, "addr", addr, "healthy", healthy)
		if userHook != nil {
			userHook(slot, addr, healthy)
		}
	}
	s.engines = dispatch.NewPool(dcfg)
	s.exchanges.New = func() any { return newExchange(s) }
	s.seeds.Store(&map[string]modelNamespace{})
	if err := s.addStatic(cfg.Static); err != nil {
		s.engines.Close()
		return nil, err
	}
	s.http = &fasthttp.Server{
		Handler:                       s.handle,
		ErrorHandler:                  s.transportError,
		Logger:                        fasthttpLogger{s.log},
		ConnState:                     s.trackConn,
		Name:                          "kvfast",
		MaxRequestBodySize:            cfg.MaxBodyBytes,
		ReadTimeout:                   cfg.ReadTimeout,
		IdleTimeout:                   cfg.IdleTimeout,
		Concurrency:                   cfg.MaxConns,
		DisableHeaderNamesNormalizing: false,
		NoDefaultServerHeader:         true,
		NoDefaultDate:                 true,
		CloseOnShutdown:               true,
		ReduceMemoryUsage:             false,
	}
	return s, nil
}

// Scheduler exposes the scheduler, for runtime tuning (cost parameters,
// busy thresholds, policy) and tests.
func (s *Server) Scheduler() *sched.Scheduler { return s.sched }

// Index is the exact (event-fed) index.
func (s *Server) Index() *radix.Index { return s.index }

// Serve accepts connections on ln until Shutdown. It also runs the
// background loops: registry sync, approximate-index expiry and, when
// configured, event ingestion (the segment's rings, and one ZMQ
// subscriber per static worker with an Events endpoint).
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.started || s.closed {
		s.mu.Unlock()
		_ = ln.Close() // as net/http does: a listener Serve will not serve is closed
		return errors.New("kvfast: server already started or shut down")
	}
	s.started = true
	s.ln = ln
	ctx, cancel := context.WithCancel(context.Background())
	s.stop = cancel
	// Count the background goroutines before Shutdown can see started:
	// a WaitGroup must not be added to while Shutdown waits on it.
	const loops = 3 // registry, approx expiry, ZMQ feeds
	s.bg.Add(loops)
	if s.ingester != nil {
		s.bg.Add(1)
	}
	s.mu.Unlock()

	s.syncRegistry()
	go s.registryLoop(ctx)
	go s.approxLoop(ctx)
	go s.runZMQ(ctx)
	if s.ingester != nil {
		go func() {
			defer s.bg.Done()
			if err := s.ingester.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				s.log.Error("event ingestion stopped", "err", err)
			}
		}()
	}
	s.log.Info("router listening", "addr", ln.Addr().String(), "policy", s.cfg.Policy, "direct", s.cfg.Direct)
	err := s.http.Serve(ln)
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// runZMQ runs one subscriber per static worker with an event socket. The
// index may live in a segment that several routers share, and only the
// elected ingester may write it, so with a segment the subscribers start
// once this process holds the ingester role (which it keeps until
// shutdown).
func (s *Server) runZMQ(ctx context.Context) {
	defer s.bg.Done()
	feeds := false
	for _, sub := range s.zmq {
		feeds = feeds || sub != nil
	}
	if !feeds {
		return
	}
	if s.seg != nil {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for s.ingester == nil || !s.ingester.Stats().Ingesting {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}
	var wg sync.WaitGroup
	for _, sub := range s.zmq {
		if sub == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := sub.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				s.log.Error("ZMQ event feed stopped", "endpoint", sub.Config().Endpoint, "err", err)
			}
		}()
	}
	wg.Wait()
}

// ListenAndServe listens on addr (host:port) and serves.
func (s *Server) ListenAndServe(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %w", addr, err)
	}
	return s.Serve(ln)
}

// Shutdown stops accepting connections, lets in-flight requests and
// streams finish until ctx ends (then cuts them), stops the background
// loops and closes the engine pool. Releasing every reservation is the
// guards' job and happens on every path, cut or not.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	started, ln := s.started, s.ln
	s.mu.Unlock()
	var err error
	if started {
		err = s.http.ShutdownWithContext(ctx)
		// A Serve that has not yet handed ln to fasthttp left it nothing
		// to close, and would then accept forever: close ln ourselves.
		_ = ln.Close()
		// Streams run on their own goroutines; wait for them too.
		done := make(chan struct{})
		go func() { s.inflight.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			err = errors.Join(err, fmt.Errorf("cannot drain in-flight streams: %w", ctx.Err()))
			// Cut them: a relay fails at its next write to its closed
			// client, cancels its engine request and aborts its guard.
			// (Closing the engine pool does not reach connections in
			// use.) A relay waiting on a silent engine notices only at
			// its idle timeout, so the wait for the cut is bounded.
			s.conns.Range(func(c net.Conn, _ struct{}) bool { _ = c.Close(); return true })
			select {
			case <-done:
			case <-time.After(streamCutGrace):
				s.log.Warn("shutdown returns with streams still waiting on silent engines")
			}
		}
		s.stop()
		s.bg.Wait()
	}
	s.engines.Close()
	return err
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
	var e *RequestError
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		status, e = fasthttp.StatusRequestEntityTooLarge, ErrBodyTooLarge
	case isTimeout(err):
		status, e = fasthttp.StatusRequestTimeout, errRequestTimeout
	default:
		status, e = fasthttp.StatusBadRequest, errUnreadableRequest
	}
	s.metrics.count(APICompletions, statusClientError)
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
	errRequestTimeout    = &RequestError{Message: "the request was not received within the read timeout", Type: invalidRequest, Code: "request_timeout"}
	errUnreadableRequest = &RequestError{Message: "the request could not be read as HTTP", Type: invalidRequest, Code: "bad_request"}
)
