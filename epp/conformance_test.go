package epp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvfast/kvfast/epp"
	"github.com/kvfast/kvfast/internal/syncbuf"
	"github.com/kvfast/kvfast/sched"
)

// These tests drive the picker exactly as Envoy's ext_proc filter does,
// over a real gRPC connection, through every phase of one HTTP request,
// in the body modes the Gateway API Inference Extension's gateways use
// (FULL_DUPLEX_STREAMED) and the one older gateways use (BUFFERED).

// TestFullDuplexStreaming: the request headers' answer waits for the
// body; it then names the endpoint that caches the prompt, in the header
// mutation and the envoy.lb metadata alike; the body goes upstream
// unchanged in the picker's streamed answers; the response's events pass
// through chunk by chunk (one split across chunks), and the booking,
// live while the response streams, is released when it ends.
func TestFullDuplexStreaming(t *testing.T) {
	eps := endpoints(4)
	r := startEPP(t, epp.DefaultConfig(), eps...)
	prompt := tokens(1000, 8*16+5)
	cache(t, r, eps[2].Address, prompt, 6)
	cache(t, r, eps[1].Address, prompt, 2)

	st := r.open(t, duplexMode())
	body := completionBody(t, prompt, true)
	st.requestHeaders("/v1/completions", false, nil)
	half := len(body) / 2
	st.requestBody(body[:half], false)
	st.requestBody(body[half:], true)

	hr := st.recv()
	rh, ok := hr.Response.(*extprocv3.ProcessingResponse_RequestHeaders)
	if !ok {
		t.Fatalf("first answer %T, want the request headers' (held until the body came)", hr.Response)
	}
	if got := destinationOf(t, hr, rh.RequestHeaders.GetResponse()); got != eps[2].Address {
		t.Fatalf("routed to %s, want %s, which caches 6 of the prompt's 8 blocks", got, eps[2].Address)
	}
	var upstream []byte
	for {
		br := st.recv()
		b, ok := br.Response.(*extprocv3.ProcessingResponse_RequestBody)
		if !ok {
			t.Fatalf("answer %T, want the request body's", br.Response)
		}
		sr := b.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse()
		upstream = append(upstream, sr.GetBody()...)
		if sr.GetEndOfStream() {
			break
		}
	}
	if !bytes.Equal(upstream, body) {
		t.Fatalf("the body sent upstream changed:\n got %s\nwant %s", upstream, body)
	}
	slot, _ := r.picker.SlotOf(eps[2].Address)
	if got := r.picker.Sched().Load(slot).Requests; got != 1 {
		t.Fatalf("requests booked on the chosen endpoint: %d, want 1", got)
	}

	st.responseHeaders("200", "text/event-stream", nil)
	if _, ok := st.recv().Response.(*extprocv3.ProcessingResponse_ResponseHeaders); !ok {
		t.Fatal("response headers not answered")
	}
	events := sseChunk("a", "") + sseChunk("b", "") + sseChunk("c", "length") + "data: [DONE]\n\n"
	first, rest := splitAt(events, len(sseChunk("a", ""))+7) // the second event spans two chunks
	var downstream []byte
	for i, chunk := range []string{first, rest, ""} {
		st.responseBody([]byte(chunk), i == 2)
		br, ok := st.recv().Response.(*extprocv3.ProcessingResponse_ResponseBody)
		if !ok {
			t.Fatal("response body chunk not answered")
		}
		sr := br.ResponseBody.GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr.GetEndOfStream() != (i == 2) {
			t.Fatalf("chunk %d: end of stream %v", i, sr.GetEndOfStream())
		}
		downstream = append(downstream, sr.GetBody()...)
		if i == 0 {
			if got := r.picker.Sched().Load(slot).Requests; got != 1 {
				t.Fatalf("mid-stream: %d requests booked, want 1", got)
			}
		}
	}
	if string(downstream) != events {
		t.Fatalf("the response changed on its way:\n got %q\nwant %q", downstream, events)
	}
	st.closeAndWaitEOF()
	settled(t, r)
	if st := r.picker.Sched().Stats(); st.Booked != 1 || st.Released != 1 {
		t.Fatalf("booked %d, released %d: want one each", st.Booked, st.Released)
	}
	if got := r.picker.Sched().Load(slot); got.Requests != 0 || got.PrefillTokens != 0 {
		t.Fatalf("load left after the response ended: %+v", got)
	}
}

