package fastpath

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/dispatch"
	"github.com/kvfast/kvfast/guard"
	"github.com/kvfast/kvfast/internal/clock"
	"github.com/kvfast/kvfast/internal/jsonscan"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/workers"
)

// Disaggregated prefill → decode (docs/routing.md, "Disaggregated
// serving"). A request is routed to a decode worker first, by the cost
// model over the decode pool, so that the decode worker's own cached
// prefix is known; then either that worker prefills locally (a short
// uncached remainder, or a prompt it mostly caches: conditional
// disaggregation), or a prefill worker chosen by the cost model over the
// prefill pool computes the prompt and hands its KV over, in the engines'
// own protocol. Each stage has its own guard from the server's pool, so
// each stage's booking is released exactly once, whatever fails.

// Disaggregation protocols (DisaggConfig.Protocol).
const (
	DisaggOff    = ""
	DisaggVLLM   = "vllm"   // NixlConnector and compatible: prefill with max_tokens 1, then decode with its kv_transfer_params
	DisaggSGLang = "sglang" // bootstrap_host/port/room injected, both stages sent at once, decode relayed
)

// DisaggConfig configures disaggregated serving.
type DisaggConfig struct {
	// Protocol is DisaggOff, DisaggVLLM or DisaggSGLang. Off routes every
	// request to one worker, whatever the workers' roles.
	Protocol string
	// MinRemoteTokens: a prompt whose part the chosen decode worker does
	// not cache is shorter than this is prefilled on the decode worker,
	// where shipping its KV would cost more than computing it.
	MinRemoteTokens int
	// LocalCachedFraction: when the chosen decode worker caches at least
	// this share of the prompt, it prefills the rest itself. 0 disables
	// the rule.
	LocalCachedFraction float64
	// BootstrapPort is the port of the SGLang prefill engines' bootstrap
	// server, sent as bootstrap_port to a prefill worker whose WorkerInfo
	// names none. 0 sends none: each engine then takes its own
	// --disaggregation-bootstrap-port (SGLang's default, 8998), which
	// suits prefill engines that all use one port. BootstrapHTTPPort
	// sends the prefill worker's HTTP port, where kvfast's mock engine
	// serves its bootstrap.
	BootstrapPort int
	// PrefillTimeout bounds the wait for a prefill worker's answer, its
	// headers and a streamed answer's first bytes (0: the first-byte
	// timeout); an SGLang prefill streaming its answer is then bounded by
	// the relay's idle timeout. Past it a vLLM prefill is tried on another
	// prefill worker, or the decode worker prefills; an SGLang request
	// fails as its prefill failing does (its decode is already paired).
	// A hung prefill engine had held its requests for the first-byte
	// timeout (10 minutes by default), per attempt.
	PrefillTimeout time.Duration
}

// Conditional disaggregation's defaults: a prompt whose uncached part is
// under 256 tokens (about a dozen milliseconds of prefill on an 8B model)
// is not worth a KV transfer, nor is one its decode worker caches at 90%.
const (
	DefaultMinRemoteTokens     = 256
	DefaultLocalCachedFraction = 0.9
	// DefaultPrefillTimeout: a long prompt's prefill behind a queue takes
	// seconds to tens of seconds; one past two minutes is given up on.
	DefaultPrefillTimeout = 2 * time.Minute
)

func (c *DisaggConfig) validate() error {
	switch c.Protocol {
	case DisaggOff, DisaggVLLM, DisaggSGLang:
	default:
		return fmt.Errorf("cannot use --disagg %q: want vllm, sglang or none", c.Protocol)
	}
	if c.MinRemoteTokens < 0 {
		return fmt.Errorf("cannot use --disagg-min-remote-tokens %d: must not be negative", c.MinRemoteTokens)
	}
	if !(c.LocalCachedFraction >= 0 && c.LocalCachedFraction <= 1) {
		return fmt.Errorf("cannot use --disagg-local-cached-fraction %v: want a fraction in [0, 1]", c.LocalCachedFraction)
	}
	if c.PrefillTimeout < 0 {
		return fmt.Errorf("cannot use --disagg-prefill-timeout %v: want 0 (the first-byte timeout) or more", c.PrefillTimeout)
	}
	if (c.BootstrapPort < 0 && c.BootstrapPort != BootstrapHTTPPort) || c.BootstrapPort > 65535 {
		return fmt.Errorf("cannot use --disagg-bootstrap-port %d: want 1-65535, 0 for the engines' own, or the prefill worker's HTTP port", c.BootstrapPort)
	}
	return nil
}

// BootstrapHTTPPort, as DisaggConfig.BootstrapPort, sends each prefill
// worker's HTTP port as its bootstrap port (kvfast's mock engine).
const BootstrapHTTPPort = -1

