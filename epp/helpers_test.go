package epp_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvfast/kvfast/epp"
	"github.com/kvfast/kvfast/radix"
)

// wait is the generous deadline every condition in these tests gets.
const wait = 20 * time.Second

const testModel = "test-model"

// eppRig is a picker served over a real gRPC connection on loopback.
type eppRig struct {
	picker *epp.Picker
	server *epp.Server
	client extprocv3.ExternalProcessorClient
	addr   string
}

func startEPP(t testing.TB, cfg epp.Config, eps ...epp.Endpoint) *eppRig {
	t.Helper()
	if cfg.Model == "" {
		cfg.Model = testModel
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	p, err := epp.NewPicker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if eps != nil {
		p.Sync(eps)
	}
	s := epp.NewServer(p)
	ctx, cancel := context.WithCancel(context.Background())
	g := epp.NewGRPC(ctx, s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = g.Serve(ln)
	}()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		g.Stop()
		cancel()
		<-served
	})
	return &eppRig{picker: p, server: s, client: extprocv3.NewExternalProcessorClient(conn), addr: ln.Addr().String()}
}

// endpoints returns n static endpoints on unroutable test addresses.
func endpoints(n int) []epp.Endpoint {
	var eps []epp.Endpoint
	for i := range n {
		eps = append(eps, epp.Endpoint{Address: "10.0.0." + strconv.Itoa(i+1) + ":8000", Name: "pod-" + strconv.Itoa(i)})
	}
	return eps
}

// stream is one ext_proc stream, driven as Envoy drives it.
type stream struct {
	t      testing.TB
	s      extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	mode   *extprocv3.ProtocolConfiguration
	sent   bool
}

func (r *eppRig) open(t testing.TB, mode *extprocv3.ProtocolConfiguration) *stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	s, err := r.client.Process(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	st := &stream{t: t, s: s, cancel: cancel, mode: mode}
	if _, bench := t.(*testing.B); !bench {
		// A benchmark's streams cancel themselves: cleanups would pile
		// up over its iterations.
		t.Cleanup(cancel)
	}
	return st
}

func duplexMode() *extprocv3.ProtocolConfiguration {
	return &extprocv3.ProtocolConfiguration{RequestBodyMode: extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED,
		ResponseBodyMode: extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED}
}

func bufferedMode() *extprocv3.ProtocolConfiguration {
	return &extprocv3.ProtocolConfiguration{RequestBodyMode: extprocfilter.ProcessingMode_BUFFERED,
		ResponseBodyMode: extprocfilter.ProcessingMode_BUFFERED}
}

func (st *stream) send(m *extprocv3.ProcessingRequest) {
	st.t.Helper()
	if !st.sent {
		m.ProtocolConfig = st.mode
		st.sent = true
	}
	if err := st.s.Send(m); err != nil {
		st.t.Fatalf("send: %v", err)
	}
}

func headerMap(kv ...string) *corev3.HeaderMap {
	hm := &corev3.HeaderMap{}
	for i := 0; i < len(kv); i += 2 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return hm
}

// requestHeaders sends a POST's headers; md, if not nil, is the filter
// metadata (a subset hint).
func (st *stream) requestHeaders(path string, eos bool, md *corev3.Metadata) {
	st.t.Helper()
	method := "POST"
	if eos {
		method = "GET"
	}
	st.send(&extprocv3.ProcessingRequest{MetadataContext: md, Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: eos, Headers: headerMap(":method", method, ":path", path,
			":authority", "gateway", "content-type", "application/json")}}})
}

func (st *stream) requestBody(b []byte, eos bool) {
	st.t.Helper()
	st.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}})
}

func (st *stream) responseHeaders(status, contentType string, md *corev3.Metadata) {
	st.t.Helper()
	st.send(&extprocv3.ProcessingRequest{MetadataContext: md, Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(":status", status, "content-type", contentType)}}})
}

func (st *stream) responseBody(b []byte, eos bool) {
	st.t.Helper()
	st.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}})
}