// TestBufferedNonStreaming: in BUFFERED mode the headers are answered at
// once (the body only comes after), and the destination rides on the
// body's answer; a plain JSON response passes through and its end
// releases the booking.
func TestBufferedNonStreaming(t *testing.T) {
	eps := endpoints(3)
	r := startEPP(t, epp.DefaultConfig(), eps...)
	prompt := tokens(5000, 4*16)
	cache(t, r, eps[0].Address, prompt, 4)

	st := r.open(t, bufferedMode())
	st.requestHeaders("/v1/completions", false, nil)
	hr := st.recv()
	rh, ok := hr.Response.(*extprocv3.ProcessingResponse_RequestHeaders)
	if !ok {
		t.Fatalf("answer %T, want the request headers'", hr.Response)
	}
	if rh.RequestHeaders.GetResponse().GetHeaderMutation() != nil || hr.GetDynamicMetadata() != nil {
		t.Fatal("buffered mode: the headers' answer routed before the body came")
	}
	st.requestBody(completionBody(t, prompt, false), true)
	br := st.recv()
	b, ok := br.Response.(*extprocv3.ProcessingResponse_RequestBody)
	if !ok {
		t.Fatalf("answer %T, want the request body's", br.Response)
	}
	if got := destinationOf(t, br, b.RequestBody.GetResponse()); got != eps[0].Address {
		t.Fatalf("routed to %s, want %s", got, eps[0].Address)
	}
	if b.RequestBody.GetResponse().GetBodyMutation() != nil {
		t.Fatal("buffered mode: the body was mutated")
	}
	st.responseHeaders("200", "application/json", nil)
	st.recv()
	st.responseBody([]byte(`{"choices":[{"text":"x","finish_reason":"length"}]}`), true)
	rb, ok := st.recv().Response.(*extprocv3.ProcessingResponse_ResponseBody)
	if !ok || rb.ResponseBody.GetResponse().GetBodyMutation() != nil {
		t.Fatal("buffered response body: want a plain continue")
	}
	st.closeAndWaitEOF()
	settled(t, r)
	if st := r.picker.Sched().Stats(); st.Booked != 1 {
		t.Fatalf("booked %d, want 1", st.Booked)
	}
}

// TestSilentEndpointsRouteOnHistory: endpoints that publish no KV events
// route exact (token) prompts on the picker's own history: a prompt sent
// again goes where the first one went.
func TestSilentEndpointsRouteOnHistory(t *testing.T) {
	eps := endpoints(4)
	r := startEPP(t, epp.DefaultConfig(), eps...)
	prompt := tokens(7000, 6*16)
	route := func() string {
		st := r.open(t, bufferedMode())
		st.requestHeaders("/v1/completions", false, nil)
		st.recv()
		st.requestBody(completionBody(t, prompt, false), true)
		br := st.recv()
		b, ok := br.Response.(*extprocv3.ProcessingResponse_RequestBody)
		if !ok {
			t.Fatalf("answer %T, want the request body's", br.Response)
		}
		dest := destinationOf(t, br, b.RequestBody.GetResponse())
		st.responseHeaders("200", "application/json", nil)
		st.recv()
		st.responseBody([]byte(`{"choices":[{"text":"x","finish_reason":"length"}]}`), true)
		st.recv()
		st.closeAndWaitEOF()
		settled(t, r)
		return dest
	}
	first := route()
	for i := range 3 {
		if got := route(); got != first {
			t.Fatalf("repeat %d routed to %s, the first to %s", i+1, got, first)
		}
	}
}

// TestChatAndHeadersOnly: a chat request routes (approximately: text is
// hashed in chunks) and a request without a body (GET) is routed on its
// headers at once.
func TestChatAndHeadersOnly(t *testing.T) {
	r := startEPP(t, epp.DefaultConfig(), endpoints(2)...)
	st := r.open(t, duplexMode())
	st.requestHeaders("/v1/chat/completions", false, nil)
	st.requestBody([]byte(`{"model":"`+testModel+`","messages":[{"role":"user","content":"hello there"}],"stream":true}`), true)
	hr := st.recv()
	destinationOf(t, hr, hr.GetRequestHeaders().GetResponse())
	st.recv() // the body
	st.closeAndWaitEOF()

	get := r.open(t, duplexMode())
	get.requestHeaders("/v1/models", true, nil)
	hr = get.recv()
	destinationOf(t, hr, hr.GetRequestHeaders().GetResponse())
	get.responseHeaders("200", "application/json", nil)
	get.recv()
	get.responseBody([]byte(`{"data":[]}`), true)
	get.recv()
	get.closeAndWaitEOF()
	settled(t, r)
}

// immediate returns the ImmediateResponse that ends the stream.
func immediate(t *testing.T, st *stream) *extprocv3.ImmediateResponse {
	t.Helper()
	r := st.recv()
	ir, ok := r.Response.(*extprocv3.ProcessingResponse_ImmediateResponse)
	if !ok {
		t.Fatalf("answer %T, want an ImmediateResponse", r.Response)
	}
	if _, err := st.s.Recv(); err == nil {
		t.Fatal("the stream went on after the ImmediateResponse")
	}
	return ir.ImmediateResponse
}

