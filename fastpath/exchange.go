package fastpath

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"net"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/dispatch"
	"github.com/kvfast/kvfast/guard"
	"github.com/kvfast/kvfast/internal/clock"
	"github.com/kvfast/kvfast/internal/hangup"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/prompt"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/workers"
)

// exchange is one client request from arrival to cleanup. It is pooled and
// owns every per-request buffer, so a routed request allocates nothing of
// its own. It is also the dispatch.Observer that turns engine progress into
// guard transitions and metrics: an interface value over a pooled pointer,
// not a closure per request.
type exchange struct {
	s        *Server
	api      openai.API
	req      openai.ParsedRequest
	tokens   []uint32          // a text or chat prompt's ids, when its model has a renderer
	mm       prompt.Multimodal // the prompt's images, audio, video, when the renderer learns them
	hashes   []uint64
	overlaps workers.Overlaps
	lower    workers.LowerTiers
	// adapterWorkers are the workers whose engines list the LoRA adapter
	// the request names (0: it names none): a session bound elsewhere
	// moves for its model, not for an allow-list.
	adapterWorkers workers.Set
	// clientAllowed and clientAllow are the client's X-Kvfast-Allow, as
	// sent: the router narrows sreq.Allow further on its own (adapters,
	// engines not listing the model or refusing the router's key), and a
	// refusal blamed on the client's list must be of the client's list.
	clientAllowed bool
	clientAllow   workers.Set
	// scores is the route-only answer's per-worker table (3 KiB). It is
	// allocated with the exchange and kept across reuse instead of being
	// zeroed with the rest of it on every request: the scheduler writes
	// the eligible set and every eligible worker's row, and only those
	// rows are read.
	scores *sched.Scores
	sreq   sched.Request
	dec    sched.Decision
	h      guard.Handle
	held   bool // h is acquired and not yet released
	call   *dispatch.Call
	// attempts holds the decode attempts' 5xx verdicts until an engine
	// serves the request (dispatch.Attempts).
	attempts dispatch.Attempts
	exact    bool          // hashes are token blocks looked up in the event-fed index
	pre      prefillStage  // a disaggregated request's prefill stage (disagg.go)
	media    prompt.Media  // a chat request's multimodal items, read when they go to encoders (encode.go)
	enc      []encodeStage // one per item of media: the encoder stage (encode.go)

	arrived, lastItem int64
	firstSeen         bool
	items             int
	abortErr          error
	outcome           string       // the status label the request was counted under (count)
	tr                requestTrace // its spans, when the request is traced (trace.go)

	wait queueWait // bounds the admission-queue wait of Select
	sess exchangeSession

	// The client's hang-up (Server.hangups) arrives on the watcher's
	// goroutine: hangMu orders it with the handler's changes of h.
	watch   hangup.Registration
	watched bool // watchClient ran
	hangMu  sync.Mutex
	hungUp  bool

	body    []byte // the request body (readBody): ex.buf's bytes, or fasthttp's
	buf     []byte // the pooled body buffer
	charged int64  // bytes of buf charged to the server's body budget

	rid []byte // request id, echoed back
	via []byte // HeaderVia of the requests forwarded: the client's, then this router's
	out []byte // scratch for response bodies and header values
	sw  fasthttp.StreamWriter
}

func newExchange(s *Server) any {
	ex := &exchange{s: s, scores: new(sched.Scores)}
	ex.sw = ex.stream
	return ex
}

func (s *Server) acquireExchange() *exchange {
	ex := s.exchanges.Get().(*exchange)
	ex.arrived = clock.Now()
	return ex
}

// maxPooledHashes and maxPooledTokens keep one huge prompt from pinning
// its buffers forever.
const (
	maxPooledHashes       = 1 << 16
	maxPooledTokens       = 1 << 18
	maxPooledEncodeStages = 64
	maxPooledEncodeBody   = 64 << 10
)

func (s *Server) releaseExchange(ex *exchange) {
	if ex.held {
		panic("BUG: fastpath: exchange released with its guard held")
	}
	ex.req.Recycle()
	if cap(ex.hashes) > maxPooledHashes {
		ex.hashes = nil
	}
	if cap(ex.tokens) > maxPooledTokens {
		ex.tokens = nil
	}
	if cap(ex.out) > 1<<16 {
		ex.out = nil
	}
	ex.media.Reset()
	if cap(ex.enc) > maxPooledEncodeStages {
		ex.enc = nil
	}
	for i := range ex.enc[:cap(ex.enc)] {
		if st := &ex.enc[:cap(ex.enc)][i]; cap(st.body) > maxPooledEncodeBody {
			st.body = nil // one 20 MiB image must not stay pinned in the pool
		}
	}
	ex.wait.release()
	ex.releaseBody()
	*ex = exchange{s: s, sw: ex.sw, req: ex.req, scores: ex.scores, tokens: ex.tokens[:0], hashes: ex.hashes[:0], rid: ex.rid[:0], via: ex.via[:0], out: ex.out[:0], buf: ex.buf,
		sess:  exchangeSession{id: ex.sess.id[:0], scoped: ex.sess.scoped[:0]},
		pre:   ex.pre.recycle(),
		media: ex.media, enc: ex.enc[:0]}
	s.exchanges.Put(ex)
}

