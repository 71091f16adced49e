package mocker

import (
	"context"
	"errors"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvfast/kvfast/feed"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
)

// TestZMQPublisherFeedsRouter: an engine publishing on ZMQ in each format,
// losing every other batch from its live stream, is followed exactly by
// the router's subscriber, which repairs every gap from the replay socket.
func TestZMQPublisherFeedsRouter(t *testing.T) {
	for _, format := range []ZMQFormat{ZMQVLLM, ZMQSGLang} {
		t.Run(format.String(), func(t *testing.T) {
			e := startEngine(t, Config{Model: "m", Speedup: math.Inf(1), DPRank: 2, ZMQ: ZMQConfig{
				Listen: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", Format: format, Topic: "kv-events",
				DropEvery: 2}})
			ix, err := radix.NewHeap(radix.Config{Capacity: 1 << 14})
			if err != nil {
				t.Fatal(err)
			}
			const slot = workers.Slot(3)
			sub, err := feed.NewZMQSubscriber(ix, feed.ZMQConfig{Endpoint: e.ZMQEndpoint(), Replay: e.ZMQReplayEndpoint(),
				Topic: "kv-events", Slot: slot, Model: "m", BlockSize: e.Config().BlockSize,
				RedialMin: 5 * time.Millisecond, RedialMax: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			runSub(t, sub)

			bs := e.Config().BlockSize
			prompt := seq(1000, 4*bs+3)
			hashes := radix.AppendBlockHashes(nil, radix.NamespaceSeed("m", "", ""), prompt, bs)
			var ov workers.Overlaps
			// A SUB socket misses what is published before its subscription
			// reaches the PUB, and the subscriber catches up on its first
			// live batch: send requests until the first prompt's blocks are in.
			for i := 0; ; i++ {
				p := prompt
				if i > 0 {
					p = seq(5000+100*i, 2*bs)
				}
				if status, b := do(t, "POST", e.URL()+"/v1/completions", `{"prompt":`+idsJSON(p)+`,"max_tokens":1}`); status != 200 {
					t.Fatalf("status %d: %s", status, b)
				}
				ix.FindMatches(hashes, &ov)
				if ov[slot] == uint32(len(hashes)) && sub.Stats().Replayed > 0 {
					break
				}
				if i > 500 {
					t.Fatalf("the router never held the prompt: overlap %d, %+v", ov[slot], sub.Stats())
				}
			}
			if st := sub.Stats(); st.Garbage != 0 || st.BadEvents != 0 || st.Resyncs != 0 {
				t.Fatalf("clean stream counted as faulty: %+v", st)
			}
		})
	}
}

func runSub(t *testing.T, s *feed.ZMQSubscriber) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run returned %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
}

// TestZMQPublisherWireShapes decodes the publisher's payloads with a
// generic msgpack decoder, independent of the router's: each format has
// the engine's layout.
func TestZMQPublisherWireShapes(t *testing.T) {
	parent := uint64(1) << 63
	want := map[ZMQFormat][]any{
		ZMQVLLM: {
			[]any{map[string]any{"type": "AllBlocksCleared"}},
			[]any{map[string]any{"type": "BlockStored", "block_hashes": []any{uint64(1) << 63}, "parent_block_hash": nil,
				"token_ids": []any{int8(1), int8(2)}, "block_size": int8(2), "lora_id": nil, "medium": "GPU", "lora_name": nil}},
			[]any{map[string]any{"type": "BlockStored", "block_hashes": []any{int8(7)}, "parent_block_hash": parent,
				"token_ids": []any{uint16(300), int8(4)}, "block_size": int8(2), "lora_id": nil, "medium": "GPU", "lora_name": nil}},
			[]any{map[string]any{"type": "BlockRemoved", "block_hashes": []any{int8(7)}, "medium": "GPU"}},
			// An adapter's salted request: the name on every block, the
			// salt on the first; its continuation has no extra keys left.
			[]any{map[string]any{"type": "BlockStored", "block_hashes": []any{int8(8), int8(9)}, "parent_block_hash": nil,
				"token_ids": []any{int8(1), int8(2), int8(3), int8(4)}, "block_size": int8(2), "lora_id": nil, "medium": "GPU",
				"lora_name": "sql", "extra_keys": []any{[]any{"sql", "a"}, []any{"sql"}}}},
			[]any{map[string]any{"type": "BlockStored", "block_hashes": []any{int8(10)}, "parent_block_hash": int8(9),
				"token_ids": []any{int8(5), int8(6)}, "block_size": int8(2), "lora_id": nil, "medium": "GPU", "lora_name": nil}},
		},
		ZMQSGLang: {
			[]any{[]any{"AllBlocksCleared"}},
			[]any{[]any{"BlockStored", []any{int64(math.MinInt64)}, nil, []any{int8(1), int8(2)}, int8(2), nil, "GPU"}},
			[]any{[]any{"BlockStored", []any{int8(7)}, int64(math.MinInt64), []any{uint16(300), int8(4)}, int8(2), nil, "GPU"}},
			[]any{[]any{"BlockRemoved", []any{int8(7)}, "GPU"}},
			// SGLang names no adapter; the salt is on every salted block.
			[]any{[]any{"BlockStored", []any{int8(8), int8(9)}, nil, []any{int8(1), int8(2), int8(3), int8(4)}, int8(2), nil, "GPU",
				map[string]any{"cache_salt": "a"}}},
			[]any{[]any{"BlockStored", []any{int8(10)}, int8(9), []any{int8(5), int8(6)}, int8(2), nil, "GPU",
				map[string]any{"cache_salt": "a"}}},
		},
	}
	for format, events := range want {
		t.Run(format.String(), func(t *testing.T) {
			p, err := NewZMQPublisher(ZMQConfig{Listen: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", Format: format}, 5)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			for _, err := range []error{
				p.Cleared(),
				p.Stored(Placement{}, 0, false, []BlockEvent{{Hash: parent, Tokens: []uint32{1, 2}}}),
				p.Stored(Placement{}, parent, true, []BlockEvent{{Hash: 7, Tokens: []uint32{300, 4}}}),
				p.Removed(Placement{}, []uint64{7}),
				p.Stored(Placement{}, 0, false, []BlockEvent{{Hash: 8, Tokens: []uint32{1, 2}, LoRA: "sql", Salt: "a"},
					{Hash: 9, Tokens: []uint32{3, 4}, LoRA: "sql", Salt: "a"}}),
				p.Stored(Placement{}, 9, true, []BlockEvent{{Hash: 10, Tokens: []uint32{5, 6}, Salt: "a"}}),
			} {
				if err != nil {
					t.Fatal(err)
				}
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			if len(p.buffer) != len(events) {
				t.Fatalf("%d batches buffered, want %d", len(p.buffer), len(events))
			}
			for i, b := range p.buffer {
				var got []any
				if err := msgpack.Unmarshal(b.payload, &got); err != nil {
					t.Fatalf("batch %d: %v", i, err)
				}
				if len(got) != 3 || got[2] != int8(5) {
					t.Fatalf("batch %d is not [ts, events, rank 5]: %v", i, got)
				}
				if _, ok := got[0].(float64); !ok {
					t.Fatalf("batch %d ts %T", i, got[0])
				}
				if !reflect.DeepEqual(got[1], events[i]) {
					t.Fatalf("batch %d events\n got %#v\nwant %#v", i, got[1], events[i])
				}
			}
		})
	}
}

// TestZMQPublisherBufferIsBounded: the replay buffer keeps the last
// BufferSteps batches, as vLLM's does.
func TestZMQPublisherBufferIsBounded(t *testing.T) {
	p, err := NewZMQPublisher(ZMQConfig{Listen: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", BufferSteps: 3}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for range 50 {
		if err := p.Cleared(); err != nil {
			t.Fatal(err)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var seqs []uint64
	for _, b := range p.buffer {
		seqs = append(seqs, b.seq)
	}
	if !reflect.DeepEqual(seqs, []uint64{47, 48, 49}) {
		t.Fatalf("buffered %v, want the last three", seqs)
	}
}

// TestZMQPublisherTierAndGroupShapes: host copies are announced as each
// engine's offloading does (vLLM's connector by engine hash alone, SGLang's
// HiCache with tokens and parent), and a hybrid engine's events name their
// KV-cache group in vLLM's format; SGLang's, which has no groups, carries
// group 0 only.
func TestZMQPublisherTierAndGroupShapes(t *testing.T) {
	host := Placement{Tier: workers.TierHost}
	full := Placement{Hybrid: true}
	window := Placement{Hybrid: true, Group: 1, SlidingWindow: 4096}
	want := map[ZMQFormat][]any{
		ZMQVLLM: {
			[]any{map[string]any{"type": "BlockStored", "block_hashes": []any{int8(10)}, "parent_block_hash": nil,
				"token_ids": []any{}, "block_size": int8(0), "lora_id": nil, "medium": "CPU", "lora_name": nil}},
			[]any{map[string]any{"type": "BlockRemoved", "block_hashes": []any{int8(10)}, "medium": "CPU"}},
			[]any{map[string]any{"type": "BlockStored", "block_hashes": []any{int8(11)}, "parent_block_hash": int8(9),
				"token_ids": []any{int8(5), int8(6)}, "block_size": int8(2), "lora_id": nil, "medium": "GPU", "lora_name": nil,
				"group_idx": int8(0), "kv_cache_spec_kind": "full_attention"}},
			[]any{map[string]any{"type": "BlockStored", "block_hashes": []any{int8(11)}, "parent_block_hash": int8(9),
				"token_ids": []any{int8(5), int8(6)}, "block_size": int8(2), "lora_id": nil, "medium": "GPU", "lora_name": nil,
				"group_idx": int8(1), "kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": uint16(4096)}},
			[]any{map[string]any{"type": "BlockRemoved", "block_hashes": []any{int8(11)}, "medium": "GPU", "group_idx": int8(1)}},
		},
		ZMQSGLang: {
			[]any{[]any{"BlockStored", []any{int8(10)}, int8(9), []any{int8(5), int8(6)}, int8(2), nil, "CPU_PINNED",
				map[string]any{"cache_salt": "a"}}},
			[]any{[]any{"BlockRemoved", []any{int8(10)}, "CPU_PINNED"}},
			[]any{[]any{"BlockStored", []any{int8(11)}, int8(9), []any{int8(5), int8(6)}, int8(2), nil, "GPU"}},
		},
	}
	for format, events := range want {
		t.Run(format.String(), func(t *testing.T) {
			p, err := NewZMQPublisher(ZMQConfig{Listen: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", Format: format}, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			for _, err := range []error{
				p.Stored(host, 9, true, []BlockEvent{{Hash: 10, Tokens: []uint32{5, 6}, Salt: "a"}}),
				p.Removed(host, []uint64{10}),
				p.Stored(full, 9, true, []BlockEvent{{Hash: 11, Tokens: []uint32{5, 6}}}),
				p.Stored(window, 9, true, []BlockEvent{{Hash: 11, Tokens: []uint32{5, 6}}}),
				p.Removed(window, []uint64{11}),
			} {
				if err != nil {
					t.Fatal(err)
				}
			}
			if got := p.Published(); got != uint64(len(events)) {
				t.Fatalf("published %d batches, want %d", got, len(events))
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			for i, b := range p.buffer {
				var got []any
				if err := msgpack.Unmarshal(b.payload, &got); err != nil {
					t.Fatalf("batch %d: %v", i, err)
				}
				if !reflect.DeepEqual(got[1], events[i]) {
					t.Fatalf("batch %d events\n got %#v\nwant %#v", i, got[1], events[i])
				}
			}
		})
	}
}