// Disaggregation decisions, the values of kvfast_disagg_decisions_total's
// decision label.
const (
	decisionRemote        = "remote"       // prefilled on a prefill worker
	decisionLocalShort    = "local_short"  // uncached remainder under MinRemoteTokens
	decisionLocalCached   = "local_cached" // decode worker caches LocalCachedFraction of the prompt
	decisionLocalNoWorker = "local_no_prefill_worker"
	decisionFallback      = "fallback_local" // every prefill attempt failed: prefilled locally
	// decisionLocalAggregated: under SGLang's protocol, the chosen worker
	// is an aggregated engine (role both), which neither hands over nor
	// takes in KV: it computes the prompt itself.
	decisionLocalAggregated = "local_aggregated"
	// decisionNoPrefillWorker: the decode worker cannot prefill (an SGLang
	// decode engine) and no prefill worker can: a 503.
	decisionNoPrefillWorker = "no_prefill_worker"
)

var allDecisions = []string{decisionRemote, decisionLocalShort, decisionLocalCached, decisionLocalNoWorker, decisionFallback, decisionNoPrefillWorker, decisionLocalAggregated}

// Stages of a disaggregated request's time to first token, the values of
// kvfast_disagg_stage_seconds's stage label.
const (
	stagePrefill      = "prefill"            // prefill request sent → its answer read (vLLM), or → its answer's end (SGLang)
	stageTransferWait = "transfer_wait"      // decode request sent → the decode engine answered (it pulls the KV first)
	stageFirstDecode  = "first_decode_token" // decode engine answered → first output token
)

// prefillStage is the prefill half of one exchange: its own guard, engine
// call and buffers. It is the prefill call's dispatch.Observer.
type prefillStage struct {
	h       guard.Handle
	held    bool // h is acquired and not yet released; set under the exchange's hangMu
	call    *dispatch.Call
	dec     sched.Decision
	decided bool // the request was disaggregated: dec names the prefill worker
	// attempts holds vLLM prefill attempts' 5xx verdicts until a prefill
	// worker serves the request (dispatch.Attempts).
	attempts dispatch.Attempts
	body     []byte // the prefill request's body
	decode   []byte // the decode request's body (the client's, rewritten)
	// client is the client's own body while decode replaces it (vLLM):
	// a retried decode sends it instead, computing the prompt itself.
	client []byte
	// clean is the client's body without the transfer fields it sent
	// (stripTransferFields), when it sent any.
	clean []byte

	decodeSent, decodeAnswered int64 // clock readings for the stage metrics

	// SGLang sends the prefill request from a goroutine of its own; done
	// is closed when it has finished with h and call.
	done chan struct{}
	// failed: the SGLang prefill failed before the decode's first token,
	// so the decode call is failed too (failDecode); decodeStarted: the
	// decode's first token came, so its KV did. Both under the exchange's
	// hangMu.
	failed, decodeStarted bool
	// refused: the SGLang prefill engine answered a 4xx, judging the
	// request (too long, a parameter it refuses), which the decode engine
	// judges alike: its 4xx is the client's answer. Under hangMu.
	refused bool
	// refusal is that 4xx answer's status and JSON body (at most
	// maxRefusalBytes): the client's answer when the prefill's verdict
	// came first and the decode call was failed on it. Written before
	// refused is set.
	refusalStatus int
	refusal       []byte
}

// maxRefusalBytes bounds the SGLang prefill refusal kept for the client:
// an engine's error object is a few hundred bytes.
const maxRefusalBytes = 16 << 10

func (st *prefillStage) OnDispatched() { _ = st.h.Dispatched() }
func (st *prefillStage) OnFirstToken() {}
func (st *prefillStage) OnItem(int)    {}
func (st *prefillStage) OnAbort(error) { st.abortFailed() }
func (st *prefillStage) OnComplete([]byte) {
	// The prefill's one token ends its stage, whatever the finish reason:
	// its booking is done with once the KV is computed.
	_ = st.h.OnItem(1, guard.FinishLength)
}

func (st *prefillStage) abortFailed() {
	if st.h.State() == guard.Selected {
		_ = st.h.DispatchFailed()
		return
	}
	_ = st.h.Abort(guard.ReasonEngineError)
}

// recycle keeps the stage's buffers for the exchange's next request.
func (st *prefillStage) recycle() prefillStage {
	if cap(st.body) > 1<<20 || cap(st.decode) > 1<<20 || cap(st.clean) > 1<<20 {
		return prefillStage{}
	}
	return prefillStage{body: st.body[:0], decode: st.decode[:0], clean: st.clean[:0], refusal: st.refusal[:0]}
}

// setPrefillGuard makes h the prefill stage's guard, held; as setGuard, a
// client already gone aborts it at once.
func (ex *exchange) setPrefillGuard(h guard.Handle) {
	ex.hangMu.Lock()
	ex.pre.h, ex.pre.held = h, true
	gone := ex.goneLocked()
	ex.hangMu.Unlock()
	if gone {
		_ = h.Abort(guard.ReasonClientCancel)
	}
}

// prefillDrainGrace is how long the end of a request waits for its SGLang
// prefill engine to finish answering before cutting it.
const prefillDrainGrace = 2 * time.Second

// stageBodyTimeout bounds reading a stage's answer (a vLLM prefill's, an
// encoder's) once its headers came: it is one small JSON object, whole
// when the engine answers. A prefill engine dribbling it a byte a second
// had held both stages' bookings for as long as the client waited.
const stageBodyTimeout = 10 * time.Second

