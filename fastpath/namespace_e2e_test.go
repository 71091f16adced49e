package fastpath_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
)

// namespacedBatch is a vLLM v0.26 batch with one BlockStored of a whole
// prompt's blocks, as an adapter's (lora) or a salted (salt) request
// leaves them: the LoRA name in every block's extra keys, the salt after
// it in the first block's (vllm/v1/core/kv_cache_utils.py,
// generate_block_hash_extra_keys).
func namespacedBatch(t *testing.T, firstHash uint64, tokens []uint32, bs int, lora, salt string) []byte {
	t.Helper()
	n := len(tokens) / bs
	hashes := make([]uint64, n)
	extra := make([]any, n)
	for i := range hashes {
		hashes[i] = firstHash + uint64(i)
		var keys []any
		if lora != "" {
			keys = append(keys, lora)
		}
		if i == 0 && salt != "" {
			keys = append(keys, salt)
		}
		if keys != nil {
			extra[i] = keys
		}
	}
	var loraName any
	if lora != "" {
		loraName = lora
	}
	ev := map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": nil,
		"token_ids": tokens[:n*bs], "block_size": bs, "lora_id": nil, "medium": "GPU", "lora_name": loraName,
		"extra_keys": extra}
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.UseCompactInts(true)
	if err := e.Encode([]any{1.5, []any{ev}, 0}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestNamespacesRouteApart: worker 1 cached a prompt for LoRA adapter
// "sql" (which its engine lists in GET /v1/models), worker 2 the same
// prompt for tenant-a's cache salt. Each namespace's requests find only
// their own blocks: a request naming the adapter matches worker 1, a
// request salted tenant-a matches worker 2, and the base model, another
// tenant's salt, and the adapter with a salt match nothing.
func TestNamespacesRouteApart(t *testing.T) {
	bs := radix.DefaultBlockSize
	const blocks = 4
	prompt := e2eTokens(31, blocks*bs+2)
	var static []node.StaticWorker
	var pubs []zmq4.Socket
	for i, adapters := range [][]string{{"sql"}, nil} {
		eng := startMock(t, mocker.Config{Listen: "127.0.0.1:0", Model: e2eModel, LoRAAdapters: adapters})
		pub := zmq4.NewPub(context.Background())
		if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pub.Close() })
		pubs = append(pubs, pub)
		static = append(static, node.StaticWorker{ID: uint64(i + 1), Endpoint: eng.Addr(), Model: e2eModel,
			Events: "tcp://" + pub.Addr().String(), Topic: "kv-events"})
	}
	r := startE2ERouter(t, e2eConfig(static...))
	payloads := [][]byte{
		namespacedBatch(t, 100, prompt, bs, "sql", ""),
		namespacedBatch(t, 200, prompt, bs, "", "tenant-a"),
	}
	// A SUB socket misses what is published before its subscription
	// arrives: publish (an idempotent store) until both feeds have it.
	deadline := time.Now().Add(e2eWait)
	for seq := uint64(0); ; seq++ {
		var sb [8]byte
		binary.BigEndian.PutUint64(sb[:], seq)
		done := true
		for i, pub := range pubs {
			if err := pub.Send(zmq4.NewMsgFrom([]byte("kv-events"), sb[:], payloads[i])); err != nil {
				t.Fatal(err)
			}
			wv := workerView(t, r.node, uint64(i+1), 0)
			done = done && wv.IndexBlocks == blocks
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the router never applied the namespaced blocks")
		}
		time.Sleep(5 * time.Millisecond)
	}

	wantNamespaces(t, r, prompt, blocks, deadline)
}