// TestBodyBudget: request bodies buffered at once are bounded over every
// stream; a body that does not fit is refused with 503 and Retry-After,
// and the budget is free again once the streams holding it end.
func TestBodyBudget(t *testing.T) {
	cfg := epp.DefaultConfig()
	const chunk = 64 << 10
	cfg.MaxBodyBytes, cfg.BodyBudgetBytes = 2*chunk, 2*chunk
	r := startEPP(t, cfg, endpoints(2)...)
	var held []*stream
	for range 2 {
		st := r.open(t, duplexMode())
		st.requestHeaders("/v1/completions", false, nil)
		st.requestBody(make([]byte, chunk), false) // more to come: buffered, unanswered
		held = append(held, st)
	}
	waitFor(t, "the two bodies charged", func() bool { return r.server.BodyBytes() == 2*chunk })
	st := r.open(t, duplexMode())
	st.requestHeaders("/v1/completions", false, nil)
	st.requestBody([]byte("{"), false)
	ir := immediate(t, st)
	if ir.GetStatus().GetCode() != typev3.StatusCode_ServiceUnavailable || ir.GetDetails() != "kvfast_epp_body_budget_exceeded" {
		t.Fatalf("over the budget: status %v, details %q; want 503 body_budget_exceeded", ir.GetStatus().GetCode(), ir.GetDetails())
	}
	for _, st := range held {
		st.cancel()
	}
	settled(t, r)
	waitFor(t, "the budget released", func() bool { return r.server.BodyBytes() == 0 })

	// A body routed and answered is no longer held while its response
	// streams: as many such requests as the budget allows twice over
	// stay open, and the next one is still served.
	body := completionBody(t, tokens(1, 40), false)
	cfg.MaxBodyBytes, cfg.BodyBudgetBytes = len(body), int64(len(body))
	r = startEPP(t, cfg, endpoints(2)...)
	for range 3 {
		st := r.open(t, duplexMode())
		st.requestHeaders("/v1/completions", false, nil)
		st.requestBody(body, true)
		if hr := st.recv(); hr.GetRequestHeaders() == nil {
			t.Fatalf("a request while earlier ones stream: %v, want its routed headers", hr)
		}
		if got := st.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody(); len(got) != len(body) {
			t.Fatalf("the body answered with %d bytes, want %d in one piece", len(got), len(body))
		}
		waitFor(t, "the answered body released", func() bool { return r.server.BodyBytes() == 0 })
		t.Cleanup(st.cancel)
	}
}

// TestSubsetQueueTimeoutSaysSo: a request whose subset hint names only a
// busy endpoint waits the queue timeout and is refused with 503
// queue_timeout saying that the subset's endpoints stayed busy, not every
// endpoint (the others were idle), while a request without the hint is
// routed to an idle one meanwhile.
func TestSubsetQueueTimeoutSaysSo(t *testing.T) {
	eps := endpoints(3)
	cfg := epp.DefaultConfig()
	cfg.Sched.Busy.PrefillTokens = 10 // one request's prompt makes its endpoint busy
	cfg.QueueTimeout = 200 * time.Millisecond
	r := startEPP(t, cfg, eps...)
	body := completionBody(t, tokens(1, 40), false)

	held := r.open(t, duplexMode())
	held.requestHeaders("/v1/completions", false, subsetHint(eps[1].Address))
	held.requestBody(body, true)
	hr := held.recv()
	if got := destinationOf(t, hr, hr.GetRequestHeaders().GetResponse()); got != eps[1].Address {
		t.Fatalf("first request routed to %s, want %s", got, eps[1].Address)
	}
	t.Cleanup(held.cancel) // its prompt stays booked: no response comes

	st := r.open(t, duplexMode())
	st.requestHeaders("/v1/completions", false, nil)
	st.requestBody(body, true)
	free := st.recv()
	if got := destinationOf(t, free, free.GetRequestHeaders().GetResponse()); got == eps[1].Address || got == "" {
		t.Fatalf("a request without a hint routed to %q, want an idle endpoint", got)
	}
	st.cancel()

	st = r.open(t, duplexMode())
	st.requestHeaders("/v1/completions", false, subsetHint(eps[1].Address))
	st.requestBody(body, true)
	ir := immediate(t, st)
	if ir.GetStatus().GetCode() != typev3.StatusCode_ServiceUnavailable || !strings.Contains(string(ir.GetBody()), `"queue_timeout"`) ||
		!strings.Contains(string(ir.GetBody()), "subset hint") {
		t.Fatalf("a request for the busy subset: %v %s", ir.GetStatus().GetCode(), ir.GetBody())
	}
}