// serveOpenAI handles /v1/completions and /v1/chat/completions, and their
// route-only twins when routeOnly is set.
func (s *Server) serveOpenAI(ctx *fasthttp.RequestCtx, api openai.API, routeOnly bool) {
	if !ctx.IsPost() {
		ctx.Response.Header.Set("Allow", "POST")
		writeError(ctx, fasthttp.StatusMethodNotAllowed, errMethodNotAllowed)
		return
	}
	ex := s.acquireExchange()
	ex.api = api
	// Once a stream takes the exchange over, its goroutine may finish and
	// recycle ex before this handler returns: settle must learn of the
	// hand-off from a local, not from ex. settle is deferred itself, not
	// called from a deferred closure, or its recover would return nil.
	handedOff := false
	defer s.settle(ctx, ex, &handedOff)
	ex.echoRequestID(ctx)
	if !routeOnly && ex.passedHere(ctx) {
		// An engine registered at this router's own address, or at a
		// router that sends here: each round would book and forward
		// again. The router that sent it counts the 508 against that
		// engine, which outlier ejection then takes out of routing.
		ex.count(statusClientError)
		ex.s.throttle.Log(ex.s.log, slog.LevelError, "loop", "a request came back to the router that forwarded it: some worker's endpoint is this router (or routes to it)",
			"via", string(ctx.Request.Header.Peek(HeaderVia)))
		writeError(ctx, fasthttp.StatusLoopDetected, errLoop)
		return
	}
	ex.traceStart(ctx)
	if rerr := s.readBody(ctx, ex); rerr != nil {
		if rerr == errBodyBudget {
			ctx.Response.Header.SetBytesV("Retry-After", s.retryAfter(ex))
			ex.count(statusOverloaded)
			writeError(ctx, rerr.Status, rerr)
			return
		}
		ex.reject(ctx, rerr)
		return
	}
	if err := s.parser.Parse(ex.body, api, &ex.req); err != nil {
		ex.reject(ctx, asRequestError(err))
		return
	}
	queryOnly, rerr := s.readHints(ctx, ex)
	if rerr != nil {
		ex.reject(ctx, rerr)
		return
	}
	// Under the server's cut, not ctx: a render or a wait for the node's
	// models that a drain began is not refused for it.
	if rerr := s.prepare(s.cut, ex.body, ex); rerr != nil {
		ex.reject(ctx, rerr)
		return
	}
	if rerr := s.readMedia(ex); rerr != nil {
		ex.reject(ctx, rerr)
		return
	}
	if rerr := s.stickyRoute(ctx, ex, routeOnly || queryOnly); rerr != nil {
		ex.reject(ctx, rerr)
		return
	}
	// After the session's binding, which it leaves pinned.
	s.avoidThrottled(&ex.sreq)
	if routeOnly || queryOnly {
		s.routeOnly(ctx, ex)
		return
	}
	if s.disaggregating() && (ex.req.Session.Open || ex.req.Session.Close) {
		ex.reject(ctx, errSessionControlDisagg)
		return
	}
	if len(ex.media.Items) > 0 {
		// The encoder stage may encode dozens of items: a request that
		// selection will refuse whatever the load (a pin to an encoder,
		// no healthy worker for it) is refused before, not after.
		if err := s.sched.Routable(&ex.sreq); err != nil {
			ex.failSelect(ctx, err)
			return
		}
	}
	if len(ex.media.Items) > 0 && !s.serveEncode(ctx, ex) {
		ex.failSelect(ctx, context.Canceled) // the client left during the encoder stage
		return
	}
	if s.disaggregating() {
		handedOff = s.serveDisagg(ctx, ex)
		return
	}
	if !s.book(ctx, ex) || !ex.sessionControl(ctx) {
		return
	}
	handedOff = s.forward(ctx, ex)
}

// book chooses the request's worker and books it into a fresh guard,
// watching the client from here on: a session's binding pins it
// (selectSticky), the wait and the stage are measured, and a refusal is
// answered. It reports whether ex.dec holds a booked decision.
func (s *Server) book(ctx *fasthttp.RequestCtx, ex *exchange) bool {
	ex.wait.reset(s.cut, s.cfg.QueueTimeout)
	ex.setGuard(s.guards.Acquire())
	ex.watchClient(ctx)
	dec, err := ex.selectSticky()
	if err == nil {
		dec, err = s.claimSession(ex, dec)
	}
	if ex.wait.queued() {
		s.waits.observe(clock.Since(ex.lastItem))
	}
	s.metrics.stageSched.Observe(seconds(clock.Since(ex.lastItem)))
	s.metrics.stageTotal.Observe(seconds(clock.Since(ex.arrived)))
	ex.traceRoute(&dec, err)
	if err != nil {
		ex.failSelect(ctx, err)
		return false
	}
	ex.dec = dec
	return true
}

// settle runs when the handler returns. Unless a stream took the exchange
// over, it releases what the request still holds. A panic anywhere in
// routing is answered with a 500 instead of killing the router, and its
// guard is aborted with ReasonPanic before release.
func (s *Server) settle(ctx *fasthttp.RequestCtx, ex *exchange, handedOff *bool) {
	p := recover()
	if *handedOff {
		// Nothing runs after the hand-off, so p is nil; ex is not ours.
		return
	}
	if p != nil {
		s.log.Error("BUG: panic while routing a request", "panic", p, "request_id", string(ex.rid))
		if ex.held {
			_ = ex.h.Abort(guard.ReasonPanic)
		}
		ctx.Response.Reset()
		ctx.Response.Header.SetBytesV(HeaderRequestID, ex.rid)
		writeError(ctx, fasthttp.StatusInternalServerError, errInternal)
		ex.count(statusEngineError)
	}
	ex.cleanup()
}

// cleanup releases the guard and the engine call exactly once and returns
// the exchange to its pool.
func (ex *exchange) cleanup() {
	ex.watch.Stop() // no HangUp runs after this
	ex.watch = hangup.Registration{}
	if ex.outcome != "" { // counted in kvfast_requests_total
		i := 0
		if ex.api == openai.APIChatCompletions {
			i = 1
		}
		ex.s.metrics.duration[i].Observe(seconds(clock.Since(ex.arrived)))
	}
	for i := range ex.enc {
		ex.releaseEncode(i)
	}
	ex.releasePrefill()
	ex.traceEnd()
	ex.endSession()
	if ex.held {
		ex.held = false
		_ = ex.h.Release()
	}
	if ex.call != nil {
		ex.call.Release()
		ex.call = nil
	}
	ex.settleVerdicts()
	ex.s.releaseExchange(ex)
}

// settleVerdicts settles the 5xx verdicts the request's stages still
// hold, no engine having served them (dispatch.Attempts.Done), and counts
// those held against no engine.
func (ex *exchange) settleVerdicts() {
	n := ex.attempts.Done() + ex.pre.attempts.Done()
	for i := range ex.enc {
		n += ex.enc[i].verdicts.Done()
	}
	if n > 0 {
		ex.s.metrics.unattributed.Add(float64(n))
	}
}

