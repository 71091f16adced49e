package epp

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/guard"
	"github.com/kvfast/kvfast/openai"
)

// Server is the ext_proc service: one Process stream per HTTP request
// the gateway forwards.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	p         *Picker
	parser    openai.Parser
	exchanges sync.Pool
	metrics   *metrics
	ready     readiness
	bodyBytes atomic.Int64 // request body bytes buffered over every stream (chargeBody)
	// errBodyTooLarge names the limit and the flag that sets it.
	errBodyTooLarge *openai.Error
}

// NewServer answers ext_proc streams with p's decisions.
func NewServer(p *Picker) *Server {
	s := &Server{p: p, parser: openai.Parser{MaxBodyBytes: p.cfg.MaxBodyBytes}, metrics: newMetrics(p)}
	s.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvfast_epp_request_body_bytes",
		Help: "Request body bytes buffered now over every stream, against --body-budget-bytes."},
		func() float64 { return float64(s.bodyBytes.Load()) }))
	s.ready.leading = true
	s.exchanges.New = func() any { return &exchange{s: s, watch: newWatchdog(s.metrics.responseTimeouts)} }
	s.errBodyTooLarge = &openai.Error{Status: http.StatusRequestEntityTooLarge, Type: openai.TypeInvalidRequest, Code: "body_too_large",
		Message: fmt.Sprintf("the request body is larger than the picker reads (%d bytes, its --max-body-bytes)", p.cfg.MaxBodyBytes)}
	return s
}

// chargeBody takes n more bytes of the body budget for x's body, or
// reports false, taking none. The charge is x's until its body has been
// answered (releaseBody) or the stream ends (reset).
func (s *Server) chargeBody(x *exchange, n int) bool {
	if s.bodyBytes.Add(int64(n)) > s.p.cfg.BodyBudgetBytes {
		s.bodyBytes.Add(-int64(n))
		return false
	}
	x.charged += int64(n)
	return true
}

// Process follows one HTTP request through its phases. It returns when
// the gateway ends the stream, when the picker answered with an
// ImmediateResponse, or when the stream breaks; the request's booking is
// released on every one of those paths, once.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	ctx := stream.Context()
	x := s.exchanges.Get().(*exchange)
	x.reqMode, x.respMode = s.p.cfg.RequestBodyMode, s.p.cfg.RequestBodyMode
	s.metrics.streams.Inc()
	defer func() {
		s.metrics.streams.Dec()
		x.watch.disarm() // a panic may unwind through an armed call
		if x.held {
			// Only a panic unwinding through handle gets here with the
			// booking held: release it before the process goes down.
			_ = x.h.Abort(guard.ReasonPanic)
			x.release()
		}
		x.reset()
		s.exchanges.Put(x)
	}()
	// While a body is begun and not yet whole, the next message is
	// received on a goroutine of its own, so that a body that stops
	// arriving midway can be timed out (BodyIdleTimeout, from its last
	// byte), as can one that trickles for too long (BodyTimeout, from the
	// first part that left it incomplete). One timer serves both: it is
	// set to whichever ends first. Only then: receiving every message so
	// cost 12-14% more CPU per decision of a 64-token prompt
	// (BENCHMARKS.md), and most bodies come in one message.
	var want chan struct{}
	var in chan received
	var idle *time.Timer
	var deadline time.Time
	wait := func() time.Duration { return min(s.p.cfg.BodyIdleTimeout, time.Until(deadline)) }
	held := 0 // body bytes when the idle clock last started
	defer func() {
		if want != nil {
			close(want)
			idle.Stop()
		}
	}()
	for first := true; ; first = false {
		var msg *extprocv3.ProcessingRequest
		var err error
		if !x.sawBody || x.decided {
			if x.held && !x.responded {
				x.watch.arm(x.h, s.p.cfg.ResponseTimeout)
			}
			msg, err = stream.Recv()
			x.watch.disarm()
		} else {
			if want == nil {
				want, in = make(chan struct{}), make(chan received, 1)
				deadline = time.Now().Add(s.p.cfg.BodyTimeout)
				idle, held = time.NewTimer(wait()), len(x.body)
				go receive(stream, want, in)
			} else if len(x.body) != held {
				idle.Reset(wait())
				held = len(x.body)
			}
			want <- struct{}{}
			select {
			case r := <-in:
				msg, err = r.msg, r.err
			case <-idle.C:
				if time.Now().Before(deadline) {
					x.refuse(errBodyStalled, 0)
				} else {
					x.refuse(errBodyTimeout, 0)
				}
				for _, r := range x.out {
					if stream.Send(r) != nil {
						break
					}
				}
				x.out = x.out[:0]
				x.end(false)
				return nil
			}
		}
		if err != nil {
			// The gateway half-closes a stream it is done with and resets
			// one whose HTTP request died (the client left). Envoy also
			// resets right after closing, so a stream whose response body
			// the picker is not sent may end either way once the response
			// began: the engine answered, and it counts as complete.
			x.end(err == io.EOF || x.respMode == extprocfilter.ProcessingMode_NONE && status.Code(err) == codes.Canceled)
			if err == io.EOF || ctx.Err() != nil || status.Code(err) == codes.Canceled {
				return nil
			}
			return status.Errorf(codes.Unknown, "cannot receive from the gateway: %v", err)
		}
		if first && msg.GetProtocolConfig() != nil {
			pc := msg.GetProtocolConfig()
			x.reqMode, x.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
		}
		if msg.GetObservabilityMode() {
			// Envoy ignores every answer and routes the request itself:
			// a decision would book load on an endpoint the request may
			// never reach.
			continue
		}
		x.handle(ctx, msg)
		if x.violation != nil {
			x.end(false)
			return x.violation
		}
		if x.held {
			x.watch.arm(x.h, s.p.cfg.ResponseTimeout)
		}
		for _, r := range x.out {
			if err := stream.Send(r); err != nil {
				x.watch.disarm()
				x.end(false)
				return status.Errorf(codes.Unknown, "cannot answer the gateway: %v", err)
			}
		}
		x.watch.disarm()
		x.out = x.out[:0]
		if x.decided && x.charged > 0 {
			// The body went upstream in the answers just sent (full
			// duplex) or goes on from the gateway's own copy: the picker
			// holds none of it for the rest of the request, which may
			// stream for minutes.
			x.releaseBody()
		}
		if x.immediate {
			// The gateway answers the client itself and ends the stream.
			x.end(false)
			return nil
		}
	}
}