// releasePrefill ends the prefill stage: it waits for an SGLang prefill
// sender, then releases the stage's call and guard.
//
// It runs once the decode has ended (the request's cleanup) or was never
// sent. By then a prefill engine has nothing left to give: the decode got
// its KV, or failed without it. One that is still answering after
// prefillDrainGrace (dribbling its answer, which the idle timeout, reset
// by every byte, never ends) is cut, so that it cannot hold the client's
// stream open, both bookings, and, once its client has left, a request
// nobody waits for.
func (ex *exchange) releasePrefill() {
	st := &ex.pre
	if st.done != nil {
		select {
		case <-st.done:
		default:
			t := time.NewTimer(prefillDrainGrace)
			select {
			case <-st.done:
			case <-t.C:
				ex.hangMu.Lock()
				call, started := st.call, st.decodeStarted
				ex.hangMu.Unlock()
				if started {
					// The decode had its first token, so its KV came: the
					// prefill did its work and only its answer is late.
					// Its stage ends as answered, not as the engine's
					// failure the cut would make it.
					_ = st.h.Close()
				}
				ex.s.log.Debug("cut an SGLang prefill answer still coming after the decode ended",
					"request_id", string(ex.rid), "worker", st.dec.WorkerID, "grace", prefillDrainGrace, "decode_started", started)
				if call != nil {
					call.Abort()
				}
				<-st.done
			}
			t.Stop()
		}
		st.done = nil
	}
	ex.hangMu.Lock()
	call := st.call
	st.call = nil
	ex.hangMu.Unlock()
	if call != nil {
		call.Release()
	}
	ex.hangMu.Lock()
	held := st.held
	st.held = false
	ex.hangMu.Unlock()
	if held {
		_ = st.h.Release()
	}
}

// setPrefillCall makes c the prefill stage's call, under hangMu so that a
// hang-up aborts it (HangUp), and aborts it at once if the client has
// already left.
func (ex *exchange) setPrefillCall(c *dispatch.Call) {
	ex.hangMu.Lock()
	ex.pre.call = c
	gone := ex.goneLocked()
	ex.hangMu.Unlock()
	if gone {
		c.Abort()
	}
}

// disaggregating reports whether requests are routed in two stages.
func (s *Server) disaggregating() bool { return s.cfg.Disagg.Protocol != DisaggOff }

// generatingStage is the stage of the worker that answers a request: the
// decode stage when disaggregating (prefill workers only prefill), else
// any worker but an encoder.
func (s *Server) generatingStage() sched.Stage {
	if s.disaggregating() {
		return sched.StageDecode
	}
	return sched.StageAny
}

// serveDisagg routes a request in two stages (or, as conditional
// disaggregation decides, in one on a decode-capable worker) and hands
// the decode stage to forward, which relays it as any request. It
// reports whether a stream took the exchange over.
func (s *Server) serveDisagg(ctx *fasthttp.RequestCtx, ex *exchange) (handedOff bool) {
	ex.sreq.Stage = sched.StageDecode
	// A session binds to its decode worker, where the conversation's KV
	// lives (forward binds it on dispatch): book's selectSticky pins the
	// request there while that worker can decode.
	if !s.book(ctx, ex) {
		return false
	}
	if !ex.stripTransferFields(s.cfg.Disagg.Protocol) {
		// Not a JSON object after all: the parser read it as one, so
		// this is the router's bug, and the body must not go on
		// unstripped. (Counted with the failures past the client's
		// reach; the parser makes the path unreachable, so it has no
		// label of its own.)
		ex.count(statusEngineError)
		writeError(ctx, fasthttp.StatusInternalServerError, errBodyNotObject)
		return false
	}
	decision := s.decideDisagg(ex)
	if decision == decisionNoPrefillWorker {
		s.refuseNoPrefill(ctx, ex, nil)
		return false
	}
	if decision == decisionRemote {
		// The decode worker computes none of the prompt: its prefill
		// booking goes now, before it misleads other selections.
		_ = ex.h.PrefillRemote()
		var ok bool
		var perr error
		if s.cfg.Disagg.Protocol == DisaggSGLang {
			perr = s.startSGLang(ctx, ex)
			ok = perr == nil
		} else {
			ok = s.prefillVLLM(ctx, ex)
		}
		if ex.clientGone() || ex.h.State() == guard.Aborted {
			s.metrics.dis.decisions[decision].Inc() // decided, then cancelled
			ex.failSelect(ctx, context.Canceled)
			return false
		}
		if !ok && s.cfg.Disagg.Protocol == DisaggSGLang && s.roleOf(ex.dec.Slot) == workers.RoleDecode {
			// No prefill could be booked (every prefill worker busy, the
			// queue full or timed out): a decode engine cannot fall back
			// to computing the prompt.
			s.refuseNoPrefill(ctx, ex, perr)
			return false
		}
		if !ok {
			decision = decisionFallback
		}
		// The decode worker owes an answer from here: after the remote
		// prefill (vLLM), or beside it (SGLang), or computing the prompt
		// itself when the prefill failed.
		_ = ex.h.AwaitDecode()
	}
	s.metrics.dis.decisions[decision].Inc()
	if ex.pre.decided {
		ex.setPrefillHeaders(ctx)
		if s.cfg.Disagg.Protocol != DisaggSGLang {
			ex.pre.client = ex.body
		}
		ex.body = ex.pre.decode
	}
	ex.pre.decodeSent = clock.Now()
	return s.forward(ctx, ex)
}

