package dispatch

import (
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfast/kvfast/internal/clock"
	"github.com/kvfast/kvfast/internal/redact"
	"github.com/kvfast/kvfast/workers"
	"github.com/valyala/fasthttp"
)

// Timeouts bound each step of a forwarded request. Zero picks the default;
// a negative value disables the timeout.
type Timeouts struct {
	// Connect bounds establishing a TCP connection to the engine.
	// Default 2s: engines sit on this node or its network, so a slow
	// connect means a dead engine and the request had better go elsewhere.
	Connect time.Duration
	// Write bounds sending the request. Default 30s.
	Write time.Duration
	// FirstByte bounds the wait from sending the request to the end of the
	// response's headers, as one deadline however slowly they come, and
	// for a 2xx event stream to its body's first bytes (vLLM sends a
	// stream's headers at once and its first event after queueing and
	// prefill). A non-streaming response arrives whole, so this must cover
	// queueing and the whole generation. Default 10m.
	FirstByte time.Duration
	// Idle bounds every later pause between reads of the response. It
	// also bounds how long one event of a
	// stream, or a plain answer's whole body, takes to arrive from its
	// first byte: an engine dribbling one, each byte resetting the pause,
	// would otherwise hold the request for as long as it dribbles.
	// Default 2m.
	Idle time.Duration
}

// HealthConfig sets the active health checks: GET Path on every engine each
// Interval; FailAfter consecutive failures make the engine unhealthy,
// RecoverAfter consecutive successes (2xx) healthy again. The pool keeps no
// healthy set of its own: OnChange tells the one the caller selects with.
type HealthConfig struct {
	Path         string        // default "/health"
	Interval     time.Duration // default 2s; negative disables checks
	Timeout      time.Duration // default 1s
	FailAfter    int           // default 2
	RecoverAfter int           // default 1
	// OnChange, if set, is called after an engine's routability flips,
	// with the new state: routable means passing the active checks and not
	// ejected by passive health (OutlierConfig). Calls for one engine are
	// serialised and in order, and none comes after Remove returned. It
	// must not call Pool.Add, Remove or Close. cause says why an engine
	// turned unroutable, for the operator: the failed check's error or
	// status, or the refused connection of a request. It is nil when the
	// engine turns routable, and for an ejection, which Engine.Outlier
	// describes.
	OnChange func(slot workers.Slot, addr string, healthy bool, cause error)
}

// Config configures a Pool.
type Config struct {
	Timeouts Timeouts
	Health   HealthConfig
	Outlier  OutlierConfig
	// MaxConnsPerEngine bounds the connections, so the concurrent
	// requests, to one engine. Default 1024.
	MaxConnsPerEngine int
	// MaxIdleConnDuration closes pooled connections idle this long. The
	// default, 3s, stays under the 5s keep-alive of vLLM's HTTP server, so
	// the router, not the engine, closes idle connections, and a request
	// rarely lands on a connection the engine is closing.
	MaxIdleConnDuration time.Duration
	// RelayBufferSize is the per-call buffer streams are relayed through.
	// An event larger than this is relayed but not inspected. Default 16 KiB.
	RelayBufferSize int
	// MaxResponseBodySize bounds a non-streaming response read with
	// Call.ReadBody. Default 64 MiB.
	MaxResponseBodySize int
	// ResponseBudgetBytes bounds the bytes of non-streaming responses
	// held at once over all calls, beyond each call's relay buffer (what
	// ReadBody grows it by), so that many large answers at once cannot
	// take the router's memory. Default 256 MiB.
	ResponseBudgetBytes int64
	// EngineToken, when not empty, is the bearer token every request to an
	// engine carries (Authorization: Bearer EngineToken): forwarded
	// requests, in place of whatever the client sent, and health checks.
	// Engines started with an API key of their own (vLLM's and SGLang's
	// --api-key) then need not share it with clients. Empty: a forwarded
	// request carries the client's Authorization, if the caller copies it.
	EngineToken string
}

