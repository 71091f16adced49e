package epp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvfast/kvfast/epp"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
)

// gateway is a small stand-in for Envoy with the inference extension: an
// HTTP proxy that asks the picker over ext_proc (full duplex, as GIE's
// gateways configure it) where each request goes, forwards it there, and
// passes the response back through the picker's response phases.
type gateway struct {
	t      testing.TB
	picker extprocv3.ExternalProcessorClient
	client *http.Client
	url    string

	mu     sync.Mutex
	picked map[string]int // requests per destination
}

func startGateway(t testing.TB, picker extprocv3.ExternalProcessorClient) *gateway {
	t.Helper()
	g := &gateway{t: t, picker: picker, client: &http.Client{}, picked: map[string]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: g}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
		g.client.CloseIdleConnections()
	})
	g.url = "http://" + ln.Addr().String()
	return g
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := g.serve(w, r); err != nil {
		g.t.Errorf("gateway: %v", err)
		http.Error(w, err.Error(), http.StatusBadGateway)
	}
}

// serve is one request's trip through the ext_proc phases.
func (g *gateway) serve(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	s, err := g.picker.Process(ctx)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	hs := []string{":method", r.Method, ":path", r.URL.RequestURI(), ":authority", r.Host}
	for k, v := range r.Header {
		hs = append(hs, strings.ToLower(k), v[0])
	}
	first := &extprocv3.ProcessingRequest{ProtocolConfig: duplexMode(), Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(hs...), EndOfStream: len(body) == 0}}}
	if err := s.Send(first); err != nil {
		return err
	}
	// The body streams in pieces, as it would arrive from the client.
	for off := 0; off < len(body); off += 1024 {
		end := min(off+1024, len(body))
		if err := s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body[off:end], EndOfStream: end == len(body)}}}); err != nil {
			return err
		}
	}
	var dest string
	var upstream []byte
	upHeaders := http.Header{}
	for done := false; !done; {
		resp, err := s.Recv()
		if err != nil {
			return err
		}
		switch m := resp.Response.(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			w.WriteHeader(int(m.ImmediateResponse.GetStatus().GetCode()))
			_, _ = w.Write(m.ImmediateResponse.GetBody())
			return nil
		case *extprocv3.ProcessingResponse_RequestHeaders:
			dest = applyMutation(upHeaders, m.RequestHeaders.GetResponse().GetHeaderMutation())
			md := resp.GetDynamicMetadata().GetFields()[epp.DefaultDestinationNamespace].GetStructValue().GetFields()[epp.HeaderDestination].GetStringValue()
			if dest == "" || md != dest {
				return fmt.Errorf("destination header %q, metadata %q", dest, md)
			}
			done = len(body) == 0
		case *extprocv3.ProcessingResponse_RequestBody:
			sr := m.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			upstream = append(upstream, sr.GetBody()...)
			done = sr.GetEndOfStream()
		default:
			return fmt.Errorf("unexpected answer %T in the request phase", resp.Response)
		}
	}
	target, _, _ := strings.Cut(dest, ",")
	g.mu.Lock()
	g.picked[target]++
	g.mu.Unlock()

	req, err := http.NewRequestWithContext(ctx, r.Method, "http://"+target+r.URL.RequestURI(), bytes.NewReader(upstream))
	if err != nil {
		return err
	}
	req.Header = upHeaders
	req.Header.Set("Content-Type", r.Header.Get("Content-Type"))
	resp, err := g.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(":status", fmt.Sprint(resp.StatusCode),
			"content-type", resp.Header.Get("Content-Type"))}}}); err != nil {
		return err
	}
	if _, err := s.Recv(); err != nil {
		return err
	}
	w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	w.WriteHeader(resp.StatusCode)
	buf := make([]byte, 4096)
	for {
		n, rerr := resp.Body.Read(buf)
		eos := rerr != nil
		if n > 0 || eos {
			if err := s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
				ResponseBody: &extprocv3.HttpBody{Body: buf[:n], EndOfStream: eos}}}); err != nil {
				return err
			}
			pr, err := s.Recv()
			if err != nil {
				return err
			}
			_, _ = w.Write(pr.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody())
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
		}
		if eos {
			if !errors.Is(rerr, io.EOF) {
				return rerr
			}
			break
		}
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	if _, err := s.Recv(); err != io.EOF {
		return fmt.Errorf("the picker did not end the stream: %v", err)
	}
	return nil
}

// applyMutation applies the picker's header mutation to the upstream
// request and returns the destination it names.
func applyMutation(h http.Header, m *extprocv3.HeaderMutation) string {
	for _, o := range m.GetSetHeaders() {
		h.Set(o.GetHeader().GetKey(), string(o.GetHeader().GetRawValue()))
	}
	for _, k := range m.GetRemoveHeaders() {
		h.Del(k)
	}
	return h.Get(epp.HeaderDestination)
}

// TestE2EFleet: two simulated nodes of four mock engines each (one
// loopback address per node) publish their KV events over ZMQ to the
// picker; a stand-in gateway sends a workload of shared-prefix prompts
// through it. Under the kv policy the engines serve far more of the
// prompts from their prefix caches than under round-robin, and every
// booking is released.
func TestE2EFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 16 mock engines")
	}
	hit := map[string]float64{}
	for _, policy := range []string{"kv", "round-robin"} {
		t.Run(policy, func(t *testing.T) {
			hit[policy] = runFleet(t, policy)
		})
	}
	t.Logf("prompt tokens served from cache: kv %.3f, round-robin %.3f", hit["kv"], hit["round-robin"])
	if hit["kv"] < hit["round-robin"]+0.25 {
		t.Fatalf("kv-aware picks: hit rate %.3f, round-robin %.3f: want kv ahead by 0.25 or more", hit["kv"], hit["round-robin"])
	}
}