// errBeforeHeaders ends a stream whose request body or trailers came
// before its headers, which a gateway never sends: deciding on the body
// and again on the headers booked the request twice, one booking never
// released.
var errBeforeHeaders = status.Error(codes.FailedPrecondition, "request_body or request_trailers came before request_headers on an ext_proc stream")

// received is one message of the gateway, or the error that ended its
// stream.
type received struct {
	msg *extprocv3.ProcessingRequest
	err error
}

// receive receives one message of stream into in for each value on want,
// until want closes (Process returned) or the stream ends. Process asks
// for one only when none is outstanding, so in, of capacity one, never
// blocks, and a Recv still waiting when Process returns ends with the
// stream.
func receive(stream extprocv3.ExternalProcessor_ProcessServer, want <-chan struct{}, in chan<- received) {
	for range want {
		msg, err := stream.Recv()
		in <- received{msg, err}
		if err != nil {
			return
		}
	}
}

// handle turns one message of the gateway into the responses it needs,
// appended to x.out. A request phase that must wait (the headers in full
// duplex mode, until the body has arrived) appends none.
func (x *exchange) handle(ctx context.Context, msg *extprocv3.ProcessingRequest) {
	switch m := msg.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		if x.sawHeaders {
			// One stream is one request: a second set of headers would
			// be decided and booked again, the first booking lost (a
			// client looping on it held every endpoint busy for good).
			x.violation = status.Error(codes.FailedPrecondition, "request_headers came twice on one ext_proc stream")
			return
		}
		x.sawHeaders = true
		x.requestHeaders(ctx, msg, m.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		if !x.sawHeaders {
			x.violation = errBeforeHeaders
			return
		}
		x.requestBody(ctx, m.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if !x.sawHeaders {
			x.violation = errBeforeHeaders
			return
		}
		trailers := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
			RequestTrailers: &extprocv3.TrailersResponse{}}}
		switch {
		case x.decided:
		case x.reqMode == extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED:
			// Trailers end a body that never said so itself.
			x.decideAndAnswer(ctx, true)
		default:
			// The headers were answered without a destination, for the
			// body's answer to carry it, and no body came: only the
			// trailers' answer is awaited, and it carries the destination
			// as dynamic metadata (a header mutation there would change
			// trailers). A body answer here would answer a message Envoy
			// never sent.
			x.decide(ctx)
			trailers = x.routed(trailers)
		}
		if x.immediate {
			return
		}
		x.out = append(x.out, trailers)
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		x.responseHeaders(msg, m.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		x.responseBody(m.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		x.complete()
		x.out = append(x.out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{}}})
	default:
		// No phase (or one newer than this build knows) has no answer
		// the gateway would accept, and a gateway waiting for one would
		// hold the request, and its booking, until its own timeout.
		x.violation = errNoPhase
	}
}

