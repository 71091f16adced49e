package fastpath

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/dispatch"
	"github.com/kvfast/kvfast/guard"
	"github.com/kvfast/kvfast/internal/logthrottle"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
)

// Sticky sessions. A request names its session in HeaderSession; the
// first one routes normally and claims the session for the worker and
// rank chosen (claimSession), a claim that becomes its binding when the
// engine accepts the request, in the bindings table every router on the
// segment shares (shm.Bindings). Later requests of the session are pinned to that
// worker while it is eligible, and refresh the binding; a binding idle
// for SessionConfig.TTL expires. docs/routing.md has the rules.

// HeaderSession names a request's sticky session: any string of up to
// maxSessionIDBytes bytes. SGLang's open_session and close_session get it
// as their session_id.
const HeaderSession = "X-Kvfast-Session-Id"

const maxSessionIDBytes = 256

// SessionConfig configures sticky sessions.
type SessionConfig struct {
	// TTL is how long a binding lives without a request of its session.
	// 0 turns sticky sessions off (HeaderSession is ignored).
	TTL time.Duration
	// BusyUnbindAfter moves a session off a worker that has stayed over a
	// busy threshold this long. A shorter overload is transient: the
	// session's requests wait in the admission queue for their worker,
	// where its KV is, and one still waiting when the worker has been
	// busy this long moves too. 0: a busy worker never loses its sessions.
	BusyUnbindAfter time.Duration
	// ControlTimeout bounds one open_session or close_session call.
	ControlTimeout time.Duration
}

// DefaultSessionConfig is what kvfast serve runs with.
func DefaultSessionConfig() SessionConfig {
	return SessionConfig{TTL: 10 * time.Minute, BusyUnbindAfter: 30 * time.Second, ControlTimeout: 5 * time.Second}
}

func (c *SessionConfig) validate() error {
	if c.TTL < 0 {
		return fmt.Errorf("cannot use --session-ttl %v: must not be negative (0: no sticky sessions)", c.TTL)
	}
	if c.BusyUnbindAfter < 0 {
		return fmt.Errorf("cannot use --session-busy-unbind %v: must not be negative (0: never unbind a busy worker's sessions)", c.BusyUnbindAfter)
	}
	if c.TTL > 0 && c.ControlTimeout <= 0 {
		return fmt.Errorf("cannot use --session-control-timeout %v: must be positive", c.ControlTimeout)
	}
	return nil
}

// defaultSessionCapacity is SGLang's capacity_of_str_len when the open
// request names none.
const defaultSessionCapacity = 65536

// Why a binding was removed: the reason label of
// kvfast_session_unbinds_total.
const (
	unbindRemoved    = "removed"     // the worker left the worker set
	unbindDown       = "down"        // the worker is unhealthy or ejected
	unbindNotAllowed = "not_allowed" // the request's allow-list excludes it
	unbindModel      = "model"       // the worker does not serve the request's model
	unbindKeyRefused = "key_refused" // its engine refuses the router's engine key
	unbindBusy       = "busy"        // over a busy threshold for BusyUnbindAfter, or its engine refused a request as overloaded (429) or had no connection free
	unbindStalled    = "stalled"     // its requests waited past --stall-after unanswered (a hung engine passing /health)
	unbindFailed     = "failed"      // the worker failed the request (connect, 5xx) and it was re-routed
	unbindClosed     = "closed"      // the session was closed (session_control close)
	unbindOpenFailed = "open_failed" // open_session failed on the chosen worker
)

var unbindReasons = []string{unbindRemoved, unbindDown, unbindNotAllowed, unbindModel, unbindKeyRefused, unbindBusy, unbindStalled, unbindFailed, unbindClosed, unbindOpenFailed}

// sessions is the server's sticky-session state.
type sessions struct {
	s        *Server
	cfg      SessionConfig
	ttl      int64
	table    *shm.Bindings
	throttle *logthrottle.Throttle
	client   *http.Client // open_session, close_session

	lookups map[shm.LookupResult]prometheus.Counter
	binds   map[shm.BindResult]prometheus.Counter
	unbinds map[string]prometheus.Counter
	control map[string]prometheus.Counter // "open/ok", "open/error", "close/ok", "close/error", "close/dropped"
	// pendingCloses counts the close_session calls in flight.
	pendingCloses atomic.Int64
}