// prepare hashes the prompt and looks up every worker's cached prefix. A
// text or chat prompt whose model has a renderer is first turned into the
// engine's token ids and then hashed as token blocks, as a token-id prompt
// is; without one, or when the renderer fails, it is hashed approximately.
// The body itself reaches the engine unchanged either way.
func (s *Server) prepare(ctx context.Context, body []byte, ex *exchange) *openai.Error {
	r := &ex.req
	model, seed, render, only, err := s.namespace(ctx, r)
	if err != nil {
		return err
	}
	clientAllow := ex.sreq.AllowListed // X-Kvfast-Allow
	ex.clientAllowed, ex.clientAllow = clientAllow, ex.sreq.Allow
	if only != 0 {
		// An adapter: only the engines that list it can serve it.
		ex.adapterWorkers = only
		if !ex.sreq.AllowListed {
			ex.sreq.AllowListed, ex.sreq.Allow = true, workers.AllSlots
		}
		ex.sreq.Allow &= only
	}
	if clientAllow && model != "" && ex.sreq.Allow&s.sched.ModelWorkers(model) == 0 && !s.modelsUnknown() {
		// Not the 503 selection would give: a client told to retry would
		// retry for ever. Unless a static worker's model is still to be
		// learned: the list may name it.
		return errAllowNoModel
	}
	// The model filters selection, and first what avoidUnlisted counts as
	// another worker.
	ex.sreq.Model = model
	s.avoidUnlisted(&ex.sreq)
	t0 := clock.Now()
	ex.tr.routeAt = t0
	exactBlocks, tokens := r.Prompt == openai.PromptTokens, r.Tokens
	ex.mm.Reset()
	if (r.Prompt == openai.PromptText || r.Prompt == openai.PromptMessages) && render != nil {
		var rerr error
		if mr, ok := render.(prompt.MultimodalRenderer); ok {
			ex.tokens, rerr = mr.TokensMultimodal(ctx, ex.tokens[:0], &ex.mm, ex.api, body, r)
		} else {
			ex.tokens, rerr = render.Tokens(ctx, ex.tokens[:0], ex.api, body, r)
		}
		t1 := clock.Now()
		s.metrics.stageTokenize.Observe(seconds(time.Duration(t1 - t0)))
		t0 = t1
		ex.tr.rendered = true
		if errors.Is(rerr, prompt.ErrInvalidRequest) {
			return &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "invalid_prompt", Message: rerr.Error()}
		}
		// Any other failure was counted by the renderer; the request still
		// routes, approximately.
		exactBlocks, tokens = rerr == nil && len(ex.tokens) > 0, ex.tokens
	}
	bs := s.sched.BlockSize()
	// An engine hashes an image's blocks with the image's hash: with the
	// inputs the renderer learned, so does the router, and the prompt
	// routes exactly. Without them (a built-in template, /tokenize, a
	// render without features) the token ids hold the same placeholders
	// for every image, and hashed as text they would match another image's
	// blocks: those the router booked for requests in flight, and those of
	// an engine whose events carry no multimodal keys. Such a prompt
	// routes approximately: its JSON text holds each item's URL or data,
	// where another image's prompt stops matching.
	switch {
	case len(ex.mm.Items) > 0:
		s.metrics.multimodalExact.Inc()
	case r.Prompt == openai.PromptMessages && prompt.HasMultimodalParts(r.Messages):
		s.metrics.multimodalApprox.Inc()
		exactBlocks = false
	}
	if exactBlocks {
		ex.hashes = radix.AppendBlockHashesMM(ex.hashes[:0], seed, tokens, bs, ex.mm.Items)
		ex.exact = !s.useApprox
		ex.sreq.PromptTokens = len(tokens)
	} else if r.Prompt == openai.PromptEmbeds {
		// A serialized tensor of a hidden size the router does not know:
		// its length says little of its tokens, and its bytes say where
		// the same embeddings went before, no more.
		ex.hashes, ex.sreq.PromptTokens = radix.AppendEmbedsHashes(ex.hashes[:0], radix.ApproxSeed(seed), r.Embeds, s.cfg.ApproxChunkBytes, bs)
		ex.exact = false
	} else {
		ex.hashes = radix.AppendApproxHashes(ex.hashes[:0], radix.ApproxSeed(seed), r.ApproxText(), s.cfg.ApproxChunkBytes)
		ex.exact = false
		// About four bytes per token: enough for load accounting, which
		// weighs this request's prefill against the others'.
		ex.sreq.PromptTokens = max(len(r.ApproxText())/4, len(ex.hashes)*bs)
	}
	t1 := clock.Now()
	ex.sreq.LowerTiers = nil
	switch {
	case ex.exact:
		s.lookup(ex)
	default:
		s.approx.FindMatches(ex.hashes, &ex.overlaps)
	}
	if ex.exact {
		s.approx.FindMatchesFor(s.silent, ex.hashes, &ex.overlaps)
	}
	t2 := clock.Now()
	s.metrics.stageHash.Observe(seconds(time.Duration(t1 - t0)))
	s.metrics.stageLookup.Observe(seconds(time.Duration(t2 - t1)))
	ex.lastItem = t2 // start of the schedule stage, reused as a stopwatch
	ex.tr.hashAt, ex.tr.lookupAt, ex.tr.selectAt = t0, t1, t2
	ex.sreq.Hashes = ex.hashes
	ex.sreq.Overlaps = &ex.overlaps
	ex.sreq.Unstreamed = !r.Stream
	if r.MaxTokens > 0 {
		// Every choice generates up to max_tokens, and the relay counts
		// the items of all of them. Each factor is capped before they
		// multiply, since either may be near 2^63.
		choices := min(max(r.Choices, 1), 1<<30)
		ex.sreq.ExpectedOutputTokens = int(min(min(r.MaxTokens, 1<<30)*choices, 1<<30))
	}
	return nil
}

// lookup fills the exchange's overlaps from the event-fed index. The
// index may live in the segment's mapping, which a truncated file makes
// fault: caught, the segment is detached (shm/fault.go) and the request
// routes as if nothing were cached.
func (s *Server) lookup(ex *exchange) {
	var faulted bool
	defer func() {
		if faulted {
			ex.overlaps, ex.sreq.LowerTiers = workers.Overlaps{}, nil
		}
	}()
	defer s.segment.Catch(&faulted)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	if s.sched.Tiered() {
		s.index.FindTieredMatches(ex.hashes, &ex.overlaps, &ex.lower)
		ex.sreq.LowerTiers = &ex.lower
		return
	}
	s.index.FindMatches(ex.hashes, &ex.overlaps)
}

// remember records in the router's history that slot now holds the
// request's prompt, where the history is what routes it: text prompts
// (approximate), and exact prompts to engines that publish no KV events.
func (s *Server) remember(ex *exchange, slot workers.Slot) {
	if !ex.exact || s.silent.Has(slot) {
		s.approx.Insert(slot, ex.hashes, time.Now())
	}
}

// canTryElsewhere reports whether a worker other than the one that just
// answered could take the request's next attempt; a sticky pin gives way,
// as it does on the re-route.
func (ex *exchange) canTryElsewhere() bool {
	req := &ex.sreq
	if ex.sess.sticky {
		unpinned := *req
		unpinned.Pinned = false
		req = &unpinned
	}
	return ex.s.sched.Eligible(req, workers.SetOf(ex.dec.Slot)) != 0
}