// errNoPhase ends a stream whose message names no request or response
// phase this picker knows.
var errNoPhase = status.Error(codes.InvalidArgument, "an ext_proc message named no request or response phase: want request_headers, request_body, request_trailers, response_headers, response_body or response_trailers")

func (x *exchange) requestHeaders(ctx context.Context, msg *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) {
	x.api, x.path, x.auth = 0, "", ""
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch hv.GetKey() {
		case ":path":
			x.path = headerValue(hv)
		case "authorization":
			x.auth = headerValue(hv)
		}
	}
	path, _, _ := strings.Cut(x.path, "?")
	// By suffix, as GIE matches: gateways often serve a model under a
	// prefix (/llama/v1/completions).
	switch path = strings.TrimSuffix(path, "/"); {
	case strings.HasSuffix(path, fastpath.PathChatCompletions):
		x.api = openai.APIChatCompletions
	case strings.HasSuffix(path, fastpath.PathCompletions):
		x.api = openai.APICompletions
	}
	x.readSubset(msg.GetMetadataContext())
	switch {
	case h.GetEndOfStream() || x.reqMode == extprocfilter.ProcessingMode_NONE || x.reqMode == extprocfilter.ProcessingMode_STREAMED:
		// No body is coming before the headers go upstream: decide on
		// the headers alone (by load, with no prompt to match).
		x.decide(ctx)
		if !x.immediate {
			x.out = append(x.out, x.headersResponse(true))
		}
	case x.reqMode == extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED:
		// The body follows without waiting; the headers' answer, which
		// carries the destination, waits for it.
	default:
		// BUFFERED: the body is sent once the headers are answered; the
		// destination rides on the body's answer.
		x.out = append(x.out, x.headersResponse(false))
	}
}

func (x *exchange) requestBody(ctx context.Context, b *extprocv3.HttpBody) {
	duplex := x.reqMode == extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED
	if x.decided {
		// A body that follows a decision made on the headers goes on as
		// it is.
		x.out = append(x.out, passBody(duplex, b.GetBody(), b.GetEndOfStream(), true))
		return
	}
	x.sawBody = true
	if len(x.body)+len(b.GetBody()) > x.s.p.cfg.MaxBodyBytes {
		x.refuse(x.s.errBodyTooLarge, 0)
		return
	}
	if !x.s.chargeBody(x, len(b.GetBody())) {
		x.refuse(errBodyBudget, time.Second)
		return
	}
	x.body = append(x.body, b.GetBody()...)
	switch {
	case b.GetEndOfStream():
	case duplex:
		return // more of the body follows; nothing is answered yet
	case x.reqMode == extprocfilter.ProcessingMode_BUFFERED_PARTIAL:
		// Envoy sent the body up to its buffer limit, and the rest goes
		// upstream unseen: a cut-off JSON cannot be parsed, so the
		// request routes by load alone rather than being refused.
		x.partial = true
	default:
		// BUFFERED: Envoy sends the whole body in one message, saying
		// end_of_stream only when no trailers follow (and trailers it
		// may never send the picker).
	}
	x.decideAndAnswer(ctx, false)
}

// decideAndAnswer chooses the endpoint once the body is in and answers
// what the gateway waits for: in full duplex mode the held headers, then
// the body (none when trailers came without one, and not ending the
// stream when trailers follow it); otherwise the body, with the
// destination on it.
func (x *exchange) decideAndAnswer(ctx context.Context, trailers bool) {
	x.decide(ctx)
	if x.immediate {
		return
	}
	if x.reqMode != extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED {
		r := x.routed(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
			RequestBody: &extprocv3.BodyResponse{Response: x.destination()}}})
		x.out = append(x.out, r)
		return
	}
	x.out = append(x.out, x.headersResponse(true))
	if trailers && !x.sawBody {
		return // the gateway asked for no body answer
	}
	// The body goes upstream in the picker's answers, in pieces of at
	// most bodyChunk bytes.
	body := x.body
	for {
		n := min(len(body), bodyChunk)
		last := n == len(body)
		x.out = append(x.out, passBody(true, body[:n], last && !trailers, true))
		body = body[n:]
		if last {
			break
		}
	}
}

// bodyChunk bounds one streamed body answer: Envoy's API recommends at
// most 64 KiB per full-duplex chunk (processing_mode.proto), and some
// gateways enforce it; GIE's picker sends 62,000 bytes.
const bodyChunk = 62000

// passBody answers a body chunk the picker does not change: in full
// duplex mode by sending it back, otherwise by letting it continue.
func passBody(duplex bool, chunk []byte, eos, request bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}
	if duplex {
		br.Response.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: chunk, EndOfStream: eos}}}
	}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}