func newSessions(s *Server, cfg SessionConfig, table *shm.Bindings) (*sessions, error) {
	if table == nil {
		var err error
		if table, err = shm.NewBindings(shm.DefaultBindings); err != nil {
			return nil, fmt.Errorf("cannot build the session table: %w", err)
		}
	}
	ss := &sessions{s: s, cfg: cfg, ttl: int64(cfg.TTL), table: table, throttle: logthrottle.New(time.Minute),
		client:  dispatch.EngineHTTPClient(cfg.ControlTimeout),
		lookups: map[shm.LookupResult]prometheus.Counter{}, binds: map[shm.BindResult]prometheus.Counter{},
		unbinds: map[string]prometheus.Counter{}, control: map[string]prometheus.Counter{}}
	reg := s.metrics.reg
	lookups := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvfast_session_lookups_total",
		Help: "Sticky-session lookups by result: hit (a live binding), miss, expired (idle past the TTL, removed)."}, []string{"result"})
	for r, name := range map[shm.LookupResult]string{shm.BindingHit: "hit", shm.BindingMiss: "miss", shm.BindingExpired: "expired"} {
		ss.lookups[r] = lookups.WithLabelValues(name)
	}
	binds := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvfast_session_binds_total",
		Help: "Sticky-session bind attempts by result: new, refreshed, rebound (moved to another worker), evicted (a new binding that pushed out the least recently used one), failed (the bucket stayed locked), followed (a session's first request found it bound meanwhile by a concurrent one, and followed it)."}, []string{"result"})
	for r, name := range map[shm.BindResult]string{shm.BindNew: "new", shm.BindRefreshed: "refreshed", shm.BindReplaced: "rebound",
		shm.BindEvicted: "evicted", shm.BindFailed: "failed", shm.BindHeld: "followed"} {
		ss.binds[r] = binds.WithLabelValues(name)
	}
	unbinds := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvfast_session_unbinds_total",
		Help: "Sticky-session bindings removed, by reason."}, []string{"reason"})
	for _, r := range unbindReasons {
		ss.unbinds[r] = unbinds.WithLabelValues(r)
	}
	control := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvfast_session_control_total",
		Help: "Engine session lifecycle calls (SGLang open_session, close_session) by operation and result: ok, error, or for close dropped (not sent: too many closes already in flight)."}, []string{"op", "result"})
	for _, op := range []string{"open", "close"} {
		for _, res := range []string{"ok", "error"} {
			ss.control[op+"/"+res] = control.WithLabelValues(op, res)
		}
	}
	ss.control["close/dropped"] = control.WithLabelValues("close", "dropped")
	live := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvfast_session_bindings",
		Help: "Live sticky-session bindings in the table (shared by every router on the segment)."},
		func() float64 { return float64(table.Live(table.Now(), ss.ttl)) })
	reg.MustRegister(lookups, binds, unbinds, control, live)
	return ss, nil
}

// exchangeSession is one request's session state, part of the pooled
// exchange.
type exchangeSession struct {
	id  []byte // the session id, copied from the header
	key uint64
	// scoped is the id behind its API key's digest, hashed into key when
	// the router holds API keys (sessionKey).
	scoped []byte
	active bool // the request names a session and sessions are on
	sticky bool // the request is pinned by its binding, not by the client
	bound  shm.Binding
	// claimed: the request bound its unbound session at selection
	// (claimSession) and no engine has accepted it yet; a request that
	// ends so takes the binding back.
	claimed     bool
	claimResult shm.BindResult // the claim's, counted when it is confirmed
	// accepted: an engine accepted the request and bindTo bound the
	// session to bound's worker, whose binding is touched again when the
	// request ends.
	accepted bool
	// closeEndpoint, when set, is the engine of the worker the session was
	// bound to (closeAt) when the request, closing it, had to go elsewhere:
	// its close_session goes there.
	closeEndpoint string
	closeAt       shm.Binding
	// opened: open_session succeeded on the chosen worker, so a re-route
	// elsewhere would lose the session; retries are off.
	opened bool
	// closer is the request's deferred close_session when it opened the
	// session: told when the request binds it (bindTo), so that it closes
	// only a session its request never bound.
	closer *sessionCloser
}

