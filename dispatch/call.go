package dispatch

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/internal/jsonscan"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/workers"
)

// Observer follows one forwarded request, in this order:
//
//	OnDispatched                      the engine answered (status and headers)
//	OnFirstToken                      the first item of a stream
//	OnItem(tokens)                    each item of a stream
//	OnComplete(finishReason) | OnAbort(reason)   exactly once per Do
//
// A Call that was given an Observer makes exactly one terminal call, on every
// path: a failed Do, a completed or broken stream, a departed client, or a
// Release before the end. OnComplete comes before the terminal item reaches
// the client. The terminal item is the one carrying a finish_reason, or
// with SetChoices(n) the n-th such item. finishReason is its raw
// finish_reason (nil for a stream ended by [DONE] alone, or a response
// without one); it
// aliases the relay buffer and is valid only during the call. reason wraps
// one of the package's sentinel errors.
//
// OnDispatched and OnAbort of a failed Do run on the goroutine calling Do;
// the rest run on the goroutine relaying the response. A stream counts one
// token per item, which is exact for engines that send a chunk per token.
// A non-streaming response reports no first token and no items.
//
// It is an interface, not a set of funcs, so that a pooled request guard can
// be passed without allocating a closure per request.
type Observer interface {
	OnDispatched()
	OnFirstToken()
	OnItem(tokens int)
	OnComplete(finishReason []byte)
	OnAbort(reason error)
}

// Call forwards one request to an engine and relays the response. Take one
// from Pool.AcquireCall, set the request, Do it (again on another worker if
// IsRetryable), then Relay a stream or ReadBody a plain response, and
// Release it. It is owned by one goroutine at a time: a server that relays
// from its body stream writer hands the call over to that stream. Abort
// alone may come from another goroutine, to cancel it.
type Call struct {
	pool   *Pool
	engine *Engine
	obs    Observer
	req    fasthttp.Request
	resp   fasthttp.Response
	buf    []byte // len == cap; the relay buffer, grown by ReadBody

	// The engine connection held from Do until closeStream (roundtrip.go).
	client  *fasthttp.HostClient // the engine's client, which cc belongs to
	cc      any                  // fasthttp's pooled connection
	br      *bufio.Reader        // reads cc; the body stream reads through it
	bodyEOF bool                 // the body was read to its end: cc may be pooled
	reused  bool                 // cc carried an earlier request: a failure before the response may be its staleness

	cancelMu  sync.Mutex // orders Abort with taking and letting go of conn
	conn      net.Conn   // cc's connection while the call uses it
	cancelled error      // the kind a cancelled call fails with (Abort, Cut, FailPrefill); nil until then

	// downstream is the client Relay writes to; with downstreamWrite > 0
	// each write must complete within it (SetClientWriteTimeout).
	downstream      deadliner
	downstreamWrite time.Duration

	open          bool      // resp holds an engine body stream not yet closed
	finished      bool      // obs had its terminal call, or there is no obs
	first         bool      // the first item was seen
	done          bool      // [DONE] was seen
	generated     bool      // the stream's last finish_reason was seen: only usage and [DONE] are left
	erred         bool      // the stream carried the engine's own error event: only [DONE] is left
	midEvent      bool      // the client was last sent part of an event, not its end
	rank          [20]byte  // scratch: the pinned rank's digits (HeaderDataParallelRank)
	requireObject bool      // RequireObject
	charged       int64     // bytes of the pool's response budget ReadBody holds
	judged        bool      // this attempt's verdict on its engine was recorded
	attempts      *Attempts // where a 5xx verdict waits for another engine to serve the request (SetAttempts); nil: judged at once
	choices       int       // completions the request asked for (SetChoices); 0 is one
	finishes      int       // finish reasons seen in this attempt's stream
	// pending is how many bytes of the stream AwaitStream read into buf,
	// which Relay sends first, and pendingErr what that read said after.
	pending    int
	pendingErr error
}

// errNotEventStream is the cause Relay reports for a plain response, which
// belongs to ReadBody.
var errNotEventStream = errors.New("the response is not an event stream")

func newCall(p *Pool) *Call {
	return &Call{pool: p, buf: make([]byte, p.cfg.RelayBufferSize), finished: true}
}

// AcquireCall returns an idle Call from the pool.
func (p *Pool) AcquireCall() *Call { return p.calls.Get().(*Call) }

// Release ends the call: it cancels an unfinished response (closing its
// engine connection), reports ErrAbandoned to an observer still waiting, and
// returns the call to the pool. The call must not be used afterwards, nor
// aborted: whoever calls Abort must be stopped first.
func (c *Call) Release() {
	c.closeStream()
	c.abort(ErrAbandoned)
	c.cancelMu.Lock()
	c.cancelled = nil
	c.cancelMu.Unlock()
	c.req.Reset()
	c.resp.Reset()
	c.engine, c.obs = nil, nil
	c.downstream, c.downstreamWrite = nil, 0
	c.choices = 0
	c.pending, c.pendingErr = 0, nil
	c.attempts = nil
	c.requireObject = false
	// The budget counts what one response needed, not what the pooled
	// call keeps: a kept buffer is at most four relay buffers.
	c.pool.responseBytes.Add(-c.charged)
	c.charged = 0
	if len(c.buf) > 4*c.pool.cfg.RelayBufferSize {
		c.buf = make([]byte, c.pool.cfg.RelayBufferSize) // ReadBody grew it; do not pin a huge body
	}
	c.pool.calls.Put(c)
}

