package fastpath_test

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"testing"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
	"github.com/kvfast/kvfast/radix"
)

// startZMQMocks starts one mock engine per config, each publishing on ZMQ
// with a replay socket, and a router following them as static workers 1,
// 2, …; it returns once the router has applied every batch each engine
// published.
func startZMQMocks(t *testing.T, cfgs ...mocker.Config) ([]*mocker.Engine, *e2eRouter) {
	t.Helper()
	var engines []*mocker.Engine
	var static []node.StaticWorker
	for i, cfg := range cfgs {
		cfg.Listen, cfg.Model, cfg.Speedup = "127.0.0.1:0", e2eModel, math.Inf(1)
		cfg.ZMQ.Listen, cfg.ZMQ.Replay, cfg.ZMQ.Topic = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", "kv-events"
		e := startMock(t, cfg)
		engines = append(engines, e)
		static = append(static, node.StaticWorker{ID: uint64(i + 1), Endpoint: e.Addr(), Model: e2eModel,
			Events: e.ZMQEndpoint(), Replay: e.ZMQReplayEndpoint(), Topic: "kv-events"})
	}
	r := startE2ERouter(t, e2eConfig(static...))
	// A SUB socket misses what is published before its subscription
	// arrives, and the router catches up from the replay socket on the
	// first live batch it sees: keep each engine publishing (a one-block
	// prompt) until the router has seen all it published.
	bs := radix.DefaultBlockSize
	for i, e := range engines {
		n := 0
		waitFor(t, "the router to follow engine "+strconv.Itoa(i+1), func() bool {
			if caughtUp(t, r, e, uint64(i+1)) {
				return true
			}
			n++
			postMock(t, e, completionBody(e2eTokens(uint32(90000+100*i+n), bs+1), false, 1))
			return false
		})
	}
	return engines, r
}

// caughtUp reports whether the router has applied every KV-event batch
// engine e, worker id, has published. A mock engine publishes a step's
// events before it replies, so once caught up the router knows all the
// engine's cache changes up to its last reply.
func caughtUp(t *testing.T, r *e2eRouter, e *mocker.Engine, id uint64) bool {
	t.Helper()
	wv := workerView(t, r.node, id, 0)
	n := e.ZMQPublished()
	return wv.ZMQ != nil && wv.ZMQ.Batches > 0 && n > 0 && wv.ZMQ.LastSeq == n-1
}

// postMock sends body to engine e's completions endpoint and returns the
// prompt tokens its usage says were served from its cache.
func postMock(t *testing.T, e *mocker.Engine, body []byte) (cachedTokens int) {
	t.Helper()
	resp, err := http.Post(e.URL()+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: status %d, %v", e.URL(), resp.StatusCode, err)
	}
	return out.Usage.Details.Cached
}

// routeDecisionOf asks the router where body would go.
func routeDecisionOf(t *testing.T, r *e2eRouter, body []byte) routeDecision {
	t.Helper()
	resp := r.post(t, fastpath.PathRouteCompletions, body, nil)
	if resp.status != http.StatusOK {
		t.Fatalf("route-only: status %d: %s", resp.status, resp.body)
	}
	var d routeDecision
	decodeJSON(t, resp.body, &d)
	return d
}