const (
	fleetNodes        = 2
	enginesPerNode    = 4
	fleetGroups       = 10 // shared prefixes; not a multiple of the engines, so round-robin does not keep a group in place
	fleetRounds       = 6
	fleetPrefixBlocks = 12
	fleetSuffixBlocks = 2
)

func runFleet(t *testing.T, policy string) float64 {
	bs := radix.DefaultBlockSize
	var engines []*mocker.Engine
	var eps []epp.Endpoint
	for node := range fleetNodes {
		for i := range enginesPerNode {
			e, err := mocker.Start(mocker.Config{Listen: fmt.Sprintf("127.0.0.%d:0", node+1), Model: testModel, KVBlocks: 4096,
				Speedup: 50, ZMQ: mocker.ZMQConfig{Listen: fmt.Sprintf("tcp://127.0.0.%d:0", node+1),
					Replay: fmt.Sprintf("tcp://127.0.0.%d:0", node+1), Topic: "kv-events"}})
			if err != nil {
				t.Fatalf("cannot start a mock engine: %v", err)
			}
			t.Cleanup(func() { _ = e.Close() })
			engines = append(engines, e)
			eps = append(eps, epp.Endpoint{Address: e.Addr(), Events: e.ZMQEndpoint(), Replay: e.ZMQReplayEndpoint(),
				Name: fmt.Sprintf("node%d-engine%d", node, i)})
		}
	}
	cfg := epp.DefaultConfig()
	cfg.Policy = policy
	cfg.Topic = "kv-events"
	r := startEPP(t, cfg, eps...)
	gw := startGateway(t, r.client)

	// Each engine's feed is followed before the workload starts: the
	// engine serves prompts of its own until the picker's index holds one
	// of the last few (a SUB socket misses what was published before it
	// joined, and a batch lost then may be given up for good if its
	// replay times out: only the live stream counts).
	for i, e := range engines {
		slot, _ := r.picker.SlotOf(eps[i].Address)
		var posted [][]uint32
		deadline := time.Now().Add(wait)
		for n := 0; ; n++ {
			held := false
			for _, p := range posted[max(0, len(posted)-3):] {
				held = held || holds(r, slot, p, 1)
			}
			if held {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("engine %d: the picker never saw its KV events (%d prompts posted)", i, n)
			}
			p := tokens(uint32(50000000+1000000*i+100*n), bs)
			post(t, e.URL()+"/v1/completions", completionBody(t, p, false))
			posted = append(posted, p)
		}
	}

	prefix := func(g int) []uint32 { return tokens(uint32(100000*(g+1)), fleetPrefixBlocks*bs) }
	var promptTokens, cachedTokens int
	for round := range fleetRounds {
		for g := range fleetGroups {
			p := append(prefix(g), tokens(uint32(7000000+1000*(round*fleetGroups+g)), fleetSuffixBlocks*bs)...)
			stream := (round+g)%2 == 0
			u := sendThroughGateway(t, gw, p, stream)
			promptTokens += u.PromptTokens
			cachedTokens += u.PromptTokensDetails.CachedTokens
		}
		// Before the next round, the picker has applied every batch the
		// engines published in this one (a mock engine publishes a step's
		// events before it replies).
		for i, e := range engines {
			waitFor(t, "the picker to apply every engine's events", func() bool {
				st := r.picker.FeedStats()[eps[i].Address]
				n := e.ZMQPublished()
				return n > 0 && st.Batches > 0 && st.LastSeq == n-1
			})
		}
	}
	settled(t, r)
	if st := r.picker.Sched().Stats(); st.Booked != fleetRounds*fleetGroups || st.Released != st.Booked {
		t.Fatalf("booked %d, released %d: want %d each", st.Booked, st.Released, fleetRounds*fleetGroups)
	}
	gw.mu.Lock()
	t.Logf("%s: requests per engine %v", policy, gw.picked)
	gw.mu.Unlock()
	return float64(cachedTokens) / float64(promptTokens)
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// sendThroughGateway sends one completion through the gateway and returns
// the engine's usage: for a stream, from its final usage chunk.
func sendThroughGateway(t *testing.T, gw *gateway, prompt []uint32, stream bool) usage {
	t.Helper()
	req := map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 4, "stream": stream}
	if stream {
		req["stream_options"] = map[string]any{"include_usage": true}
	}
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(gw.url+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	var u struct {
		Usage *usage `json:"usage"`
	}
	if !stream {
		if err := json.Unmarshal(out, &u); err != nil || u.Usage == nil {
			t.Fatalf("no usage in %s: %v", out, err)
		}
		return *u.Usage
	}
	if !strings.HasSuffix(string(out), "data: [DONE]\n\n") {
		t.Fatalf("stream did not end with [DONE]: %q", out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		u.Usage = nil
		if json.Unmarshal([]byte(data), &u) == nil && u.Usage != nil {
			return *u.Usage
		}
	}
	t.Fatalf("no usage chunk in %q", out)
	return usage{}
}

func post(t *testing.T, url string, body []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: status %d", url, resp.StatusCode)
	}
}

// holds reports whether the picker's index has slot caching the first
// blocks of prompt.
func holds(r *eppRig, slot workers.Slot, prompt []uint32, blocks int) bool {
	var ov workers.Overlaps
	r.picker.Index().FindMatches(radix.AppendBlockHashes(nil, radix.NamespaceSeed(testModel, "", ""), prompt, radix.DefaultBlockSize), &ov)
	return int(ov[slot]) >= blocks
}