var (
	errBadSessionHeader = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: HeaderSession, Code: "invalid_header",
		Message: HeaderSession + " must be 1 to 256 bytes of UTF-8"}
	errSessionControlNeedsID = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: "session_control", Code: "session_id_required",
		Message: "session_control needs the session named in " + HeaderSession}
	errSessionsOff = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: "session_control", Code: "sessions_disabled",
		Message: "this router runs without sticky sessions (--session-ttl 0); session_control cannot be honoured"}
	errSessionControlDisagg = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: "session_control", Code: "session_control_disaggregated",
		Message: "this router serves prefill and decode on separate workers (--disagg); session_control (SGLang open_session and close_session) cannot be honoured there"}
	errSessionOpen = &openai.Error{Status: 502, Type: openai.TypeServerError, Code: "session_open_failed",
		Message: "the chosen worker could not open the session (SGLang open_session); nothing was generated"}
)

// sessionOpenRefused is the client's answer when the engine refused its
// open_session with a 4xx that judges the request, not the engine: a
// session of that id open there already, or open parameters it rejects.
// A 502 had told SDKs to retry an open that fails the same way each time.
// 401 and 403 (the engine's key), 408 and 429 (its load) stay 502: not
// the client's to fix.
func sessionOpenRefused(err error) *openai.Error {
	refusal, ok := errors.AsType[*controlRefusal](err)
	if !ok || refusal.status/100 != 4 {
		return nil
	}
	switch refusal.status {
	case 401, 403, 408, 429:
		return nil
	case 404, 405:
		return &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: "session_control", Code: "session_control_unsupported",
			Message: fmt.Sprintf("the chosen worker has no SGLang open_session (it answered %d; vLLM has none): session_control needs SGLang engines; nothing was generated", refusal.status)}
	}
	return &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: "session_control", Code: "session_open_refused",
		Message: fmt.Sprintf("the chosen worker refused to open the session (SGLang open_session answered %d): a session of that id is open there already, or it rejects the open parameters; nothing was generated", refusal.status)}
}

// sessionKey is the binding table's key of the request's session. With
// API keys, each key has a namespace of its own: one tenant naming
// another's session id neither lands on its worker (which would say where
// that session lives) nor moves it. Routers sharing a segment and its
// keys agree on the key; the digest is of the key, never the key. The
// id an SGLang engine gets is the client's, in the engine's one namespace.
func (s *Server) sessionKey(ctx *fasthttp.RequestCtx, es *exchangeSession) uint64 {
	if len(s.apiKeys) == 0 {
		return s.sessions.table.Key(es.id)
	}
	d := sha256.Sum256(bearer(ctx))
	es.scoped = append(append(es.scoped[:0], d[:16]...), es.id...)
	return s.sessions.table.Key(es.scoped)
}

// stickyRoute reads the request's session and, when it is bound to a
// worker that can serve the request, pins the request there. A bound
// worker that cannot (gone, down, outside the allow-list, not serving the
// model, busy for too long) loses the binding, and the request routes
// normally and binds anew. A query-only request reads bindings but never
// changes them. It runs after prepare, which learns the model.
func (s *Server) stickyRoute(ctx *fasthttp.RequestCtx, ex *exchange, queryOnly bool) *openai.Error {
	es := &ex.sess
	v := ctx.Request.Header.Peek(HeaderSession)
	ctl := ex.req.Session
	if len(v) == 0 {
		if ctl.Open || ctl.Close {
			return errSessionControlNeedsID
		}
		return nil
	}
	if len(v) > maxSessionIDBytes || !utf8.Valid(v) {
		// Not UTF-8, it would reach SGLang's session_id as U+FFFD, and
		// two distinct ids one engine session.
		return errBadSessionHeader
	}
	ss := s.sessions
	if ss == nil {
		if ctl.Open || ctl.Close {
			return errSessionsOff
		}
		return nil
	}
	es.active = true
	es.id = append(es.id[:0], v...)
	es.key = s.sessionKey(ctx, es)
	if ex.sreq.Pinned {
		return nil // the client's own pin wins; the session binds where it lands
	}
	now := ss.table.Now()
	var b shm.Binding
	var res shm.LookupResult
	if queryOnly {
		b, res = ss.table.Peek(es.key, now, ss.ttl)
	} else {
		b, res = ss.table.Lookup(es.key, now, ss.ttl)
		ss.lookups[res].Inc()
	}
	if res != shm.BindingHit {
		return nil
	}
	if reason := ss.ineligible(ex, b); reason != "" {
		if !queryOnly {
			ss.unbind(es, b, reason, now)
			if ctl.Close && reason != unbindRemoved {
				// The request goes elsewhere, but the engine session
				// lives on the bound worker's engine: its close goes
				// there, or it would stay open for good.
				if slot, ok := ss.s.sched.Resolve(b.WorkerID, b.DPRank); ok {
					if info, ok := ss.s.sched.Worker(slot); ok {
						es.closeAt, es.closeEndpoint = b, info.Endpoint
					}
				}
			}
		}
		return nil
	}
	es.sticky, es.bound = true, b
	ex.sreq.Pinned, ex.sreq.PinWorker, ex.sreq.PinRank = true, b.WorkerID, b.DPRank
	// A turn that queues behind its busy worker moves, as the next turn
	// would, once the worker has stayed busy for BusyUnbindAfter.
	ex.sreq.PinBusyLimit = ss.cfg.BusyUnbindAfter
	return nil
}