// Request returns the request to forward, for headers beyond what
// SetRequest sets (authorization, request id). Client headers are not
// forwarded unless added here; leave out Accept-Encoding, or a compressed
// stream is relayed uninspected.
func (c *Call) Request() *fasthttp.Request { return &c.req }

// SetRequest prepares a POST of body to uri (path and query, e.g.
// "/v1/chat/completions") with a JSON content type. body is forwarded
// unchanged and not copied: it must stay intact until the call is released.
func (c *Call) SetRequest(uri, body []byte) {
	c.req.Header.SetMethod(fasthttp.MethodPost)
	c.req.SetRequestURIBytes(uri)
	c.req.Header.SetContentType("application/json")
	c.req.SetBodyRaw(body)
}

// RequireObject makes ReadBody count a success answer that is not a JSON
// object (an HTML page, bytes, nothing; an event stream, for a stage that
// only reads objects) as the engine's failure, for a request that only a
// JSON object answers when it is read whole: an internal stage's (a
// prefill, an encoding), or a completion's plain answer. Passive health
// then ejects an engine that keeps answering so.
func (c *Call) RequireObject() { c.requireObject = true }

// isObject reports whether b is one whole JSON object, blanks aside. A
// first '{' is not enough: an answer cut short with a Content-Length
// that matches what was sent (an engine that died mid-write behind a
// proxy that had buffered its headers) starts as one.
func isObject(b []byte) bool {
	i := jsonscan.SkipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	end := jsonscan.SkipValue(b, i, 0)
	return end >= 0 && jsonscan.SkipSpace(b, end) == len(b)
}

// SetChoices says the request asks for n completions (OpenAI's n): its
// stream's generation ends with the n-th finish_reason, not the first,
// and until then the stream's items are counted and a broken stream is a
// failure. n <= 1 is one completion.
func (c *Call) SetChoices(n int) { c.choices = n }

// SetAttempts makes a 5xx answer's verdict on its engine wait in a until
// another attempt of the same request, with this or another Call given
// a, gets a success status (Attempts says why). Set it where the request
// is retried on another engine; without it a 5xx counts against its
// engine at once.
func (c *Call) SetAttempts(a *Attempts) { c.attempts = a }

// Do sends the request to slot's engine and waits for the response status
// and headers (the first-byte timeout). On success it calls
// obs.OnDispatched; on failure obs.OnAbort, and the error says whether
// another worker may be tried (IsRetryable). obs may be nil. Calling Do
// again, for a retry, abandons any response of the previous attempt. An
// Abort, before or during Do, makes it fail with ErrClientGone.
func (c *Call) Do(slot workers.Slot, obs Observer) error {
	c.closeStream()
	c.abort(ErrAbandoned)
	c.obs, c.finished, c.first, c.done, c.judged, c.midEvent = obs, obs == nil, false, false, false, false
	c.finishes, c.generated, c.erred = 0, false, false
	c.pending, c.pendingErr = 0, nil
	e := c.pool.Engine(slot)
	c.engine = e
	if e == nil {
		err := &Error{Slot: slot, Op: "forward to", Kind: ErrUnknownEngine}
		c.abort(err)
		return err
	}
	c.req.Header.SetHost(e.addr)
	if a := c.pool.authorization; a != nil {
		c.req.Header.SetBytesV(fasthttp.HeaderAuthorization, a) // the router's, not the client's
	}
	if r := e.dpRank.Load(); r >= 0 {
		c.req.Header.SetBytesV(HeaderDataParallelRank, strconv.AppendInt(c.rank[:0], r, 10))
	} else {
		c.req.Header.Del(HeaderDataParallelRank)
	}
	c.req.URI().DisablePathNormalizing = true
	if err := c.roundTrip(e); err != nil {
		kind := classifyDo(err)
		if c.isCancelled() {
			kind = c.cancelKind() // whatever the broken connection said
		}
		if errors.Is(err, ErrClientGone) {
			err = nil // not a cause: the kind says it all
		}
		ferr := &Error{Slot: slot, Addr: e.addr, Op: "forward to", Kind: kind, Cause: err}
		if de := (*dialError)(nil); errors.As(err, &de) {
			e.connectFailed(de) // refused or unreachable, not merely busy
		}
		if IsEngineFault(kind) {
			c.judge(false)
		}
		c.abort(ferr)
		return ferr
	}
	c.open = true
	switch status := c.resp.StatusCode(); {
	case status == fasthttp.StatusTooManyRequests:
		// Load, not sickness: retried elsewhere (Failed), but no verdict,
		// as Envoy's outlier detection gives none. Counted, five pinned
		// requests to an engine shedding load ejected it for everyone.
		// Its Retry-After keeps the next requests off it (Throttled).
		e.throttle(throttleFor(&c.resp.Header, time.Now()))
	case status >= 500:
		if c.attempts != nil && c.attempts.hold(e) {
			c.judged = true
		} else {
			c.judge(false)
		}
	case c.Failed():
		c.judge(false) // the engine refuses the router's own key: no request's doing
	}
	if obs != nil {
		obs.OnDispatched()
	}
	return nil
}

