package feed

import (
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// benchBatch is an engine step's worth of events: 8 prompts of 32 blocks
// of 16 tokens.
func benchBatch(b *testing.B, f wireFormat, k hashKind, round uint64) ([]byte, int) {
	evs := benchEvents(k, round)
	return encodeBatch(b, f, evs), len(evs) * len(evs[0].hashes)
}

func benchEvents(k hashKind, round uint64) []wireEvent {
	const events, blocks, bs = 8, 32, 16
	var evs []wireEvent
	for e := range uint64(events) {
		ev := wireEvent{kind: "BlockStored", bs: bs, medium: "GPU"}
		for i := range uint64(blocks) {
			ev.hashes = append(ev.hashes, k.wire(round<<32|e<<16|i))
			for j := range uint32(bs) {
				ev.tokens = append(ev.tokens, uint32(round)*7+uint32(e)*1000+uint32(i)*bs+j)
			}
		}
		evs = append(evs, ev)
	}
	return evs
}

// BenchmarkZMQDecode: the decoder on one engine step's batch in each wire
// shape the engines ship (testdata/conformance), in events/s. Once its
// buffers have grown it allocates nothing (TestZMQDecodeZeroAllocs).
func BenchmarkZMQDecode(b *testing.B) {
	for _, bc := range []struct {
		name  string
		f     wireFormat
		k     hashKind
		tweak func(*wireEvent)
	}{
		{"vllm-v0.26/int", vllmMixed, intHashes, nil},
		{"vllm-map/sha256", vllmMap, bytesHashes, nil},
		{"vllm-array/sha256", vllmArray, bytesHashes, nil},
		{"sglang/int64", sglangMeta, signedHashes, nil},
		{"sglang-salted/int64", sglangMeta, signedHashes, func(ev *wireEvent) { ev.salt = "tenant-a" }},
		{"sglang-eagle/int64", sglangMeta, signedHashes, func(ev *wireEvent) { ev.bigram = true }},
	} {
		evs := benchEvents(bc.k, 1)
		if bc.tweak != nil {
			for i := range evs {
				bc.tweak(&evs[i])
			}
		}
		payload := encodeBatch(b, bc.f, evs)
		blocks := len(evs) * len(evs[0].hashes)
		b.Run(bc.name, func(b *testing.B) {
			var d VLLMDecoder
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			for b.Loop() {
				if _, err := d.Decode(payload); err != nil {
					b.Fatal(err)
				}
			}
			el := b.Elapsed().Seconds()
			b.ReportMetric(float64(len(evs))*float64(b.N)/el, "events/s")
			b.ReportMetric(float64(blocks)*float64(b.N)/el, "blocks/s")
		})
	}
}

// BenchmarkVLLMDecode: the decoder against decoding the same payload
// generically with vmihailenco/msgpack (what a consumer without a
// purpose-built decoder does).
func BenchmarkVLLMDecode(b *testing.B) {
	for _, f := range []wireFormat{vllmMap, vllmArray} {
		payload, blocks := benchBatch(b, f, bytesHashes, 1)
		b.Run("kvfast/"+f.String(), func(b *testing.B) {
			var d VLLMDecoder
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			for b.Loop() {
				if _, err := d.Decode(payload); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(blocks)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
		b.Run("baseline-msgpack-any/"+f.String(), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			for b.Loop() {
				var v any
				if err := msgpack.Unmarshal(payload, &v); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(blocks)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

// BenchmarkZMQApply: decode plus index writes (re-hashing every block's
// tokens, mapping engine hashes), alternating a store and its removal.
func BenchmarkZMQApply(b *testing.B) {
	ix := newZMQIndex(b)
	s, err := NewZMQSubscriber(ix, ZMQConfig{Endpoint: "tcp://127.0.0.1:1", Slot: zmqTestSlot, Model: testModel, BlockSize: 16})
	if err != nil {
		b.Fatal(err)
	}
	stored, blocks := benchBatch(b, vllmMap, bytesHashes, 1)
	var removed []wireEvent
	for e := range uint64(8) {
		ev := wireEvent{kind: "BlockRemoved", medium: "GPU"}
		for i := range uint64(32) {
			ev.hashes = append(ev.hashes, bytesHashes.wire(1<<32|e<<16|i))
		}
		removed = append(removed, ev)
	}
	gone := encodeBatch(b, vllmMap, removed)
	seq := uint64(0)
	b.ReportAllocs()
	for b.Loop() {
		seq++
		s.offer(seq, stored)
		seq++
		s.offer(seq, gone)
	}
	if st := s.Stats(); st.StoredBlocks != st.RemovedBlocks || st.StoredBlocks == 0 {
		b.Fatalf("stats %+v", st)
	}
	b.ReportMetric(float64(2*blocks)*float64(b.N)/b.Elapsed().Seconds(), "blockops/s")
}

// BenchmarkZMQEndToEnd: batches published on a zmq4 PUB socket over
// loopback until the subscriber has applied them (pipelined throughput,
// at most a window of batches in flight: zmq4's PUB queue is unbounded).
func BenchmarkZMQEndToEnd(b *testing.B) {
	ix := newZMQIndex(b)
	e := newTestEngine(b, false)
	s := startSub(b, ix, e, func(c *ZMQConfig) { c.BlockSize = 16 })
	e.warmUp(b, s, vllmMap)
	payload, blocks := benchBatch(b, vllmMap, intHashes, 1)
	b.ReportAllocs()
	start := time.Now()
	var last uint64
	for b.Loop() {
		last = e.publish(payload)
		if last%256 == 0 {
			waitSeq(b, s, last-128)
		}
	}
	waitSeq(b, s, last)
	el := time.Since(start).Seconds()
	b.ReportMetric(float64(b.N)/el, "batches/s")
	b.ReportMetric(float64(b.N*blocks)/el, "blocks/s")
}
