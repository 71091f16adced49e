package epp

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvfast/kvfast/guard"
	"github.com/kvfast/kvfast/internal/clock"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/workers"
)

// exchange is one ext_proc stream: one HTTP request from its headers to
// the end of its response. It is pooled and owns the request's buffers;
// only its stream's goroutine touches it.
type exchange struct {
	s                 *Server
	reqMode, respMode extprocfilter.ProcessingMode_BodySendMode

	path string
	auth string     // the client's Authorization header, for --query-nodes
	api  openai.API // 0: a path the picker does not parse
	body []byte
	req  openai.ParsedRequest
	// sawBody: a request body message came; partial: it was cut at
	// Envoy's buffer limit (BUFFERED_PARTIAL), the rest unseen.
	sawBody, partial bool
	charged          int64 // of the server's body budget, for body

	subset     bool        // the gateway restricted the choice
	allow      workers.Set // to these endpoints
	hashes     []uint64
	overlaps   workers.Overlaps
	scores     sched.Scores
	sreq       sched.Request
	exact      bool
	dec        sched.Decision
	dest       string // the destination value: the chosen endpoint, then fallbacks
	sawHeaders bool   // the request's headers came
	violation  error  // the gateway broke the protocol: the stream ends with it
	decided    bool   // dest is set (or the request was refused)
	immediate  bool   // the picker answered the request itself
	responded  bool   // the response headers came
	sse        bool   // the response is an event stream
	h          guard.Handle
	held       bool // h is acquired and not yet released
	carry      []byte
	lineStart  int
	fallbackBy []workers.Slot

	out []*extprocv3.ProcessingResponse // answers to the current message

	watch *watchdog // made with the exchange, kept across streams
}

// reset readies x for its next stream, keeping its buffers unless one
// huge request grew them.
func (x *exchange) reset() {
	if x.held {
		panic("BUG: epp: exchange recycled with its guard held")
	}
	x.req.Recycle()
	x.s.bodyBytes.Add(-x.charged)
	body, hashes, carry := x.body[:0], x.hashes[:0], x.carry[:0]
	if cap(body) > 1<<20 {
		body = nil
	}
	if cap(hashes) > 1<<16 {
		hashes = nil
	}
	if cap(carry) > 1<<16 {
		carry = nil
	}
	*x = exchange{s: x.s, req: x.req, body: body, hashes: hashes, carry: carry,
		fallbackBy: x.fallbackBy[:0], out: x.out[:0], watch: x.watch}
}

// releaseBody gives back x's body and its charge of the body budget once
// the body has been answered: the decision is made and nothing reads the
// body again.
func (x *exchange) releaseBody() {
	x.s.bodyBytes.Add(-x.charged)
	x.charged = 0
	if cap(x.body) > 1<<20 {
		x.body = nil
	} else {
		x.body = x.body[:0]
	}
}

func (x *exchange) release() {
	if x.held {
		x.held = false
		_ = x.h.Release()
	}
}

// Refusals the picker answers itself, as the protocol says: 503 when no
// endpoint is eligible, 429 when the request should be dropped.
var (
	errNoEndpoint = &openai.Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "no_endpoint",
		Message: "no endpoint of the pool can serve the request"}
	errNoSubsetEndpoint = &openai.Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "no_endpoint",
		Message: "no endpoint the gateway's subset hint names is in the pool, healthy and free to serve the request"}
	errQueueTimeout = &openai.Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "queue_timeout",
		Message: "every endpoint stayed busy for the whole queue timeout"}
	errSubsetQueueTimeout = &openai.Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "queue_timeout",
		Message: "every endpoint the gateway's subset hint names stayed busy for the whole queue timeout"}
	errOverloaded = &openai.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_exceeded", Code: "overloaded",
		Message: "every endpoint is busy and the queue is full"}
	errBodyBudget = &openai.Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "body_budget_exceeded",
		Message: "the picker holds as many request body bytes as it may; retry shortly"}
	errBodyStalled = &openai.Error{Status: http.StatusRequestTimeout, Type: openai.TypeInvalidRequest, Code: "body_stalled",
		Message: "the rest of the request body did not arrive within the picker's --body-idle-timeout"}
	errBodyTimeout = &openai.Error{Status: http.StatusRequestTimeout, Type: openai.TypeInvalidRequest, Code: "body_timeout",
		Message: "the request body was not whole within the picker's --body-timeout"}
)