// AwaitStream waits, for a 2xx event stream, until its body's first
// bytes arrive, before anything is sent to the client (which is answered
// only once the handler has returned). An engine that sends a stream's
// headers and then ends its body, or breaks the connection or stalls
// past the first-byte timeout, before any byte of it has failed with nothing
// relayed: AwaitStream fails the call as its engine's fault, and the
// error (IsRetryable accepts a broken or empty stream) lets the request
// be sent elsewhere; such a stream had reached the client as a 200 with
// an error event. The bytes read are the first Relay sends. nil for any
// other answer, and once bytes came.
func (c *Call) AwaitStream() error {
	if !c.open || c.resp.StatusCode()/100 != 2 || !c.IsEventStream() {
		return nil
	}
	body := c.resp.BodyStream()
	if body == nil {
		return nil // no body at all: Relay's to end
	}
	for {
		n, err := body.Read(c.buf)
		if n > 0 {
			c.pending, c.pendingErr = n, err
			return nil
		}
		switch {
		case err == io.EOF:
			c.bodyEOF = true
			return c.fail(ErrEngineFailed, errEmptyStream, nil, false)
		case err != nil:
			return c.fail(c.readFailure(err), err, nil, false)
		}
	}
}

var errEmptyStream = errors.New("the event stream ended before its first byte")

// RefuseFailedStart fails the call when the stream AwaitStream waited for
// opens with the engine's error event coded 5xx (an engine whose
// generation failed before its first token: a dead engine core answers
// every request so).
// Nothing reached the client, so the request may go to another worker;
// the verdict is held as a 5xx's is (SetAttempts), so that a prompt that
// fails everywhere does not eject the engines it tried. Call it only when
// another worker can take the request: otherwise the client is better
// served by the engine's own error, relayed. It returns that error
// (IsRetryable accepts it), or nil for a stream that began otherwise or
// whose first event is not whole in the bytes AwaitStream read.
func (c *Call) RefuseFailedStart() error {
	if !c.OpensWithServerError() {
		return nil
	}
	if !c.judged && c.attempts != nil && c.engine != nil && c.attempts.hold(c.engine) {
		c.judged = true
	}
	return c.fail(ErrEngineError, errFailedStart, nil, false)
}

// OpensWithServerError reports whether the stream AwaitStream waited for
// opens with an error event the engine codes 5xx, whole in the bytes read:
// the cheap test before RefuseFailedStart. Only an error the engine itself
// calls a server failure counts: one it codes 4xx (a schema or grammar it
// refuses) is the request's, and every engine would answer it so.
func (c *Call) OpensWithServerError() bool {
	if c.pending == 0 {
		return false
	}
	end, _ := openai.EventEnd(c.buf[:c.pending], 0)
	if end < 0 {
		return false
	}
	ev := openai.ParseEvent(c.buf[:end])
	return ev.Kind == openai.EventError && ev.ErrorCode >= 500
}

var errFailedStart = errors.New("the event stream began with the engine's error event")

// RefuseUnaskedStream fails the call, as its engine's fault, when Do
// received a 2xx event stream for a request that did not ask for one:
// its client expects one JSON object and would get server-sent events. It
// returns that error (IsRetryable accepts it), or nil for any other
// answer.
func (c *Call) RefuseUnaskedStream() error {
	if c.resp.StatusCode()/100 != 2 || !c.IsEventStream() {
		return nil
	}
	return c.fail(ErrEngineFailed, errUnaskedStream, nil, false)
}

var errUnaskedStream = errors.New("an event stream answering a request that asked for one object")

// RefuseUnaskedObject is RefuseUnaskedStream's mirror, for a request that
// asked for a stream: a 2xx answer that is not an event stream (one JSON
// object, an HTML page) fails the call as its engine's fault. A client's
// SDK would read the object as a stream of no events, an empty
// completion, and report no error.
func (c *Call) RefuseUnaskedObject() error {
	if c.resp.StatusCode()/100 != 2 || c.IsEventStream() {
		return nil
	}
	return c.fail(ErrEngineFailed, errUnaskedObject, nil, false)
}

var errUnaskedObject = errors.New("a plain answer to a request that asked for an event stream")

// Discard gives up the response Do received, a failure (Failed), so that the
// request may be sent to another worker before any byte of it reached the
// client: it closes the engine connection, aborts the observer with
// ErrEngineError (ErrEngineAuth for a refusal of the router's key) and
// returns that error, which IsRetryable accepts.
func (c *Call) Discard() error {
	var addr string
	var slot workers.Slot
	if c.engine != nil {
		addr, slot = c.engine.addr, c.engine.slot
	}
	kind := ErrEngineError
	switch c.resp.StatusCode() {
	case fasthttp.StatusTooManyRequests:
		kind = ErrEngineOverloaded
	case fasthttp.StatusUnauthorized, fasthttp.StatusForbidden:
		kind = ErrEngineAuth
	}
	err := &Error{Slot: slot, Addr: addr, Op: "forward to", Kind: kind}
	c.closeStream()
	c.abort(err)
	return err
}

