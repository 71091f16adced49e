package fastpath_test

import (
	"net/http"
	"sync"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/dispatch"
	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/node"
)

// TestSharedEndpointRanksArePinned: two data-parallel ranks behind one
// API server (vLLM's and SGLang's internal load balancing) each get the
// requests routed to them, because the router names the rank in
// X-Data-Parallel-Rank; a worker alone at its endpoint is sent none.
func TestSharedEndpointRanksArePinned(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	answer := func(ctx *fasthttp.RequestCtx) {
		mu.Lock()
		seen = append(seen, string(ctx.Request.Header.Peek(dispatch.HeaderDataParallelRank)))
		mu.Unlock()
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"c","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`)
	}
	shared, alone := startE2EEngine(t, answer), startE2EEngine(t, answer)
	r := startE2ERouter(t, e2eConfig(
		node.StaticWorker{ID: 1, DPRank: 0, Endpoint: shared.addr(), Model: e2eModel},
		node.StaticWorker{ID: 1, DPRank: 1, Endpoint: shared.addr(), Model: e2eModel},
		node.StaticWorker{ID: 2, Endpoint: alone.addr(), Model: e2eModel},
	))
	body := completionBody(e2eTokens(21, 32), false, 2)
	for _, pin := range []struct{ worker, rank, want string }{{"1", "1", "1"}, {"1", "0", "0"}, {"2", "0", ""}} {
		mu.Lock()
		seen = seen[:0]
		mu.Unlock()
		resp := r.post(t, fastpath.PathCompletions, body, map[string]string{fastpath.HeaderWorker: pin.worker, fastpath.HeaderDPRank: pin.rank})
		if resp.status != http.StatusOK {
			t.Fatalf("worker %s rank %s: status %d: %s", pin.worker, pin.rank, resp.status, resp.body)
		}
		mu.Lock()
		got := append([]string(nil), seen...)
		mu.Unlock()
		if len(got) != 1 || got[0] != pin.want {
			t.Errorf("worker %s rank %s: the engine saw rank headers %q, want %q", pin.worker, pin.rank, got, pin.want)
		}
	}
	waitReleased(t, r.node)
}