// withDefaults fills the zero fields of c from DefaultConfig, and maps a
// negative timeout to 0, which fasthttp and engineConn read as "no limit".
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	dur := func(v *time.Duration, def time.Duration) {
		switch {
		case *v == 0:
			*v = def
		case *v < 0:
			*v = 0
		}
	}
	dur(&c.Timeouts.Connect, d.Timeouts.Connect)
	dur(&c.Timeouts.Write, d.Timeouts.Write)
	dur(&c.Timeouts.FirstByte, d.Timeouts.FirstByte)
	dur(&c.Timeouts.Idle, d.Timeouts.Idle)
	if c.Health.Path == "" {
		c.Health.Path = d.Health.Path
	}
	if c.Health.Interval == 0 {
		c.Health.Interval = d.Health.Interval
	}
	pos := func(v *time.Duration, def time.Duration) {
		if *v <= 0 {
			*v = def
		}
	}
	pos(&c.Health.Timeout, d.Health.Timeout)
	pos(&c.MaxIdleConnDuration, d.MaxIdleConnDuration)
	posInt := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	posInt(&c.Health.FailAfter, d.Health.FailAfter)
	posInt(&c.Health.RecoverAfter, d.Health.RecoverAfter)
	posInt(&c.MaxConnsPerEngine, d.MaxConnsPerEngine)
	posInt(&c.RelayBufferSize, d.RelayBufferSize)
	posInt(&c.MaxResponseBodySize, d.MaxResponseBodySize)
	if c.ResponseBudgetBytes <= 0 {
		c.ResponseBudgetBytes = d.ResponseBudgetBytes
	}
	o, do := &c.Outlier, d.Outlier
	for _, v := range []struct {
		v   *int
		def int
	}{{&o.Consecutive, do.Consecutive}, {&o.FailurePercent, do.FailurePercent},
		{&o.MaxEjectedPercent, do.MaxEjectedPercent}} {
		switch {
		case *v.v == 0:
			*v.v = v.def
		case *v.v < 0:
			*v.v = 0 // off
		}
	}
	posInt(&o.MinRequests, do.MinRequests)
	pos(&o.Window, do.Window)
	pos(&o.BaseEjection, do.BaseEjection)
	pos(&o.MaxEjection, do.MaxEjection)
	o.MaxEjection = max(o.MaxEjection, o.BaseEjection)
	return c
}

// Pool holds one Engine per occupied worker slot: its pooled connections
// and its health. Lookups are lock-free; Add and Remove are serialised.
type Pool struct {
	cfg     Config
	engines [workers.Max]atomic.Pointer[Engine]
	mu      sync.Mutex // serialises Add, Remove and Close
	calls   sync.Pool
	closed  bool

	ejectMu sync.Mutex     // guards ejected; taken inside an engine's healthMu
	ejected map[uint32]int // engines ejected now, by ejection group (OutlierConfig.MaxEjectedPercent)

	responseBytes atomic.Int64 // held against ResponseBudgetBytes

	throttled atomic.Uint64 // workers.Set of engines whose 429 may still hold (Throttled)

	authorization []byte // "Bearer " + cfg.EngineToken; nil without one
}

// HeaderDataParallelRank names the data-parallel rank a request is for.
// vLLM's and SGLang's API servers, fronting several ranks with internal
// load balancing, send a request carrying it to that rank (vLLM reads it
// case-insensitively; SGLang's DataParallelController honours it).
const HeaderDataParallelRank = "X-Data-Parallel-Rank"

// PinRank makes every request to slot's engine carry
// HeaderDataParallelRank with rank, or none with rank < 0. A router that chose one rank of an API
// server fronting several must say which, or the server balances the
// request onto whichever rank it likes, and the rank whose cache was
// chosen is not the one that serves it.
func (p *Pool) PinRank(slot workers.Slot, rank int64) {
	if e := p.Engine(slot); e != nil {
		e.dpRank.Store(rank)
	}
}

// EngineToken returns Config.EngineToken, for the caller's own requests
// to the engines (SGLang's session calls).
func (p *Pool) EngineToken() string { return p.cfg.EngineToken }

// ResponseBytes is what the pool's calls hold of ResponseBudgetBytes now.
func (p *Pool) ResponseBytes() int64 { return p.responseBytes.Load() }

// NewPool returns an empty pool.
func NewPool(cfg Config) *Pool {
	p := &Pool{cfg: cfg.withDefaults()}
	if p.cfg.EngineToken != "" {
		p.authorization = []byte("Bearer " + p.cfg.EngineToken)
	}
	p.calls.New = func() any { return newCall(p) }
	return p
}