// pairedSGLang reports whether the decode request is one half of an SGLang
// prefill/decode pair. Its room is spent on the engine that was sent it:
// the prefill engine hands the prompt's KV to whichever decode engine
// claimed the room, and another decode engine sent the same room would
// wait for KV that never comes, until its bootstrap timeout. So the pair
// is not retried: the client gets the decode engine's answer or a 502.
func (ex *exchange) pairedSGLang() bool {
	return ex.pre.decided && ex.s.cfg.Disagg.Protocol == DisaggSGLang
}

// forward sends the request to the chosen engine and hands a stream to its
// relay goroutine. Until a byte of the answer reaches the client, a failed
// attempt (refused or broken connection, garbage, a 5xx: dispatch's
// IsRetryable) is re-routed to another worker, up to MaxRetries times; each
// attempt's guard ends and is released before the next one is booked, so
// every attempt's load is released exactly once.
func (s *Server) forward(ctx *fasthttp.RequestCtx, ex *exchange) (handedOff bool) {
	ex.setCall(s.engines.AcquireCall())
	// The engine gets the path that was routed, not the client's spelling
	// of it: what a front proxy filtered and what the engine serves agree.
	ex.call.SetRequest(routedPath(ex.api), ex.body)
	ex.call.SetChoices(int(min(ex.req.Choices, math.MaxInt32)))
	// A completion that is not an event stream is one JSON object: any
	// other success answer (an HTML page, bytes) is the engine's failure,
	// retried elsewhere and held against it, not a 200 the client's SDK
	// fails to parse without retrying.
	ex.call.RequireObject()
	copyForwardHeaders(ctx, ex.call.Request(), ex.rid, ex.via)
	var body []byte
	for attempt := 0; ; attempt++ {
		retryable := attempt < s.cfg.MaxRetries && (!ex.sreq.Pinned || ex.sess.sticky) && ex.sessionRetryable() && !ex.pairedSGLang()
		if attempt == 0 && retryable {
			// Another engine may answer this request: until one serves it,
			// a 5xx may be the request's fault rather than the engine's.
			ex.call.SetAttempts(&ex.attempts)
		}
		ex.traceDispatch(ex.call.Request())
		err := ex.call.Do(ex.dec.Slot, ex)
		if code := ex.call.StatusCode(); err == nil && code >= 400 && code < 500 && ex.pairedSGLang() && ex.prefillFailed(sglangVerdictWait) {
			// The decode engine refused the request because its prefill
			// failed (the KV pull was refused) before the router heard of
			// that failure: the client hears the cause, a 502 it may
			// retry, not the decode's 4xx about a transfer it never asked
			// for.
			err = dispatch.ErrPrefillFailed
		}
		switch {
		case err != nil:
		case ex.req.Stream:
			err = ex.call.RefuseUnaskedObject()
		default:
			err = ex.call.RefuseUnaskedStream()
		}
		if err == nil && ex.call.StatusCode() == fasthttp.StatusLoopDetected {
			// The router it came back to can only say that some worker
			// loops; this one knows which.
			ex.s.throttle.Log(ex.s.log, slog.LevelError, "loop/"+strconv.Itoa(int(ex.dec.Slot)), loopMessage,
				"worker", ex.dec.WorkerID, "dp_rank", ex.dec.DPRank, "endpoint", ex.dec.Endpoint)
		}
		if err == nil && ex.call.StatusCode() == fasthttp.StatusNotFound && ex.adapterWorkers != 0 &&
			retryable && ex.canTryElsewhere() {
			// The engine listed the adapter the request names when last
			// asked, and has unloaded it since: another engine listing it
			// may serve it, and the next poll, brought forward, sends
			// later requests there alone.
			if s.refreshModels != nil {
				s.refreshModels(doneContext)
			}
			err = ex.call.DiscardUnserved()
		}
		if err == nil && ex.call.Failed() {
			switch {
			case retryable && ex.canTryElsewhere():
				err = ex.call.Discard()
			case ex.call.StatusCode() == fasthttp.StatusUnauthorized || ex.call.StatusCode() == fasthttp.StatusForbidden:
				// The engine refused the router's own key: relayed, its
				// 401 would tell the client that the client's key is
				// wrong. A 502 names the router's.
				err, retryable = ex.call.Discard(), false
			default:
				retryable = false // no other engine to ask: the client gets this one's answer
			}
		}
		if err == nil && !ex.call.IsEventStream() {
			// A plain answer is read whole before the client sees any of
			// it, so a failure while reading it may still be retried.
			body, err = ex.call.ReadBody()
		}
		if err == nil && ex.call.IsEventStream() && !ex.pairedSGLang() {
			// Nor has the client seen a stream before its first bytes:
			// one that ends (or breaks) before them may go elsewhere, or
			// be answered with a status the client can retry on. (A
			// paired SGLang decode sends its headers before the prefill
			// is done, and its failures have their own answers.)
			err = ex.call.AwaitStream()
			if err == nil && retryable && ex.call.OpensWithServerError() && ex.canTryElsewhere() {
				// An engine whose generation failed at once sent its
				// error event first: another worker may serve it.
				err = ex.call.RefuseFailedStart()
			}
		}
		if err == nil {
			break
		}
		ex.traceDispatchFailed(err)
		ex.logFailure("engine attempt failed", err)
		if !retryable || !dispatch.IsRetryable(err) {
			if !errors.Is(err, dispatch.ErrPrefillFailed) || !ex.prefillRefusal(ctx) {
				ex.failDispatch(ctx, err)
			}
			return false
		}
		// Route again, without the engines that failed.
		failed := workers.SetOf(ex.dec.Slot)
		if errors.Is(err, dispatch.ErrEngineOverloaded) || errors.Is(err, dispatch.ErrConnsExhausted) {
			ex.unstick(unbindBusy) // load, not a failure: said apart in kvfast_session_unbinds_total
		} else {
			ex.unstick(unbindFailed)
		}
		_ = ex.h.Release()
		if !ex.sreq.AllowListed {
			ex.sreq.AllowListed, ex.sreq.Allow = true, workers.AllSlots
		}
		ex.sreq.Allow &^= failed
		ex.setGuard(s.guards.Acquire())
		dec, serr := ex.h.Select(&ex.wait, &ex.sreq)
		if serr == nil {
			// Its claim was taken back: claimed again where it goes.
			dec, serr = s.claimSession(ex, dec)
		}
		if errors.Is(serr, sched.ErrNoEligibleWorker) {
			// Nowhere else to try: the client hears what went wrong with
			// the engine that was tried, not that no worker exists.
			ex.failDispatch(ctx, err)
			return false
		}
		if serr != nil {
			ex.failSelect(ctx, serr)
			return false
		}
		s.metrics.retries.Inc() // counted once there is somewhere to send it
		ex.dec = dec
		if ex.pre.client != nil {
			// The failed decode engine may have pulled the prompt's KV,
			// which the prefill engine then freed: another decode
			// engine's pull of it could only be refused (vLLM answers
			// 409, which reached the client as its own 400). The retry
			// computes the prompt where it lands, booked so.
			ex.body, ex.pre.client = ex.pre.client, nil
			ex.call.SetRequest(routedPath(ex.api), ex.body)
			// No longer disaggregated: no prefill worker to name, and no
			// transfer in the stage metrics.
			ex.pre.decided = false
			ctx.Response.Header.Del(HeaderPrefillWorker)
			ctx.Response.Header.Del(HeaderPrefillDPRank)
		}
	}
	if code := ex.call.StatusCode(); code >= 200 && code < 300 {
		// Accepted. An engine's refusal (a 4xx judging the request, a
		// 5xx passed through) cached nothing: it neither enters the
		// history (which a client could otherwise steer with requests it
		// knows are refused) nor binds or refreshes the session.
		s.remember(ex, ex.dec.Slot)
		ex.bindSession()
	}
	s.metrics.promptBlocks.Add(float64(len(ex.hashes)))
	s.metrics.cachedBlocks.Add(float64(ex.dec.OverlapBlocks))

	ctx.SetStatusCode(ex.call.StatusCode())
	ex.call.CopyHeaders(&ctx.Response.Header)
	ex.setDecisionHeaders(ctx)
	if ex.call.IsEventStream() {
		// The stream holds its own count until it ends; the handler's
		// count keeps a drain from sealing, so this enter cannot fail.
		s.active.enter()
		if !ctx.Request.Header.IsHTTP11() {
			s.streamHTTP10(ctx, ex)
			return true
		}
		// The connection, not ctx: the stream writer must not touch ctx,
		// which fasthttp may reuse for another client once a write to
		// this one has failed; a connection is never reused.
		ex.call.SetClientWriteTimeout(ctx.Conn(), s.cfg.WriteTimeout)
		ctx.SetBodyStreamWriter(ex.sw) // ex is the stream's from here on
		return true
	}
	ctx.SetBody(body)
	if code := ex.call.StatusCode(); code >= 400 {
		if ex.call.Failed() && code != fasthttp.StatusTooManyRequests {
			ex.count(statusEngineError) // a 5xx, or the router's engine key refused
		} else {
			ex.count(engineStatus(code))
		}
		return false
	}
	_ = ex.h.Close()
	ex.count(statusOK)
	return false
}