// ineligible returns why binding b cannot take ex, or "".
func (ss *sessions) ineligible(ex *exchange, b shm.Binding) string {
	slot, ok := ss.s.sched.Resolve(b.WorkerID, b.DPRank)
	if !ok {
		return unbindRemoved
	}
	e := ss.s.sched.Eligibility(slot)
	switch {
	case !e.Present:
		return unbindRemoved
	case !e.Healthy:
		return unbindDown
	case e.Stalled:
		return unbindStalled
	case ex.sreq.Model != "" && e.Model != ex.sreq.Model,
		ex.adapterWorkers != 0 && !ex.adapterWorkers.Has(slot), // does not serve the adapter named
		// Its engine no longer lists the model: avoidUnlisted took it off
		// the request's allow-list, which the client may not have sent.
		ex.sreq.AllowListed && !ex.sreq.Allow.Has(slot) && workers.Set(ss.s.unlisted.Load()).Has(slot):
		return unbindModel
	case ex.sreq.AllowListed && !ex.sreq.Allow.Has(slot) && workers.Set(ss.s.keyRefused.Load()).Has(slot):
		// avoidUnlisted took it off too.
		return unbindKeyRefused
	case ex.sreq.AllowListed && !ex.sreq.Allow.Has(slot):
		return unbindNotAllowed
	}
	// Busy: transient unless the worker has stayed busy, as this
	// router's selections saw it, for BusyUnbindAfter.
	if after := ss.cfg.BusyUnbindAfter; e.Busy && after > 0 && e.BusyFor >= after {
		return unbindBusy
	}
	return ""
}

// unbind removes es's binding to b, counts it and logs it, throttled per
// reason so that a worker going down with thousands of sessions does not
// flood the log.
func (ss *sessions) unbind(es *exchangeSession, b shm.Binding, reason string, now int64) {
	if !ss.table.Unbind(es.key, b.WorkerID, b.DPRank, now) {
		return // already gone, or another router rebound it meanwhile
	}
	ss.unbinds[reason].Inc()
	ss.throttle.Log(ss.s.log, slog.LevelInfo, "session-unbind/"+reason, "sticky session moved off its worker",
		"reason", reason, "worker_id", b.WorkerID, "dp_rank", b.DPRank)
}

// selectSticky is Select for a request that may be pinned by its
// binding: when the bound worker stopped being eligible between the
// check and the selection (a race with its removal or health), the
// binding is dropped and the request routes normally. Nothing was booked
// by the failed attempt, so the guard selects again.
func (ex *exchange) selectSticky() (sched.Decision, error) {
	dec, err := ex.h.Select(&ex.wait, &ex.sreq)
	if !ex.sess.sticky {
		return dec, err
	}
	if err == nil {
		if dec.PinLapsed {
			// It queued behind its worker for BusyUnbindAfter, and Select
			// routed it unpinned: the session follows it.
			ex.unstick(unbindBusy)
		}
		return dec, nil
	}
	// AsType, unlike As, lets nothing escape: a sticky request refused
	// in a traffic spike passes here too.
	if _, pinned := errors.AsType[*sched.PinError](err); !pinned {
		return dec, err
	}
	ex.unstick(unbindDown)
	return ex.h.Select(&ex.wait, &ex.sreq)
}