// decide chooses the endpoint for the request read so far and books it
// into a guard; on failure it answers the request itself (x.immediate).
func (x *exchange) decide(ctx context.Context) {
	t0 := clock.Now()
	x.decided = true
	if rerr := x.prepare(ctx); rerr != nil {
		x.refuse(rerr, 0)
		return
	}
	x.h, x.held = x.s.p.guards.Acquire(), true
	wait, cancel := context.WithTimeout(ctx, x.s.p.cfg.QueueTimeout)
	dec, err := x.h.Select(wait, &x.sreq)
	cancel()
	if err != nil {
		x.release()
		if ctx.Err() != nil {
			// The stream is gone: nobody reads an answer.
			x.immediate = true
			x.s.metrics.cancelled.Inc()
			return
		}
		e, retry := refusalOf(err)
		switch {
		case e == errNoEndpoint && x.subset:
			e = errNoSubsetEndpoint
		case e == errQueueTimeout && x.subset:
			e = errSubsetQueueTimeout
		}
		x.refuse(e, retry)
		return
	}
	x.dec = dec
	if !x.exact || workers.Set(x.s.p.silent.Load()).Has(dec.Slot) {
		x.s.p.approx.Insert(dec.Slot, x.hashes, time.Now())
	}
	x.dest = x.appendDestination(dec)
	x.s.metrics.decided(clock.Since(t0), dec.OverlapBlocks, len(x.hashes))
}

// prepare reads the prompt from the body (when the path is one the
// picker parses), hashes it, and looks up every endpoint's cached prefix.
// A request without a prompt routes by load alone.
func (x *exchange) prepare(ctx context.Context) *openai.Error {
	p := x.s.p
	x.hashes, x.exact = x.hashes[:0], !p.useApprox
	x.sreq = sched.Request{AllowListed: x.subset, Allow: x.allow}
	if x.api != 0 && len(x.body) > 0 && !x.partial {
		if err := x.s.parser.Parse(x.body, x.api, &x.req); err != nil {
			if oe, ok := errors.AsType[*openai.Error](err); ok {
				return oe
			}
			return &openai.Error{Status: http.StatusBadRequest, Type: openai.TypeInvalidRequest, Code: "invalid_body", Message: err.Error()}
		}
		seed := p.seed
		if a, sglangOnly := x.adapterOf(); a != nil || len(x.req.CacheSalt) > 0 {
			// An adapter's or a salted request's own namespace; building
			// it allocates, off the common path.
			if a != nil {
				x.adapterEndpoints(a, sglangOnly)
			}
			seed = radix.NamespaceSeed(p.cfg.Model, string(a), string(x.req.CacheSalt))
		}
		bs := p.sched.BlockSize()
		switch x.req.Prompt {
		case openai.PromptTokens:
			x.hashes = radix.AppendBlockHashes(x.hashes, seed, x.req.Tokens, bs)
			x.sreq.PromptTokens = len(x.req.Tokens)
		case openai.PromptEmbeds:
			// vLLM's prompt_embeds, as kvfast serve routes it.
			x.hashes, x.sreq.PromptTokens = radix.AppendEmbedsHashes(x.hashes, radix.ApproxSeed(seed), x.req.Embeds, p.cfg.ApproxChunkBytes, bs)
			x.exact = false
		default:
			x.hashes = radix.AppendApproxHashes(x.hashes, radix.ApproxSeed(seed), x.req.ApproxText(), p.cfg.ApproxChunkBytes)
			x.exact = false
			x.sreq.PromptTokens = max(len(x.req.ApproxText())/4, len(x.hashes)*bs)
		}
		if x.req.MaxTokens > 0 {
			x.sreq.ExpectedOutputTokens = int(min(x.req.MaxTokens, 1<<30))
		}
		x.sreq.Unstreamed = !x.req.Stream
	}
	switch {
	case p.cfg.QueryNodes:
		x.overlaps, x.exact = workers.Overlaps{}, true // the nodes' answers stand in for the index
		if len(x.hashes) > 0 {
			x.queryNodes(ctx)
		}
	case x.exact:
		p.index.FindMatches(x.hashes, &x.overlaps)
		p.approx.FindMatchesFor(workers.Set(p.silent.Load()), x.hashes, &x.overlaps)
	default:
		p.approx.FindMatches(x.hashes, &x.overlaps)
	}
	x.sreq.Hashes, x.sreq.Overlaps = x.hashes, &x.overlaps
	if p.cfg.Fallbacks > 0 {
		x.sreq.Scores = &x.scores
	}
	return nil
}