// engineStatus is how an engine's error answer (status code >= 400) is
// counted: a 429 is the engine's overload, any other 4xx its refusal of
// the client's input, a 5xx its failure.
func engineStatus(code int) string {
	switch {
	case code == fasthttp.StatusTooManyRequests:
		return statusOverloaded
	case code < 500:
		return statusEngineRejected
	default:
		return statusEngineError
	}
}

// streamHTTP10 relays a stream to an HTTP/1.0 client, which cannot read
// chunked encoding: the response has no length and ends when the router
// closes the connection. fasthttp frames every streamed body as chunked,
// so the router takes the connection over and writes the response itself.
func (s *Server) streamHTTP10(ctx *fasthttp.RequestCtx, ex *exchange) {
	h := &ctx.Response.Header
	h.SetContentLength(-2) // no Content-Length, no Transfer-Encoding
	h.SetConnectionClose()
	head := h.AppendBytes(nil)
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		cs := new(connState)
		cs.serving.Store(true)
		s.conns.Store(c, cs) // Shutdown cuts it as it cuts other streams
		defer func() {
			s.conns.Delete(c)
			s.noteIdle()
		}()
		w := bufio.NewWriter(c)
		ex.call.SetClientWriteTimeout(c, s.cfg.WriteTimeout)
		_, _ = w.Write(head) // a failure shows at the relay's first flush, which settles ex
		ex.stream(w)
		_ = w.Flush()
	})
}

// stream relays an engine's event stream on fasthttp's writer goroutine and
// then settles the request. Relay aborts the guard itself (through the
// observer) when the client leaves or the engine fails.
func (ex *exchange) stream(w *bufio.Writer) {
	s := ex.s
	defer s.active.exit()
	// This goroutine is fasthttp's, which recovers nothing: a panic here
	// would kill the router and strand the request's load.
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("BUG: panic while relaying a stream", "panic", p, "request_id", string(ex.rid))
			if ex.held {
				_ = ex.h.Abort(guard.ReasonPanic)
			}
			ex.count(statusEngineError)
			ex.cleanup()
		}
	}()
	err := ex.call.Relay(w)
	status := statusOK
	switch {
	case err == nil && ex.call.EngineErred():
		// Relayed whole, but the engine's own error event ended it (the
		// guard was aborted then): not an ok in kvfast_requests_total.
		status = statusEngineError
	case err == nil && ex.call.StatusCode() < 400:
		_ = ex.h.Close()
	case err == nil:
		status = engineStatus(ex.call.StatusCode())
	default:
		status = outcomeOf(err)
		if status != statusCancelled {
			ex.logFailure("stream failed", err)
		}
	}
	ex.count(status)
	ex.cleanup()
}

const loopMessage = "a worker's endpoint sent a request back to this router (508 loop_detected): it is this router's " +
	"address, or a router that routes here; the engine's real address belongs in its registration or --worker url="

// logFailure logs a failed engine call with what lets an operator follow
// it: the request id the client got, the worker and the failure. Every
// one at debug level, because an engine outage fails many requests at
// once and kvfast_requests_total counts them; an engine's own failures
// also as a warning once a minute per worker (below the ejection
// thresholds they were seen per worker nowhere else, and 504s could not
// be traced to an engine), and an answer no engine sends as its own
// warning. The levels and the throttle are asked first: the arguments
// would allocate even when nothing is written.
func (ex *exchange) logFailure(msg string, err error) {
	switch {
	case dispatch.IsMalformedAnswer(err):
		ex.s.warnMalformed(ex.dec, err)
	case dispatch.IsEngineFault(err):
		if ok, held := ex.s.throttle.Allow(failingKeys[ex.dec.Slot%workers.Max]); ok {
			args := []any{"worker", ex.dec.WorkerID, "dp_rank", ex.dec.DPRank, "endpoint", ex.dec.Endpoint, "err", err}
			if held > 0 {
				args = append(args, "repeated", held)
			}
			ex.s.log.Warn("an engine's request failed (logged once a minute per worker; every one at debug level)", args...)
		}
	}
	if !ex.s.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	status := 0 // no answer
	if ex.call != nil && (errors.Is(err, dispatch.ErrEngineError) || errors.Is(err, dispatch.ErrEngineOverloaded)) {
		status = ex.call.StatusCode() // the error status it answered with
	}
	ex.s.log.Debug(msg, "request_id", string(ex.rid), "worker", ex.dec.WorkerID, "dp_rank", ex.dec.DPRank,
		"endpoint", ex.dec.Endpoint, "status", status, "err", err)
}