// claimSession binds a session that had no binding to the worker just
// chosen for its request, at once: binding only when an engine accepts
// the request (bindTo) left the session unbound for as long as that took
// (a whole generation for a non-streamed answer), and the session's
// other requests meanwhile went where selection sent them, each binding
// it in turn. When a concurrent request claimed the session first, this
// one follows it there: its booking is given back and it is selected
// again, pinned to that worker, unless the worker cannot take it.
func (s *Server) claimSession(ex *exchange, dec sched.Decision) (sched.Decision, error) {
	es := &ex.sess
	if !es.active || es.sticky || ex.sreq.Pinned || ex.req.Session.Close {
		// Not a session; bound already; pinned by the client (it binds
		// where it lands); or closing it.
		return dec, nil
	}
	ss := s.sessions
	b, res := ss.table.Claim(es.key, dec.WorkerID, dec.DPRank, ss.table.Now(), ss.ttl)
	switch {
	case res == shm.BindFailed:
		return dec, nil // it binds when accepted, as before
	case res != shm.BindHeld:
		// Counted once an engine accepts the request (bindTo).
		es.sticky, es.bound, es.claimed, es.claimResult = true, b, true, res
		return dec, nil
	}
	if b.WorkerID == dec.WorkerID && b.DPRank == dec.DPRank {
		ss.binds[shm.BindHeld].Inc()
		es.sticky, es.bound = true, b
		return dec, nil
	}
	if ss.ineligible(ex, b) != "" {
		return dec, nil // the other request's worker went meanwhile: this one rebinds on acceptance
	}
	ss.binds[shm.BindHeld].Inc()
	_ = ex.h.Release()
	ex.setGuard(s.guards.Acquire())
	es.sticky, es.bound = true, b
	ex.sreq.Pinned, ex.sreq.PinWorker, ex.sreq.PinRank = true, b.WorkerID, b.DPRank
	ex.sreq.PinBusyLimit = ss.cfg.BusyUnbindAfter
	return ex.selectSticky()
}

// endSession runs when the request ends: a claim no engine accepted is
// taken back, and an accepted request's binding is touched, so that the
// session's idle time runs from the end of its turn, not from its start
// (a stream longer than the TTL lost its binding as it ended).
func (ex *exchange) endSession() {
	es := &ex.sess
	if !es.active || ex.s.sessions == nil {
		return
	}
	ss := ex.s.sessions
	switch {
	case es.claimed:
		ss.takeBack(es)
	case es.accepted && !ex.req.Session.Close:
		ss.table.Touch(es.key, es.bound.WorkerID, es.bound.DPRank, ss.table.Now())
	}
}

// takeBack takes back es's claim, unless another request has bound or
// touched the binding since (its stamp moved), which makes it theirs.
func (ss *sessions) takeBack(es *exchangeSession) {
	es.claimed = false
	ss.table.Unclaim(es.key, es.bound.WorkerID, es.bound.DPRank, es.bound.Touched, ss.table.Now())
}

// unstick drops the binding's pin from the request and the binding from
// the table, for reason. A claim this request made is only taken back:
// the session was never bound anywhere else.
func (ex *exchange) unstick(reason string) {
	es := &ex.sess
	if !es.sticky {
		return
	}
	ss := ex.s.sessions
	if es.claimed {
		ss.takeBack(es)
	} else {
		ss.unbind(es, es.bound, reason, ss.table.Now())
	}
	es.sticky = false
	ex.sreq.Pinned, ex.sreq.PinWorker, ex.sreq.PinRank, ex.sreq.PinBusyLimit = false, 0, 0, 0
}

// retryable reports whether a failed attempt may be re-routed as far as
// the session is concerned: not once the session was opened on the
// worker, and not when a deferred close is registered on the guard (a
// re-route releases it). A sticky pin gives way to another worker.
func (ex *exchange) sessionRetryable() bool {
	return !ex.sess.opened && !ex.req.Session.Close
}

// bindSession binds (or refreshes) the session to the worker that served
// the request. Called once the engine accepted it.
func (ex *exchange) bindSession() {
	if !ex.req.Session.Close { // a closing session is unbound when it closes
		ex.bindTo(ex.dec.WorkerID, ex.dec.DPRank)
	}
}

// bindTo binds, or refreshes, the request's session to (workerID, rank).
// It is also the hook for routing stages that choose the worker which
// will hold the conversation's KV by other means than one Select (the
// decode stage of disaggregated serving binds the decode worker, where
// the KV lives). A request without a session does nothing.
func (ex *exchange) bindTo(workerID uint64, rank uint32) {
	es := &ex.sess
	if !es.active {
		return
	}
	ss := ex.s.sessions
	res := ss.table.Bind(es.key, workerID, rank, ss.table.Now(), ss.ttl)
	if es.claimed && res == shm.BindRefreshed {
		res = es.claimResult // the claim, now confirmed
	}
	ss.binds[res].Inc()
	es.claimed, es.accepted = false, true
	es.bound = shm.Binding{WorkerID: workerID, DPRank: rank}
	if es.closer != nil {
		es.closer.bound.Store(true)
	}
}