// TestNoHealthyEndpoint: with every endpoint unhealthy, and with a subset
// hint that names none the picker knows, the request is answered with
// 503, as the protocol says; a subset hint naming one known endpoint
// routes there.
func TestNoHealthyEndpoint(t *testing.T) {
	eps := endpoints(3)
	cfg := epp.DefaultConfig()
	var log syncbuf.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
	r := startEPP(t, cfg, eps...)
	body := completionBody(t, tokens(1, 40), false)

	st := r.open(t, duplexMode())
	st.requestHeaders("/v1/completions", false, subsetHint("192.0.2.1:8000"))
	st.requestBody(body, true)
	ir := immediate(t, st)
	if ir.GetStatus().GetCode() != typev3.StatusCode_ServiceUnavailable {
		t.Fatalf("subset of unknown endpoints: status %v, want 503", ir.GetStatus().GetCode())
	}
	// The answer and the log tell a subset hint naming no endpoint from an
	// empty pool.
	if !strings.Contains(string(ir.GetBody()), "subset hint") || !strings.Contains(log.String(), `msg="request refused" status=503`) ||
		!strings.Contains(log.String(), "subset hint") {
		t.Fatalf("the refusal does not say the subset hint named no endpoint: %s\nlog:\n%s", ir.GetBody(), log.String())
	}

	st = r.open(t, duplexMode())
	st.requestHeaders("/v1/completions", false, subsetHint("192.0.2.1:8000", eps[1].Address))
	st.requestBody(body, true)
	hr := st.recv()
	if got := destinationOf(t, hr, hr.GetRequestHeaders().GetResponse()); got != eps[1].Address {
		t.Fatalf("subset routed to %s, want %s", got, eps[1].Address)
	}
	st.cancel()

	// The other shapes gateways send: one comma-separated string (what a
	// header-to-metadata rule extracts), and a bare IP for all its ports.
	for _, hint := range []*structpb.Value{
		structpb.NewStringValue("192.0.2.1:8000, " + eps[1].Address),
		structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("192.0.2.1:8000," + eps[1].Address)}}),
		structpb.NewStringValue(strings.TrimSuffix(eps[1].Address, ":8000")),
	} {
		st = r.open(t, duplexMode())
		st.requestHeaders("/v1/completions", false, &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			epp.DefaultSubsetNamespace: {Fields: map[string]*structpb.Value{epp.KeySubset: hint}}}})
		st.requestBody(body, true)
		hr = st.recv()
		if got := destinationOf(t, hr, hr.GetRequestHeaders().GetResponse()); got != eps[1].Address {
			t.Fatalf("subset hint %v routed to %s, want %s", hint, got, eps[1].Address)
		}
		st.cancel()
	}

	for _, e := range eps {
		slot, _ := r.picker.SlotOf(e.Address)
		r.picker.Sched().SetHealthy(slot, false)
	}
	st = r.open(t, duplexMode())
	st.requestHeaders("/v1/completions", false, nil)
	st.requestBody(body, true)
	ir = immediate(t, st)
	if ir.GetStatus().GetCode() != typev3.StatusCode_ServiceUnavailable {
		t.Fatalf("no healthy endpoint: status %v, want 503", ir.GetStatus().GetCode())
	}
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	if err := json.Unmarshal(ir.GetBody(), &e); err != nil || e.Error.Code != "no_endpoint" {
		t.Fatalf("body %s (%v): want an OpenAI error with code no_endpoint", ir.GetBody(), err)
	}
	settled(t, r)
}

// TestOverloadedAndBadRequests: a request that finds every endpoint busy
// with no queue is refused with 429 and Retry-After; a body that is not a
// completions request, 400; one larger than the picker reads, 413.
func TestOverloadedAndBadRequests(t *testing.T) {
	cfg := epp.DefaultConfig()
	cfg.Sched = sched.Config{Busy: sched.BusyThresholds{PrefillTokens: 1}, QueueCapacity: -1}
	cfg.MaxBodyBytes = 4096
	r := startEPP(t, cfg, endpoints(1)...)
	body := completionBody(t, tokens(1, 40), false)

	busy := r.open(t, duplexMode())
	busy.requestHeaders("/v1/completions", false, nil)
	busy.requestBody(body, true)
	busy.recv() // routed; its prompt awaits its first token, so the endpoint is busy
	busy.recv()

	st := r.open(t, duplexMode())
	st.requestHeaders("/v1/completions", false, nil)
	st.requestBody(body, true)
	ir := immediate(t, st)
	if ir.GetStatus().GetCode() != typev3.StatusCode_TooManyRequests {
		t.Fatalf("overloaded: status %v, want 429", ir.GetStatus().GetCode())
	}
	retry := ""
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if strings.EqualFold(h.GetHeader().GetKey(), "retry-after") {
			retry = string(h.GetHeader().GetRawValue())
		}
	}
	if retry == "" {
		t.Fatal("429 without Retry-After")
	}
	busy.closeAndWaitEOF() // ended before any response: aborted, released

	for _, c := range []struct {
		body []byte
		want typev3.StatusCode
	}{
		{[]byte(`{"model":"x","prompt":`), typev3.StatusCode_BadRequest},
		{bytes.Repeat([]byte("x"), 5000), typev3.StatusCode_PayloadTooLarge},
	} {
		st := r.open(t, duplexMode())
		st.requestHeaders("/v1/completions", false, nil)
		st.requestBody(c.body, true)
		if got := immediate(t, st).GetStatus().GetCode(); got != c.want {
			t.Fatalf("status %v, want %v", got, c.want)
		}
	}
	settled(t, r)
	if st := r.picker.Sched().Stats(); st.Booked != 1 || st.Released != 1 {
		t.Fatalf("booked %d, released %d: want one each", st.Booked, st.Released)
	}
}