// failingKeys are logFailure's throttle keys, one per worker slot, made
// once.
var failingKeys = func() (k [workers.Max]string) {
	for i := range k {
		k[i] = "failing/" + strconv.Itoa(i)
	}
	return k
}()

// warnMalformed warns, once a minute per worker, of an answer no
// OpenAI-compatible engine sends (dispatch.IsMalformedAnswer), at any
// stage: an operator must hear of a worker URL naming another service,
// where an engine's broken connection is everyday and logged at debug.
func (s *Server) warnMalformed(d sched.Decision, err error) {
	if !dispatch.IsMalformedAnswer(err) {
		return
	}
	s.throttle.Log(s.log, slog.LevelWarn, "malformed/"+strconv.Itoa(int(d.Slot)),
		"an engine answered with something no OpenAI-compatible engine sends (is the worker's URL an engine?); its requests are retried elsewhere when another worker can take them, and count against its passive health",
		"worker", d.WorkerID, "dp_rank", d.DPRank, "endpoint", d.Endpoint, "err", err)
}

// --- client hang-up ---

// watchClient asks to hear of the client's hang-up while the request is
// served (internal/hangup): fasthttp would notice only at the response.
func (ex *exchange) watchClient(ctx *fasthttp.RequestCtx) {
	if ex.watched {
		return // an earlier stage asked
	}
	ex.watched = true
	if w := ex.s.hangups; w != nil {
		if reg, err := w.Watch(ctx.Conn(), ex); err == nil {
			ex.watch = reg
		}
	}
}

// setGuard makes h the request's guard, held. A client already gone
// aborts it at once, so that Select books nothing.
func (ex *exchange) setGuard(h guard.Handle) {
	ex.hangMu.Lock()
	ex.h, ex.held = h, true
	gone := ex.goneLocked()
	ex.hangMu.Unlock()
	if gone {
		_ = h.Abort(guard.ReasonClientCancel)
	}
}

// setCall makes c the request's engine call. A client already gone
// aborts it at once, so that Do sends nothing, as does an SGLang prefill
// that already failed (failDecode).
func (ex *exchange) setCall(c *dispatch.Call) {
	ex.hangMu.Lock()
	ex.call = c
	gone, prefillFailed := ex.goneLocked(), ex.pre.failed
	ex.hangMu.Unlock()
	switch {
	case gone:
		ex.cancelCall(c)
	case prefillFailed:
		c.FailPrefill()
	}
}

// cancelCall aborts c for a client that left, or cuts it for a router
// that is shutting down (Shutdown's deadline passed).
func (ex *exchange) cancelCall(c *dispatch.Call) {
	if ex.s.cutting.Load() {
		c.Cut()
	} else {
		c.Abort()
	}
}

// HangUp runs on the watcher's goroutine when the client closed its
// connection, or when Shutdown cuts it: the request leaves the admission
// queue, its guard is aborted, which releases its booking now rather than
// when the engine answers, and its engine call is aborted, which closes
// the engine connection so that the engine stops generating and the
// handler or stream waiting on it returns at once.
func (ex *exchange) HangUp() {
	ex.hangMu.Lock()
	ex.hungUp = true
	h, held, call := ex.h, ex.held, ex.call
	pre, preHeld := ex.pre.h, ex.pre.held
	if ex.pre.call != nil {
		// Under hangMu: releasePrefill takes the call from under it
		// before releasing it, so this is still the prefill's call.
		ex.cancelCall(ex.pre.call)
	}
	ex.hangUpEncode()
	ex.hangMu.Unlock()
	ex.wait.cancel(context.Canceled)
	if preHeld {
		_ = pre.Abort(guard.ReasonClientCancel)
	}
	if held {
		_ = h.Abort(guard.ReasonClientCancel)
	}
	if call != nil {
		// cleanup stops the watch before it releases the call, so the
		// call is still this request's.
		ex.cancelCall(call)
	}
}

// clientGone reports whether the client hung up.
func (ex *exchange) clientGone() bool {
	ex.hangMu.Lock()
	defer ex.hangMu.Unlock()
	return ex.goneLocked()
}

// goneLocked reports, with hangMu held, whether the request must stop:
// its client hung up, or Shutdown is cutting requests. A request that
// reaches a stage after the cut's hang-ups went out (it was still reading
// its body, say) is cut there, rather than booking a worker and calling
// an engine that nothing would abort.
func (ex *exchange) goneLocked() bool {
	if ex.s.cutting.Load() {
		ex.hungUp = true
	}
	return ex.hungUp
}

// --- dispatch.Observer ---

func (ex *exchange) OnDispatched() {
	_ = ex.h.Dispatched()
	ex.decodeDispatched()
}

func (ex *exchange) OnFirstToken() {
	now := clock.Now()
	ex.decodeFirstToken(now)
	ex.traceFirstToken(now)
	ex.s.metrics.ttft.Observe(seconds(time.Duration(now - ex.arrived)))
	ex.lastItem = now
	ex.firstSeen = true
}

func (ex *exchange) OnItem(tokens int) {
	now := clock.Now()
	if ex.items > 0 {
		ex.s.metrics.itl.Observe(seconds(time.Duration(now - ex.lastItem)))
	}
	ex.lastItem = now
	ex.items++
	_ = ex.h.OnItem(tokens, guard.FinishNone)
}

func (ex *exchange) OnComplete(finishReason []byte) {
	_ = ex.h.OnItem(0, finishOf(finishReason))
	if finishReason == nil {
		_ = ex.h.Close()
	}
}