// DiscardUnserved gives up a 404 answer to a request naming a LoRA adapter
// that the engine listed, as Discard does, so that the request may go to
// another engine listing it: the adapter was unloaded there since the
// router last asked. It returns ErrAdapterGone, which IsRetryable accepts;
// the engine was judged healthy (it answered properly).
func (c *Call) DiscardUnserved() error {
	var addr string
	var slot workers.Slot
	if c.engine != nil {
		addr, slot = c.engine.addr, c.engine.slot
	}
	err := &Error{Slot: slot, Addr: addr, Op: "forward to", Kind: ErrAdapterGone}
	c.closeStream()
	c.abort(err)
	return err
}

// judge records this attempt's verdict on its engine for passive health,
// once.
func (c *Call) judge(ok bool) {
	if !c.judged && c.engine != nil {
		c.judged = true
		c.engine.record(ok)
	}
}

func classifyDo(err error) error {
	var de *dialError
	switch {
	case errors.As(err, new(*brokenThenGone)):
		return ErrEngineFailed
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		return ErrConnsExhausted
	case errors.As(err, &de):
		return ErrConnect
	case errors.Is(err, ErrIdleTimeout):
		return ErrIdleTimeout
	case errors.Is(err, ErrWriteTimeout):
		return ErrWriteTimeout
	case errors.Is(err, fasthttp.ErrTimeout), errors.Is(err, ErrFirstByteTimeout):
		// fasthttp reports any timeout before the response as ErrTimeout;
		// the only read deadline then is the first-byte one.
		return ErrFirstByteTimeout
	}
	return ErrEngineFailed
}

// StatusCode returns the engine's response status.
func (c *Call) StatusCode() int { return c.resp.StatusCode() }

// Failed reports whether the engine's answer is its own failure rather
// than a verdict on the request: a 5xx, a 429 (the engine is overloaded),
// or, when the router sends the engines' key (Config.EngineToken), a 401
// or 403, the engine refusing that key (an engine restarted with
// another), which no client caused. Such an answer may be given up with
// Discard and the request sent to another worker.
func (c *Call) Failed() bool {
	switch s := c.resp.StatusCode(); {
	case s >= 500, s == fasthttp.StatusTooManyRequests:
		return true
	case s == fasthttp.StatusUnauthorized || s == fasthttp.StatusForbidden:
		return c.pool.authorization != nil
	}
	return false
}

var (
	eventStream = []byte("text/event-stream")
	contentType = []byte("Content-Type")
)

// IsEventStream reports whether the engine answered with a server-sent event
// stream, to be relayed with Relay; otherwise use ReadBody.
func (c *Call) IsEventStream() bool {
	ct := c.resp.Header.ContentType()
	return len(ct) >= len(eventStream) && bytes.EqualFold(ct[:len(eventStream)], eventStream)
}

// hopByHop lists headers that describe the engine connection, not the
// response, and so are not passed to the client.
var hopByHop = [...][]byte{
	[]byte("Connection"), []byte("Keep-Alive"), []byte("Proxy-Connection"),
	[]byte("Transfer-Encoding"), []byte("Content-Length"), []byte("TE"),
	[]byte("Trailer"), []byte("Upgrade"), []byte("Date"), []byte("Server"),
}

var connectionHeader = []byte("Connection")

// namedByConnection reports whether one of the engine's Connection headers
// names header: it is hop-by-hop too (RFC 9110, 7.6.1). Names match
// whatever their case, since the engine's header names are kept as sent.
func (c *Call) namedByConnection(header []byte) bool {
	for k, v := range c.resp.Header.All() {
		if bytes.EqualFold(k, connectionHeader) && namedIn(v, header) {
			return true
		}
	}
	return false
}

// namedIn reports whether list, a comma-separated header value, names
// header, ignoring case and blanks.
func namedIn(list, header []byte) bool {
	for len(list) > 0 {
		item := list
		if i := bytes.IndexByte(list, ','); i >= 0 {
			item, list = list[:i], list[i+1:]
		} else {
			list = nil
		}
		if bytes.EqualFold(bytes.TrimSpace(item), header) {
			return true
		}
	}
	return false
}

// CopyHeaders sets dst's status and headers from the engine's response,
// leaving out hop-by-hop headers and the framing, which the server redoes.
func (c *Call) CopyHeaders(dst *fasthttp.ResponseHeader) {
	dst.SetStatusCode(c.resp.StatusCode())
	for k, v := range c.resp.Header.All() {
		skip := c.namedByConnection(k)
		for _, h := range hopByHop {
			if skip || bytes.EqualFold(k, h) {
				skip = true
				break
			}
		}
		switch {
		case skip:
		case bytes.EqualFold(k, contentType):
			dst.SetContentTypeBytes(v)
		default:
			dst.SetBytesKV(k, v)
		}
	}
}