// TestClientDisconnects: a stream reset mid-body (nothing booked yet),
// one reset after the decision but before the response, and one reset
// mid-response each end with no booking left, released once.
func TestClientDisconnects(t *testing.T) {
	eps := endpoints(2)
	r := startEPP(t, epp.DefaultConfig(), eps...)
	body := completionBody(t, tokens(7, 64), true)

	midBody := r.open(t, duplexMode())
	midBody.requestHeaders("/v1/completions", false, nil)
	midBody.requestBody(body[:10], false)
	midBody.cancel()
	settled(t, r)
	if st := r.picker.Sched().Stats(); st.Booked != 0 {
		t.Fatalf("a request cut mid-body booked %d", st.Booked)
	}

	for _, midResponse := range []bool{false, true} {
		st := r.open(t, duplexMode())
		st.requestHeaders("/v1/completions", false, nil)
		st.requestBody(body, true)
		hr := st.recv()
		dest := destinationOf(t, hr, hr.GetRequestHeaders().GetResponse())
		st.recv()
		if midResponse {
			st.responseHeaders("200", "text/event-stream", nil)
			st.recv()
			st.responseBody([]byte(sseChunk("a", "")), false)
			st.recv()
		}
		slot, _ := r.picker.SlotOf(dest)
		if got := r.picker.Sched().Load(slot).Requests; got != 1 {
			t.Fatalf("before the reset: %d requests booked, want 1", got)
		}
		st.cancel()
		settled(t, r)
		if got := r.picker.Sched().Load(slot); got.Requests != 0 || got.ActiveBlocks != 0 {
			t.Fatalf("after the reset (mid-response %v): load left %+v", midResponse, got)
		}
	}
	if st := r.picker.Sched().Stats(); st.Booked != 2 || st.Released != 2 {
		t.Fatalf("booked %d, released %d: want two each", st.Booked, st.Released)
	}
}

// TestFallbacksAndServed: with fallbacks the destination lists further
// endpoints after the chosen one, header and metadata alike; when the
// gateway reports that a fallback served the request, the booking moves
// there.
func TestFallbacksAndServed(t *testing.T) {
	cfg := epp.DefaultConfig()
	cfg.Fallbacks = 2
	eps := endpoints(4)
	r := startEPP(t, cfg, eps...)
	prompt := tokens(300, 5*16)
	cache(t, r, eps[3].Address, prompt, 5)
	cache(t, r, eps[0].Address, prompt, 3)

	st := r.open(t, duplexMode())
	st.requestHeaders("/v1/completions", false, nil)
	st.requestBody(completionBody(t, prompt, true), true)
	hr := st.recv()
	dest := strings.Split(destinationOf(t, hr, hr.GetRequestHeaders().GetResponse()), ",")
	if len(dest) != 3 || dest[0] != eps[3].Address || dest[1] != eps[0].Address {
		t.Fatalf("destination %v: want %s first, then %s (the next cheapest), 3 in all", dest, eps[3].Address, eps[0].Address)
	}
	st.recv()
	st.responseHeaders("200", "text/event-stream", servedBy(dest[1]))
	st.recv()
	primary, _ := r.picker.SlotOf(dest[0])
	served, _ := r.picker.SlotOf(dest[1])
	if p, s := r.picker.Sched().Load(primary).Requests, r.picker.Sched().Load(served).Requests; p != 0 || s != 1 {
		t.Fatalf("after the fallback served: %d requests on the primary, %d on the fallback; want 0 and 1", p, s)
	}
	st.responseBody([]byte(sseChunk("a", "stop")), true)
	st.recv()
	st.closeAndWaitEOF()
	settled(t, r)
}

// TestServedFallbackIsBookedWhenBusy: when the gateway reports that a
// fallback served the request, the booking moves there even if that
// endpoint is over its busy thresholds, since the request runs there
// anyway; it used to be refused and the request booked nowhere.
func TestServedFallbackIsBookedWhenBusy(t *testing.T) {
	cfg := epp.DefaultConfig()
	cfg.Fallbacks = 1
	cfg.Sched.Busy = sched.BusyThresholds{PrefillTokens: 100}
	eps := endpoints(2)
	r := startEPP(t, cfg, eps...)
	streams := make([]*stream, 2)
	dests := make([]string, 2)
	for i := range streams {
		streams[i] = r.open(t, duplexMode())
		streams[i].requestHeaders("/v1/completions", false, nil)
		streams[i].requestBody(completionBody(t, tokens(uint32(1000*(i+1)), 200), true), true)
		hr := streams[i].recv()
		dests[i] = strings.Split(destinationOf(t, hr, hr.GetRequestHeaders().GetResponse()), ",")[0]
		streams[i].recv()
	}
	if dests[0] == dests[1] {
		t.Fatalf("both requests went to %s; the test needs one on each endpoint", dests[0])
	}
	// The first request's gateway fell back to the second's endpoint,
	// which is busy with the second request's prefill.
	streams[0].responseHeaders("200", "text/event-stream", servedBy(dests[1]))
	streams[0].recv()
	served, _ := r.picker.SlotOf(dests[1])
	if got := r.picker.Sched().Load(served).Requests; got != 2 {
		t.Fatalf("%d requests booked on the endpoint that serves both, want 2", got)
	}
	for _, st := range streams {
		st.cancel()
	}
	settled(t, r)
}

