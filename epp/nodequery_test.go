package epp_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvfast/kvfast/epp"
	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/internal/rig"
	"github.com/kvfast/kvfast/internal/rig/rigtest"
	"github.com/kvfast/kvfast/internal/syncbuf"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/radix"
)

// fakeNode answers the route-only endpoint as a node's kvfast router
// does, with the overlap and busyness the test sets.
type fakeNode struct {
	addr            string
	overlap, prompt atomic.Int64
	busy, broken    atomic.Bool
	wantsKey        atomic.Bool // answers 401, as a node with --api-key-file does to no key
	asked           atomic.Int64
	auth            atomic.Value // the last Authorization header
}

func startFakeNode(t *testing.T) *fakeNode {
	n := &fakeNode{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+fastpath.PathRouteCompletions, func(w http.ResponseWriter, r *http.Request) {
		n.asked.Add(1)
		n.auth.Store(r.Header.Get("Authorization"))
		if n.wantsKey.Load() {
			http.Error(w, "no key", http.StatusUnauthorized)
			return
		}
		if _, err := io.ReadAll(r.Body); err != nil || n.broken.Load() {
			http.Error(w, "broken", http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte(`{"worker_id":1,"overlap_blocks":` + strconv.FormatInt(n.overlap.Load(), 10) +
			`,"prompt_blocks":` + strconv.FormatInt(n.prompt.Load(), 10) + `,"busy":` + strconv.FormatBool(n.busy.Load()) + `,"workers":[]}`))
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	n.addr = ln.Addr().String()
	return n
}

// pick routes one completion through r and returns the destination.
func pick(t *testing.T, r *eppRig, body []byte) string {
	t.Helper()
	st := r.open(t, duplexMode())
	st.requestHeaders("/v1/completions", false, nil)
	st.requestBody(body, true)
	hr := st.recv()
	dest := destinationOf(t, hr, hr.GetRequestHeaders().GetResponse())
	st.recv()
	st.closeAndWaitEOF()
	return dest
}

// TestQueryNodes: with --query-nodes the picker asks every node what it
// caches and routes to the node caching the largest share of the prompt;
// a busy node is passed over while another can take the request; a node
// that fails to answer counts as caching nothing.
func TestQueryNodes(t *testing.T) {
	nodes := []*fakeNode{startFakeNode(t), startFakeNode(t), startFakeNode(t)}
	var eps []epp.Endpoint
	for _, n := range nodes {
		eps = append(eps, epp.Endpoint{Address: n.addr})
		n.prompt.Store(10)
	}
	cfg := epp.DefaultConfig()
	cfg.QueryNodes = true
	cfg.QueryTimeout = 10 * time.Second // a loaded machine must not turn a slow answer into a failure
	r := startEPP(t, cfg, eps...)
	body := completionBody(t, tokens(1, 10*16), false)

	nodes[0].overlap.Store(2)
	nodes[1].overlap.Store(8)
	nodes[2].overlap.Store(5)
	if got := pick(t, r, body); got != nodes[1].addr {
		t.Fatalf("routed to %s, want %s (caches 80%%)", got, nodes[1].addr)
	}
	for _, n := range nodes {
		if n.asked.Load() != 1 {
			t.Fatalf("node %s asked %d times, want once", n.addr, n.asked.Load())
		}
	}
	// A node that requires API keys gets the client's, which the gateway
	// forwards the request itself with.
	st := r.open(t, duplexMode())
	st.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(":method", "POST", ":path", "/v1/completions",
			"authorization", "Bearer client-key", "content-type", "application/json")}}})
	st.requestBody(body, true)
	st.recv()
	st.recv()
	st.closeAndWaitEOF()
	for _, n := range nodes {
		if got, _ := n.auth.Load().(string); got != "Bearer client-key" {
			t.Fatalf("node %s was asked with Authorization %q, want the client's", n.addr, got)
		}
	}
	nodes[1].busy.Store(true)
	if got := pick(t, r, body); got != nodes[2].addr {
		t.Fatalf("with the best node busy: routed to %s, want %s", got, nodes[2].addr)
	}
	nodes[2].broken.Store(true)
	if got := pick(t, r, body); got != nodes[0].addr {
		t.Fatalf("with the second broken: routed to %s, want %s", got, nodes[0].addr)
	}
	settled(t, r)
	if n := r.server.NodeQueryFailures(); n != 1 {
		t.Fatalf("%v node query failures counted, want 1", n)
	}
}

