//go:build !race

package feed

import "testing"

// TestZMQApplyZeroAllocs: once its buffers have grown, the subscriber
// decodes and applies batches without allocating (zmq4 itself allocates
// each received frame).
func TestZMQApplyZeroAllocs(t *testing.T) {
	ix := newZMQIndex(t)
	s, err := NewZMQSubscriber(ix, ZMQConfig{Endpoint: "tcp://127.0.0.1:1", Slot: zmqTestSlot, Model: testModel,
		BlockSize: testBlockSize})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []wireFormat{vllmMap, vllmArray, vllmMixed, sglangMeta} {
		for _, k := range []hashKind{intHashes, bytesHashes, signedHashes} {
			ops := genOps(uint64(40+f)*2+uint64(k), 1)
			ops[0].Parent = nil
			var removed op
			removed.Op, removed.Hashes = "removed", ops[0].Hashes
			stored := encodeBatch(t, f, wireOps(k, ops))
			gone := encodeBatch(t, f, wireOps(k, []op{removed, {Op: "cleared"}}))
			seq := s.lastSeq
			allocs := testing.AllocsPerRun(200, func() {
				seq++
				s.offer(seq, stored)
				seq++
				s.offer(seq, gone)
			})
			if allocs != 0 {
				t.Errorf("%v hashes %d: %v allocs per stored+removed pair", f, k, allocs)
			}
		}
	}
	if st := s.Stats(); st.StoredBlocks == 0 || st.RemovedBlocks != st.StoredBlocks || st.Garbage != 0 {
		t.Fatalf("nothing was applied: %+v", st)
	}
}

// TestZMQDecodeZeroAllocs: every wire shape the engines ship decodes
// without allocating once the decoder's buffers have grown, the fields
// carried for later routing (salt, medium, LoRA name, extra keys, group
// metadata) included, as they alias the payload.
func TestZMQDecodeZeroAllocs(t *testing.T) {
	for _, src := range []string{
		// vLLM v0.26: array batch, map events, every optional field set.
		`[1789095808.5, [{"type": "BlockStored", "block_hashes": [15760518052499183552, 1], "parent_block_hash": 7,
		  "token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "block_size": 4, "lora_id": 2, "medium": "CPU", "lora_name": "a",
		  "extra_keys": [["salt"], [["mm", 0]]], "group_idx": 1, "kv_cache_spec_kind": "sliding_window",
		  "kv_cache_spec_sliding_window": 128, "locality": "LOCAL", "session_id": "s"},
		  {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", "group_idx": 1}, {"type": "AllBlocksCleared"}], 0]`,
		// vLLM array_like with sha256 digests.
		`[1.5, [["BlockStored", [x"b8c6f33f1780d30977c5e964f62e7959102a3694f1c28ae0834ab12f98a3dcb0"], null,
		  [1, 2, 3, 4], 4, null, "GPU", null, null, 0, "full_attention"]], 0]`,
		// SGLang: salted metadata, bigrams, map events with a salt.
		`[1.5, [["BlockStored", [-3], null, [[1, 2], [2, 3], [3, 4], [4, 5]], 4, null, "GPU", {"cache_salt": "t", "session_id": "s"}],
		  {"type": "BlockStored", "block_hashes": [-4], "parent_block_hash": -3, "token_ids": [5, 6, 7, 8],
		   "block_size": 4, "lora_id": null, "medium": "CPU_PINNED", "cache_salt": "t"}], 0]`,
	} {
		payload := mpNotation(t, src)
		var d VLLMDecoder
		if _, err := d.Decode(payload); err != nil {
			t.Fatal(err)
		}
		if allocs := testing.AllocsPerRun(100, func() {
			if _, err := d.Decode(payload); err != nil {
				t.Fatal(err)
			}
			d.Release()
		}); allocs != 0 {
			t.Errorf("%.40s…: %v allocs per decode", src, allocs)
		}
	}
}

// TestZMQApplyNamespacedZeroAllocs: blocks of an adapter and of a salted
// tenant are applied in their namespace, and image blocks with their
// multimodal keys, without allocating once the namespace's seed is cached.
func TestZMQApplyNamespacedZeroAllocs(t *testing.T) {
	ix := newZMQIndex(t)
	s, err := NewZMQSubscriber(ix, ZMQConfig{Endpoint: "tcp://127.0.0.1:1", Slot: zmqTestSlot, Model: testModel,
		BlockSize: testBlockSize})
	if err != nil {
		t.Fatal(err)
	}
	stored := mpNotation(t, `[1.5, [{"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": null,
	  "token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "block_size": 4, "lora_id": 2, "medium": "GPU", "lora_name": "a",
	  "extra_keys": [["a", "tenant"], ["a"]]},
	  ["BlockStored", [3], null, [1, 2, 3, 4], 4, null, "GPU", {"cache_salt": "other"}],
	  {"type": "BlockStored", "block_hashes": [4, 5], "parent_block_hash": null,
	  "token_ids": [9, 9, 9, 9, 9, 9, 9, 9], "block_size": 4, "lora_id": 2, "medium": "GPU", "lora_name": "a",
	  "extra_keys": [["a", ["a:img", 1]], ["a", ["a:img", -3], ["img2", 2]]]}], 0]`)
	gone := mpNotation(t, `[1.5, [{"type": "BlockRemoved", "block_hashes": [1, 2, 3, 4, 5]}], 0]`)
	seq := s.lastSeq
	allocs := testing.AllocsPerRun(200, func() {
		seq++
		s.offer(seq, stored)
		seq++
		s.offer(seq, gone)
	})
	if allocs != 0 {
		t.Errorf("%v allocs per stored+removed pair", allocs)
	}
	if st := s.Stats(); st.StoredBlocks == 0 || st.RemovedBlocks != st.StoredBlocks || st.SkippedExtraKeys != 0 ||
		st.MultimodalBlocks == 0 {
		t.Fatalf("the namespaced and multimodal blocks were not applied: %+v", st)
	}
}