// Relay copies the response body to w byte for byte. For an event stream it
// writes and flushes each complete event as soon as it has arrived, and
// reports items, the first token and the terminal item to the observer
// before the client sees them; an engine error event aborts the observer
// and is relayed like any other. Flushes block while the client is slow,
// and the engine is not read meanwhile: TCP carries the backpressure.
//
// If writing to w fails, or Abort is called, the client is gone: Relay
// closes the engine connection, which cancels the request, and aborts with
// ErrClientGone. If
// the engine fails, stalls past the idle timeout or ends the stream early,
// Relay writes an OpenAI error event to the client (for a stream), closes
// the engine connection and aborts. A nil return means the response was
// relayed to its end.
func (c *Call) Relay(w *bufio.Writer) error {
	if !c.open {
		return c.fail(ErrAbandoned, nil, w, false)
	}
	body := c.resp.BodyStream()
	if body == nil { // no body at all
		c.closeStream()
		c.end(nil)
		return nil
	}
	if !c.IsEventStream() {
		// A plain response is read whole with ReadBody; relaying one would
		// leave its finish unobserved.
		return c.fail(ErrEngineFailed, errNotEventStream, w, false)
	}
	kind, cause := c.relayEvents(body, w)
	if kind == nil {
		if !c.finished && !c.done {
			kind = ErrTruncated
		} else {
			c.closeStream()
			c.end(nil)
			if err := c.closeErred(w); err != nil {
				return c.fail(ErrClientGone, err, w, true)
			}
			// The server writes the stream's last chunk after Relay: give
			// it a deadline of its own, not what is left of the last
			// write's, which a long silence before the end used up.
			c.extendDeadline()
			return nil
		}
	}
	return c.fail(kind, cause, w, true)
}

// EngineErred reports whether the relayed stream carried the engine's own
// error event: relayed to its end, the answer still failed.
func (c *Call) EngineErred() bool { return c.erred }

// extendDeadline gives the next write to the client the whole write
// timeout, when one is set (SetClientWriteTimeout).
func (c *Call) extendDeadline() error {
	if c.downstreamWrite > 0 && c.downstream != nil {
		return c.downstream.SetWriteDeadline(time.Now().Add(c.downstreamWrite))
	}
	return nil
}

// end reports a response that reached its end: complete for a success
// status, else the engine's error.
func (c *Call) end(reason []byte) {
	c.judge(c.resp.StatusCode() < 500) // a 4xx is the client's fault, answered properly
	if s := c.resp.StatusCode(); s < 200 || s > 299 {
		c.abort(ErrEngineError)
		return
	}
	c.finish(reason)
}

// fail ends a broken relay: tell a waiting stream client, cancel upstream,
// abort the observer.
func (c *Call) fail(kind, cause error, w *bufio.Writer, sse bool) error {
	var addr string
	var slot workers.Slot
	if c.engine != nil {
		addr, slot = c.engine.addr, c.engine.slot
	}
	err := &Error{Slot: slot, Addr: addr, Op: "relay from", Kind: kind, Cause: cause}
	if IsEngineFault(kind) {
		c.judge(false)
	}
	switch {
	case !sse || kind == ErrClientGone:
	case !c.finished && !c.done:
		if c.midEvent {
			// End the event cut short, so that the error is an event of
			// its own.
			_ = c.write(w, blankLine)
		}
		_ = c.write(w, sseErrors[kindOf(kind)])
	default:
		_ = c.closeErred(w) // broken after the engine's own error event
	}
	c.closeStream()
	c.abort(err)
	// The server writes the stream's last chunk after Relay, as after a
	// whole answer (a failure after a long silence had left the client
	// a body without its end).
	c.extendDeadline()
	return err
}

var doneEvent = []byte("data: [DONE]\n\n")

// closeErred ends a stream that carried the engine's own error event and
// no [DONE] as the router ends one it breaks off, with [DONE] (after a
// blank line, if the client was last sent part of an event, so that it
// stands alone). Nothing for any other stream.
func (c *Call) closeErred(w *bufio.Writer) error {
	if !c.erred || c.done {
		return nil
	}
	if c.midEvent {
		if err := c.write(w, blankLine); err != nil {
			return err
		}
		c.midEvent = false
	}
	return c.write(w, doneEvent)
}

// deadliner is the client's side of a relay: its connection.
type deadliner interface{ SetWriteDeadline(time.Time) error }

// SetClientWriteTimeout makes every write Relay makes to its client
// complete within d, on client's connection: a client that stops reading
// a stream (a full receive window) is cut when its next write has waited
// d, rather than holding the engine, the booking and the relay forever.
// d is per write, not per stream: a long stream the client keeps reading
// is not cut. d <= 0 sets no deadline.
func (c *Call) SetClientWriteTimeout(client deadliner, d time.Duration) {
	c.downstream, c.downstreamWrite = client, d
}

// write sends p to the client and flushes it.
func (c *Call) write(w *bufio.Writer, p []byte) error {
	if err := c.extendDeadline(); err != nil {
		return err
	}
	if _, err := w.Write(p); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return nil
}