// sessionControl runs the request's session_control on the chosen worker
// before dispatch: open_session now, failing the request if it fails;
// close_session deferred until the guard is released, so after the
// stream ended and its booking was freed.
func (ex *exchange) sessionControl(ctx *fasthttp.RequestCtx) bool {
	ctl := &ex.req.Session
	if !ex.sess.active || !ctl.Open && !ctl.Close {
		return true
	}
	ss := ex.s.sessions
	// The client's credentials go with the calls, as with its request
	// (an engine that requires its key refused every open), unless the
	// router has the engines' own key; copied, as the closer outlives ctx.
	caller := controlCaller{auth: string(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)), rid: string(ex.rid)}
	if ctl.Open {
		// Not ctx: fasthttp's RequestCtx is recycled after the handler and
		// must not parent a context that outlives it; the call is bounded
		// by ControlTimeout instead.
		if err := ss.open(context.Background(), ex.dec.Endpoint, string(ex.sess.id), ctl.OpenParams, caller); err != nil {
			ss.control["open/error"].Inc()
			ss.throttle.Log(ss.s.log, slog.LevelWarn, "session-open", "cannot open the session on the chosen worker",
				"worker_id", ex.dec.WorkerID, "dp_rank", ex.dec.DPRank, "err", err)
			var refusal *controlRefusal
			refused := errors.As(err, &refusal) && refusal.status/100 == 4
			if !refused {
				// The engine may have opened it all the same (the call
				// timed out while it worked; a 5xx after the fact): close
				// it again, as an open whose client left is, once the
				// engine has had as long again to finish the open (a close
				// before it would find no session, and the open then
				// stand). A refusal is not closed: the session it names is
				// another request's.
				_ = ex.h.Defer(&sessionCloser{ss: ss, endpoint: ex.dec.Endpoint, id: string(ex.sess.id), key: ex.sess.key,
					workerID: ex.dec.WorkerID, rank: ex.dec.DPRank, caller: caller, unlessBound: true, after: ss.cfg.ControlTimeout})
			}
			switch {
			case ex.sess.claimed:
				ex.unstick(unbindOpenFailed) // this request's own claim, taken back
			case refused:
				// The engine refused this open (a session of that id open
				// already, which an earlier or concurrent request opened
				// there; bad parameters): the binding stays with the
				// session.
			default:
				ex.unstick(unbindOpenFailed) // the worker failed: the next turn goes elsewhere
			}
			_ = ex.h.DispatchFailed()
			if e := sessionOpenRefused(err); e != nil {
				ex.count(statusEngineRejected) // the client's open, judged by the engine
				writeError(ctx, e.Status, e)
				return false
			}
			ex.count(statusEngineError) // the worker's failure, not a want of workers
			writeError(ctx, errSessionOpen.Status, errSessionOpen)
			return false
		}
		ss.control["open/ok"].Inc()
		ex.sess.opened = true
	}
	if ctl.Close || ctl.Open {
		// An open whose request ends before the session is bound (the
		// client left, the engine failed it) is closed again: nothing
		// else would close it on the engine.
		c := &sessionCloser{ss: ss, endpoint: ex.dec.Endpoint, id: string(ex.sess.id), key: ex.sess.key,
			workerID: ex.dec.WorkerID, rank: ex.dec.DPRank, caller: caller, unlessBound: !ctl.Close}
		if ctl.Close && ex.sess.closeEndpoint != "" {
			c.endpoint, c.workerID, c.rank = ex.sess.closeEndpoint, ex.sess.closeAt.WorkerID, ex.sess.closeAt.DPRank
		}
		if c.unlessBound {
			ex.sess.closer = c
		}
		_ = ex.h.Defer(c)
	}
	return true
}

// controlCaller is what session control calls carry of the client's
// request: its Authorization header and its request id.
type controlCaller struct{ auth, rid string }