// decideDisagg is conditional disaggregation: whether the decode worker
// chosen in ex.dec prefills the prompt itself.
func (s *Server) decideDisagg(ex *exchange) string {
	cfg := &s.cfg.Disagg
	cached := int(ex.dec.OverlapBlocks) * s.sched.BlockSize()
	prompt := ex.sreq.PromptTokens
	switch {
	case cfg.Protocol == DisaggSGLang && s.roleOf(ex.dec.Slot) == workers.RoleDecode:
		// An SGLang engine started in decode mode computes no prompt of
		// its own: given one without bootstrap fields it waits for a KV
		// transfer that never comes. Every request it answers is paired
		// with a prefill, as sgl-router's PD mode pairs them.
		if s.routablePrefill(ex) == 0 {
			return decisionNoPrefillWorker
		}
		return decisionRemote
	case cfg.Protocol == DisaggSGLang:
		// An SGLang engine that is not a decode engine (disaggregation
		// mode null: role both) ignores the bootstrap fields: paired with
		// a prefill engine, it would compute the prompt all the same, and
		// the prefill engine wait for a decode that never pulls.
		return decisionLocalAggregated
	case prompt-cached < cfg.MinRemoteTokens:
		return decisionLocalShort
	case cfg.LocalCachedFraction > 0 && float64(cached) >= cfg.LocalCachedFraction*float64(prompt):
		return decisionLocalCached
	case s.routablePrefill(ex) == 0:
		return decisionLocalNoWorker
	}
	return decisionRemote
}

// refuseNoPrefill answers a request whose decode worker cannot compute
// its prompt (an SGLang decode engine) when no prefill worker could take
// it: a 400 when the client's allow-list named none (a 503 would have it
// retry for ever), the selection's own refusal when every prefill worker
// was busy (selErr: 429 or 503 queue_timeout), else a 503.
func (s *Server) refuseNoPrefill(ctx *fasthttp.RequestCtx, ex *exchange, selErr error) {
	s.metrics.dis.decisions[decisionNoPrefillWorker].Inc()
	switch _, overloaded := errors.AsType[*sched.OverloadError](selErr); {
	case errors.Is(selErr, errNotObject): // the body could not be rewritten: the router's bug
		ex.count(statusEngineError)
		writeError(ctx, fasthttp.StatusInternalServerError, errBodyNotObject)
	case ex.clientAllowed && s.prefillPool()&ex.clientAllow&^workers.SetOf(ex.dec.Slot) == 0:
		ex.count(statusClientError)
		writeError(ctx, fasthttp.StatusBadRequest, errAllowNoPrefill)
	case overloaded, errors.Is(selErr, context.DeadlineExceeded):
		ex.failSelect(ctx, selErr)
	default:
		ex.count(statusUnavailable)
		ctx.Response.Header.SetBytesV("Retry-After", s.retryAfter(ex))
		writeError(ctx, fasthttp.StatusServiceUnavailable, errNoPrefillWorker)
	}
}

// roleOf is the role of the worker in slot (both, if it just left).
func (s *Server) roleOf(slot workers.Slot) workers.Role {
	info, _ := s.sched.Worker(slot)
	return info.Role
}

// errNoPrefillWorker answers a request whose decode worker cannot compute
// its prompt when no prefill worker can take it; errAllowNoPrefill when
// the client's allow-list named none.
var (
	errNoPrefillWorker = &openai.Error{Status: fasthttp.StatusServiceUnavailable, Type: openai.TypeServerError, Code: "no_prefill_worker",
		Message: "no prefill worker can take the request, and its decode worker (an SGLang decode engine) cannot compute the prompt itself"}
	errAllowNoPrefill = &openai.Error{Status: fasthttp.StatusBadRequest, Type: openai.TypeInvalidRequest, Param: HeaderAllow, Code: "allow_excluded",
		Message: HeaderAllow + " names no prefill worker, and an SGLang decode engine cannot compute a prompt itself: name a prefill worker too"}
)

// stripTransferFields drops from the client's body the fields by which
// the stages of a disaggregated request find each other: vLLM's
// kv_transfer_params, SGLang's bootstrap address, room and prefill rank.
// Only the router may set them. A client's own would reach a decode engine on
// every path that forwards its body as it came (a local decision, the
// fallback after failed prefills, a retried decode), and have it pull KV
// from, or hold it for, whatever host the client named.
//
// It reports false, leaving the body as it was, when the body cannot be
// read as a JSON object: the request must then not be sent.
func (ex *exchange) stripTransferFields(protocol string) bool {
	fields := vllmTransferFields
	if protocol == DisaggSGLang {
		fields = sglangTransferFields
	}
	for _, f := range fields {
		if topLevelMember(ex.body, f) == nil {
			continue
		}
		clean, _, err := appendMembersExcept(ex.pre.clean[:0], ex.body, fields...)
		if err != nil {
			return false
		}
		ex.pre.clean = append(clean, '}')
		ex.body = ex.pre.clean
		return true
	}
	return true
}