// appendDestination is the chosen endpoint, then up to Fallbacks other
// eligible ones that are not busy, cheapest first.
func (x *exchange) appendDestination(dec sched.Decision) string {
	n := x.s.p.cfg.Fallbacks
	if n == 0 {
		return dec.Endpoint
	}
	x.fallbackBy = x.fallbackBy[:0]
	for w := range (x.scores.Eligible &^ x.scores.Busy &^ workers.SetOf(dec.Slot)).All() {
		x.fallbackBy = append(x.fallbackBy, w)
	}
	slices.SortStableFunc(x.fallbackBy, func(a, b workers.Slot) int {
		ca, cb := x.scores.Workers[a].Cost, x.scores.Workers[b].Cost
		switch {
		case ca < cb:
			return -1
		case ca > cb:
			return 1
		}
		return 0
	})
	var b strings.Builder
	b.WriteString(dec.Endpoint)
	for _, w := range x.fallbackBy[:min(n, len(x.fallbackBy))] {
		if info, ok := x.s.p.sched.Worker(w); ok {
			b.WriteByte(',')
			b.WriteString(info.Endpoint)
		}
	}
	return b.String()
}

// refusalOf maps a failed selection to the protocol's errors, with the
// wait an overload suggests (0: none).
func refusalOf(err error) (*openai.Error, time.Duration) {
	switch over, overloaded := errors.AsType[*sched.OverloadError](err); {
	case overloaded:
		return errOverloaded, over.RetryAfter
	case errors.Is(err, context.DeadlineExceeded):
		return errQueueTimeout, 0
	case errors.Is(err, sched.ErrInvalidRequest):
		return &openai.Error{Status: http.StatusBadRequest, Type: openai.TypeInvalidRequest, Code: "invalid_request", Message: err.Error()}, 0
	}
	return errNoEndpoint, 0
}

// refuse answers the request with e, in the OpenAI error format the
// engines use, and ends the exchange.
func (x *exchange) refuse(e *openai.Error, retryAfter time.Duration) {
	x.decided, x.immediate = true, true
	x.s.metrics.refused(e.Status)
	// Once a minute per kind: an operator otherwise saw refusals only as
	// a count by status, and could not tell an empty pool from a subset
	// hint naming none of it.
	key := "refused/" + e.Code
	if e == errNoSubsetEndpoint {
		key += "/subset" // its own line: one code, two causes
	}
	x.s.p.throttle.Log(x.s.p.log, slog.LevelWarn, key, "request refused", "status", e.Status, "code", e.Code, "message", e.Message)
	headers := []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")}}}
	if retryAfter > 0 {
		headers = append(headers, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "retry-after",
			RawValue: []byte(retryAfterSeconds(retryAfter))}})
	}
	x.out = append(x.out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(e.Status)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: headers},
			Body:    e.AppendJSON(nil),
			Details: "kvfast_epp_" + e.Code,
		}}})
}

