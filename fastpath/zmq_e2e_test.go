package fastpath_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/node"
	"github.com/kvfast/kvfast/radix"
)

// vllmStoredBatch is a KVEventBatch with one BlockStored event, map-encoded
// as stock vLLM publishes it, with int block hashes.
func vllmStoredBatch(t *testing.T, hashes []uint64, tokens []uint32, blockSize int) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.UseCompactInts(true)
	ev := map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": nil,
		"token_ids": tokens, "block_size": blockSize, "lora_id": nil, "medium": "GPU", "lora_name": nil}
	if err := e.Encode(map[string]any{"ts": 1.5, "events": []any{ev}, "data_parallel_rank": 0}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestStaticWorkerZMQFeed: a static worker configured with a ZMQ events
// endpoint gets its blocks into the index from a vLLM-format PUB socket,
// and routing follows them.
func TestStaticWorkerZMQFeed(t *testing.T) {
	var pubs []zmq4.Socket
	var static []node.StaticWorker
	for i := range 2 {
		pub := zmq4.NewPub(context.Background())
		if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pub.Close() })
		pubs = append(pubs, pub)
		eng := startE2EEngine(t, sseHandler(nil))
		static = append(static, node.StaticWorker{ID: uint64(i + 1), Endpoint: eng.addr(), Model: e2eModel,
			Events: "tcp://" + pub.Addr().String(), Topic: "kv-events"})
	}
	r := startE2ERouter(t, e2eConfig(static...))

	const blocks = 6
	bs := radix.DefaultBlockSize
	prompt := e2eTokens(77, blocks*bs+5)
	hashes := make([]uint64, blocks)
	for i := range hashes {
		hashes[i] = uint64(1000 + i)
	}
	payload := vllmStoredBatch(t, hashes, prompt[:blocks*bs], bs)
	// Worker 2's engine cached the prompt's blocks. A SUB socket misses
	// what is published before its subscription arrives, so publish (an
	// idempotent store) until the router has it.
	deadline := time.Now().Add(e2eWait)
	for seq := uint64(0); ; seq++ {
		var sb [8]byte
		binary.BigEndian.PutUint64(sb[:], seq)
		if err := pubs[1].Send(zmq4.NewMsgFrom([]byte("kv-events"), sb[:], payload)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
		if wv := workerView(t, r.node, 2, 0); wv.ZMQ != nil && wv.ZMQ.StoredBlocks > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the router never applied the batch: %+v", workerView(t, r.node, 2, 0).ZMQ)
		}
	}

	resp := r.post(t, fastpath.PathRouteCompletions, completionBody(prompt, false, 4), nil)
	if resp.status != http.StatusOK {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	var dec struct {
		WorkerID      uint64 `json:"worker_id"`
		OverlapBlocks int    `json:"overlap_blocks"`
	}
	if err := json.Unmarshal(resp.body, &dec); err != nil {
		t.Fatal(err)
	}
	if dec.WorkerID != 2 || dec.OverlapBlocks != blocks {
		t.Fatalf("routed to worker %d with %d blocks cached, want worker 2 with %d: %s", dec.WorkerID, dec.OverlapBlocks, blocks, resp.body)
	}

	wv := workerView(t, r.node, 2, 0)
	if wv.ZMQ == nil || !wv.ZMQ.Connected || wv.ZMQ.StoredBlocks%blocks != 0 || wv.IndexBlocks != blocks {
		t.Fatalf("admin view %+v, zmq %+v", wv, wv.ZMQ)
	}
	if wv := workerView(t, r.node, 1, 0); wv.ZMQ == nil || wv.ZMQ.Batches != 0 || wv.IndexBlocks != 0 {
		t.Fatalf("worker 1 admin view %+v", wv)
	}
	// Nothing above waited for worker 1's subscriber: on a loaded machine
	// it may still be dialling.
	waitFor(t, "worker 1's ZMQ subscriber to connect", func() bool {
		wv := workerView(t, r.node, 1, 0)
		return wv.ZMQ != nil && wv.ZMQ.Connected
	})
	text := r.metrics(t)
	series := `kvfast_zmq_events_total{dp_rank="0",status="blocks_stored",worker="2"}`
	if v, ok := metricValue(text, series); !ok || v < blocks {
		t.Fatalf("%s = %v (found %v)", series, v, ok)
	}
	wantMetric(t, text, `kvfast_zmq_connected{dp_rank="0",worker="1"}`, 1)
}

// TestSharedEndpointRankChecksItsEvents: ranks that share one HTTP
// endpoint are each one rank, so a rank whose events= socket streams
// another rank's batches (the base port + r mixed up) has them skipped
// and counted, not credited to it.
func TestSharedEndpointRankChecksItsEvents(t *testing.T) {
	pub := zmq4.NewPub(context.Background())
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	eng := startE2EEngine(t, sseHandler(nil))
	events := "tcp://" + pub.Addr().String()
	r := startE2ERouter(t, e2eConfig(
		node.StaticWorker{ID: 1, DPRank: 0, Endpoint: eng.addr(), Model: e2eModel},
		node.StaticWorker{ID: 1, DPRank: 1, Endpoint: eng.addr(), Model: e2eModel, Events: events, Topic: "kv-events"}))

	bs := radix.DefaultBlockSize
	payload := vllmStoredBatch(t, []uint64{1000}, e2eTokens(78, bs), bs) // stamped data_parallel_rank 0
	deadline := time.Now().Add(e2eWait)
	for seq := uint64(0); ; seq++ {
		var sb [8]byte
		binary.BigEndian.PutUint64(sb[:], seq)
		if err := pub.Send(zmq4.NewMsgFrom([]byte("kv-events"), sb[:], payload)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
		if wv := workerView(t, r.node, 1, 1); wv.ZMQ != nil && wv.ZMQ.OtherRankBatches > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rank 0's batches were not skipped on rank 1: %+v", workerView(t, r.node, 1, 1).ZMQ)
		}
	}
	if wv := workerView(t, r.node, 1, 1); wv.ZMQ.StoredBlocks != 0 || wv.IndexBlocks != 0 {
		t.Fatalf("rank 0's blocks credited to rank 1: %+v, zmq %+v", wv, wv.ZMQ)
	}
	if v, _ := metricValue(r.metrics(t), `kvfast_zmq_events_total{dp_rank="1",status="other_rank_batches",worker="1"}`); v == 0 {
		t.Error("kvfast_zmq_events_total{status=\"other_rank_batches\"} does not count them")
	}
}