func (ex *exchange) OnAbort(reason error) {
	ex.abortErr = reason
	switch {
	case ex.h.State() == guard.Selected:
		_ = ex.h.DispatchFailed()
	case errors.Is(reason, dispatch.ErrClientGone), errors.Is(reason, dispatch.ErrShuttingDown):
		// A shutdown cut, like a client's cancel, is no failure of the engine's.
		_ = ex.h.Abort(guard.ReasonClientCancel)
	case errors.Is(reason, dispatch.ErrFirstByteTimeout), errors.Is(reason, dispatch.ErrIdleTimeout), errors.Is(reason, dispatch.ErrWriteTimeout):
		_ = ex.h.Abort(guard.ReasonTimeout)
	case errors.Is(reason, dispatch.ErrResponseTooLarge), errors.Is(reason, dispatch.ErrResponseBudget):
		// The engine answered; the router would not hold the answer.
		_ = ex.h.Abort(guard.ReasonEngineRejected)
	case errors.Is(reason, dispatch.ErrEngineError) && ex.call != nil && ex.call.StatusCode()/100 == 4:
		// The engine judged the request and refused it: no failure of
		// the engine's, and proof that it answers (sched's stall.go).
		_ = ex.h.Abort(guard.ReasonEngineRejected)
	default:
		_ = ex.h.Abort(guard.ReasonEngineError)
	}
}

func finishOf(reason []byte) guard.Finish {
	switch string(reason) {
	case "stop":
		return guard.FinishStop
	case "length":
		return guard.FinishLength
	case "eos", "end_of_sequence":
		return guard.FinishEOS
	case "error":
		return guard.FinishError
	}
	return guard.FinishStop
}

// outcomeOf maps a failed relay or dispatch to a status label.
func outcomeOf(err error) string {
	switch {
	case errors.Is(err, dispatch.ErrClientGone):
		return statusCancelled
	case errors.Is(err, dispatch.ErrFirstByteTimeout), errors.Is(err, dispatch.ErrIdleTimeout), errors.Is(err, dispatch.ErrWriteTimeout):
		return statusTimeout
	case errors.Is(err, dispatch.ErrConnect), errors.Is(err, dispatch.ErrUnknownEngine):
		return statusUnavailable
	case errors.Is(err, dispatch.ErrResponseBudget), errors.Is(err, dispatch.ErrEngineOverloaded), errors.Is(err, dispatch.ErrConnsExhausted):
		return statusOverloaded
	case errors.Is(err, dispatch.ErrShuttingDown):
		return statusUnavailable
	}
	return statusEngineError
}

// --- failures ---

func (ex *exchange) reject(ctx *fasthttp.RequestCtx, e *openai.Error) {
	if e == errModelUnavailable || e == errModelsPending || e == errNoEnginesYet || e == errPinnedWorkerDown {
		// The router's side, not the client's: its engines are down, or
		// not heard from yet.
		ctx.Response.Header.SetBytesV("Retry-After", ex.s.retryAfter(ex))
		ex.count(statusUnavailable)
	} else {
		ex.count(statusClientError)
	}
	writeError(ctx, e.Status, e)
}

func (ex *exchange) failSelect(ctx *fasthttp.RequestCtx, err error) {
	switch over, overloaded := errors.AsType[*sched.OverloadError](err); {
	case ex.clientGone() && ex.s.cutting.Load():
		// Shutdown cut it while it waited to be routed.
		ex.count(statusUnavailable)
		ctx.SetConnectionClose()
		writeError(ctx, fasthttp.StatusServiceUnavailable, errShuttingDown)
	case ex.clientGone():
		// Nobody reads this answer; fasthttp finds the connection closed.
		ex.count(statusCancelled)
		ctx.SetConnectionClose()
		writeError(ctx, fasthttp.StatusServiceUnavailable, errClientGone)
	case overloaded:
		secs := max(1, int((over.RetryAfter+time.Second-1)/time.Second))
		ex.out = strconv.AppendInt(ex.out[:0], int64(secs), 10)
		ctx.Response.Header.SetBytesV("Retry-After", ex.out)
		ex.count(statusOverloaded)
		writeError(ctx, fasthttp.StatusTooManyRequests, errOverloaded)
	case errors.Is(err, sched.ErrPinnedWorkerNotFound) && ex.s.pinnedDown(ex.sreq.PinWorker):
		ex.reject(ctx, errPinnedWorkerDown)
	case errors.Is(err, sched.ErrPinnedWorkerNotFound):
		ex.count(statusClientError)
		writeError(ctx, fasthttp.StatusNotFound, errUnknownPinnedWorker)
	case errors.Is(err, sched.ErrPinExcluded):
		// Not a 503: a client told to retry would retry for ever.
		ex.count(statusClientError)
		writeError(ctx, fasthttp.StatusBadRequest, errPinExcluded)
	case errors.Is(err, sched.ErrInvalidRequest):
		ex.count(statusClientError)
		writeError(ctx, fasthttp.StatusBadRequest, &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "invalid_request", Message: err.Error()})
	case errors.Is(err, context.DeadlineExceeded):
		ex.count(statusOverloaded)
		ctx.Response.Header.SetBytesV("Retry-After", ex.s.retryAfter(ex))
		writeError(ctx, fasthttp.StatusServiceUnavailable, errQueueTimeout)
	default: // no eligible worker (a pin to a known but unhealthy worker too), or shutdown
		ex.count(statusUnavailable)
		ctx.Response.Header.SetBytesV("Retry-After", ex.s.retryAfter(ex))
		writeError(ctx, fasthttp.StatusServiceUnavailable, errNoWorker)
	}
}