func (st *stream) recv() *extprocv3.ProcessingResponse {
	st.t.Helper()
	r, err := st.s.Recv()
	if err != nil {
		st.t.Fatalf("recv: %v", err)
	}
	return r
}

// trickle sends chunk as a request body part every 5 ms, as a client
// whose body dribbles in (nil: empty parts), until the returned stop is
// called, which waits for the sender to end.
func (st *stream) trickle(chunk []byte) (stop func()) {
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if st.s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: chunk}}}) != nil {
				return
			}
		}
	}()
	return func() {
		close(done)
		<-ended
	}
}

// closeAndWaitEOF half-closes the stream, as Envoy does when it is done,
// and waits for the picker to end it.
func (st *stream) closeAndWaitEOF() {
	st.t.Helper()
	if err := st.s.CloseSend(); err != nil {
		st.t.Fatal(err)
	}
	if _, err := st.s.Recv(); err != io.EOF {
		st.t.Fatalf("after close: %v, want EOF", err)
	}
}

// destinationOf returns the destination a routed response names in its
// header mutation and in its dynamic metadata; the test fails unless both
// are there.
func destinationOf(t testing.TB, r *extprocv3.ProcessingResponse, common *extprocv3.CommonResponse) string {
	t.Helper()
	if common == nil {
		t.Fatalf("no common response in %v", r)
	}
	if !common.GetClearRouteCache() {
		t.Errorf("the routed response does not clear the route cache")
	}
	var header string
	for _, h := range common.GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == epp.HeaderDestination {
			header = string(h.GetHeader().GetRawValue())
			if h.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
				t.Errorf("the destination header does not overwrite a client's: %v", h.GetAppendAction())
			}
		}
	}
	md := r.GetDynamicMetadata().GetFields()[epp.DefaultDestinationNamespace].GetStructValue().GetFields()[epp.HeaderDestination].GetStringValue()
	if header == "" || md != header {
		t.Fatalf("destination header %q and metadata %q: want both, equal", header, md)
	}
	return header
}

func subsetHint(addrs ...string) *corev3.Metadata {
	var vals []*structpb.Value
	for _, a := range addrs {
		vals = append(vals, structpb.NewStringValue(a))
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{epp.DefaultSubsetNamespace: {
		Fields: map[string]*structpb.Value{epp.KeySubset: structpb.NewListValue(&structpb.ListValue{Values: vals})}}}}
}

func servedBy(addr string) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{epp.DefaultDestinationNamespace: {
		Fields: map[string]*structpb.Value{epp.KeyServed: structpb.NewStringValue(addr)}}}}
}

// tokens returns n token ids starting at from.
func tokens(from uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = from + uint32(i)
	}
	return out
}

func completionBody(t testing.TB, prompt []uint32, stream bool) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 4, "stream": stream})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// cache tells the picker's index that the endpoint at addr holds the
// prompt's first blocks.
func cache(t testing.TB, r *eppRig, addr string, prompt []uint32, blocks int) {
	t.Helper()
	slot, ok := r.picker.SlotOf(addr)
	if !ok {
		t.Fatalf("no slot for %s", addr)
	}
	h := radix.AppendBlockHashes(nil, radix.NamespaceSeed(testModel, "", ""), prompt, r.picker.Sched().BlockSize())
	r.picker.Index().Stored(slot, h[:blocks])
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// settled waits until no stream is open and every booking was released.
func settled(t testing.TB, r *eppRig) {
	t.Helper()
	waitFor(t, "every stream to end and release its booking", func() bool {
		st := r.picker.Sched().Stats()
		return r.server.OpenStreams() == 0 && st.Booked == st.Released
	})
}

func sseChunk(text string, finish string) string {
	f := "null"
	if finish != "" {
		f = `"` + finish + `"`
	}
	return `data: {"object":"text_completion","choices":[{"index":0,"text":"` + text + `","finish_reason":` + f + "}]}\n\n"
}

func splitAt(s string, n int) (string, string) {
	n = min(n, len(s))
	return s[:n], s[n:]
}

// grpcHealth asks the picker's gRPC health service about service.
func grpcHealth(t testing.TB, addr, service string) string {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetStatus().String()
}