// TestHealthBeforeSync: readiness and the ext_proc service turn SERVING once the
// picker knows its endpoints.
func TestHealthBeforeSync(t *testing.T) {
	r := startEPP(t, epp.DefaultConfig())
	if code := grpcHealth(t, r.addr, epp.HealthLiveness); code != "SERVING" {
		t.Fatalf("liveness %s before sync", code)
	}
	if code := grpcHealth(t, r.addr, epp.HealthReadiness); code != "NOT_SERVING" {
		t.Fatalf("readiness %s before sync", code)
	}
	if code := grpcHealth(t, r.addr, epp.HealthGIE); code != "NOT_SERVING" {
		t.Fatalf("%s %s before sync", epp.HealthGIE, code)
	}
	r.picker.Sync(endpoints(1))
	waitFor(t, "readiness", func() bool {
		return grpcHealth(t, r.addr, extprocv3.ExternalProcessor_ServiceDesc.ServiceName) == "SERVING" &&
			grpcHealth(t, r.addr, epp.HealthGIE) == "SERVING"
	})
}

// TestBodyShapesEnvoySends: the bodies Envoy sends outside the plain
// cases are answered as it waits for them: in BUFFERED mode one message
// with end_of_stream false (trailers follow, which it may never send);
// in BUFFERED_PARTIAL a body cut at the buffer limit, which routes by
// load instead of failing to parse; a model served under a path prefix;
// in full duplex a large body in chunks of at most 64 KiB, not ending the
// stream when trailers follow, and no body answer for trailers without a
// body.
func TestBodyShapesEnvoySends(t *testing.T) {
	eps := endpoints(3)
	r := startEPP(t, epp.DefaultConfig(), eps...)
	prompt := tokens(7000, 4*16)
	cache(t, r, eps[2].Address, prompt, 4)

	t.Run("buffered with trailers to follow", func(t *testing.T) {
		st := r.open(t, bufferedMode())
		st.requestHeaders("/v1/completions", false, nil)
		st.recv()
		st.requestBody(completionBody(t, prompt, false), false)
		br := st.recv()
		b, ok := br.Response.(*extprocv3.ProcessingResponse_RequestBody)
		if !ok || destinationOf(t, br, b.RequestBody.GetResponse()) != eps[2].Address {
			t.Fatalf("answer %v, want the body's routed to %s", br.Response, eps[2].Address)
		}
		st.cancel()
	})

	t.Run("partial body", func(t *testing.T) {
		st := r.open(t, &extprocv3.ProtocolConfiguration{RequestBodyMode: extprocfilter.ProcessingMode_BUFFERED_PARTIAL})
		st.requestHeaders("/v1/completions", false, nil)
		st.recv()
		body := completionBody(t, prompt, false)
		st.requestBody(body[:len(body)/2], false)
		br := st.recv()
		b, ok := br.Response.(*extprocv3.ProcessingResponse_RequestBody)
		if !ok || destinationOf(t, br, b.RequestBody.GetResponse()) == "" {
			t.Fatalf("answer %v, want the body's with a destination", br.Response)
		}
		st.cancel()
	})

	t.Run("path prefix", func(t *testing.T) {
		st := r.open(t, bufferedMode())
		st.requestHeaders("/llama/v1/completions", false, nil)
		st.recv()
		st.requestBody(completionBody(t, prompt, false), true)
		br := st.recv()
		if got := destinationOf(t, br, br.GetRequestBody().GetResponse()); got != eps[2].Address {
			t.Fatalf("a prefixed path routed to %s, want %s, which caches the prompt", got, eps[2].Address)
		}
		st.cancel()
	})

	t.Run("duplex, large body, trailers", func(t *testing.T) {
		st := r.open(t, duplexMode())
		st.requestHeaders("/v1/completions", false, nil)
		body := completionBody(t, tokens(1, 40000), false)
		st.requestBody(body, false)
		st.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
			RequestTrailers: &extprocv3.HttpTrailers{}}})
		if _, ok := st.recv().Response.(*extprocv3.ProcessingResponse_RequestHeaders); !ok {
			t.Fatal("the headers' answer does not come first")
		}
		var back []byte
		for {
			r := st.recv()
			if _, ok := r.Response.(*extprocv3.ProcessingResponse_RequestTrailers); ok {
				break
			}
			sb := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			if sb == nil || len(sb.GetBody()) > 64<<10 || sb.GetEndOfStream() {
				t.Fatalf("a body answer of %d bytes, end of stream %v: want at most 64 KiB, not ending the stream before the trailers",
					len(sb.GetBody()), sb.GetEndOfStream())
			}
			back = append(back, sb.GetBody()...)
		}
		if !bytes.Equal(back, body) {
			t.Fatalf("the body came back as %d bytes, want the %d sent", len(back), len(body))
		}
		st.cancel()
	})

	t.Run("buffered, trailers without a body", func(t *testing.T) {
		// The headers were answered without a destination and no body
		// comes: the trailers' answer is the one awaited, and it carries
		// the destination as dynamic metadata.
		st := r.open(t, bufferedMode())
		st.requestHeaders("/v1/completions", false, nil)
		st.recv()
		st.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
			RequestTrailers: &extprocv3.HttpTrailers{}}})
		tr := st.recv()
		md := tr.GetDynamicMetadata().GetFields()[epp.DefaultDestinationNamespace].GetStructValue().GetFields()[epp.HeaderDestination].GetStringValue()
		if tr.GetRequestTrailers() == nil || md == "" {
			t.Fatalf("answer %T with destination metadata %q, want the trailers' with one", tr.Response, md)
		}
		st.cancel()
	})

	t.Run("duplex, trailers without a body", func(t *testing.T) {
		st := r.open(t, duplexMode())
		st.requestHeaders("/v1/completions", false, nil)
		st.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
			RequestTrailers: &extprocv3.HttpTrailers{}}})
		if _, ok := st.recv().Response.(*extprocv3.ProcessingResponse_RequestHeaders); !ok {
			t.Fatal("the headers' answer does not come first")
		}
		if r := st.recv(); r.GetRequestTrailers() == nil {
			t.Fatalf("answer %T after the headers', want the trailers' (no body was sent)", r.Response)
		}
		st.cancel()
	})
}