// TestMockZMQHostTier: engine 1 caches a prompt, and other traffic pushes
// it out of its GPU into its CPU tier (Config.HostBlocks), announced as
// vLLM's OffloadingConnector or SGLang's HiCache does. The router credits
// engine 1 with the prompt's host blocks and routes the repeat there, and
// the engine serves it from its host pool: usage's cached tokens count
// every block.
func TestMockZMQHostTier(t *testing.T) {
	for _, format := range []mocker.ZMQFormat{mocker.ZMQVLLM, mocker.ZMQSGLang} {
		t.Run(format.String(), func(t *testing.T) {
			cfg := mocker.Config{KVBlocks: 12, HostBlocks: 64, ZMQ: mocker.ZMQConfig{Format: format}}
			engines, r := startZMQMocks(t, cfg, cfg)
			a := engines[0]
			const blocks = 5
			bs := radix.DefaultBlockSize
			prompt := completionBody(e2eTokens(77, blocks*bs+3), false, 1)
			if got := postMock(t, a, prompt); got != 0 {
				t.Fatalf("a new prompt was served %d cached tokens", got)
			}
			// Prompts of 11 blocks, on a GPU of 12, evict it into the host
			// pool. A fixed few, then a wait that posts nothing: more
			// prompts while the router lags (a loaded machine) would push
			// it out of the host pool too.
			for n := range 3 {
				postMock(t, a, completionBody(e2eTokens(uint32(5000+n), 10*bs+1), false, 1))
			}
			waitFor(t, "the router to hold the prompt on worker 1's host tier alone", func() bool {
				if caughtUp(t, r, a, 1) {
					for _, w := range routeDecisionOf(t, r, prompt).Workers {
						if w.WorkerID == 1 && w.OverlapBlocks == blocks && w.HostBlocks == blocks {
							return true
						}
					}
				}
				return false
			})
			d := routeDecisionOf(t, r, prompt)
			if d.WorkerID != 1 || d.OverlapBlocks != blocks {
				t.Fatalf("routed to worker %d with %d blocks, want worker 1 with %d", d.WorkerID, d.OverlapBlocks, blocks)
			}
			for _, w := range d.Workers {
				if w.WorkerID == 2 && (w.OverlapBlocks != 0 || w.HostBlocks != 0) {
					t.Fatalf("worker 2, which never saw the prompt, is credited %d blocks (%d on the host)", w.OverlapBlocks, w.HostBlocks)
				}
			}
			loaded := a.Stats().BlocksLoaded
			resp := r.post(t, fastpath.PathCompletions, prompt, nil)
			if resp.status != http.StatusOK {
				t.Fatalf("status %d: %s", resp.status, resp.body)
			}
			if got := resp.header.Get(fastpath.HeaderWorker); got != "1" {
				t.Fatalf("the repeat went to worker %s, want 1", got)
			}
			var out struct {
				Usage struct {
					Details struct {
						Cached int `json:"cached_tokens"`
					} `json:"prompt_tokens_details"`
				} `json:"usage"`
			}
			decodeJSON(t, resp.body, &out)
			if out.Usage.Details.Cached != blocks*bs {
				t.Fatalf("engine 1 served %d cached tokens, want %d", out.Usage.Details.Cached, blocks*bs)
			}
			waitFor(t, "engine 1 to count the blocks it loaded", func() bool { return a.Stats().BlocksLoaded >= loaded+blocks })
			wv := workerView(t, r.node, 1, 0).ZMQ
			if wv.SkippedMedium != 0 || wv.UnresolvedParent != 0 || wv.BadEvents != 0 || wv.Garbage != 0 {
				t.Fatalf("the feed skipped offloaded blocks: %+v", wv)
			}
		})
	}
}

// TestMockZMQHybridNeverOverClaims: a hybrid mock engine (a
// sliding-window KV-cache group that frees blocks as the window passes
// them) serves prompts that share prefixes and decode for various
// lengths, so that group 0 keeps prefixes group 1 has freed the window
// of. Whenever the router has seen all the engine's events, the overlap it
// claims never exceeds what the engine then serves from its cache.
func TestMockZMQHybridNeverOverClaims(t *testing.T) {
	bs := radix.DefaultBlockSize
	engines, r := startZMQMocks(t, mocker.Config{KVBlocks: 256, SlidingWindow: 3 * bs})
	e := engines[0]
	rng := rand.New(rand.NewPCG(3, 11))
	bases := make([][]uint32, 4)
	for i := range bases {
		bases[i] = e2eTokens(uint32(300+i), 8*bs)
	}
	claimed, served := 0, 0
	for i := range 60 {
		base := bases[rng.IntN(len(bases))]
		// A shared prefix, then a tail that never ends on a block
		// boundary: the engine always computes a prompt's last token, so
		// a prompt of whole blocks could reuse one block less than the
		// router counts.
		p := append(append([]uint32{}, base[:bs*rng.IntN(len(bases[0])/bs+1)]...), e2eTokens(uint32(7000+i), bs*rng.IntN(3)+1+rng.IntN(bs-1))...)
		body := completionBody(p, false, 1+rng.IntN(3*bs))
		waitFor(t, "the router to apply the engine's events", func() bool { return caughtUp(t, r, e, 1) })
		d := routeDecisionOf(t, r, body)
		cached := postMock(t, e, body)
		if int(d.OverlapBlocks)*bs > cached+bs-1 {
			t.Fatalf("request %d: the router claimed %d blocks, the engine served %d cached tokens", i, d.OverlapBlocks, cached)
		}
		if d.OverlapBlocks > 0 {
			claimed++
		}
		if cached > 0 {
			served++
		}
	}
	// The test proves something only if group 1 freed prefixes that group
	// 0 still holds, so that a router blind to the rule would over-claim.
	waitFor(t, "the engine's counters", func() bool { return e.Stats().Finished >= 60 })
	st := e.Stats()
	if st.WindowBlocksFreed == 0 || st.WindowMissedBlocks == 0 || claimed == 0 || served == 0 {
		t.Fatalf("workload too tame: %d claims, %d hits, engine %+v", claimed, served, st)
	}
	if wv := workerView(t, r.node, 1, 0).ZMQ; wv.SkippedGroup != 0 || wv.BadEvents != 0 || wv.Garbage != 0 {
		t.Fatalf("the feed skipped the window group: %+v", wv)
	}
}