// readFailure classifies an error reading the engine's body. A read that
// Abort broke is the client's doing, not the engine's.
func (c *Call) readFailure(err error) error {
	if c.isCancelled() {
		return c.cancelKind()
	}
	switch {
	case errors.Is(err, ErrIdleTimeout):
		return ErrIdleTimeout
	case errors.Is(err, ErrFirstByteTimeout):
		return ErrFirstByteTimeout
	}
	return ErrEngineFailed
}

// relayEvents is Relay's loop for an event stream, reading r. It returns
// the kind of failure and its cause, or nils at the end of r.
//
// buf[start:end] holds bytes read but not yet sent: the beginning of an
// incomplete event. Whole events are inspected, then sent and flushed
// together, which sends each of them as early as flushing one by one would,
// with fewer writes.
func (c *Call) relayEvents(r io.Reader, w *bufio.Writer) (kind, cause error) {
	buf := c.buf
	start, end := 0, 0
	lineStart := 0  // openai.EventEnd's resume point, relative to start
	inspect := true // false while passing through an event too big for buf
	timed := false  // an incomplete event's clock runs (pieceStarted)
	passed := 0     // bytes of an event too big for buf sent so far
	// What AwaitStream read comes first, without waiting for more.
	end, c.pending = c.pending, 0
	preread, prereadErr := end > 0, c.pendingErr
	c.pendingErr = nil
	for {
		if end == len(buf) && !preread {
			if start > 0 {
				end = copy(buf, buf[start:end])
				start = 0
			} else {
				// One event fills the buffer. Send what there is and
				// keep going; the event will not be inspected. A pending
				// line that is only "\r" stays, since its "\n" may yet
				// end the event.
				keep := 0
				if lineStart == end-1 && buf[end-1] == '\r' {
					keep = 1
				}
				// Bounded as a plain answer is: the idle timeout below
				// cannot cut an engine that sends one event as fast as
				// the client takes it.
				if passed+end-keep > c.pool.cfg.MaxResponseBodySize {
					return ErrResponseTooLarge, nil
				}
				passed += end - keep
				wrote := time.Now()
				if err := c.write(w, buf[:end-keep]); err != nil {
					return ErrClientGone, err
				}
				// The time the client took over the event's part is not
				// the engine's: its clock is put back by that much, not
				// started again (which let an engine dribbling one endless
				// event in parts hold the stream past the idle timeout).
				if timed {
					c.pieceDelayed(time.Since(wrote))
				} else {
					c.pieceStarted()
					timed = true
				}
				c.midEvent = true
				if lineStart < end-keep {
					lineStart = -1 // mid-line: the rest of this line is not blank
				} else {
					lineStart = 0
				}
				end = copy(buf, buf[end-keep:end])
				inspect = false
			}
		}
		var n int
		var rerr error
		if preread {
			preread, rerr = false, prereadErr
		} else {
			n, rerr = r.Read(buf[end:])
		}
		end += n
		sent := start
		for {
			evEnd, resume := openai.EventEnd(buf[start:end], lineStart)
			if evEnd < 0 {
				lineStart = resume
				break
			}
			if passed+evEnd > c.pool.cfg.MaxResponseBodySize {
				return ErrResponseTooLarge, nil
			}
			if inspect {
				c.observe(openai.ParseEvent(buf[start : start+evEnd]))
			}
			inspect, passed = true, 0
			start += evEnd
			lineStart = 0
		}
		if start > sent {
			if err := c.write(w, buf[sent:start]); err != nil {
				return ErrClientGone, err
			}
			c.midEvent = false
		}
		switch {
		case end == start:
			if timed {
				c.pieceEnded()
				timed = false
			}
		case !timed || start > sent: // a new event has begun
			c.pieceStarted()
			timed = true
		}
		if c.done && rerr == nil {
			c.expectEnd(doneGrace)
		}
		if rerr != nil {
			if (c.done || c.generated) && errors.Is(rerr, ErrIdleTimeout) {
				// [DONE], or the last finish_reason, came and the body did
				// not end: the response is whole (what an engine may send
				// after the finish, a usage chunk and [DONE], comes at
				// once), and the connection is not reusable (bodyEOF stays
				// false, so closeStream closes it).
				return nil, nil
			}
			if rerr != io.EOF {
				return c.readFailure(rerr), rerr
			}
			c.bodyEOF = true
			if end > start && !inspect {
				// The rest of an event too big to inspect: relayed as it
				// came, as the rest of it was.
				if err := c.write(w, buf[start:end]); err != nil {
					return ErrClientGone, err
				}
				c.midEvent = true
			}
			if end > start && inspect { // a last event without its blank line
				c.observe(openai.ParseEvent(buf[start:end]))
				// Complete it if it ended the response (clients drop an
				// unterminated event at the end of a stream); a truncated
				// one is dropped for the error event that follows, which
				// would otherwise be glued to it.
				if c.finished || c.done {
					if err := c.write(w, buf[start:end]); err != nil {
						return ErrClientGone, err
					}
					if err := c.write(w, blankLine); err != nil {
						return ErrClientGone, err
					}
				}
			}
			return nil, nil
		}
	}
}