// errBodyNotObject answers a body the disaggregation stages could not
// rewrite, which the parser had accepted as a JSON object: the router's
// failure, not the client's.
var errBodyNotObject = &openai.Error{Status: fasthttp.StatusInternalServerError, Type: openai.TypeServerError, Code: "internal_error",
	Message: "the router could not rewrite the request body for its stages"}

var (
	vllmTransferFields   = []string{"kv_transfer_params"}
	sglangTransferFields = []string{"bootstrap_host", "bootstrap_port", "bootstrap_room", "disagg_prefill_dp_rank"}
)

// routablePrefill are the prefill candidates that can take the stage now:
// healthy, not ejected, serving the model. With none, the decode worker
// prefills, and is booked for it, from the start: a prefill pool that is
// down is not a remote decision that then falls back.
func (s *Server) routablePrefill(ex *exchange) workers.Set {
	preq := s.prefillRequest(ex)
	return s.sched.Eligible(&preq, 0)
}

// prefillCandidates are the workers the prefill stage may choose: the
// prefill pool, under the request's allow-list, without the decode worker
// (a both-role worker prefilling for itself is a local prefill).
func (s *Server) prefillCandidates(ex *exchange) workers.Set {
	set := s.prefillPool() &^ workers.SetOf(ex.dec.Slot)
	if ex.sreq.AllowListed {
		set &= ex.sreq.Allow
	}
	return set
}

// prefillPool is every worker that can run a remote prefill, healthy or
// not: under SGLang's protocol only engines started in prefill mode (an
// aggregated one ignores the bootstrap fields and generates the whole
// answer, which no decode engine then receives), else the prefill stage's
// workers, both-role ones among them.
func (s *Server) prefillPool() workers.Set {
	if s.cfg.Disagg.Protocol == DisaggSGLang {
		return s.sched.RoleWorkers(workers.RolePrefill)
	}
	return s.sched.StageWorkers(sched.StagePrefill)
}

// prefillRequest is the selection request of the prefill stage: the same
// prompt and overlaps, the prefill pool, no output.
func (s *Server) prefillRequest(ex *exchange) sched.Request {
	preq := ex.sreq
	preq.Stage = sched.StagePrefill
	preq.ExpectedOutputTokens = 0
	preq.Unstreamed = false // its one token, at its answer, is its first
	preq.Scores = nil
	preq.Pinned = false // a pin names the worker that answers: the decode worker
	preq.AllowListed, preq.Allow = true, s.prefillCandidates(ex)
	return preq
}

// prefillVLLM runs the vLLM prefill stage: the prompt, one token and
// kv_transfer_params asking to keep the KV for a remote decode, on a
// prefill worker; a failed attempt is retried on another prefill worker,
// up to MaxRetries times. On success the decode body, carrying the
// prefill's answer's kv_transfer_params, is in ex.pre.decode. It reports
// false when every attempt failed or the client left.
func (s *Server) prefillVLLM(ctx *fasthttp.RequestCtx, ex *exchange) bool {
	st := &ex.pre
	var err error
	if st.body, err = appendVLLMPrefillBody(st.body[:0], ex.body, ex.api == openai.APIChatCompletions); err != nil {
		return false
	}
	preq := s.prefillRequest(ex)
	for attempt := 0; attempt <= s.cfg.MaxRetries; attempt++ {
		ex.setPrefillGuard(s.guards.Acquire())
		d, serr := st.h.Select(&ex.wait, &preq)
		if serr != nil {
			ex.releasePrefill()
			return false
		}
		if attempt > 0 {
			s.metrics.retries.Inc() // counted once there is somewhere to send it
		}
		st.dec = d
		ex.setPrefillCall(s.engines.AcquireCall())
		if s.cfg.MaxRetries > 0 {
			st.call.SetAttempts(&st.attempts)
		}
		st.call.SetRequest(routedPath(ex.api), st.body)
		st.call.RequireObject()
		copyForwardHeaders(ctx, st.call.Request(), ex.rid, ex.via)
		span := ex.startCall(spanPrefill, st.call.Request(), &d, stagePrefill)
		t0 := clock.Now()
		err := st.call.DoWithin(d.Slot, st, s.cfg.Disagg.PrefillTimeout)
		var body []byte
		if err == nil {
			body, err = st.call.ReadBodyWithin(stageBodyTimeout)
		}
		if err == nil && st.call.StatusCode() >= 300 {
			err = errPrefillRefused
			if judgesRequest(st.call) {
				err = errPrefillInvalid
			}
			st.abortFailed()
		}
		var params []byte
		if err == nil {
			// vLLM answers null when the request ended at its one token
			// (an end-of-sequence token): nothing is kept for a remote
			// decode, and the decode worker computes the prompt itself,
			// as vLLM's own proxy lets it.
			params, err = transferParams(body, ex.sreq.PromptTokens)
		}
		if err == nil {
			st.decode, err = appendVLLMDecodeBody(st.decode[:0], ex.body, params)
		}
		s.metrics.dis.stages[stagePrefill].Observe(seconds(clock.Since(t0)))
		endCall(span, err)
		ex.releasePrefill() // the prefill stage is over: its booking goes now
		if err == nil {
			st.decided = true
			s.remember(ex, d.Slot)
			return true
		}
		if ex.clientGone() || errors.Is(err, dispatch.ErrClientGone) {
			return false
		}
		s.metrics.dis.prefillFailures.Inc()
		s.warnMalformed(d, err)
		s.log.Debug("prefill stage failed", "request_id", string(ex.rid), "worker", d.WorkerID, "err", err)
		if !retryablePrefill(err) {
			return false
		}
		preq.Allow &^= workers.SetOf(d.Slot)
		if preq.Allow == 0 {
			return false
		}
	}
	return false
}

