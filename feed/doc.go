// Package feed turns KV events into index updates. Ingester consumes
// every worker's shm ring into the segment's radix index; ZMQSubscriber
// consumes one engine's ZMQ KV-event stream in vLLM's own wire format, so
// stock vLLM and SGLang need no plugin.
//
// # What it owns
//
// The ingest loop and its policy: resolving a record's engine parent
// hash to a kvfast hash through the index's per-worker engine map,
// re-hashing token ids with radix.ChainBlockHash (the first block of a
// sequence is seeded with radix.NamespaceSeed(model, "", "")), applying
// Stored/Removed/Cleared; detecting sequence gaps and garbage and
// resyncing the worker (clearing its entries); following the registry
// (new workers, generation bumps, stale heartbeats, clean closes, each of
// which drops the stale blocks with RemoveWorker); and the counters in
// Stats.
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
// A subscriber applies events like the ring ingester applies records:
// BlockStored re-hashes its token_ids with radix.ChainBlockHash from the
// parent's kvfast hash (or the model's namespace seed) and maps the
// engine hashes; BlockRemoved resolves them; AllBlocksCleared clears the
// worker. Events the router cannot route on are counted and skipped: LoRA
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
// seq <= lastSeq and skips it; one killed mid-apply re-applies the record
// (every record kind is idempotent on the index). Records of an older
// generation are skipped, a newer generation first drops the worker's
// blocks.
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
// Stats are atomics, safe from any goroutine.
//
// # Throughput envelope
//
// On the 2-core reference box one goroutine applies about 8-10M block
// events/s (BenchmarkFeedIngest, 1M-block index), dominated by the
// index's per-block locked probes, with zero allocations. Publish to
// visible across processes: p50 ≈ 14 µs when the ingester sleeps on the
// doorbell, ≈ 1.5 µs while it spins (BenchmarkPublishToVisible).
//
// ZMQ: VLLMDecoder decodes about 1 GB/s (a batch of 256 blocks with
// sha256 hashes in ~20 µs, ~13M blocks/s, six times vmihailenco/msgpack
// into interface values, with zero allocations: BenchmarkVLLMDecode);
// decode plus index writes run at ~7M block operations/s
// (BenchmarkZMQApply); over loopback through zmq4 a subscriber applies
// ~20K such batches/s, ~5M blocks/s (BenchmarkZMQEndToEnd). An engine
// publishes one batch per scheduler step (milliseconds), orders of
// magnitude below this.
package feed