// headersResponse answers the request headers, with the destination when
// routed is set.
func (x *exchange) headersResponse(routed bool) *extprocv3.ProcessingResponse {
	if !routed {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}}}
	}
	return x.routed(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: x.destination()}}})
}

// destination is the header mutation naming the chosen endpoints. It
// overwrites any destination the client sent, and clears the route cache
// so that the gateway routes on it.
func (x *exchange) destination() *extprocv3.CommonResponse {
	return &extprocv3.CommonResponse{
		ClearRouteCache: true,
		HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
			Header:       &corev3.HeaderValue{Key: HeaderDestination, RawValue: []byte(x.dest)},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		}}},
	}
}

// routed adds the destination's dynamic metadata, the same value as the
// header (the protocol forbids two different ones).
func (x *exchange) routed(r *extprocv3.ProcessingResponse) *extprocv3.ProcessingResponse {
	r.DynamicMetadata = destinationMetadata(x.s.p.cfg.DestinationNamespace, x.dest)
	return r
}

func (x *exchange) responseHeaders(msg *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) {
	code := ""
	x.sse = false
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch strings.ToLower(hv.GetKey()) {
		case ":status":
			code = headerValue(hv)
		case "content-type":
			x.sse = strings.HasPrefix(strings.ToLower(headerValue(hv)), "text/event-stream")
		}
	}
	x.responded = true
	x.followServed(msg.GetMetadataContext())
	if x.held {
		if code == "" || code[0] == '5' {
			// The gateway could not reach the endpoint, or the engine
			// failed the request: nothing runs there.
			_ = x.h.DispatchFailed()
		} else {
			_ = x.h.Dispatched()
		}
	}
	if h.GetEndOfStream() {
		x.complete()
	}
	x.out = append(x.out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}}})
}

func (x *exchange) responseBody(b *extprocv3.HttpBody) {
	if x.sse && x.held {
		x.scanEvents(b.GetBody())
	}
	if b.GetEndOfStream() {
		x.complete()
	}
	x.out = append(x.out, passBody(x.respMode == extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED, b.GetBody(), b.GetEndOfStream(), false))
}

// scanEvents turns the stream's events into guard progress: each item
// carries a token (the first releases the prompt's prefill load), a
// finish reason completes the request, an error event aborts it. An
// event split across chunks is carried over, up to maxCarry bytes.
func (x *exchange) scanEvents(chunk []byte) {
	x.carry = append(x.carry, chunk...)
	// The events found are passed over by offset and the rest moved to
	// the front once: moving it after each event made a chunk's scan
	// quadratic (a 1 MiB chunk of newlines, 17 s).
	off := 0
	for {
		end, resume := openai.EventEnd(x.carry[off:], x.lineStart)
		if end < 0 {
			x.lineStart = resume
			break
		}
		x.lineStart = 0
		ev := openai.ParseEvent(x.carry[off : off+end])
		off += end
		switch ev.Kind {
		case openai.EventItem:
			_ = x.h.OnItem(1, x.finish(ev.FinishReason))
		case openai.EventError:
			_ = x.h.Abort(guard.ReasonEngineError)
		}
	}
	x.carry = x.carry[:copy(x.carry, x.carry[off:])]
	if len(x.carry) > maxCarry {
		// Not an event stream after all: stop carrying it.
		x.carry, x.lineStart = x.carry[:0], -1
	}
}

const maxCarry = 1 << 20

// finish maps an item's finish reason to the guard's: the guard only
// tells a terminal item from an error, and with several choices only the
// end of the stream completes the request.
func (x *exchange) finish(reason []byte) guard.Finish {
	switch {
	case reason == nil || x.req.Choices > 1:
		return guard.FinishNone
	case string(reason) == "error":
		return guard.FinishError
	}
	return guard.FinishStop
}

// complete records the normal end of the response.
func (x *exchange) complete() {
	if x.held {
		_ = x.h.Close()
	}
}

// end settles the request when its stream ends: a gateway that closed the
// stream after the response began has seen that response end (with the
// response body not sent to the picker, nothing else says so); any other
// end means the request died on its way, and its booking is aborted.
func (x *exchange) end(closed bool) {
	if !x.held {
		return
	}
	if closed && x.responded {
		_ = x.h.Close()
	} else {
		_ = x.h.Abort(guard.ReasonClientCancel)
	}
	x.release()
}

func headerValue(h *corev3.HeaderValue) string {
	if v := h.GetRawValue(); len(v) > 0 {
		return string(v)
	}
	return h.GetValue()
}