// wantNamespaces checks that worker 1 holds prompt's blocks for adapter
// "sql" only and worker 2 for salt tenant-a only: each namespace's
// requests find only their own blocks.
func wantNamespaces(t *testing.T, r *e2eRouter, prompt []uint32, blocks uint32, deadline time.Time) {
	t.Helper()
	route := func(model, salt string) (status int, d routeDecision) {
		ids, err := json.Marshal(prompt)
		if err != nil {
			t.Fatal(err)
		}
		body := []byte(`{"model":` + strconv.Quote(model) + `,"max_tokens":1,`)
		if salt != "" {
			body = append(body, `"cache_salt":`+strconv.Quote(salt)+`,`...)
		}
		body = append(append(append(body, `"prompt":`...), ids...), '}')
		resp := r.post(t, fastpath.PathRouteCompletions, body, nil)
		if resp.status == http.StatusOK {
			if err := json.Unmarshal(resp.body, &d); err != nil {
				t.Fatal(err)
			}
		}
		return resp.status, d
	}
	// The adapter is known once the router has polled the engines' models.
	for {
		if status, _ := route("sql", ""); status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the router never learned adapter sql")
		}
		time.Sleep(10 * time.Millisecond)
	}
	type model struct {
		ID, Object, Parent string
		OwnedBy            string `json:"owned_by"`
		Created            int64
	}
	wantSQL := func(m model) bool {
		return m.ID == "sql" && m.Object == "model" && m.OwnedBy == "kvfast" && m.Parent == e2eModel && m.Created > 0
	}
	var list struct{ Data []model }
	decodeJSON(t, r.get(t, fastpath.PathModels).body, &list)
	if !slices.ContainsFunc(list.Data, wantSQL) {
		t.Errorf("the router's model list does not show the adapter: %+v", list.Data)
	}
	// One model, as the OpenAI clients' models.retrieve asks for it.
	var one model
	if resp := r.get(t, fastpath.PathModels+"/sql"); resp.status != http.StatusOK {
		t.Errorf("GET /v1/models/sql: %d %s", resp.status, resp.body)
	} else if decodeJSON(t, resp.body, &one); !wantSQL(one) {
		t.Errorf("GET /v1/models/sql: %s", resp.body)
	}
	if resp := r.get(t, fastpath.PathModels+"/no-such-model"); resp.status != http.StatusNotFound ||
		!bytes.Contains(resp.body, []byte(`"code":"model_not_found"`)) {
		t.Errorf("GET /v1/models/no-such-model: %d %s", resp.status, resp.body)
	}
	for _, tc := range []struct {
		model, salt string
		worker      uint64 // 0: no worker holds any block
	}{
		{"sql", "", 1},
		{e2eModel, "tenant-a", 2},
		{e2eModel, "", 0},
		{e2eModel, "tenant-b", 0},
		{"sql", "tenant-a", 0},
	} {
		status, d := route(tc.model, tc.salt)
		if status != http.StatusOK {
			t.Fatalf("model %q salt %q: status %d", tc.model, tc.salt, status)
		}
		for _, w := range d.Workers {
			want := uint32(0)
			if w.WorkerID == tc.worker {
				want = blocks
			}
			if w.OverlapBlocks != want {
				t.Errorf("model %q salt %q: worker %d overlaps %d blocks, want %d", tc.model, tc.salt, w.WorkerID, w.OverlapBlocks, want)
			}
		}
		if tc.worker != 0 && d.WorkerID != tc.worker {
			t.Errorf("model %q salt %q: routed to worker %d, want %d", tc.model, tc.salt, d.WorkerID, tc.worker)
		}
	}
}