// readSubset reads the gateway's subset hint: the endpoints the picker
// must choose from. Listed endpoints the picker does not know are
// ignored; none known (or an empty list) leaves nothing eligible, and the
// request is refused with 503, as the protocol says.
func (x *exchange) readSubset(md *corev3.Metadata) {
	ns := md.GetFilterMetadata()[x.s.p.cfg.SubsetNamespace]
	v, ok := ns.GetFields()[KeySubset]
	if !ok {
		return
	}
	x.subset, x.allow = true, 0
	if lv := v.GetListValue(); lv != nil {
		for _, e := range lv.GetValues() {
			x.allowSubset(e.GetStringValue())
		}
		return
	}
	x.allowSubset(v.GetStringValue())
}

// allowSubset adds to x.allow the endpoints one subset hint value names.
// The protocol's shape is a list of "ip:port" strings; gateways also
// send one comma-separated string (what a header-to-metadata rule
// extracts), and a bare IP, which GIE's picker reads as every port of it.
func (x *exchange) allowSubset(v string) {
	slots := *x.s.p.slots.Load()
	for e := range strings.SplitSeq(v, ",") {
		e = strings.TrimSpace(e)
		if w, ok := slots[e]; ok {
			x.allow |= workers.SetOf(w)
			continue
		}
		if _, _, err := net.SplitHostPort(e); err == nil || e == "" {
			continue // an ip:port the pool does not have
		}
		ip := strings.Trim(e, "[]") // a bare IP; IPv6 may come bracketed
		for addr, w := range slots {
			if host, _, err := net.SplitHostPort(addr); err == nil && host == ip {
				x.allow |= workers.SetOf(w)
			}
		}
	}
}

// followServed moves the booking when the gateway says another endpoint
// served the request (it fell back down the destination list): the load
// belongs where the request runs.
func (x *exchange) followServed(md *corev3.Metadata) {
	v, ok := md.GetFilterMetadata()[x.s.p.cfg.DestinationNamespace].GetFields()[KeyServed]
	if !ok || !x.held {
		return
	}
	served := v.GetStringValue()
	if served == "" || served == x.dec.Endpoint {
		return
	}
	x.s.metrics.servedElsewhere.Inc()
	slot, known := (*x.s.p.slots.Load())[served]
	_ = x.h.DispatchFailed()
	x.release()
	if !known {
		return
	}
	info, ok := x.s.p.sched.Worker(slot)
	if !ok {
		return
	}
	// Booked whatever its load: the request already runs there.
	x.sreq.AllowListed, x.sreq.Allow = true, workers.SetOf(slot)
	x.sreq.Pinned, x.sreq.PinWorker, x.sreq.PinRank = true, info.ID, info.DPRank
	x.sreq.Scores, x.sreq.Running = nil, true
	x.h, x.held = x.s.p.guards.Acquire(), true
	done, cancel := context.WithCancel(context.Background())
	cancel()
	dec, err := x.h.Select(done, &x.sreq)
	if err != nil {
		x.release()
		return
	}
	x.dec = dec
}

// destinationMetadata is the dynamic metadata naming dest:
// {namespace: {x-gateway-destination-endpoint: dest}}.
func destinationMetadata(namespace, dest string) *structpb.Struct {
	inner := &structpb.Struct{Fields: map[string]*structpb.Value{HeaderDestination: structpb.NewStringValue(dest)}}
	return &structpb.Struct{Fields: map[string]*structpb.Value{namespace: structpb.NewStructValue(inner)}}
}

// retryAfterSeconds renders d in whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) string {
	return strconv.Itoa(max(1, int((d+time.Second-1)/time.Second)))
}