// TestNodeQueryRefusedIsSaid: nodes that refuse the picker's queries
// (they want API keys the clients do not send) leave it routing by load
// alone; that is counted and said, with what to do, once a minute.
func TestNodeQueryRefusedIsSaid(t *testing.T) {
	node := startFakeNode(t)
	node.wantsKey.Store(true)
	cfg := epp.DefaultConfig()
	cfg.QueryNodes = true
	cfg.QueryTimeout = 10 * time.Second
	var log syncbuf.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
	r := startEPP(t, cfg, epp.Endpoint{Address: node.addr})
	body := completionBody(t, tokens(1, 10*16), false)
	for range 3 {
		pick(t, r, body)
	}
	settled(t, r)
	if n := r.server.NodeQueryFailures(); n != 3 {
		t.Fatalf("%v node query failures counted, want 3", n)
	}
	if got := strings.Count(log.String(), "level=WARN msg=\"a node did not say what it caches"); got != 1 || !strings.Contains(log.String(), "wants an API key") {
		t.Fatalf("logged %d times, want once with the hint:\n%s", got, log.String())
	}
}

// TestE2ENodesBehindClusterPicker: two nodes, each a kvfast router with
// four mock engines; the cluster picker asks the nodes' routers what they
// cache, and a stand-in gateway forwards to the chosen node, whose router
// picks the engine. Prompts sharing a prefix stay on the node that has it,
// where round-robin across nodes scatters them.
func TestE2ENodesBehindClusterPicker(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 16 mock engines")
	}
	hit := map[string]float64{}
	for _, policy := range []string{"kv", "round-robin"} {
		t.Run(policy, func(t *testing.T) {
			var eps []epp.Endpoint
			var nodes []string
			for range 2 {
				n := rigtest.Start(t, rig.Config{Node: rigtest.Config(), Engines: 4,
					Engine: mocker.Config{Model: testModel, KVBlocks: 4096, Speedup: 50}})
				eps = append(eps, epp.Endpoint{Address: n.Addr})
				nodes = append(nodes, n.URL)
			}
			cfg := epp.DefaultConfig()
			cfg.QueryNodes, cfg.Policy = true, policy
			r := startEPP(t, cfg, eps...)
			gw := startGateway(t, r.client)
			const groups, rounds = 9, 6 // an odd count alternates round-robin's node for a group
			bs := radix.DefaultBlockSize
			var promptTokens, cached int
			for round := range rounds {
				for g := range groups {
					p := append(tokens(uint32(100000*(g+1)), 12*bs), tokens(uint32(9000000+1000*(round*groups+g)), 2*bs)...)
					u := sendThroughGateway(t, gw, p, round%2 == 0)
					promptTokens += u.PromptTokens
					cached += u.PromptTokensDetails.CachedTokens
				}
				// Before the next round, some node's router knows each
				// group's prefix is cached (its index follows the
				// engines' events, asynchronously).
				for g := range groups {
					body := completionBody(t, tokens(uint32(100000*(g+1)), 12*bs), false)
					waitFor(t, "a node to know the prefix cached", func() bool {
						for _, n := range nodes {
							if routeOverlap(t, n, body) >= 12 {
								return true
							}
						}
						return false
					})
				}
			}
			settled(t, r)
			hit[policy] = float64(cached) / float64(promptTokens)
		})
	}
	t.Logf("prompt tokens served from cache: cluster picker kv %.3f, round-robin %.3f", hit["kv"], hit["round-robin"])
	if hit["kv"] < hit["round-robin"]+0.1 {
		t.Fatalf("node picks by the nodes' answers: hit rate %.3f, round-robin %.3f: want kv ahead by 0.1 or more", hit["kv"], hit["round-robin"])
	}
}

// routeOverlap asks a node's router, through its route-only endpoint,
// how many of the prompt's blocks its choice caches.
func routeOverlap(t *testing.T, nodeURL string, body []byte) int {
	t.Helper()
	resp, err := http.Post(nodeURL+fastpath.PathRouteCompletions, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var d struct {
		OverlapBlocks int `json:"overlap_blocks"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		t.Fatal(err)
	}
	return d.OverlapBlocks
}
