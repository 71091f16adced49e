package fastpath

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvfast/kvfast/dispatch"
	"github.com/kvfast/kvfast/guard"
	"github.com/kvfast/kvfast/internal/clock"
	"github.com/kvfast/kvfast/internal/jsonscan"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/prompt"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/workers"
)

// The encoder stage (docs/routing.md, "Encoder disaggregation"). A chat
// request with images, audio or video, routed while encode workers are
// in the worker set, first has each of its multimodal items encoded on
// an encoder: the one that encoded the same item recently (encoder-cache
// affinity, encoderAffinity), unless it is busy, else the least loaded,
// by the cost model over the encode pool. The items go to their encoders
// concurrently, each as vLLM's own encoder-disaggregation proxy sends it:
// a chat request with that one content part, max_tokens 1, not streamed.
// The encoder writes the item's embeddings to the engines' encoder cache
// connector (ec_transfer_config) under the item's mm_hash, where the
// prefill (or aggregated) engine that later gets the unchanged request
// finds them, so the request goes on as any other: to prefill and decode
// under --disagg vllm, or to one aggregated worker.
//
// An item whose encoder fails is retried on another encoder, up to
// MaxRetries times; past that the request goes on without it, and the
// prefill engine encodes it itself, which vLLM's encoder-cache consumer
// does for any item it does not find in the connector. Each item's stage
// has its own guard, released exactly once; a client's hang-up aborts
// every stage's guard and call (HangUp).
//
// Under --disagg sglang the router does not run the stage: SGLang's
// language-only engines call their encoders themselves (--encoder-urls).

// EncodeConfig configures the encoder stage.
type EncodeConfig struct {
	// Off never runs the stage: encode workers are left alone and every
	// engine encodes its own requests' items.
	Off bool
	// MaxItems and MaxItemBytes bound what the router reads of a
	// multimodal request; beyond them it is refused (prompt.MediaLimits).
	MaxItems     int
	MaxItemBytes int
	// AffinityItems is how many recently encoded items the router
	// remembers per encoder; 0 turns affinity off (load only).
	AffinityItems int
	// AffinityTTL is how long an encoder is trusted to keep an item.
	AffinityTTL time.Duration
	// Timeout bounds the wait for an encoder's answer headers (0: the
	// first-byte timeout). Past it the item goes to another encoder, or
	// the engine encodes it: a hung encoder held the request for the
	// first-byte timeout (10 minutes by default) per attempt.
	Timeout time.Duration
}

// Encoder stage defaults: an encoder cache of vLLM's default size (a few
// thousand embeddings' worth of tokens) holds on the order of a thousand
// images, and ten minutes is far longer than one stays there under load
// only when it is popular, which is when affinity matters.
const (
	DefaultEncoderAffinityItems = 1024
	DefaultEncoderAffinityTTL   = 10 * time.Minute
	// DefaultEncodeTimeout: encoding an image takes tens of milliseconds
	// to a few seconds on a loaded encoder.
	DefaultEncodeTimeout = 30 * time.Second
)

// DefaultEncodeConfig is the stage kvfast serve starts with: on whenever
// encode workers are present.
func DefaultEncodeConfig() EncodeConfig {
	return EncodeConfig{MaxItems: prompt.DefaultMaxMediaItems, MaxItemBytes: prompt.DefaultMaxMediaItemBytes,
		AffinityItems: DefaultEncoderAffinityItems, AffinityTTL: DefaultEncoderAffinityTTL, Timeout: DefaultEncodeTimeout}
}