// judgesRequest reports whether an internal stage's error answer judges
// the request itself, as every engine of the model would (a 4xx: too
// long, a parameter or an item it refuses), so that another engine
// would only say the same; or else the engine's state, which another
// may not share: a 5xx, a refusal of the router's key (Call.Failed: an
// engine restarted with another), a timeout (408), a throttle (429), a
// model it does not serve (404).
func judgesRequest(call *dispatch.Call) bool {
	switch code := call.StatusCode(); {
	case code < 400 || code >= 500 || call.Failed():
		return false
	case code == fasthttp.StatusNotFound, code == fasthttp.StatusRequestTimeout, code == fasthttp.StatusTooManyRequests:
		return false
	}
	return true
}

// errPrefillRefused is a prefill engine's 5xx or other refusal of its
// own state; one judging the request (judgesRequest) is
// errPrefillInvalid.
var (
	errPrefillRefused = errors.New("the prefill engine refused the request")
	errPrefillInvalid = errors.New("the prefill engine found the request invalid")
	// errPrefillAborted: an SGLang prefill's stream ended with the engine's
	// own error event (it aborted the request after its headers).
	errPrefillAborted = errors.New("the prefill engine aborted the request in its stream")
)

// errStageGarbled is a prefill's answer whose kv_transfer_params are not
// an object: the engine's failure, tried elsewhere. (An answer that is
// not one whole JSON object, or an error object under a 2xx, failed in
// ReadBody: the stage's call requires an object.)
var errStageGarbled = errors.New("the engine's answer is not a JSON completion")

// maxTransferParams bounds the kv_transfer_params a prefill answer may
// hand to the decode engine for a prompt of promptTokens: vLLM's hold a
// block id per prompt block per KV-cache group (some 7 bytes each, a
// block being 16 tokens or more), so 16 bytes per prompt token is room
// for a dozen groups, and 1 MiB for anything shorter.
func maxTransferParams(promptTokens int) int { return max(1<<20, 16*promptTokens) }

// errTransferTooLarge is kv_transfer_params past maxTransferParams: every
// prefill worker of the pool would send as many, so the request is not
// tried on another, and the decode worker computes the prompt itself.
var errTransferTooLarge = errors.New("the prefill engine's kv_transfer_params are too large to forward")

// transferParams returns the kv_transfer_params of a checked prefill
// answer for the decode request of a prompt of promptTokens: an object of
// at most maxTransferParams bytes, or nil where vLLM sends null or none
// (the request ended at its one token: the decode engine computes the
// prompt itself).
func transferParams(body []byte, promptTokens int) ([]byte, error) {
	params := topLevelMember(body, "kv_transfer_params")
	switch {
	case params == nil, string(params) == "null":
		return nil, nil
	case params[0] != '{':
		return nil, errStageGarbled
	case len(params) > maxTransferParams(promptTokens):
		return nil, errTransferTooLarge
	}
	return params, nil
}

// retryablePrefill: a prefill failure is tried on another prefill worker
// unless the request itself is at fault (a 4xx), which no worker would
// accept, or its client left.
func retryablePrefill(err error) bool {
	return !errors.Is(err, dispatch.ErrClientGone) && !errors.Is(err, errPrefillInvalid) && !errors.Is(err, errTransferTooLarge)
}