// TestRepeatedHeadersEndTheStream: a stream is one request, so headers
// that come again break the protocol: the stream ends with
// FailedPrecondition and the request's booking is released (each set of
// headers used to be decided and booked, the earlier bookings never
// released).
func TestRepeatedHeadersEndTheStream(t *testing.T) {
	r := startEPP(t, epp.DefaultConfig(), endpoints(2)...)
	for _, mode := range []*extprocv3.ProtocolConfiguration{{}, duplexMode()} {
		st := r.open(t, mode)
		st.requestHeaders("/v1/completions", true, nil)
		st.recv()
		st.requestHeaders("/v1/completions", true, nil)
		if _, err := st.s.Recv(); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("mode %v: after headers twice: %v, want FailedPrecondition", mode, err)
		}
		settled(t, r)
	}
	if got := r.picker.Sched().Stats(); got.Booked != 2 || got.Released != 2 {
		t.Fatalf("booked %d, released %d: want two each", got.Booked, got.Released)
	}
}

// TestBodyBeforeHeadersEndsTheStream: a gateway sends a request's
// headers first. A body first was decided on, and the headers after it
// decided and booked again, the first booking never released.
func TestBodyBeforeHeadersEndsTheStream(t *testing.T) {
	r := startEPP(t, epp.DefaultConfig(), endpoints(2)...)
	for _, mode := range []*extprocv3.ProtocolConfiguration{duplexMode(), {RequestBodyMode: extprocfilter.ProcessingMode_STREAMED}} {
		st := r.open(t, mode)
		// The stream ends at the body: headers sent after it could find
		// it closed.
		st.requestBody(completionBody(t, tokens(1, 64), false), true)
		if _, err := st.s.Recv(); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("mode %v: a body before the headers: %v, want FailedPrecondition", mode, err)
		}
		settled(t, r)
	}
	if got := r.picker.Sched().Stats(); got.Booked != 0 {
		t.Fatalf("booked %d requests on streams that broke the protocol", got.Booked)
	}
}

// TestMessageWithoutPhaseEndsTheStream: a message that names no phase
// has no answer; one was left unanswered, the gateway waiting on it and
// the request's booking held until the gateway gave up.
func TestMessageWithoutPhaseEndsTheStream(t *testing.T) {
	r := startEPP(t, epp.DefaultConfig(), endpoints(2)...)
	for _, headersFirst := range []bool{false, true} {
		st := r.open(t, duplexMode())
		if headersFirst {
			st.requestHeaders("/v1/completions", false, nil)
			st.requestBody(completionBody(t, tokens(1, 64), false), true)
			if resp := st.recv(); resp.GetRequestHeaders() == nil {
				t.Fatalf("answer %v, want the headers' answer", resp)
			}
			for resp := st.recv(); resp.GetRequestBody() == nil; resp = st.recv() {
			}
		}
		st.send(&extprocv3.ProcessingRequest{})
		if _, err := st.s.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("headers first %v: a message without a phase: %v, want InvalidArgument", headersFirst, err)
		}
		settled(t, r)
	}
	if got := r.picker.Sched().Stats(); got.Booked != got.Released {
		t.Fatalf("booked %d, released %d", got.Booked, got.Released)
	}
}

// TestStalledBodyIsTimedOut: a body that stops arriving midway is
// answered 408 after BodyIdleTimeout, and its bytes go back to the budget
// (a stalled body held them, every other body's 503 with them, for as
// long as its stream lived).
func TestStalledBodyIsTimedOut(t *testing.T) {
	cfg := epp.DefaultConfig()
	cfg.BodyIdleTimeout = 50 * time.Millisecond
	r := startEPP(t, cfg, endpoints(2)...)
	st := r.open(t, duplexMode())
	st.requestHeaders("/v1/completions", false, nil)
	st.requestBody([]byte(`{"model":"`+testModel+`","prompt":`), false)
	// Empty chunks are no progress: they do not hold the body's share.
	stop := st.trickle(nil)
	resp := st.recv()
	stop()
	im := resp.GetImmediateResponse()
	if im == nil || im.GetStatus().GetCode() != 408 || !strings.Contains(string(im.GetBody()), "--body-idle-timeout") {
		t.Fatalf("answer %v, want 408 naming --body-idle-timeout", resp)
	}
	settled(t, r)
	if n := r.server.BodyBytes(); n != 0 {
		t.Fatalf("%d body bytes still held", n)
	}
}