func (c *EncodeConfig) validate() error {
	if c.Off {
		return nil
	}
	if c.Timeout < 0 {
		return fmt.Errorf("cannot use --encode-timeout %v: want 0 (the first-byte timeout) or more", c.Timeout)
	}
	for _, n := range []struct {
		name string
		v    int64
	}{{"--encode-max-items", int64(c.MaxItems)}, {"--encode-max-item-bytes", int64(c.MaxItemBytes)}} {
		if n.v <= 0 {
			return fmt.Errorf("cannot use %s %d: must be positive", n.name, n.v)
		}
	}
	if c.AffinityItems < 0 {
		return fmt.Errorf("cannot use --encoder-affinity-items %d: must not be negative (0: no affinity)", c.AffinityItems)
	}
	if c.AffinityTTL < 0 {
		return fmt.Errorf("cannot use --encoder-affinity-ttl %v: must not be negative", c.AffinityTTL)
	}
	return nil
}

// encodeItemTokens is the load one item books on its encoder: about an
// image's embeddings at a vision model's usual resolution. Only the
// encoders' relative load matters, and every item weighs the same.
const encodeItemTokens = 256

// Outcomes of an item, the values of kvfast_encode_items_total's outcome
// label.
const (
	encodeEncoded   = "encoded"        // an encoder encoded it
	encodeDuplicate = "duplicate"      // the same item appeared earlier in the request
	encodeFallback  = "fallback_local" // every attempt failed: the prefill engine encodes it
	encodeRefused   = "refused"        // an encoder answered 4xx: not retried, the prefill engine judges it
)

// encodeStage is one item's trip to an encoder: its own guard, engine
// call and body. It is the call's dispatch.Observer.
type encodeStage struct {
	h    guard.Handle
	held bool // h is acquired and not yet released; set under the exchange's hangMu
	call *dispatch.Call
	dec  sched.Decision
	item int // index in the exchange's media items
	body []byte
	rid  []byte // the item's request id: the client's, suffixed
	err  error
	// tried are the encoders that failed this item.
	tried workers.Set
	// holds the attempts' 5xx verdicts until an encoder serves the item
	// (dispatch.Attempts).
	verdicts dispatch.Attempts
	attempts int        // attempts sent
	sent     bool       // an attempt was sent and is not yet settled
	refused  bool       // an encoder judged the item with a 4xx: not retried
	ok       bool       // an encoder encoded the item
	settled  bool       // ok, or given up: no more attempts
	span     trace.Span // the attempt's trace span; nil when the request is not traced
}

func (st *encodeStage) OnDispatched() { _ = st.h.Dispatched() }
func (st *encodeStage) OnFirstToken() {}
func (st *encodeStage) OnItem(int)    {}
func (st *encodeStage) OnAbort(error) { st.abortFailed() }
func (st *encodeStage) OnComplete([]byte) {
	// The encoder's one token ends its stage: the embeddings are stored.
	_ = st.h.OnItem(1, guard.FinishLength)
}

func (st *encodeStage) abortFailed() {
	if st.h.State() == guard.Selected {
		_ = st.h.DispatchFailed()
		return
	}
	_ = st.h.Abort(guard.ReasonEngineError)
}

// encoding reports whether ex's multimodal items go to encoders first:
// a chat prompt, encode workers present, the stage not off, and not
// SGLang, whose engines call their encoders themselves.
func (s *Server) encoding(ex *exchange) bool {
	return ex.req.Prompt == openai.PromptMessages && !s.cfg.Encode.Off && s.cfg.Disagg.Protocol != DisaggSGLang &&
		s.sched.StageWorkers(sched.StageEncode) != 0
}

// readMedia reads a chat request's multimodal items when the encoder
// stage may run; a request beyond the media limits is refused.
func (s *Server) readMedia(ex *exchange) *openai.Error {
	ex.media.Reset()
	if !s.encoding(ex) {
		return nil
	}
	switch err := ex.media.Parse(ex.req.Messages, prompt.MediaLimits{MaxItems: s.cfg.Encode.MaxItems, MaxItemBytes: s.cfg.Encode.MaxItemBytes}); err {
	case prompt.ErrTooManyMedia:
		return s.errTooManyMedia
	case prompt.ErrMediaTooLarge:
		return s.errMediaTooLarge
	default:
		return err
	}
}