// TestAdapterRoutesToItsEngines: a request naming a LoRA adapter goes
// only to workers whose engines list it, however the load falls: an
// engine without the adapter refuses it (vLLM's 404 "The model ... does
// not exist"), which the router once caused for half of such requests.
func TestAdapterRoutesToItsEngines(t *testing.T) {
	var static []node.StaticWorker
	for i, adapters := range [][]string{nil, {"sql"}, nil} {
		eng := startMock(t, mocker.Config{Listen: "127.0.0.1:0", Model: e2eModel, LoRAAdapters: adapters})
		static = append(static, node.StaticWorker{ID: uint64(i + 1), Endpoint: eng.Addr(), Model: e2eModel})
	}
	r := startE2ERouter(t, e2eConfig(static...))
	body := func(i int) []byte {
		return []byte(`{"model":"sql","max_tokens":1,"prompt":[` + strconv.Itoa(1000+i) + `,2,3]}`)
	}
	deadline := time.Now().Add(e2eWait)
	for {
		resp := r.post(t, fastpath.PathRouteCompletions, body(0), nil)
		if resp.status == http.StatusOK {
			var d routeDecision
			decodeJSON(t, resp.body, &d)
			if d.WorkerID != 2 || len(d.Workers) != 1 {
				t.Fatalf("route-only for adapter sql: worker %d among %+v, want worker 2 alone", d.WorkerID, d.Workers)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the router never learned adapter sql")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := range 9 {
		resp := r.post(t, fastpath.PathCompletions, body(i), nil)
		if resp.status != http.StatusOK || resp.header.Get(fastpath.HeaderWorker) != "2" {
			t.Fatalf("request %d for adapter sql: %d from worker %q: %s", i, resp.status, resp.header.Get(fastpath.HeaderWorker), resp.body)
		}
	}
	// An allow-list without the adapter's engine leaves no candidate.
	if resp := r.post(t, fastpath.PathCompletions, body(0), map[string]string{fastpath.HeaderAllow: "1,3"}); resp.status == http.StatusOK {
		t.Fatalf("adapter sql allowed only on workers without it: %d from worker %q", resp.status, resp.header.Get(fastpath.HeaderWorker))
	}
}

// TestEngineNotListingItsModelIsAvoided: an engine restarted under
// another --served-model-name (or a static worker's model= mistyped)
// refuses the model's requests with 404; while another worker serves the
// model, the router routes them there instead of sending about half of
// them to be refused, and /admin/workers says why.
func TestEngineNotListingItsModelIsAvoided(t *testing.T) {
	other := startMock(t, mocker.Config{WorkerID: 1, Model: "other-model"})
	good := startMock(t, mocker.Config{WorkerID: 2})
	r := startE2ERouter(t, e2eConfig(
		node.StaticWorker{ID: 1, Endpoint: other.Addr(), Model: e2eModel},
		node.StaticWorker{ID: 2, Endpoint: good.Addr(), Model: e2eModel}))
	waitFor(t, "worker 1 reported as not listing its model", func() bool {
		for _, w := range r.node.Snapshot().Workers {
			if w.WorkerID == 1 {
				return w.ModelUnlisted
			}
		}
		return false
	})
	for i := range 8 {
		resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(uint32(40+i), 64), false, 2), nil)
		if resp.status != http.StatusOK || resp.header.Get(fastpath.HeaderWorker) != "2" {
			t.Fatalf("request %d: status %d from worker %q: %s", i, resp.status, resp.header.Get(fastpath.HeaderWorker), resp.body)
		}
	}
	// Pinned, it goes where it is pinned, and the client hears the
	// engine's refusal.
	if resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(50, 64), false, 2), map[string]string{fastpath.HeaderWorker: "1"}); resp.status != http.StatusNotFound {
		t.Errorf("pinned to worker 1: status %d: %s", resp.status, resp.body)
	}
	waitReleased(t, r.node)

	// Disaggregated, a prefill worker is no alternative to the one decode
	// worker: its engine's refusal reaches the client, not a 503 that no
	// worker can take the request.
	prefill := startMock(t, mocker.Config{WorkerID: 3, Role: workers.RolePrefill})
	decode := startMock(t, mocker.Config{WorkerID: 4, Role: workers.RoleDecode, Model: "other-model"})
	cfg := e2eConfig(
		node.StaticWorker{ID: 3, Endpoint: prefill.Addr(), Model: e2eModel, Role: workers.RolePrefill},
		node.StaticWorker{ID: 4, Endpoint: decode.Addr(), Model: e2eModel, Role: workers.RoleDecode})
	cfg.HTTP.Disagg = fastpath.DisaggConfig{Protocol: fastpath.DisaggVLLM}
	rd := startE2ERouter(t, cfg)
	waitFor(t, "the decode worker reported as not listing its model", func() bool {
		for _, w := range rd.node.Snapshot().Workers {
			if w.WorkerID == 4 {
				return w.ModelUnlisted
			}
		}
		return false
	})
	if resp := rd.post(t, fastpath.PathCompletions, completionBody(e2eTokens(60, 64), false, 2), nil); resp.status != http.StatusNotFound {
		t.Errorf("disaggregated, the decode engine not listing the model: status %d: %s", resp.status, resp.body)
	}
	waitReleased(t, rd.node)
}

