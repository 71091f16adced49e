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
	tokens := make([]string, 256)
	for i := range tokens {
		tokens[i] = strconv.Itoa(1000 + i)
	}
	body := fmt.Sprintf(`{"model":%q,"prompt":[%s],"max_tokens":1}`, mocker.DefaultModel, strings.Join(tokens, ","))
	first := ""
	for i := range 6 {
		resp, err := http.Post(r.URL+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
		w, overlap := resp.Header.Get("X-Kvfast-Worker"), resp.Header.Get(fastpath.HeaderOverlapBlocks)
		if i == 0 {
			first = w
			continue
		}
		if w != first || overlap == "" || overlap == "0" {
			t.Fatalf("repeat %d went to worker %s with %q blocks credited; the first went to %s", i, w, overlap, first)
		}
	}
}