// setEncodeStages makes ex.enc n fresh stages, keeping their buffers,
// under hangMu: HangUp reads them.
func (ex *exchange) setEncodeStages(n int) {
	ex.hangMu.Lock()
	defer ex.hangMu.Unlock()
	if cap(ex.enc) < n {
		ex.enc = append(ex.enc[:cap(ex.enc)], make([]encodeStage, n-cap(ex.enc))...)
	}
	ex.enc = ex.enc[:n]
	for i := range ex.enc {
		st := &ex.enc[i]
		*st = encodeStage{body: st.body[:0], rid: st.rid[:0]}
	}
}

// setEncodeGuard makes h the guard of stage i, held; a client already
// gone aborts it at once.
func (ex *exchange) setEncodeGuard(i int, h guard.Handle) {
	ex.hangMu.Lock()
	st := &ex.enc[i]
	st.h, st.held = h, true
	gone := ex.goneLocked()
	ex.hangMu.Unlock()
	if gone {
		_ = h.Abort(guard.ReasonClientCancel)
	}
}

// setEncodeCall makes c the call of stage i; a client already gone
// aborts it at once.
func (ex *exchange) setEncodeCall(i int, c *dispatch.Call) {
	ex.hangMu.Lock()
	ex.enc[i].call = c
	gone := ex.goneLocked()
	ex.hangMu.Unlock()
	if gone {
		c.Abort()
	}
}

// releaseEncode ends stage i: its call and its guard go, once.
func (ex *exchange) releaseEncode(i int) {
	ex.hangMu.Lock()
	st := &ex.enc[i]
	call, held := st.call, st.held
	st.call, st.held = nil, false
	ex.hangMu.Unlock()
	if call != nil {
		call.Release()
	}
	if held {
		_ = st.h.Release()
	}
}

// hangUpEncode aborts every encode stage's call and guard; HangUp calls
// it under hangMu.
func (ex *exchange) hangUpEncode() {
	for i := range ex.enc {
		st := &ex.enc[i]
		if st.call != nil {
			st.call.Abort()
		}
		if st.held {
			_ = st.h.Abort(guard.ReasonClientCancel)
		}
	}
}

// errEncodeRefused is an encoder's answer of an error status.
var errEncodeRefused = errors.New("the encoder refused the item")

// serveEncode runs the encoder stage of ex's items. It reports false when
// the client left meanwhile; any other failure only leaves items to the
// prefill engine.
func (s *Server) serveEncode(ctx *fasthttp.RequestCtx, ex *exchange) bool {
	items := ex.media.Items
	if len(items) == 0 {
		return true
	}
	t0 := clock.Now()
	s.metrics.enc.items.Observe(float64(len(items)))
	ex.wait.reset(s.cut, s.cfg.QueueTimeout)
	ex.watchClient(ctx)
	ex.setEncodeStages(len(items))
	pending := 0
	for i := range items {
		ex.enc[i].item = i
		if duplicateItem(items, i) {
			ex.enc[i].ok, ex.enc[i].settled = true, true
			s.metrics.enc.outcomes[encodeDuplicate].Inc()
			continue
		}
		pending++
	}
	var wg sync.WaitGroup
	// A panic while the round is being booked must not let cleanup
	// release calls still in use: the senders are joined first.
	defer wg.Wait()
	for pending > 0 {
		// Select one item after the other, so that each booking weighs on
		// the next item's choice, then send them all at once. Only the
		// first item of a round may wait in the admission queue: an item
		// that finds every encoder busy while this request holds others'
		// bookings waits for the next round instead, or requests holding
		// some encoders and waiting for more could wait for each other.
		launched := 0
		for i := range ex.enc {
			st := &ex.enc[i]
			if st.settled || !s.startEncode(ctx, ex, i, launched > 0) {
				continue
			}
			if st.attempts > 0 {
				s.metrics.retries.Inc()
			}
			launched++
			st.sent = true
			wg.Add(1)
			go s.runEncode(ex, i, &wg)
		}
		wg.Wait()
		pending = 0
		for i := range ex.enc {
			st := &ex.enc[i]
			if st.sent {
				st.sent = false
				s.finishEncode(ex, i)
			}
			if !st.settled {
				pending++
			}
		}
		if ex.clientGone() {
			return false
		}
		if launched == 0 {
			break
		}
	}
	for i := range ex.enc {
		switch st := &ex.enc[i]; {
		case st.ok:
		case st.refused:
			s.metrics.enc.outcomes[encodeRefused].Inc()
			s.log.Debug("an encoder refused the item: the prefill engine gets it as sent", "request_id", string(ex.rid), "item", i)
		default:
			s.metrics.enc.outcomes[encodeFallback].Inc()
			s.log.Debug("encoder stage failed: the prefill engine encodes the item", "request_id", string(ex.rid), "item", i, "err", st.err)
		}
	}
	s.metrics.enc.stage.Observe(seconds(clock.Since(t0)))
	return !ex.clientGone()
}