// TestEngineRefusingTheKeyIsAvoided: an engine started with another API
// key than the router's --engine-api-key-file answers its health check
// and refuses every request. It is not counted by /ready (a probe passed
// on a router whose every request failed) and, while another worker can
// take a request, is not routed one; /admin/workers says why. Without a
// key of its own the router forwards the clients', which the engine may
// take: then it is routed as any other.
func TestEngineRefusingTheKeyIsAvoided(t *testing.T) {
	locked := startMock(t, mocker.Config{WorkerID: 1, APIKey: "the-engine-key"})
	open := startMock(t, mocker.Config{WorkerID: 2})
	cfg := e2eConfig(
		node.StaticWorker{ID: 1, Endpoint: locked.Addr(), Model: e2eModel},
		node.StaticWorker{ID: 2, Endpoint: open.Addr(), Model: e2eModel})
	cfg.Dispatch.EngineToken = "a-stale-key"
	r := startE2ERouter(t, cfg)
	waitFor(t, "worker 1 reported as refusing the router's key", func() bool {
		return workerView(t, r.node, 1, 0).KeyRefused
	})
	if v := workerView(t, r.node, 2, 0); v.KeyRefused {
		t.Fatal("worker 2, which takes any key, is reported as refusing the router's")
	}
	var ready struct {
		Status  string `json:"status"`
		Healthy int    `json:"healthy_workers"`
	}
	resp := r.get(t, fastpath.PathReady)
	decodeJSON(t, resp.body, &ready)
	if resp.status != http.StatusOK || ready.Healthy != 1 {
		t.Fatalf("/ready with one of two engines refusing the key: %d %s, want 200 and one worker", resp.status, resp.body)
	}
	for i := range 8 {
		resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(uint32(70+i), 64), false, 2), nil)
		if resp.status != http.StatusOK || resp.header.Get(fastpath.HeaderWorker) != "2" {
			t.Fatalf("request %d: status %d from worker %q: %s", i, resp.status, resp.header.Get(fastpath.HeaderWorker), resp.body)
		}
	}
	// Not sent there and retried: not sent there at all.
	wantMetric(t, r.metrics(t), "kvfast_dispatch_retries_total", 0)
	waitReleased(t, r.node)

	// Alone, it leaves the router not ready.
	cfg = e2eConfig(node.StaticWorker{ID: 1, Endpoint: locked.Addr(), Model: e2eModel})
	cfg.Dispatch.EngineToken = "a-stale-key"
	lone := startE2ERouter(t, cfg)
	waitFor(t, "the lone worker reported as refusing the router's key", func() bool {
		return workerView(t, lone.node, 1, 0).KeyRefused
	})
	if resp := lone.get(t, fastpath.PathReady); resp.status != http.StatusServiceUnavailable {
		t.Errorf("/ready with its one engine refusing the router's key: %d %s, want 503", resp.status, resp.body)
	}
	wantMetric(t, lone.metrics(t), "kvfast_routable_workers", 0)

	// Without a key of the router's own, a client holding the engine's
	// key is served there.
	keyless := startE2ERouter(t, e2eConfig(node.StaticWorker{ID: 1, Endpoint: locked.Addr(), Model: e2eModel}))
	waitFor(t, "the keyless router ready", func() bool {
		return keyless.get(t, fastpath.PathReady).status == http.StatusOK
	})
	if v := workerView(t, keyless.node, 1, 0); v.KeyRefused {
		t.Error("without --engine-api-key-file, an engine refusing the router's model poll is reported as refusing its key")
	}
	resp = keyless.post(t, fastpath.PathCompletions, completionBody(e2eTokens(90, 64), false, 2), map[string]string{"Authorization": "Bearer the-engine-key"})
	if resp.status != http.StatusOK {
		t.Errorf("a client with the engine's key, through a router without one: %d %s", resp.status, resp.body)
	}
	waitReleased(t, keyless.node)
}
