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
// its entries); following the registry (new workers and generation bumps,
// clean closes, which drop the stale blocks with RemoveWorker at once, and
// stale heartbeats, whose worker keeps its blocks for DownRetention in case
// it was only paused and revives); and the counters in Stats.
//
// # Taking over the index
//
// Acquire, before the first write, has radix repair what a dead
// predecessor left half-written, within Config.RepairBudget and its
// caller's context (a shutdown stops it, and the role is given back),
// logging progress. An index damaged beyond repair, or whose repair
// overruns the budget, is Reset instead (Stats.IndexResets, and a warning
// in the log): engines cannot replay through the segment, so it refills
// from their next events, as one worker's entries do after a resync.
// Settled is closed once the first attempt has decided (the role taken
// and the index safe, or another process holding it); the node keeps
// /ready at 503 until then.
//
// A standby (Run, while another process holds the lock) also watches the
// holder: the kernel frees the lock when its holder dies, not when it
// hangs alive, and a hung holder freezes every router's index. Events
// waiting in the rings with no consumer cursor moving for
// Config.StallAfter make Stats.IngesterStalled true and a warning once a
// minute.
//
// # Applying events
//
// Ring records and ZMQ events reach the index through one path (apply.go),
// after each source has checked and counted what the router cannot route
// on. Stored re-hashes the blocks' token ids with radix.ChainBlockHash
// from the parent's kvfast hash (looked up in the index's per-worker
// engine map by the parent's engine hash; for the first block of a
// sequence, radix.NamespaceSeed(model, lora, salt), the namespace of its
// LoRA adapter and cache salt, "" for none), maps each block's engine
// hash to its kvfast hash, and stores the blocks. Removed resolves the
// engine hashes, removes the blocks and forgets the mappings. The
// engine's own Cleared (it emptied its cache, which vLLM and SGLang do
// only with no request holding a block) drops the worker's blocks and its
// mappings (radix's ClearedAll): nothing it stores later chains from a
// block it dropped, and an engine reset after every weight sync would
// otherwise fill the map. The router's resync, after a gap or a lost
// event, drops the blocks and keeps the mappings (Cleared), so that
// blocks the engine still holds, and stores later, resolve their parents;
// with the engine map more than half full it drops the worker's mappings
// too, since those of blocks evicted in the lost events would otherwise
// pile up over repeated gaps until the map refused every store.
//
// The order of those writes keeps one invariant at every instant, and so
// also after a writer killed between any two index writes: every block
// the index holds for worker w is the kvfast hash of at least one of w's
// engine-hash mappings. Engines name blocks only by engine hash, so a
// block outside that set could never be removed again and would be
// claimed for w until the next resync. Hence Stored maps before it
// stores, and stores only the blocks whose mapping found room in the map;
// Removed removes before it unmaps; a resync leaves the map alone, and
// ClearedAll and RemoveWorker drop blocks before mappings. The converse is not
// kept and need not be: a mapping may outlive its block (after a resync,
// or a store refused by a full block table), which only lets a later
// event resolve it. Two blocks of a worker under one engine hash (or
// engine hashes that collide in the map's key) cannot both be named: a
// block the worker holds keeps its name and the later one is not stored
// (counted as reused_engine_hash on ZMQ feeds); a name whose block the worker no
// longer holds (a resync dropped it) is taken over. An event that later
// names the shared hash as its parent chains from the block that kept
// the name, which may not be its prefix: engines that hash each block
// alone cannot be followed exactly, and such blocks may be over-claimed. Routers read only the block table,
// so the order does not change what they see; what a reader sees of one
// block write is radix's guarantee. The invariant needs one writer per
// worker slot (Removed reads the map between its writes).
//
// # The ZMQ path
//
// vLLM's ZmqEventPublisher (SGLang's is a copy) sends each KVEventBatch
// on a PUB socket as frames [topic, 8-byte big-endian sequence number,
// msgpack payload]. The payload is msgspec's encoding of the batch (ts,
// events, data_parallel_rank or attn_dp_rank) and its tagged events
// BlockStored, BlockRemoved and AllBlocksCleared. VLLMDecoder reads every
// shape the engines have shipped: batch and events as arrays with the tag
// first (array_like structs: vLLM before its PR #42892, SGLang before its
// PR #37482) or as maps with the tag under "type", in any mix (vLLM v0.26
// sends an array batch of map events); block hashes as uint64, as int64
// (SGLang's, often negative; taken as their 64 bits) or as sha256 digests
// (bytes, taken as vLLM's own int form of them, the low 64 bits read
// big-endian, so that an engine naming a block both ways names one key),
// either way only keys of the engine map;
// SGLang's BlockStoredWithMetadata, whose metadata map sits in the array
// slot where vLLM has lora_name; SGLang's EAGLE bigram token_ids
// ([[t0,t1],[t1,t2],…], whose first elements are the block's tokens).
// Unknown keys and trailing fields are skipped. testdata/conformance pins
// each shape to the engine file and commit it comes from. The decoder is
// hand-written over the payload bytes rather than a generic msgpack
// decoder so that it allocates nothing and can bound everything: each
// count is checked against the bytes left before any loop, skipped values
// nest at most 32 deep, and a batch carries at most MaxBlocks hashes and
// MaxTokens token ids.
//
// The decoder carries every field an event has (LoRA id and name, cache
// salt, medium and locality, KV-cache group and its spec, extra keys as
// raw msgpack), routed on or not: what the router skips is the
// subscriber's policy, not a loss in decoding. A subscriber applies
// BlockStored, BlockRemoved and AllBlocksCleared through the same path as
// ring records' Stored, Removed and Cleared.
//
// # Namespaces
//
// Blocks of a LoRA adapter or of a salted request are hashed in their
// namespace, radix.NamespaceSeed(model, lora, salt), the one requests
// naming that adapter (their model) and salt (their cache_salt) are
// hashed in, so that they match only each other. Only a sequence's first
// block (no parent) takes the seed; later blocks inherit it through the
// parent's kvfast hash. vLLM names the adapter in lora_name and, hashing
// each block with the extra keys lora + mm + salt + prompt_embeds
// (kv_cache_utils.py, generate_block_hash_extra_keys), repeats the name
// first in every block's extra keys and puts the salt last in a
// request's first block's: those keys are the namespace. Between them
// come the multimodal keys, one (identifier, offset) pair per image,
// audio or video input whose placeholder tokens the block overlaps
// (identifier: the input's mm_hash, "lora_name:" prefixed under
// tower-connector LoRA, a prefix dropped here; offset: where its
// placeholders start, relative to the block). They are folded into the
// block's hash (radix.FoldMMKey, radix.ChainBlockHashExtra) exactly as
// the router folds the mm_hashes and placeholder ranges the engine's
// render endpoint returns for a request, so an image prompt matches the
// blocks of the same image and never another image's (counted in
// multimodal_blocks). Prompt-embedding digests, and keys of any other
// shape, are not reproducible from a request and end what is hashed
// (below). SGLang sends the
// salt as its own field (metadata.cache_salt, or cache_salt in its map
// events), and its events name no adapter at all (lora_id is always
// null): kvfast takes SGLang's blocks as the base model's, so with SGLang
// serving adapters, a base-model request may be credited with blocks an
// adapter's request cached (an over-claim the events give no way to
// avoid, and no way to count), while adapter requests find no blocks (an
// under-claim). Serve adapters from vLLM where routing must be exact.
//
// # Tiers and KV-cache groups
//
// A worker holds each block in a keyspace: a tier (the GPU, host memory,
// storage: mediumTier maps the media the engines name) and, for a hybrid
// model, a KV-cache group. Blocks and engine mappings of a keyspace other
// than group 0 on the GPU are written under radix.KeyspaceHash of their
// hashes, so every keyspace keeps the invariant below on its own and an
// eviction from one tier leaves the block's other copies removable. A
// BlockStored on a lower tier that carries tokens (SGLang HiCache's
// CPU_PINNED backups) is hashed like any other; one without (vLLM's
// OffloadingConnector: token_ids [], block_size 0) names blocks the
// worker held on another tier first, and is resolved through that tier's
// mappings; an offloaded block that spans several GPU blocks is named by
// its last, which alone is credited. Each group's kind
// (kv_cache_spec_kind, kv_cache_spec_sliding_window) is learned from the
// events that store into it, and once a worker has groups beyond 0 the
// index holds its matches to vLLM's reuse rule (radix.Index.SetHybrid).
// AllBlocksCleared drops every keyspace; the ring path (shm records name
// no tier or group) writes group 0 on the GPU only.
//
// Events the router cannot route on are counted and skipped: blocks of an
// adapter named only by lora_id (vLLM before lora_name; requests name
// adapters), media no engine has shipped, groups beyond radix.MaxGroups,
// lower tiers of groups other than 0 (offloading a hybrid model is not
// modelled), another block size, blocks whose hash covers extra keys
// beyond the namespace and multimodal pairs (prompt embeddings, unknown
// shapes, from the first such block on), token_ids that are not whole
// blocks or cover fewer blocks than are named (token_ids covering more
// whole blocks name the last ones: the engine left out null blocks, or
// blocks it had cached already, which lead the range).
//
// # Undecodable events
//
// A payload that is not msgpack, not a batch, or over a limit (2^17
// block hashes, 2^21 token ids, 2^16 events: an event costs the decoder
// some 360 bytes however few it takes on the wire) loses its batch: it is counted as garbage and, its effects being unknown, resyncs
// the worker. An event that is well-formed msgpack but not a well-formed
// event (a field of the wrong type, a required field missing, a tag that
// is not a string) costs only itself: it is counted (bad_events) and the
// other events of its batch apply, in order. Ordering decides what the
// lost event may leave wrong. A lost BlockStored only under-claims: its
// blocks are never stored, their engine hashes never mapped, so events
// that chain from them later find no parent and count their blocks as
// unresolved_parent_blocks, and removals of them as
// unknown_removed_blocks; nothing is claimed that the engine lacks. Any
// other lost event (a BlockRemoved, an AllBlocksCleared, or one whose tag
// could not be read) may have dropped blocks the index still holds, and
// nothing later would remove them: the worker is resynced at the last
// such event's place in the batch, before the events after it apply (one
// resync per batch: each drops every block). A resync keeps the engine
// mappings, so those events still resolve their parents.
// Events of a type this version does not know are well-formed and are
// only counted (unknown_events).
//
// # Sequence numbers and restarts
//
// Sequence numbers drive recovery. A gap is replayed through a DEALER
// socket from the engine's ROUTER replay socket (request [empty, start];
// replies [empty, seq, payload], or [empty, topic, seq, payload] since
// vLLM's PR #45177 in v0.26, each ended by seq -1 with an empty payload
// and, in the newer shape, an empty topic) when one is configured;
// batches still missing after that cost the worker its entries (Cleared),
// never a claim the engine may have dropped. A subscriber starts by
// dropping the slot's blocks and, with a replay socket, catches up from
// sequence 0 as soon as it connects, without waiting for the engine's next
// batch, which an idle engine may not send for hours (exact if the
// engine's replay buffer still holds its whole history). An engine sends
// its whole buffer in one burst through a ROUTER socket that drops what
// exceeds its send high-water mark (vLLM's: the default 1,000 messages,
// its buffer 10,000 batches), so replies are read up to 64 MiB ahead of
// applying them, and a hole among them, a batch missing after others
// came, is asked for again from the missing number (replay_holes, up to
// 32 times per replay) rather than cleared over; a first reply past the
// number asked for means the buffer no longer holds it. The live stream
// waits while a replay runs, so a replay ends
// at the live batch that called for it (a reply numbered at or past it
// ends the replay there), a reply that does not move the sequence on is
// not progress against the stall timeout, and a replay lasts 30 stall
// timeouts at most: a replay socket that repeats itself or lies about
// numbers cannot freeze the worker's view (see below for batches numbered
// past the engine's).
//
// An engine that restarts numbers its batches from 0 again and has an
// empty cache. Two signals prove a restart wherever they appear: a
// sequence number at or below the last one seen on the live stream, and a
// batch stamped more than a second before its predecessor (an engine
// stamps batches with its clock as it makes them and sends them in order,
// so only another engine's batch goes back). The worker's blocks and
// engine mappings are then dropped (restarts). A restart also closes the
// connection, which is where the other restarts are caught. A lost
// connection is redialled with backoff, and across it nothing is trusted
// that is not proven: the engine may have restarted meanwhile and
// published as many batches as the router had seen, or more, so that its
// first batch looks like the next one or like a gap. As soon as the
// connection is back, before any live batch (a restarted engine left idle
// sends none, and its predecessor's prefixes would stay claimed), the
// subscriber asks the replay socket for the batch it applied last: the
// same engine returns it byte for byte from its buffer (the bytes include
// the engine's timestamp), and what follows is then replayed and applied
// as the continuation it is. Different bytes prove a restart (restarts);
// a missing batch (evicted from the buffer, or a restarted engine's empty
// one), a failed replay, or no replay socket prove nothing: the view is
// dropped and rebuilt as at start, from the replay buffer's history where
// there is one, else from live traffic (rejoins).
//
// A live batch numbered at or below the last batch applied is a repeat
// (the batches an engine publishes while a replay catches up come again
// live) only if it is the batch applied under that number, byte for byte
// (the digests of the last 4,096 applied are kept): otherwise the
// numbering the view followed is not the stream's (a replay socket that
// numbered its batches past the engine's), and what the replay applied is
// dropped (replay_rejected) before the batch applies. An engine's own start time, from
// its HTTP API, would be another proof; this package does not call the
// engine's HTTP API. SGLang's RadixCache publishes AllBlocksCleared when
// it starts, so the replay of a restarted SGLang's history begins by
// clearing; it needs no special case, as any AllBlocksCleared is applied.
// zmq4 allocates each received frame in full as the ZMTP header claims,
// before reading it; the subscriber therefore dials through transports of
// its own (zmq_frames.go) that follow the framing as the bytes arrive and
// break the connection at a header claiming more than 20 MiB, at a
// command of more than 64 KiB or of several frames, and at a READY whose
// metadata runs past it (zmq4 parses it unchecked and panicked), which
// the feed counts as a disconnect. The handshake has the dial timeout
// (zmq4 gives it none: a port that accepted and stayed silent held the
// feed and the router's shutdown), and a batch whose topic is not the
// subscription's is garbage (zmq4's SUB leaves filtering to the
// publisher).
//
// # Delivery guarantee
//
// Exactly-once across router restarts: each record is committed by
// storing its sequence number, then the ring tail, both in the segment.
// A router killed between the two finds the record at the tail with
// seq <= lastSeq and skips it; one killed mid-apply re-applies the record,
// which completes it: Stored and Cleared are idempotent (the first record
// a successor applies per worker counts no block it finds held as
// another copy of it, apply.go), and by the
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
// BenchmarkZMQDecode (each wire shape, in events/s), BenchmarkVLLMDecode,
// BenchmarkZMQApply and BenchmarkZMQEndToEnd.
// Ingesting a record, and decoding and applying a batch once the
// subscriber's buffers have grown, allocate nothing (the allocation
// tests).
package feed