var errNoEncoder = errors.New("no encoder can take the item")

// duplicateItem reports whether items[i] appeared earlier in the request:
// one encoding serves both.
func duplicateItem(items []prompt.MediaItem, i int) bool {
	for j := range i {
		if items[j].ID == items[i].ID {
			return true
		}
	}
	return false
}

// encodeRequest is the selection request of item stage st: the encode
// pool, without the encoders that failed it.
func (s *Server) encodeRequest(ex *exchange, st *encodeStage) sched.Request {
	req := sched.Request{PromptTokens: encodeItemTokens, Model: ex.sreq.Model, Stage: sched.StageEncode}
	if st.tried != 0 {
		req.AllowListed, req.Allow = true, workers.AllSlots&^st.tried
	}
	return req
}

// startEncode chooses stage i's encoder, books it and builds its call.
// It reports false when the item waits for the next round (holding: the
// request holds other items' bookings, and every encoder it may use is
// busy), when no encoder can take it (the stage is then settled, its err
// saying why), or when the client left.
func (s *Server) startEncode(ctx *fasthttp.RequestCtx, ex *exchange, i int, holding bool) bool {
	st := &ex.enc[i]
	it := &ex.media.Items[st.item]
	req := s.encodeRequest(ex, st)
	hit := false
	if slot, ok := s.encAffinity.lookup(it.ID, time.Now()); ok && !st.tried.Has(slot) {
		// The encoder that has the item takes it unless it is busy: a
		// query books nothing, and a busy encoder would queue the item
		// behind others that another encoder could start now.
		q := req
		q.QueryOnly, q.AllowListed, q.Allow = true, true, workers.SetOf(slot)
		if d, err := s.sched.Select(&ex.wait, &q, nil); err == nil && !d.Busy {
			req.AllowListed, req.Allow, hit = true, workers.SetOf(slot), true
		}
	}
	if holding && !hit {
		q := req
		q.QueryOnly = true
		if d, err := s.sched.Select(&ex.wait, &q, nil); err == nil && d.Busy {
			return false
		}
	}
	ex.setEncodeGuard(i, s.guards.Acquire())
	d, err := st.h.Select(&ex.wait, &req)
	if err != nil {
		st.err, st.settled = errNoEncoder, true
		ex.releaseEncode(i)
		return false
	}
	if hit {
		s.metrics.enc.affinityHit.Inc()
	} else {
		s.metrics.enc.affinityMiss.Inc()
	}
	st.dec = d
	st.body = appendEncodeBody(st.body[:0], ex, it.Part)
	st.rid = append(append(st.rid[:0], ex.rid...), "-enc"...)
	st.rid = strconv.AppendInt(st.rid, int64(i), 10)
	ex.setEncodeCall(i, s.engines.AcquireCall())
	if s.cfg.MaxRetries > 0 {
		st.call.SetAttempts(&st.verdicts)
	}
	st.call.SetRequest(pathChatCompletions, st.body)
	st.call.RequireObject()
	copyForwardHeaders(ctx, st.call.Request(), st.rid, ex.via)
	st.span = ex.startCall(spanEncode, st.call.Request(), &d, "encode")
	return true
}