func (ex *exchange) failDispatch(ctx *fasthttp.RequestCtx, err error) {
	ex.count(outcomeOf(err))
	ctx.Response.Reset()
	ctx.Response.Header.SetBytesV(HeaderRequestID, ex.rid)
	status := dispatch.ErrorStatus(err)
	if status == fasthttp.StatusTooManyRequests || status == fasthttp.StatusServiceUnavailable {
		// Load, not a fault: the client is told when to come back.
		ctx.Response.Header.SetBytesV("Retry-After", ex.s.retryAfter(ex))
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ex.out = dispatch.AppendErrorJSON(ex.out[:0], err)
	ctx.SetBody(ex.out)
}

// retryAfter renders the Retry-After of a refusal into ex.out: the recent
// admission-queue wait, in whole seconds.
func (s *Server) retryAfter(ex *exchange) []byte {
	ex.out = strconv.AppendInt(ex.out[:0], s.waits.retryAfterSeconds(), 10)
	return ex.out
}

// routedPath is the path a request of api is forwarded to.
func routedPath(api openai.API) []byte {
	if api == openai.APIChatCompletions {
		return pathChatCompletions
	}
	return pathCompletions
}

var pathCompletions, pathChatCompletions = []byte(PathCompletions), []byte(PathChatCompletions)

// setDecisionHeaders tells the client where its request went: the worker,
// its DP rank and the prefix the router expected it to find cached.
func (ex *exchange) setDecisionHeaders(ctx *fasthttp.RequestCtx) {
	h := &ctx.Response.Header
	ex.out = strconv.AppendUint(ex.out[:0], ex.dec.WorkerID, 10)
	h.SetCanonical(headerWorkerKey, ex.out)
	ex.out = strconv.AppendUint(ex.out[:0], uint64(ex.dec.DPRank), 10)
	h.SetCanonical(headerDPRankKey, ex.out)
	ex.out = strconv.AppendUint(ex.out[:0], uint64(ex.dec.OverlapBlocks), 10)
	h.SetCanonical(headerOverlapBlocksKey, ex.out)
	h.SetCanonical(headerRequestIDKey, ex.rid)
}

// The decision headers' names, already in the canonical form fasthttp
// would otherwise copy and normalize them into on every request.
var (
	headerWorkerKey        = []byte(HeaderWorker)
	headerDPRankKey        = []byte(HeaderDPRank)
	headerOverlapBlocksKey = []byte(HeaderOverlapBlocks)
	headerRequestIDKey     = []byte(HeaderRequestID)
)

// copyForwardHeaders passes on what an engine may need from the client's
// request: credentials and the request id. Everything else about the
// request is its body, forwarded unchanged.
func copyForwardHeaders(ctx *fasthttp.RequestCtx, req *fasthttp.Request, rid, via []byte) {
	if v := ctx.Request.Header.Peek("Authorization"); len(v) > 0 {
		req.Header.SetBytesV("Authorization", v)
	}
	// The client's trace context goes on as it came; a traced request's
	// engine call replaces traceparent with its own span (startCall).
	if v := ctx.Request.Header.Peek(headerTraceparent); len(v) > 0 {
		req.Header.SetBytesV(headerTraceparent, v)
		if v := ctx.Request.Header.Peek(headerTracestate); len(v) > 0 {
			req.Header.SetBytesV(headerTracestate, v)
		}
	}
	req.Header.SetBytesV(HeaderRequestID, rid)
	req.Header.SetBytesV(HeaderVia, via)
}

// maxViaBytes bounds the HeaderVia a request brings that the router
// passes on; a longer one is not, and only this router's id goes on.
const maxViaBytes = 1024

// passedHere reports whether the request came through this router
// already (a loop), and otherwise sets ex.via for its engine calls. Every
// copy of the header counts: a proxy may add a line of its own rather
// than extend the one there, and a loop seen only in the first copy would
// go round until some timeout.
func (ex *exchange) passedHere(ctx *fasthttp.RequestCtx) bool {
	ex.via = ex.via[:0]
	for _, in := range ctx.Request.Header.PeekAll(HeaderVia) {
		for rest := in; len(rest) > 0; {
			var id []byte
			id, rest, _ = bytes.Cut(rest, []byte(","))
			if bytes.Equal(bytes.TrimSpace(id), ex.s.via) {
				return true
			}
		}
		if len(in) > 0 && len(ex.via)+len(in) < maxViaBytes {
			ex.via = append(append(ex.via, in...), ',')
		}
	}
	ex.via = append(ex.via, ex.s.via...)
	return false
}

func writeError(ctx *fasthttp.RequestCtx, status int, e *openai.Error) {
	if len(ctx.Response.Header.Peek(HeaderRequestID)) == 0 {
		// A refusal before the exchange (a key, a method, a body too
		// large) echoes the client's id too, as every answer of the
		// completion endpoints does: a client's SDK reports it with the
		// error.
		if v := clientRequestID(ctx); v != nil {
			ctx.Response.Header.SetBytesV(HeaderRequestID, v)
		}
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	// Render into the response's own (pooled) body buffer, so that a flood
	// of bad requests makes the router allocate nothing.
	ctx.Response.ResetBody()
	ctx.Response.SwapBody(e.AppendJSON(ctx.Response.SwapBody(nil)[:0]))
}

func asRequestError(err error) *openai.Error {
	if e, ok := errors.AsType[*openai.Error](err); ok {
		return e
	}
	return &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "invalid_request", Message: err.Error()}
}

var (
	errMethodNotAllowed = &openai.Error{Status: 405, Type: openai.TypeInvalidRequest, Code: "method_not_allowed",
		Message: "this endpoint accepts POST only"}
	errReadOnlyMethod = &openai.Error{Status: 405, Type: openai.TypeInvalidRequest, Code: "method_not_allowed",
		Message: "this endpoint accepts GET and HEAD only"}
	errOverloaded = &openai.Error{Status: 429, Type: openai.TypeServerError, Code: "overloaded",
		Message: "every eligible worker is busy and the admission queue is full; retry after the Retry-After interval"}
	errQueueTimeout = &openai.Error{Status: 503, Type: openai.TypeServerError, Code: "queue_timeout",
		Message: "every eligible worker stayed busy for the whole admission-queue timeout; retry after the Retry-After interval"}
	errNoWorker = &openai.Error{Status: 503, Type: openai.TypeServerError, Code: "no_worker_available",
		Message: "no healthy worker can serve this request now"}
	errPinnedWorkerDown = &openai.Error{Status: 503, Type: openai.TypeServerError, Param: HeaderWorker, Code: "no_worker_available",
		Message: "the pinned worker's engine is presumed dead (its heartbeat stopped; GET /admin/workers lists it under down_registrations); retry later"}
	errUnknownPinnedWorker = &openai.Error{Status: 404, Type: openai.TypeInvalidRequest, Param: HeaderWorker, Code: "worker_not_found",
		Message: "the pinned worker and DP rank are not in the worker set"}
	errLoop = &openai.Error{Status: 508, Type: openai.TypeServerError, Code: "loop_detected",
		Message: "the request came back to a router it already passed (" + HeaderVia + "): a worker's endpoint is a router on its own path"}
	errPinExcluded = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: HeaderWorker, Code: "pin_excluded",
		Message: "the pinned worker is excluded by the request itself: it is not in " + HeaderAllow + ", does not serve the requested model, or does not serve this endpoint (its role)"}
	errShuttingDown = &openai.Error{Status: 503, Type: openai.TypeServerError, Code: "shutting_down",
		Message: "the router is shutting down; retry on another router"}
	errClientGone = &openai.Error{Status: 503, Type: openai.TypeServerError, Code: "client_gone",
		Message: "the client closed its connection before the request was routed"}
	errInternal = &openai.Error{Status: 500, Type: openai.TypeServerError, Code: "internal_error",
		Message: "the router failed while handling this request; it has been logged"}
)