var blankLine = []byte("\n\n")

// doneGrace is how long the relay waits, after [DONE], for the engine to
// end the response body: a well-behaved engine ends it at once (the
// chunked body's last chunk follows [DONE]), and the client's stream ends
// only when it does.
const doneGrace = time.Second

// finishGrace is how long the relay waits, after a stream's last
// finish_reason, for the engine to end it. vLLM and SGLang send the usage
// chunk and [DONE] straight after it; an engine that stalls there had
// held its client for the whole idle timeout (2 minutes by default)
// after the answer was complete.
var finishGrace = 10 * time.Second // a variable for tests (export_test.go)

// pieceStarted and pieceEnded time a piece of the answer: an event, or
// a plain answer's body, must be whole within the idle timeout of its
// first byte (engineConn.pieceBy); pieceDelayed gives it the time the
// relay spent writing part of it to a slow client.
func (c *Call) pieceStarted() {
	if ec, ok := c.conn.(*engineConn); ok {
		ec.pieceStarted()
	}
}

func (c *Call) pieceDelayed(d time.Duration) {
	if ec, ok := c.conn.(*engineConn); ok {
		ec.pieceDelayed(d)
	}
}

func (c *Call) pieceEnded() {
	if ec, ok := c.conn.(*engineConn); ok {
		ec.pieceEnded()
	}
}

// clearEnd lifts expectEnd's bound.
func (c *Call) clearEnd() {
	if ec, ok := c.conn.(*engineConn); ok {
		ec.endBy = time.Time{}
	}
}

// expectEnd bounds the wait for the end of the body after [DONE] or the
// last finish_reason.
func (c *Call) expectEnd(grace time.Duration) {
	if ec, ok := c.conn.(*engineConn); ok {
		ec.expectEnd(grace)
	}
}

// observe passes one event to the observer.
func (c *Call) observe(ev openai.Event) {
	switch ev.Kind {
	case openai.EventItem:
		if c.finished {
			if c.generated && !c.done && !c.erred {
				// More items after the last finish_reason (an engine that
				// repeats a choice's finish): the answer goes on, and the
				// grace that would cut it does not stand.
				c.generated = false
				c.clearEnd()
			}
			return
		}
		if !c.first {
			c.first = true
			c.served()
			c.obs.OnFirstToken()
		}
		c.obs.OnItem(1)
		if ev.FinishReason != nil {
			if c.finishes += ev.Finishes; c.finishes >= c.choices {
				c.finish(ev.FinishReason)
				c.generated = true
				c.expectEnd(finishGrace)
			}
		}
	case openai.EventDone:
		c.done = true
		c.end(nil)
	case openai.EventError:
		if !c.finished {
			var addr string
			var slot workers.Slot
			if c.engine != nil {
				addr, slot = c.engine.addr, c.engine.slot
			}
			// The engine failed the answer it had begun: a failure for
			// passive health, as an error under a 2xx plain answer is.
			c.judge(false)
			c.abort(&Error{Slot: slot, Addr: addr, Op: "relay from", Kind: ErrEngineError})
			c.erred = true
		}
		// The engine's error ends its answer (vLLM sends [DONE] next):
		// one that then stalls is not waited for past the grace (it had
		// held the client for the whole idle timeout, and then left its
		// stream unterminated), nor do later items lift it.
		c.generated = true
		c.expectEnd(finishGrace)
	}
}

// observeBody reports a complete non-streaming response, parsed.
func (c *Call) observeBody(ev openai.Event) {
	if ev.Kind == openai.EventError {
		if s := c.resp.StatusCode(); s >= 200 && s < 300 {
			c.judge(false) // an error under a success status: the engine failed, not the request
		}
		c.abort(ErrEngineError)
		return
	}
	c.end(ev.FinishReason)
}

// ReadBodyWithin is ReadBody with a deadline on the whole body: past d
// the call is cut and fails as an idle timeout (ErrIdleTimeout, the
// engine's fault). It is for answers the router reads itself, a prefill
// stage's or an encoder's: one small object the engine has finished
// computing when its headers come, which the idle timeout, reset by every
// byte, never ends when it is dribbled a byte at a time.
func (c *Call) ReadBodyWithin(d time.Duration) ([]byte, error) {
	defer c.cutAfter(d, ErrIdleTimeout)()
	return c.ReadBody()
}

// DoWithin is Do with a bound of its own, d, on the wait for the answer's
// headers, and for a 2xx stream's first bytes, shorter than
// Timeouts.FirstByte: past it the call is cut and fails as a first-byte
// timeout (the engine's fault). It is for a stage the request can do
// without or must not wait long for (an encoder's: the engine encodes the
// item itself; a prefill's), which a hung engine would otherwise hold for
// the whole first-byte timeout, per attempt. d <= 0 is Do.
func (c *Call) DoWithin(slot workers.Slot, obs Observer, d time.Duration) error {
	if d <= 0 {
		return c.Do(slot, obs)
	}
	by := time.Now().Add(d)
	defer c.cutAfter(d, ErrFirstByteTimeout)()
	err := c.Do(slot, obs)
	if ec, ok := c.conn.(*engineConn); ok && err == nil {
		ec.awaitBodyBy(by)
	}
	return err
}

