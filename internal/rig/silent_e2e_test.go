package rig_test

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/internal/rig"
	"github.com/kvfast/kvfast/internal/rig/rigtest"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
	"github.com/kvfast/kvfast/workers"
)

// TestSilentStaticWorkersRouteOnHistory: engines that publish no KV
// events (static, no zmq=) route exact prompts on the router's own
// history, as they do text prompts: a repeated token prompt stays on the
// worker that has it, and the router credits that worker its prefix.
// Before, the exact lookup asked only the event-fed index, which never
// hears of such engines, so every repeat was routed on load alone.
func TestSilentStaticWorkersRouteOnHistory(t *testing.T) {
	cfg := rigtest.Config()
	for i := range 2 {
		eng, err := mocker.Start(mocker.Config{WorkerID: uint64(i + 1), Speedup: math.Inf(1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = eng.Close() })
		cfg.Static = append(cfg.Static, node.StaticWorker{ID: uint64(i + 1), Endpoint: eng.Addr(), Model: mocker.DefaultModel})
	}
	r := rigtest.Start(t, rig.Config{Node: cfg, NoSegment: true})
	if err := r.WaitWorkers(t.Context(), 2); err != nil {
		t.Fatal(err)
	}
	body := tokenPrompt(256, 0, 0)
	first := ""
	for i := range 6 {
		header, _ := postCompletion(t, r.URL, body)
		w, overlap := header.Get("X-Kvfast-Worker"), header.Get(fastpath.HeaderOverlapBlocks)
		if i == 0 {
			first = w
			continue
		}
		if w != first || overlap == "" || overlap == "0" {
			t.Fatalf("repeat %d went to worker %s with %q blocks credited; the first went to %s", i, w, overlap, first)
		}
	}
}

// TestSilentPrefillWorkersRouteOnHistory: in disaggregated serving, a
// prefill worker that publishes no KV events is credited what the router
// sent it, as an aggregated one is: a repeated prompt is prefilled again
// where its prefix is. Before, the prefill stage recorded no history, so
// every repeat was prefilled wherever load put it.
func TestSilentPrefillWorkersRouteOnHistory(t *testing.T) {
	cfg := rigtest.Config()
	cfg.HTTP.Disagg = fastpath.DisaggConfig{Protocol: fastpath.DisaggVLLM, MinRemoteTokens: 64}
	for i, role := range []workers.Role{workers.RolePrefill, workers.RolePrefill, workers.RoleDecode} {
		eng, err := mocker.Start(mocker.Config{WorkerID: uint64(i + 1), Role: role, Speedup: math.Inf(1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = eng.Close() })
		cfg.Static = append(cfg.Static, node.StaticWorker{ID: uint64(i + 1), Endpoint: eng.Addr(), Model: mocker.DefaultModel, Role: role})
	}
	r := rigtest.Start(t, rig.Config{Node: cfg, NoSegment: true})
	if err := r.WaitWorkers(t.Context(), 3); err != nil {
		t.Fatal(err)
	}
	// One shared prefix, each prompt with a tail of its own: the decode
	// worker's copy of the prefix leaves enough to prefill remotely.
	first := ""
	for i := range 6 {
		body := tokenPrompt(256, 128, 5000+i*1000)
		header, b := postCompletion(t, r.URL, body)
		w := header.Get(fastpath.HeaderPrefillWorker)
		if w == "" {
			t.Fatalf("request %d was not prefilled remotely: %s", i, b)
		}
		if i == 0 {
			first = w
			continue
		}
		if w != first {
			t.Fatalf("repeat %d was prefilled on worker %s; the first on %s", i, w, first)
		}
	}
}

// tokenPrompt is a completions body of a prefix of n distinct token ids,
// the same in every prompt, and then tail ids counting up from tailFrom.
func tokenPrompt(n, tail, tailFrom int) string {
	tokens := make([]string, 0, n+tail)
	for i := range n {
		tokens = append(tokens, strconv.Itoa(1000+i))
	}
	for i := range tail {
		tokens = append(tokens, strconv.Itoa(tailFrom+i))
	}
	return fmt.Sprintf(`{"model":%q,"prompt":[%s],"max_tokens":1}`, mocker.DefaultModel, strings.Join(tokens, ","))
}

// postCompletion posts a completions body to the router at url and
// returns the answer's headers and body, failing the test unless it is 200.
func postCompletion(t *testing.T, url, body string) (http.Header, []byte) {
	t.Helper()
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	return resp.Header, b
}