// Engine is one engine endpoint behind one worker slot.
type Engine struct {
	slot   workers.Slot
	addr   string
	pool   *Pool
	client *fasthttp.HostClient

	healthMu sync.Mutex // orders health transitions and their callbacks
	healthy  bool       // the active checks' last verdict; guarded by healthMu
	routable bool       // healthy and not ejected, as last reported; guarded by healthMu
	out      outlier    // passive health
	stop     chan struct{}
	done     chan struct{}
	// dpRank, when not negative, goes with every request to the engine as
	// X-Data-Parallel-Rank (PinRank).
	dpRank atomic.Int64
	// conns are the engine's open connections, idle or carrying a
	// request, for Abandon to close.
	conns connSet
	// ejectGroup is the engines that can stand in for this one
	// (SetEjectionGroup); MaxEjectedPercent bounds each group apart.
	ejectGroup atomic.Uint32
	// throttledUntil is the clock time until which the engine's 429s asked
	// not to be sent requests; throttles counts those 429s (throttle.go).
	throttledUntil atomic.Int64
	throttles      atomic.Uint64
}

// SetEjectionGroup puts e among the engines that can stand in for one
// another: MaxEjectedPercent bounds the ejected share of each group apart,
// so that encoders or prefill engines cannot make room for ejecting the
// last engine that generates. The router groups engines by their role in
// disaggregated serving. All start in group 0.
func (e *Engine) SetEjectionGroup(g uint32) { e.ejectGroup.Store(g) }

// Add registers the engine at addr (host:port) in slot and starts its health
// checks. Re-adding the same address is a no-op; a different address
// replaces the slot's engine, whose in-flight requests run to their end.
// A new engine starts healthy, so that traffic need not wait for a check.
func (p *Pool) Add(slot workers.Slot, addr string) (*Engine, error) {
	if !slot.Valid() {
		return nil, fmt.Errorf("cannot add engine %s: worker slot %d is out of range", addr, slot)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("cannot add engine %q to slot %d: %w", addr, slot, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, fmt.Errorf("cannot add engine %s to slot %d: the pool is closed", addr, slot)
	}
	if old := p.engines[slot].Load(); old != nil {
		if old.addr == addr {
			return old, nil
		}
		p.removeLocked(slot)
	}
	e := &Engine{slot: slot, addr: addr, pool: p, healthy: true, routable: true}
	e.dpRank.Store(-1)
	e.out.windowStart.Store(clock.Now())
	t := p.cfg.Timeouts
	e.client = &fasthttp.HostClient{
		Addr: addr,
		Dial: func(addr string) (net.Conn, error) {
			return dialEngine(addr, t.Connect, t.FirstByte, t.Idle, &e.conns)
		},
		MaxConns:                      p.cfg.MaxConnsPerEngine,
		MaxIdleConnDuration:           p.cfg.MaxIdleConnDuration,
		WriteTimeout:                  t.Write,
		StreamResponseBody:            true,
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: true,
		DisablePathNormalizing:        true,
		// A malformed answer's bytes stay out of the error text, which the
		// log carries: an engine may echo a request's key or prompt.
		SecureErrorLogMessage: true,
	}
	p.engines[slot].Store(e)
	if p.cfg.Health.Interval > 0 {
		e.stop, e.done = make(chan struct{}), make(chan struct{})
		go e.checkHealth()
	}
	return e, nil
}

// Remove unregisters slot's engine, stops its health checks and closes its
// idle connections. In-flight requests to it run to their end.
func (p *Pool) Remove(slot workers.Slot) {
	if !slot.Valid() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.removeLocked(slot)
}

// Abandon removes slot's engine, as Remove, and closes every connection
// it has, so that the requests it is running fail now, as they would had
// the engine died: for an engine the router has learned is gone (its
// heartbeat went stale, a new process took its registration), whose
// requests would otherwise wait out the first-byte or idle timeout. A
// request that has sent its client nothing yet may then go to another
// worker (IsRetryable); a stream already under way ends with an error
// event.
func (p *Pool) Abandon(slot workers.Slot) {
	if !slot.Valid() {
		return
	}
	p.mu.Lock()
	e := p.engines[slot].Load()
	p.removeLocked(slot)
	p.mu.Unlock()
	if e != nil {
		e.conns.closeAll()
	}
}

func (p *Pool) removeLocked(slot workers.Slot) {
	e := p.engines[slot].Load()
	if e == nil {
		return
	}
	// Under healthMu, so that a verdict being recorded cannot reach OnChange
	// after the engine left.
	e.healthMu.Lock()
	p.engines[slot].Store(nil)
	e.endEjectionLocked()
	e.healthMu.Unlock()
	if e.stop != nil {
		close(e.stop)
		<-e.done
	}
	e.client.CloseIdleConnections()
}

// Close removes every engine.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for s := range p.engines {
		p.removeLocked(workers.Slot(s))
	}
}

// Engine returns slot's engine, or nil.
func (p *Pool) Engine(slot workers.Slot) *Engine {
	if !slot.Valid() {
		return nil
	}
	return p.engines[slot].Load()
}