// runEncode sends stage i's request and reads its answer, on a goroutine
// of its own.
func (s *Server) runEncode(ex *exchange, i int, wg *sync.WaitGroup) {
	defer wg.Done()
	st := &ex.enc[i]
	defer func() {
		// Nothing above this goroutine recovers: a panic would kill the
		// router and strand the stage's booking.
		if p := recover(); p != nil {
			s.log.Error("BUG: panic while encoding an item", "panic", p, "request_id", string(ex.rid))
			st.err = errInternalEncode
		}
	}()
	err := st.call.DoWithin(st.dec.Slot, st, s.cfg.Encode.Timeout)
	if err == nil {
		// Read whole, and required to be one JSON object that is no
		// error: what the encoder cached is unknown, so not remembered.
		_, err = st.call.ReadBodyWithin(stageBodyTimeout)
	}
	if err == nil && st.call.StatusCode() >= 300 {
		// A refusal judging the item (a modality or format the model
		// does not take, a picture that does not decode) is not retried
		// on another encoder; the prefill engine gets the item and
		// answers the client as the engine does.
		st.refused = judgesRequest(st.call)
		err = errEncodeRefused
		st.abortFailed()
	}
	st.err = err
	st.ok = err == nil
	endCall(st.span, err)
	st.span = nil
}

var errInternalEncode = errors.New("the router failed while encoding the item")

// finishEncode settles stage i after its attempt: the encoder is
// remembered for the item, or excluded from its next attempt.
func (s *Server) finishEncode(ex *exchange, i int) {
	st := &ex.enc[i]
	it := &ex.media.Items[st.item]
	slot := st.dec.Slot
	st.attempts++
	if st.ok {
		st.settled = true
		s.metrics.enc.outcomes[encodeEncoded].Inc()
		s.encAffinity.record(it.ID, slot, time.Now())
	} else {
		st.settled = st.refused || st.attempts > s.cfg.MaxRetries
		st.tried |= workers.SetOf(slot)
		s.encAffinity.forget(it.ID, slot)
		s.warnMalformed(st.dec, st.err)
		s.log.Debug("encoder failed an item", "request_id", string(ex.rid), "worker", st.dec.WorkerID, "err", st.err)
	}
	ex.releaseEncode(i)
}

// appendEncodeBody appends the encoder request of one content part: the
// client's model, mm_processor_kwargs and media_io_kwargs (the first the
// engines fold into the item's mm_hash, the second decides how the item
// is decoded, a video's frames, which the hash is taken over: the encoder
// must see the item as the prefill engine will), one user message holding
// only the part, one token, no stream.
func appendEncodeBody(b []byte, ex *exchange, part []byte) []byte {
	b = append(b, '{')
	if ex.req.Model != nil {
		b = append(b, `"model":`...)
		b = jsonscan.AppendQuoted(b, b2s(ex.req.Model))
		b = append(b, ',')
	}
	for _, name := range [...]string{"mm_processor_kwargs", "media_io_kwargs"} {
		if kw := topLevelMember(ex.body, name); kw != nil {
			b = append(b, '"')
			b = append(b, name...)
			b = append(b, `":`...)
			b = append(b, kw...)
			b = append(b, ',')
		}
	}
	b = append(b, `"messages":[{"role":"user","content":[`...)
	b = append(b, part...)
	return append(b, `]}],"max_tokens":1,"stream":false}`...)
}