// startSGLang starts the SGLang prefill stage: both stages get the
// client's body with the prefill worker's bootstrap address and a fresh
// room, the prefill request is sent from a goroutine of its own, and the
// decode request goes on at once (forward), so that the decode engine
// pairs with the prefill engine by room while both run. The prefill's
// answer is read and dropped; cleanup waits for the sender. An error is
// why no prefill was sent: no prefill worker could be booked (Select's
// error), or the body could not be rewritten.
func (s *Server) startSGLang(ctx *fasthttp.RequestCtx, ex *exchange) error {
	st := &ex.pre
	preq := s.prefillRequest(ex)
	ex.setPrefillGuard(s.guards.Acquire())
	d, err := st.h.Select(&ex.wait, &preq)
	if err != nil {
		ex.releasePrefill()
		return err
	}
	host, portText, err := net.SplitHostPort(d.Endpoint)
	if err != nil {
		host = d.Endpoint
	}
	if strings.Contains(host, ":") {
		// An IPv6 address goes bracketed, as SGLang's own load balancer
		// sends it (mini_lb's maybe_wrap_ipv6_address).
		host = "[" + host + "]"
	}
	port := s.cfg.Disagg.BootstrapPort
	if info, _ := s.sched.Worker(d.Slot); info.BootstrapPort > 0 {
		port = info.BootstrapPort
	}
	if port == BootstrapHTTPPort {
		port, _ = strconv.Atoi(portText)
	}
	room := sglangRoom(d.DPRank)
	if st.body, err = appendSGLangBody(st.body[:0], ex.body, sglangBootstrap{host: host, port: port, room: room}); err != nil {
		ex.releasePrefill()
		return err
	}
	// The decode engine is told which of the prefill engine's
	// data-parallel ranks holds the KV (SGLang's disagg_prefill_dp_rank,
	// as its router sends it); the room says it too, for releases that
	// read only the room. The prefill's body with that member added.
	st.decode = appendMember(append(st.decode[:0], st.body[:len(st.body)-1]...), true, "disagg_prefill_dp_rank", "")
	st.decode = append(strconv.AppendUint(st.decode, uint64(d.DPRank), 10), '}')
	st.dec, st.decided = d, true
	ex.setPrefillCall(s.engines.AcquireCall())
	st.call.SetRequest(routedPath(ex.api), st.body)
	copyForwardHeaders(ctx, st.call.Request(), ex.rid, ex.via)
	span := ex.startCall(spanPrefill, st.call.Request(), &d, stagePrefill)
	st.done = make(chan struct{})
	go func(call *dispatch.Call, slot workers.Slot) {
		defer close(st.done)
		t0 := clock.Now()
		// A prefill engine that never answers holds the decode engine,
		// which waits for the room's KV, and the client: bounded as a
		// vLLM prefill is.
		err := call.DoWithin(slot, st, s.cfg.Disagg.PrefillTimeout)
		// The prefill failed when it got no success status (refused, a
		// connection that broke or never was, an error status), or when
		// its stream, whose headers come before any work, broke. A plain
		// 2xx answer comes once the prompt is computed and its KV on its
		// way, whatever becomes of the rest of it (a broken read, one the
		// router will not hold): the decode is left to finish.
		failed := err != nil || call.StatusCode() >= 300
		if err == nil {
			if call.IsEventStream() {
				err = call.Relay(discardWriter())
				if err == nil && call.EngineErred() {
					// An error event ends an SGLang prefill that aborted
					// after its stream began: its KV will not come.
					err = errPrefillAborted
				}
				failed = failed || err != nil
			} else {
				var body []byte
				body, err = call.ReadBody()
				if err == nil && judgesRequest(call) && len(body) <= maxRefusalBytes && json.Valid(body) {
					// Kept for the client: the engine's own words on
					// why the request is invalid (prefillRefusal).
					st.refusalStatus, st.refusal = call.StatusCode(), append(st.refusal[:0], body...)
				}
			}
			if err == nil && call.StatusCode() < 300 {
				_ = st.h.Close()
			}
		}
		s.metrics.dis.stages[stagePrefill].Observe(seconds(clock.Since(t0)))
		if err == nil && call.StatusCode() >= 300 {
			err = errPrefillRefused
		}
		endCall(span, err)
		if !failed {
			// Its engine computed the prompt: the history may say so
			// (the exchange outlives this goroutine: releasePrefill waits
			// for it).
			s.remember(ex, slot)
		}
		if judgesRequest(call) {
			ex.hangMu.Lock()
			st.refused = true
			ex.hangMu.Unlock()
		}
		if failed && !errors.Is(err, dispatch.ErrClientGone) && !errors.Is(err, dispatch.ErrShuttingDown) {
			s.metrics.dis.prefillFailures.Inc()
			s.log.Debug("prefill stage failed", "request_id", string(ex.rid), "worker", d.WorkerID, "err", err)
			ex.failDecode()
		}
	}(st.call, d.Slot)
	return nil
}

// roomStride is a multiple of every data-parallel size up to 16, and of
// 32 and 64: a room that is the rank plus a multiple of it leaves that
// rank as the room modulo any such size. SGLang's decode engines before
// disagg_prefill_dp_rank pull a room's KV from prefill rank room %
// prefill_dp_size, and its prefill engines without a pinned rank compute
// it there too. 2^63 / roomStride still leaves 3.2e12 rooms to draw from.
const roomStride = 2882880

// sglangRoom draws a bootstrap room (SGLang reads it as a signed 64-bit
// integer) that names prefillRank as room % dp for the data-parallel
// sizes roomStride covers.
func sglangRoom(prefillRank uint32) uint64 {
	n := (uint64(1)<<63 - 1 - uint64(prefillRank)) / roomStride
	return rand.Uint64N(n)*roomStride + uint64(prefillRank)
}

// failDecode fails the decode call of an SGLang request whose prefill
// failed before answering, unless the decode has its first token (its KV
// came all the same): its engine would wait for the room's KV until SGLang's bootstrap
// timeout, minutes, and the client with it. The client gets a 502
// prefill_failed, or an error event if its stream has begun; the decode
// engine sees its connection close and drops the request. sgl-router
// retries such a request with a new pair; kvfast does not (docs/routing.md).
func (ex *exchange) failDecode() {
	ex.hangMu.Lock()
	ex.pre.failed = !ex.pre.decodeStarted
	call, failed := ex.call, ex.pre.failed
	ex.hangMu.Unlock()
	if failed && call != nil {
		call.FailPrefill()
	}
}

