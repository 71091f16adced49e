// Package feed turns KV events into index updates. Ingester consumes
// every worker's shm ring into the segment's radix index; ZMQSubscriber
// consumes one engine's ZMQ KV-event stream in vLLM's own wire format, so
// stock vLLM and SGLang need no plugin.
//
// # What it owns
//
// The ingest loop and its policy: applying Stored/Removed/Cleared to the
// index through one apply path shared with the ZMQ subscriber (below);
// detecting sequence gaps and garbage and resyncing the worker (clearing
// its entries); following the registry (new workers, generation bumps,
// stale heartbeats, clean closes, each of which drops the stale blocks
// with RemoveWorker); and the counters in Stats.
//
// # Applying events
//
// Ring records and ZMQ events reach the index through one path (apply.go),
// after each source has checked and counted what the router cannot route
// on. Stored re-hashes the blocks' token ids with radix.ChainBlockHash
// from the parent's kvfast hash (looked up in the index's per-worker
// engine map by the parent's engine hash; for the first block of a
// sequence, radix.NamespaceSeed(model, "", "")), maps each block's engine
// hash to its kvfast hash, and stores the blocks. Removed resolves the
// engine hashes, removes the blocks and forgets the mappings. Cleared
// drops the worker's blocks and keeps its mappings, so that blocks the
// engine stores later still resolve their parents.
//
// The order of those writes keeps one invariant at every instant, and so
// also after a writer killed between any two index writes: every block
// the index holds for worker w is the kvfast hash of at least one of w's
// engine-hash mappings. Engines name blocks only by engine hash, so a
// block outside that set could never be removed again and would be
// claimed for w until the next resync. Hence Stored maps before it
// stores, and stores only the blocks whose mapping found room in the map;
// Removed removes before it unmaps; Cleared leaves the map alone, and
// radix's RemoveWorker drops blocks before mappings. The converse is not
// kept and need not be: a mapping may outlive its block (after Cleared,
// or a store refused by a full block table), which only lets a later
// event resolve it. The one exception is two blocks of a worker whose
// engine hashes collide in the map's key: the later mapping replaces the
// earlier, whose block then has none. Routers read only the block table,
// so the order does not change what they see; what a reader sees of one
// block write is radix's guarantee. The invariant needs one writer per
// worker slot (Removed reads the map between its writes).
//
// # The ZMQ path
//
// vLLM's ZmqEventPublisher (SGLang's is a copy) sends each KVEventBatch
// on a PUB socket as frames [topic, 8-byte big-endian sequence number,
// msgpack payload]. The payload is msgspec's encoding of the batch (ts,
// events, data_parallel_rank) and its tagged events BlockStored
// (block_hashes, parent_block_hash, token_ids, block_size, lora_id,
// medium, lora_name, extra_keys, group_idx), BlockRemoved (block_hashes,
// medium, group_idx) and AllBlocksCleared: as arrays with the tag first
// (array_like structs: older vLLM, SGLang, which also stops at lora_id)
// or as maps with the tag under "type" (current vLLM). VLLMDecoder reads
// both, with any trailing fields and unknown keys skipped. Block hashes
// are ints (taken as their 64 bits) or bytes (vLLM's sha256 digests,
// folded with XXH64); either way they are only keys of the engine map.
// The decoder is hand-written over the payload bytes rather than a
// generic msgpack decoder so that it allocates nothing and can bound
// everything: each count is checked against the bytes left before any
// loop, skipped values nest at most 32 deep, and a batch carries at most
// MaxBlocks hashes and MaxTokens token ids.
//
// A subscriber applies BlockStored, BlockRemoved and AllBlocksCleared
// through the same path as ring records' Stored, Removed and Cleared.
// Events the router cannot route on are counted and skipped: LoRA
// adapters' blocks, other media (CPU or disk tiers), KV-cache groups
// other than 0, another block size, blocks whose hash covers extra keys
// (images, cache salt, from the first such block on), token_ids whose
// length is not len(block_hashes)·block_size. A batch that does not
// decode is counted as garbage and, as its effects are unknown, resyncs
// the worker.
//
// Sequence numbers drive recovery. A gap is replayed through a DEALER
// socket from the engine's ROUTER replay socket (request [empty, start];
// replies [empty, seq, payload], ended by seq -1 with an empty payload)
// when one is configured; batches still missing after that cost the
// worker its entries (Cleared), never a claim the engine may have dropped.
// A subscriber starts by dropping the slot's blocks and, with a replay
// socket, catches up from sequence 0 (exact if the engine's replay buffer
// still holds its whole history). A sequence number at or below the last
// one seen on the live stream means the publisher restarted: the worker's
// blocks and engine mappings are dropped. A lost connection is redialled
// with backoff; the next sequence number tells whether anything was
// missed. Limits: an engine that restarts while disconnected and
// publishes more batches than the router had seen before it reconnects
// looks like a gap, not a restart (the replay then comes from the new
// engine, and its removals of the old engine's blocks are unknown).
// zmq4 allocates each received frame in full as the ZMTP header claims,
// so the engine endpoint must be trusted not to claim absurd frame sizes.
//
// # Delivery guarantee
//
// Exactly-once across router restarts: each record is committed by
// storing its sequence number, then the ring tail, both in the segment.
// A router killed between the two finds the record at the tail with
// seq <= lastSeq and skips it; one killed mid-apply re-applies the record,
// which completes it: Stored and Cleared are idempotent, and by the
// invariant above Removed still resolves every block its first attempt
// left in the index. Records of an older generation are skipped, a newer
// generation first drops the worker's blocks.
//
// # Concurrency
//
// One Ingester per segment ingests at a time, elected by the segment's
// flock (Run waits as a standby and takes over within StandbyPoll when
// the holder dies). Poll is single-goroutine; Stats is safe from any
// goroutine (counters are published once per pass).
//
// Each ZMQSubscriber runs one goroutine (Run) and writes only its own
// worker slot, through the index's per-shard locks, so subscribers and
// the ring ingester (other slots) write one index concurrently. Its
// Stats are atomics, safe from any goroutine. A subscriber's slot must be
// one the registry does not hand out: each slot has one writer.
//
// # Performance
//
// Throughput and latency are measured by BenchmarkFeedIngest and
// BenchmarkPublishToVisible, whose figures BENCHMARKS.md quotes, and by
// BenchmarkVLLMDecode, BenchmarkZMQApply and BenchmarkZMQEndToEnd.
// Ingesting a record, and decoding and applying a batch once the
// subscriber's buffers have grown, allocate nothing (the allocation
// tests).
package feed