// setHealthy records an active health verdict and reports a flip. A
// removed engine's late verdict is dropped, so it cannot mark the slot
// healthy again.
func (e *Engine) setHealthy(h bool, cause error) {
	e.healthMu.Lock()
	defer e.healthMu.Unlock()
	if e.healthy == h || e.pool.engines[e.slot].Load() != e {
		return
	}
	e.healthy = h
	e.reportLocked(cause)
}

// reportLocked tells OnChange when e's routability (active health passing
// and no ejection) flipped. Both kinds of verdict go through here, so the
// selector sees one bit per engine and a passing /health cannot undo an
// ejection.
func (e *Engine) reportLocked(cause error) {
	r := e.healthy && !e.out.ejected.Load()
	if r == e.routable {
		return
	}
	e.routable = r
	if r {
		cause = nil
	}
	if f := e.pool.cfg.Health.OnChange; f != nil {
		f(e.slot, e.addr, r, cause)
	}
}

// connectFailed is the passive half of health checking: a refused connection
// is as clear a verdict as a failed check, so with active checks running to
// bring the engine back, take it out of selection at once.
func (e *Engine) connectFailed(cause error) {
	if e.stop != nil {
		e.setHealthy(false, cause)
	}
}

// checkHealth runs the active checks of one engine until Remove.
func (e *Engine) checkHealth() {
	defer close(e.done)
	cfg := e.pool.cfg.Health
	client := &fasthttp.HostClient{
		Addr:                     e.addr,
		MaxConns:                 1,
		ReadTimeout:              cfg.Timeout,
		WriteTimeout:             cfg.Timeout,
		MaxIdleConnDuration:      cfg.Interval + cfg.Timeout,
		NoDefaultUserAgentHeader: true,
		SecureErrorLogMessage:    true, // as the engine's request client
		MaxResponseBodySize:      64 << 10,
		// The system's dialer, as forwarding's (dialEngine): fasthttp's
		// DialTimeout dials IPv4 only, so an engine at [::1]:8000 failed
		// every check and never took a request.
		DialTimeout: func(addr string, timeout time.Duration) (net.Conn, error) {
			return net.DialTimeout("tcp", addr, timeout)
		},
	}
	defer client.CloseIdleConnections()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodGet)
	req.SetRequestURI(cfg.Path)
	req.Header.SetHost(e.addr)
	if a := e.pool.authorization; a != nil {
		req.Header.SetBytesV(fasthttp.HeaderAuthorization, a)
	}

	ticker := time.NewTicker(cfg.Interval)
	defer ticker.Stop()
	fails, oks := 0, 0
	proven := false // a check has passed since Add
	for {
		err := client.DoTimeout(req, resp, cfg.Timeout)
		if err == nil && resp.StatusCode() >= 200 && resp.StatusCode() < 300 {
			fails, oks, proven = 0, oks+1, true
			if oks >= cfg.RecoverAfter {
				e.setHealthy(true, nil)
			}
		} else {
			fails, oks = fails+1, 0
			// An engine that has never passed a check is not given
			// FailAfter tries: it is presumed healthy only until its
			// first check says otherwise, so /ready does not report a
			// router ready on engines it cannot reach.
			if fails >= cfg.FailAfter || !proven {
				if err == nil {
					err = fmt.Errorf("health check GET %s answered status %d", cfg.Path, resp.StatusCode())
				} else {
					err = fmt.Errorf("health check GET %s: %w", cfg.Path, redact.AnswerError(err))
				}
				e.setHealthy(false, err)
			}
		}
		select {
		case <-e.stop:
			return
		case <-ticker.C:
		}
	}
}

// RefuseRedirects is the CheckRedirect of every net/http client that calls
// an engine (its /v1/models, SGLang's session calls): a redirect is
// answered as the engine's response, never followed, since following it
// would send the engines' key (--engine-api-key-file) wherever an engine
// points, and ask that address what only the engine may answer.
func RefuseRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// EngineHTTPClient is the net/http client of the router's own calls to
// engines (their /v1/models, SGLang's session calls), each bounded by
// timeout. It refuses redirects (RefuseRedirects) and, unlike net/http's
// default, ignores HTTP_PROXY and its kin: the engines are the router's
// neighbours, a proxy would be handed the engines' key, and a health
// judged through one would be the proxy's.
func EngineHTTPClient(timeout time.Duration) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	return &http.Client{Transport: tr, Timeout: timeout, CheckRedirect: RefuseRedirects}
}