// prefillRefusal writes the SGLang prefill engine's own 4xx as the
// client's answer when the decode call failed on it (failDecode): the
// request is at fault, and the decode engine would have said so too had
// it answered first. It reports false, writing nothing, when the prefill
// did not refuse the request or its answer was not kept.
func (ex *exchange) prefillRefusal(ctx *fasthttp.RequestCtx) bool {
	ex.hangMu.Lock()
	refused := ex.pre.refused && len(ex.pre.refusal) > 0
	ex.hangMu.Unlock()
	if !refused {
		return false
	}
	ex.count(statusEngineRejected)
	ctx.Response.Reset()
	ctx.Response.Header.SetBytesV(HeaderRequestID, ex.rid)
	ctx.SetStatusCode(ex.pre.refusalStatus)
	ctx.SetContentType("application/json")
	ctx.SetBody(ex.pre.refusal)
	return true
}

// prefillFailed waits up to wait for an SGLang prefill's outcome and
// reports whether it failed (failDecode) other than by refusing the
// request with a 4xx. False without one.
func (ex *exchange) prefillFailed(wait time.Duration) bool {
	if ex.pre.done == nil {
		return false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ex.pre.done:
	case <-t.C:
		return false
	}
	ex.hangMu.Lock()
	defer ex.hangMu.Unlock()
	return ex.pre.failed && !ex.pre.refused
}

// sglangVerdictWait bounds how long a decode engine's error answer waits
// for its SGLang prefill's outcome, which decides what the client is
// told: a prefill still running when the decode has failed is seldom the
// cause.
const sglangVerdictWait = 5 * time.Second

// discardWriter is where an SGLang prefill engine's streamed answer goes.
func discardWriter() *bufio.Writer { return bufio.NewWriterSize(io.Discard, 4096) }

// setPrefillHeaders names the prefill worker in the response, beside the
// decode worker's X-Kvfast-Worker.
func (ex *exchange) setPrefillHeaders(ctx *fasthttp.RequestCtx) {
	h := &ctx.Response.Header
	ex.out = strconv.AppendUint(ex.out[:0], ex.pre.dec.WorkerID, 10)
	h.SetBytesV(HeaderPrefillWorker, ex.out)
	ex.out = strconv.AppendUint(ex.out[:0], uint64(ex.pre.dec.DPRank), 10)
	h.SetBytesV(HeaderPrefillDPRank, ex.out)
}

// Response headers of a disaggregated request.
const (
	// HeaderPrefillWorker names the worker that prefilled the prompt of a
	// disaggregated request; X-Kvfast-Worker names the decode worker.
	HeaderPrefillWorker = "X-Kvfast-Prefill-Worker"
	HeaderPrefillDPRank = "X-Kvfast-Prefill-Dp-Rank"
)

// decodeDispatched and decodeFirstToken split a disaggregated request's
// time to first token into its stages (the exchange's observer calls
// them).
func (ex *exchange) decodeDispatched() {
	if !ex.pre.decided {
		return
	}
	now := clock.Now()
	ex.pre.decodeAnswered = now
	ex.s.metrics.dis.stages[stageTransferWait].Observe(seconds(time.Duration(now - ex.pre.decodeSent)))
}

func (ex *exchange) decodeFirstToken(now int64) {
	if !ex.pre.decided {
		return
	}
	if ex.pre.done != nil { // an SGLang prefill may still be running (failDecode)
		ex.hangMu.Lock()
		ex.pre.decodeStarted = true
		ex.hangMu.Unlock()
	}
	if ex.pre.decodeAnswered == 0 {
		return
	}
	ex.s.metrics.dis.stages[stageFirstDecode].Observe(seconds(time.Duration(now - ex.pre.decodeAnswered)))
}

// appendDisaggRoute extends a route-only answer (b ends with its closing
// brace) with the prefill stage's choice and the disaggregation decision.
func (s *Server) appendDisaggRoute(ctx context.Context, b []byte, ex *exchange) []byte {
	if len(b) == 0 || b[len(b)-1] != '}' {
		return b
	}
	b = b[:len(b)-1]
	decision := s.decideDisagg(ex)
	b = append(b, `,"disaggregation":`...)
	b = jsonscan.AppendQuoted(b, decision)
	b = append(b, `,"prefill":`...)
	if decision != decisionRemote {
		return append(b, "null}"...)
	}
	preq := s.prefillRequest(ex)
	preq.QueryOnly = true
	d, err := s.sched.Select(ctx, &preq, nil)
	if err != nil {
		return append(b, "null}"...)
	}
	b = append(b, `{"worker_id":`...)
	b = strconv.AppendUint(b, d.WorkerID, 10)
	b = append(b, `,"dp_rank":`...)
	b = strconv.AppendUint(b, uint64(d.DPRank), 10)
	b = append(b, `,"endpoint":`...)
	b = jsonscan.AppendQuoted(b, d.Endpoint)
	b = append(b, `,"overlap_blocks":`...)
	b = strconv.AppendUint(b, uint64(d.OverlapBlocks), 10)
	b = append(b, `,"busy":`...)
	b = strconv.AppendBool(b, d.Busy)
	return append(b, "}}"...)
}
