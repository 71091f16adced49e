package feed

import (
	"bytes"
	"slices"
	"testing"

	"github.com/kvfast/kvfast/workers"
)

// FuzzDecodeVLLMBatch lets the fuzzer act as a hostile ZMQ publisher: any
// payload must decode or fail with a DecodeError, never panic, hang or
// allocate beyond its limits; a decoded batch must be self-consistent and
// decode the same way twice (the decoder reuses its buffers); and applying
// it must leave the index structurally valid.
func FuzzDecodeVLLMBatch(f *testing.F) {
	sha := bytesHashes.wire(1).([]byte)
	stored := wireEvent{kind: "BlockStored", hashes: []any{uint64(1), uint64(2)}, tokens: make([]uint32, 2*testBlockSize),
		bs: testBlockSize, medium: "GPU"}
	chained := wireEvent{kind: "BlockStored", hashes: []any{sha}, parent: uint64(2), tokens: make([]uint32, testBlockSize),
		bs: testBlockSize, extra: []any{[]any{"salt"}}, group: 0}
	events := []wireEvent{stored, chained, {kind: "BlockRemoved", hashes: []any{uint64(1), sha}, medium: "CPU"},
		{kind: "AllBlocksCleared"}, {kind: "Future"}}
	for _, fm := range []wireFormat{vllmMap, vllmArray, sglangArray} {
		f.Add(encodeBatch(f, fm, events))
		f.Add(encodeBatch(f, fm, nil))
	}
	// The shapes of testdata/conformance: SGLang's salted and bigram
	// events, map events with a cache salt, vLLM v0.26's mixed batch, the
	// hybrid fields, and undecodable events among good ones.
	for _, src := range []string{
		`[1.5, [["BlockStored", [-3], null, [1, 2, 3, 4], 4, null, "GPU", {"cache_salt": "a", "session_id": "s"}],
		  ["BlockStored", [-4], -3, [[5, 6], [6, 7], [7, 8], [8, 9]], 4, null, "CPU_PINNED"], ["BlockRemoved", [-3], "GPU"]], 0]`,
		`[2.5, [{"type": "BlockStored", "block_hashes": [18446744073709551615], "parent_block_hash": null,
		  "token_ids": [1, 2, 3, 4], "block_size": 4, "lora_id": null, "medium": "GPU", "lora_name": "x",
		  "cache_salt": "t", "extra_keys": [["t"]], "group_idx": 1, "kv_cache_spec_kind": "sliding_window",
		  "kv_cache_spec_sliding_window": 128, "locality": "LOCAL"}], 1]`,
		`[3.5, [["BlockStored", [1], null, [1, 2, 3, 4], 4, null, "GPU", null, null, 0, "full_attention", 0, "LOCAL"],
		  {"type": "BlockStored", "block_hashes": [2], "medium": 7}, [7], {"type": "BlockRemoved", "block_hashes": "x"},
		  ["BlockStored", [3], null, [[1], [], 3, [4, 5, 6]], 4, null]], 0]`,
	} {
		f.Add(mpNotation(f, src))
	}
	f.Add([]byte{})
	f.Add([]byte{0x92, 0xcb, 1, 2})
	f.Add([]byte{0x92, 0, 0xdd, 0xff, 0xff, 0xff, 0xff})

	ix := newZMQIndex(f)
	s, err := NewZMQSubscriber(ix, ZMQConfig{Endpoint: "tcp://127.0.0.1:1", Slot: zmqTestSlot, Model: testModel,
		BlockSize: testBlockSize, MaxBatchBlocks: 1 << 12, MaxBatchTokens: 1 << 14})
	if err != nil {
		f.Fatal(err)
	}
	var again VLLMDecoder
	seq := uint64(0)
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := s.dec.Decode(payload)
		if err != nil {
			if _, ok := err.(*DecodeError); !ok {
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		blocks, tokens := 0, 0
		for _, ev := range b.Events {
			blocks += len(ev.Hashes)
			tokens += len(ev.Tokens)
			if ev.ExtraKeysFrom < 0 || ev.ExtraKeysFrom > len(ev.Hashes) {
				t.Fatalf("ExtraKeysFrom %d of %d blocks", ev.ExtraKeysFrom, len(ev.Hashes))
			}
			if ev.Undecodable && (ev.Reason == "" || len(ev.Hashes)+len(ev.Tokens) > 0 || ev.Salt != nil) {
				t.Fatalf("undecodable event carries fields: %+v", ev)
			}
			if ev.LoRA != (ev.LoRAID != 0 || len(ev.LoRAName) > 0) || (ev.Tier != workers.TierGPU || ev.UnknownMedium) && ev.Medium == nil {
				t.Fatalf("derived flags disagree with the fields: %+v", ev)
			}
		}
		if blocks > 1<<12 || tokens > 1<<14 {
			t.Fatalf("%d blocks and %d tokens passed the limits", blocks, tokens)
		}
		first := cloneBatch(b)
		b2, err := again.Decode(payload)
		if err != nil || !equalBatches(first, b2) {
			t.Fatalf("second decode differs: %v", err)
		}
		seq++
		s.offer(seq, payload)
		if err := ix.Verify(); err != nil {
			t.Fatal(err)
		}
	})
}

// cloneBatch copies what a decoder owns; the byte fields alias the payload,
// which the fuzzer does not change under them.
func cloneBatch(b *VLLMBatch) VLLMBatch {
	c := *b
	c.Events = slices.Clone(b.Events)
	for i := range c.Events {
		c.Events[i].Hashes = slices.Clone(c.Events[i].Hashes)
		c.Events[i].Tokens = slices.Clone(c.Events[i].Tokens)
	}
	return c
}

func equalBatches(a VLLMBatch, b *VLLMBatch) bool {
	if a.TS != b.TS && (a.TS == a.TS || b.TS == b.TS) { // NaN equals NaN here
		return false
	}
	if a.DPRank != b.DPRank || a.HasDPRank != b.HasDPRank || len(a.Events) != len(b.Events) {
		return false
	}
	for i := range a.Events {
		x, y := &a.Events[i], &b.Events[i]
		if !slices.Equal(x.Hashes, y.Hashes) || !slices.Equal(x.Tokens, y.Tokens) || x.Kind != y.Kind ||
			x.Parent != y.Parent || x.HasParent != y.HasParent || x.BlockSize != y.BlockSize ||
			x.BadTokens != y.BadTokens || x.Bigram != y.Bigram || x.LoRA != y.LoRA || x.LoRAID != y.LoRAID ||
			!bytes.Equal(x.LoRAName, y.LoRAName) || !bytes.Equal(x.Salt, y.Salt) || !bytes.Equal(x.Medium, y.Medium) ||
			x.Tier != y.Tier || x.UnknownMedium != y.UnknownMedium || !bytes.Equal(x.Locality, y.Locality) || x.Group != y.Group ||
			!bytes.Equal(x.SpecKind, y.SpecKind) || x.SlidingWindow != y.SlidingWindow ||
			!bytes.Equal(x.ExtraKeys, y.ExtraKeys) || x.ExtraKeysFrom != y.ExtraKeysFrom ||
			x.Undecodable != y.Undecodable || x.Reason != y.Reason {
			return false
		}
	}
	return true
}
