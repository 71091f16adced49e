package fastpath_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
	"github.com/kvfast/kvfast/radix"
)

// TestStaticWorkerMockZMQ: two mock engines publish their KV events on
// ZMQ, one in vLLM's wire format and one in SGLang's, each losing every
// other batch from its live stream. The router follows both through their
// replay sockets (each gap replayed, none resynced), and a prompt one
// engine cached routes to it.
func TestStaticWorkerMockZMQ(t *testing.T) {
	var engines []*mocker.Engine
	var static []node.StaticWorker
	for i, format := range []mocker.ZMQFormat{mocker.ZMQVLLM, mocker.ZMQSGLang} {
		e := startMock(t, mocker.Config{Listen: "127.0.0.1:0", Model: e2eModel, KVBlocks: 1024,
			ZMQ: mocker.ZMQConfig{Listen: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", Format: format,
				Topic: "kv-events", DropEvery: 2}})
		engines = append(engines, e)
		static = append(static, node.StaticWorker{ID: uint64(i + 1), Endpoint: e.Addr(), Model: e2eModel,
			Events: e.ZMQEndpoint(), Replay: e.ZMQReplayEndpoint(), Topic: "kv-events"})
	}
	r := startE2ERouter(t, e2eConfig(static...))

	const blocks = 5
	bs := radix.DefaultBlockSize
	for i, e := range engines {
		id := uint64(i + 1)
		prompt := e2eTokens(uint32(100+i), blocks*bs+3)
		// The engine caches the prompt. A SUB socket misses what is
		// published before its subscription arrives, and the router
		// catches up from the replay socket on its first live batch, so
		// keep the engine publishing (other prompts) until the router
		// routes the prompt to it.
		deadline := time.Now().Add(e2eWait)
		for n := 0; ; n++ {
			p := prompt
			if n > 0 {
				p = e2eTokens(uint32(1000*(i+1)+n), 2*bs)
			}
			resp, err := http.Post(e.URL()+"/v1/completions", "application/json", strings.NewReader(string(completionBody(p, false, 1))))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("engine %d: status %d", id, resp.StatusCode)
			}
			got, overlap := routeOnly(t, r, prompt)
			wv := workerView(t, r.node, id, 0)
			if got == id && overlap == blocks && wv.ZMQ != nil && wv.ZMQ.Gaps > 0 && wv.ZMQ.Replayed > 0 {
				if wv.ZMQ.Garbage != 0 || wv.ZMQ.BadEvents != 0 || wv.ZMQ.Resyncs != 0 {
					t.Fatalf("worker %d: a clean stream counted as faulty: %+v", id, wv.ZMQ)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("prompt cached by worker %d routed to %d with %d blocks; feed %+v", id, got, overlap, wv.ZMQ)
			}
		}
	}
}

func routeOnly(t *testing.T, r *e2eRouter, prompt []uint32) (worker uint64, overlap int) {
	t.Helper()
	resp := r.post(t, fastpath.PathRouteCompletions, completionBody(prompt, false, 1), nil)
	if resp.status != http.StatusOK {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	var dec routeDecision
	if err := json.Unmarshal(resp.body, &dec); err != nil {
		t.Fatal(err)
	}
	return dec.WorkerID, int(dec.OverlapBlocks)
}

// TestMockZMQNamespaces: mock engines serving adapter "sql" publish on ZMQ
// in vLLM's format. Engine 1 caches a prompt for the adapter, engine 2 the
// same prompt for tenant-a's cache salt, and each namespace's requests
// find only their own blocks through the router.
func TestMockZMQNamespaces(t *testing.T) {
	var engines []*mocker.Engine
	var static []node.StaticWorker
	for i := range 2 {
		e := startMock(t, mocker.Config{Listen: "127.0.0.1:0", Model: e2eModel, KVBlocks: 1024, LoRAAdapters: []string{"sql"},
			ZMQ: mocker.ZMQConfig{Listen: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", Topic: "kv-events"}})
		engines = append(engines, e)
		static = append(static, node.StaticWorker{ID: uint64(i + 1), Endpoint: e.Addr(), Model: e2eModel,
			Events: e.ZMQEndpoint(), Replay: e.ZMQReplayEndpoint(), Topic: "kv-events"})
	}
	r := startE2ERouter(t, e2eConfig(static...))

	const blocks = 4
	bs := radix.DefaultBlockSize
	prompt := e2eTokens(57, blocks*bs+1)
	ids, err := json.Marshal(prompt)
	if err != nil {
		t.Fatal(err)
	}
	cached := [][]byte{
		[]byte(`{"model":"sql","max_tokens":1,"prompt":` + string(ids) + `}`),
		[]byte(`{"model":"` + e2eModel + `","cache_salt":"tenant-a","max_tokens":1,"prompt":` + string(ids) + `}`),
	}
	post := func(e *mocker.Engine, body []byte) {
		resp, err := http.Post(e.URL()+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d", e.URL(), resp.StatusCode)
		}
	}
	// overlap is what the router says worker id holds of body's prompt;
	// 0 also while it does not know the adapter yet.
	overlap := func(id uint64, body []byte) uint32 {
		resp := r.post(t, fastpath.PathRouteCompletions, body, nil)
		var d routeDecision
		if resp.status != http.StatusOK || json.Unmarshal(resp.body, &d) != nil {
			return 0
		}
		for _, w := range d.Workers {
			if w.WorkerID == id {
				return w.OverlapBlocks
			}
		}
		return 0
	}
	// Each engine caches its namespaced prompt, then serves other prompts
	// (a block each, in the base namespace) until the router holds the
	// namespaced blocks: its subscriber catches up from the replay socket
	// on the first live batch it sees.
	deadline := time.Now().Add(e2eWait)
	for i, e := range engines {
		id := uint64(i + 1)
		post(e, cached[i])
		for n := 0; overlap(id, cached[i]) != blocks; n++ {
			if time.Now().After(deadline) {
				t.Fatalf("worker %d: the router never held the namespaced blocks: %+v", id, workerView(t, r.node, id, 0).ZMQ)
			}
			post(e, completionBody(e2eTokens(uint32(7000*(i+1)+n), bs+1), false, 1))
		}
	}
	wantNamespaces(t, r, prompt, blocks, deadline)
}