// cutAfter cancels the call with kind after d, unless the returned stop
// is called first. Once stop returns, a timer firing late cannot cut the
// call, which may be released and reused by then.
func (c *Call) cutAfter(d time.Duration, kind error) (stop func()) {
	var mu sync.Mutex
	over := false
	t := time.AfterFunc(d, func() {
		mu.Lock()
		defer mu.Unlock()
		if !over {
			c.cancel(kind)
		}
	})
	return func() {
		mu.Lock()
		over = true
		mu.Unlock()
		t.Stop()
	}
}

// ReadBody reads the whole non-streaming response, reports it to the
// observer (complete with its finish_reason, or aborted for an error status
// or error object) and returns it. The body is valid until Release; the
// server copies it into its response, whose Content-Length it then knows.
// On failure nothing has reached the client, so the server can still answer
// with an error of its own (ErrorStatus, AppendErrorJSON).
func (c *Call) ReadBody() ([]byte, error) {
	if !c.open {
		return nil, c.fail(ErrAbandoned, nil, nil, false)
	}
	body := c.resp.BodyStream()
	c.pieceStarted() // the whole body within the idle timeout: an engine writes it at once
	limit := c.pool.cfg.MaxResponseBodySize
	cl := c.resp.Header.ContentLength()
	if cl > limit {
		return nil, c.fail(ErrResponseTooLarge, nil, nil, false) // refused from its header, unread
	}
	n := 0
	for body != nil {
		if n == len(c.buf) {
			if n >= limit {
				return nil, c.fail(ErrResponseTooLarge, nil, nil, false)
			}
			grow := min(len(c.buf), limit-n)
			if cl >= n {
				// Doubling stops at the declared length (and the byte that
				// finds the end), not past it; it is not taken up front,
				// where an engine that declares much and sends little
				// would hold the budget with bytes it never sent.
				grow = min(grow, cl+1-n)
			}
			if !c.chargeResponse(int64(grow)) {
				return nil, c.fail(ErrResponseBudget, nil, nil, false)
			}
			c.buf = append(c.buf, make([]byte, grow)...)
		}
		m, err := body.Read(c.buf[n:])
		n += m
		if err == io.EOF {
			c.bodyEOF = true
			break
		}
		if err != nil {
			return nil, c.fail(c.readFailure(err), err, nil, false)
		}
	}
	c.closeStream()
	ev := openai.ParseResponse(c.buf[:n])
	if c.requireObject && c.resp.StatusCode()/100 == 2 {
		// Not what was asked for: the engine failed, and the caller must
		// not take the bytes for an answer (nor relay an error as a
		// success its client would count as one).
		switch {
		case !isObject(c.buf[:n]):
			return nil, c.fail(ErrEngineFailed, errNotObject, nil, false)
		case ev.Kind == openai.EventError:
			return nil, c.fail(ErrEngineFailed, errErrorUnder2xx, nil, false)
		}
	}
	if ev.Kind != openai.EventError {
		c.served()
	}
	c.observeBody(ev)
	return c.buf[:n], nil
}

// served settles the 5xx verdicts held for this request (SetAttempts) as
// failures once this engine has served it: a plain answer accepted, or a
// stream's first item. Not at its 2xx headers, which an answer that turns
// out empty, broken or not an object follows, to be retried elsewhere:
// then no engine had served the request yet. Not at the answer's end
// either: a stream may run for minutes while those engines draw traffic.
func (c *Call) served() {
	if c.attempts != nil && c.resp.StatusCode()/100 == 2 {
		c.attempts.served()
	}
}

// errNotObject and errErrorUnder2xx are why a RequireObject call failed.
var (
	errNotObject     = errors.New("a success answer that is not a JSON object")
	errErrorUnder2xx = errors.New("an error object under a success status")
)

// chargeResponse takes n more bytes of the pool's response budget for
// this call, or reports false, taking none, if they do not fit.
func (c *Call) chargeResponse(n int64) bool {
	p := c.pool
	if p.responseBytes.Add(n) > p.cfg.ResponseBudgetBytes {
		p.responseBytes.Add(-n)
		return false
	}
	c.charged += n
	return true
}

// closeStream lets go of the engine's body stream and its connection. A
// body read to its end returns the connection to the pool; otherwise the
// connection is closed, which is how an engine learns that its request was
// cancelled.
func (c *Call) closeStream() {
	if c.open {
		c.open = false
		_ = c.resp.CloseBodyStream()
		c.letGo(c.bodyEOF && !c.resp.ConnectionClose())
	}
}

func (c *Call) finish(reason []byte) {
	if !c.finished {
		c.finished = true
		c.obs.OnComplete(reason)
	}
}

func (c *Call) abort(err error) {
	if !c.finished {
		c.finished = true
		c.obs.OnAbort(err)
	}
}