// open calls the engine's open_session (SGLang: POST /open_session with
// capacity_of_str_len and session_id, answered with the session id).
func (ss *sessions) open(ctx context.Context, endpoint, id string, params []byte, caller controlCaller) error {
	req := map[string]any{}
	if len(params) > 0 {
		if err := json.Unmarshal(params, &req); err != nil {
			return fmt.Errorf("cannot read session_control open parameters: %w", err)
		}
	}
	if _, ok := req["capacity_of_str_len"]; !ok {
		req["capacity_of_str_len"] = defaultSessionCapacity
	}
	req["session_id"] = id
	return ss.call(ctx, endpoint, "/open_session", req, caller)
}

func (ss *sessions) call(ctx context.Context, endpoint, path string, body any, caller controlCaller) error {
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("cannot encode %s: %w", path, err)
	}
	ctx, cancel := context.WithTimeout(ctx, ss.cfg.ControlTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+endpoint+path, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("cannot call %s on %s: %w", path, endpoint, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderRequestID, caller.rid)
	// SGLang's --api-key guards everything but /health: the router's key
	// for the engines, else the client's, as its request carries it.
	if t := ss.s.engines.EngineToken(); t != "" {
		req.Header.Set("Authorization", "Bearer "+t)
	} else if caller.auth != "" {
		req.Header.Set("Authorization", caller.auth)
	}
	resp, err := ss.client.Do(req)
	if err != nil {
		return fmt.Errorf("cannot call %s on %s: %w", path, endpoint, err)
	}
	defer resp.Body.Close()
	// Drained (bounded) for the connection's reuse, never logged: an
	// engine's answer is not the router's to print.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return &controlRefusal{path: path, endpoint: endpoint, status: resp.StatusCode}
	}
	return nil
}

// controlRefusal is an engine's non-2xx answer to a session call.
type controlRefusal struct {
	path, endpoint string
	status         int
}

func (e *controlRefusal) Error() string {
	return fmt.Sprintf("cannot call %s on %s: status %d", e.path, e.endpoint, e.status)
}

// sessionCloser is the deferred close_session of one request. It owns
// copies of what it needs: the exchange is recycled when it runs.
type sessionCloser struct {
	ss       *sessions
	endpoint string
	id       string
	key      uint64
	workerID uint64
	rank     uint32
	caller   controlCaller
	// unlessBound: the request opened the session; close it only if the
	// request ended without binding it (bound).
	unlessBound bool
	bound       atomic.Bool
	// after delays the call: a failed open's close waits for the engine
	// to finish the open it may still be working on.
	after time.Duration
}

// maxPendingCloses bounds the close_session calls in flight at once. Each
// holds a goroutine for up to ControlTimeout (twice that for a failed
// open's close, which waits first) and a connection for one, and runs
// after its request has been answered, so neither --max-conns nor any
// client's patience bounds them: 1,500 closes against hung engines held
// 3,000 goroutines and 1,000 file descriptors (a review's run). Past it a
// close is not sent, counted and logged; the engine keeps that session
// until it times it out.
var maxPendingCloses int64 = 256

// AfterRelease runs once the request's guard is released, on every path;
// the call itself goes to a goroutine, as Release must not block.
func (c *sessionCloser) AfterRelease(guard.Event) {
	ss := c.ss
	now := ss.table.Now()
	if c.unlessBound {
		if c.bound.Load() {
			return // opened and bound: the session lives on
		}
	} else if ss.table.Unbind(c.key, c.workerID, c.rank, now) {
		ss.unbinds[unbindClosed].Inc()
	}
	if ss.pendingCloses.Add(1) > maxPendingCloses {
		ss.pendingCloses.Add(-1)
		ss.control["close/dropped"].Inc()
		ss.throttle.Log(ss.s.log, slog.LevelWarn, "session-close-dropped",
			"too many session closes in flight (engines slow to answer close_session): this one is not sent, and its engine keeps the session until it times it out",
			"worker_id", c.workerID, "dp_rank", c.rank, "in_flight", maxPendingCloses)
		return
	}
	go func() {
		defer ss.pendingCloses.Add(-1)
		if c.after > 0 {
			<-time.After(c.after)
		}
		if err := ss.call(context.Background(), c.endpoint, "/close_session", map[string]string{"session_id": c.id}, c.caller); err != nil {
			ss.control["close/error"].Inc()
			ss.throttle.Log(ss.s.log, slog.LevelWarn, "session-close", "cannot close the session on its worker",
				"worker_id", c.workerID, "dp_rank", c.rank, "err", err)
			return
		}
		ss.control["close/ok"].Inc()
	}()
}