// TestTricklingBodyIsTimedOut: a body that keeps arriving, a byte at a
// time well within BodyIdleTimeout, is answered 408 once BodyTimeout has
// passed since it began, and its bytes go back to the budget.
func TestTricklingBodyIsTimedOut(t *testing.T) {
	cfg := epp.DefaultConfig()
	cfg.BodyIdleTimeout = time.Hour
	cfg.BodyTimeout = 100 * time.Millisecond
	r := startEPP(t, cfg, endpoints(2)...)
	st := r.open(t, duplexMode())
	st.requestHeaders("/v1/completions", false, nil)
	st.requestBody([]byte(`{"model":"`+testModel+`","prompt":`), false)
	stop := st.trickle([]byte(" "))
	got := make(chan *extprocv3.ProcessingResponse, 1)
	go func() {
		resp, _ := st.s.Recv() // nil when the stream ends unanswered
		got <- resp
	}()
	var resp *extprocv3.ProcessingResponse
	select {
	case resp = <-got:
	case <-time.After(time.Minute):
		t.Fatal("a body trickling for a minute was still being read")
	}
	stop()
	im := resp.GetImmediateResponse()
	if im == nil || im.GetStatus().GetCode() != 408 || !strings.Contains(string(im.GetBody()), "--body-timeout") {
		t.Fatalf("answer %v, want 408 naming --body-timeout", resp)
	}
	settled(t, r)
	if n := r.server.BodyBytes(); n != 0 {
		t.Fatalf("%d body bytes still held", n)
	}
}

// TestObservabilityModeBooksNothing: in observability mode Envoy ignores
// the picker's answers and routes the request itself, so the picker
// answers nothing and books no load on an endpoint the request may never
// reach.
func TestObservabilityModeBooksNothing(t *testing.T) {
	r := startEPP(t, epp.DefaultConfig(), endpoints(2)...)
	st := r.open(t, duplexMode())
	for _, m := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(":method", "POST", ":path", "/v1/completions", "content-type", "application/json")}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
			Body: completionBody(t, tokens(1, 64), false), EndOfStream: true}}},
	} {
		m.ObservabilityMode = true
		st.send(m)
	}
	st.closeAndWaitEOF()
	settled(t, r)
	if st := r.picker.Sched().Stats(); st.Booked != 0 {
		t.Fatalf("observability mode booked %d requests, want none", st.Booked)
	}
}

// TestGatewayThatLeavesARequestWaiting: a routed request whose response
// headers never come (a hung endpoint, and no route timeout), or whose
// gateway stops taking the picker's answers, keeps its booking only for
// --response-timeout; the stream lives on until the gateway ends it, and
// its end releases nothing twice.
func TestGatewayThatLeavesARequestWaiting(t *testing.T) {
	cfg := epp.DefaultConfig()
	cfg.ResponseTimeout = 200 * time.Millisecond
	eps := endpoints(2)
	r := startEPP(t, cfg, eps...)
	booked := func() int {
		n := 0
		for _, ep := range eps {
			slot, _ := r.picker.SlotOf(ep.Address)
			n += int(r.picker.Sched().Load(slot).Requests)
		}
		return n
	}

	// No response headers: the booking goes after the timeout.
	st := r.open(t, duplexMode())
	st.requestHeaders("/v1/completions", false, nil)
	st.requestBody(completionBody(t, tokens(1, 64), true), true)
	st.recv()
	st.recv()
	// Booked (a count that only grows: the booking itself may already be
	// gone on a slow machine), then released.
	if got := r.picker.Sched().Stats().Booked; got != 1 {
		t.Fatalf("routed: %d bookings made, want 1", got)
	}
	waitFor(t, "the waiting request's booking to be released", func() bool { return booked() == 0 })
	// The response comes after all: relayed, and nothing more released.
	st.responseHeaders("200", "text/event-stream", nil)
	st.recv()
	st.responseBody([]byte(sseChunk("a", "stop")), true)
	st.recv()
	st.closeAndWaitEOF()
	settled(t, r)

	// A gateway that stops reading: the picker's answers to a large body
	// (sent back upstream in full duplex) fill the stream's flow-control
	// window, and its Send blocks. The stream has no deadline of its own,
	// which would end it, and release the booking, anyway.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ps, err := r.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st = &stream{t: t, s: ps, cancel: cancel, mode: duplexMode()}
	st.requestHeaders("/v1/completions", false, nil)
	body := completionBody(t, tokens(1, 400_000), true)
	for len(body) > 0 {
		n := min(len(body), 60_000)
		st.requestBody(body[:n], n == len(body))
		body = body[n:]
	}
	waitFor(t, "the request to be routed", func() bool { return r.picker.Sched().Stats().Booked == 2 })
	waitFor(t, "the unread request's booking to be released", func() bool { return booked() == 0 })
	st.cancel()
	settled(t, r)
	if s := r.picker.Sched().Stats(); s.Booked != 2 || s.Released != 2 {
		t.Fatalf("booked %d, released %d: want two each", s.Booked, s.Released)
	}
}
