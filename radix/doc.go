// Package radix owns block hashing and the block index: which engine (worker
// slot) caches which KV block, and how long a prefix of a prompt each
// worker already holds.
//
// # Hashing
//
// A prompt's token IDs are cut into blocks of the engine's block size. Each
// full block is hashed with XXH64, and its parent block's hash (the first
// block's: a namespace seed from model, LoRA adapter and cache salt) is
// folded in, so one 64-bit value names a whole prefix. The hash also
// carries the block's place in a group of eight consecutive blocks: a
// 3-bit counter and group bits inherited from the group's first block.
// That is what lets the index keep a prompt's blocks side by side without
// knowing their depth. docs/hashing.md is the normative description, with
// test vectors and the collision analysis.
//
// Text and chat prompts of models the router has no tokenizer for are
// hashed for approximate routing in fixed byte chunks
// (AppendApproxHashes), a plain XXH64 chain under a seed of their own
// (ApproxSeed), so that text chunks and token blocks of the same namespace
// never meet.
//
// Approx (approx.go) is the index of routing without engine events: it
// records the router's own decisions in an Index, as if the chosen engine
// now cached the prompt, and forgets each after a TTL. The approx and
// affinity policies, and text prompts without a tokenizer, look up there.
//
// # Index
//
// The index is a sharded open-addressing hash table from block hash to a
// 64-bit set of worker slots, plus a per-worker map from the engine's own
// block hash to kvfast's (so removals that name only the engine hash
// resolve). It lives entirely in a caller-supplied byte region holding no
// Go pointers: the Go heap in tests, an mmap'd shared-memory segment in
// production (package shm), so a restarted router reattaches to a warm
// index. The byte layout is drawn in layout.go.
//
// A block's home is its group's base slot plus its counter, in the shard
// its group picks, so a group's eight blocks share two or three cache
// lines. A block that finds no room within a bounded window of its home
// (the continuations of a popular prefix all share one) spills to a
// uniform second home in a shard picked by its whole hash, so neither
// probes nor shard balance degrade however many siblings a prefix has.
// table.go has the details.
//
// # Concurrency
//
// Lookups (FindMatches, FindTieredMatches, Lookup, LookupEngineHash) are
// lock-free and never wait for a writer: they may retry a bounded number
// of times when a probe raced a deletion's backward shift, and otherwise
// read each slot once.
// Writers (Stored, Removed, Cleared, RemoveWorker and the engine map) are
// serialised per shard by a process-local mutex; a block being spilled, or
// looked for on its spill path, also takes its spill shard's mutex, in
// ascending shard order. The design expects one ingesting process (elected
// by package feed), so writers of different shards rarely contend. Keeping
// one writer per shard is what makes in-place deletion without tombstones
// safe without a 128-bit compare-and-swap.
//
// # Tiers and hybrid groups
//
// A block a worker holds on a lower tier (host memory, storage) or in a
// KV-cache group other than 0 is stored under KeyspaceHash(h, group,
// tier), which keeps the hash's counter bits, so each keyspace's blocks
// still sit side by side and nothing in the table knows of keyspaces.
// FindTieredMatches continues a worker's prefix through its lower-tier
// copies, probing them only for workers that miss a block on the GPU, and
// counts them per tier. For a worker SetHybrid describes, FindMatches
// shortens the group-0 prefix to the longest one every other group can
// serve (full attention: every block; sliding window: the blocks within
// the window before the prefix's end), so a hit is never claimed that the
// engine could not use. Hybrid descriptions are process-local.
//
// What a reader may rely on: a block that is present and not being
// changed is always found; a reader never sees a worker set that no writer
// stored for that key; a block being stored or removed concurrently may
// be seen either way.
//
// # Capacity
//
// Memory is fixed when the region is formatted. A store beyond a shard's
// limit is refused and counted (Stats.Overflow); lookups go on. Deletion
// shifts later entries back, so churn leaves no dead slots behind. One
// worker may hold at most a share of each shard (SetWorkerShare,
// share.go), so that a publisher that never reports evictions cannot
// leave no room for the others.
//
// # Repair
//
// A writer that dies mid-operation leaves at most a parked slot and a
// duplicated key per table it held. Repair, which the next writer runs
// once before its first write, undoes that in time linear in the region:
// a survey pass recounts every table and measures its runs of occupied
// slots, which bound what the sweeps after it cost, and refuses
// (ErrBeyondRepair) a region no crash leaves, one with more entries than
// its limit or runs long enough to make the sweeps superlinear (random
// bytes). Repair honours its context between slots and reports progress;
// Reset empties a refused region in place. BENCHMARKS.md has the figures.
//
// # Throughput envelope
//
// Every hot path (hashing, FindMatches, Lookup, the writers) makes zero
// allocations; the allocation tests assert it. Two benchmarks hold the
// hot paths to their floors in the same run, so that the ratio holds on
// any machine:
//
//   - BenchmarkFindMatchesFloor: FindMatches against one load of each of
//     the prompt's blocks and nothing else (metric x-floor). FindMatches
//     is software-pipelined: every block's home is known from its hash,
//     so it prefetches the groups of the blocks well ahead of the one it
//     resolves (prefetch_*.s, a no-op on other architectures), keeping
//     many misses in flight while it resolves in order, early exit
//     intact.
//   - BenchmarkHashBlocksXXH64: AppendBlockHashes against xxhash.Sum64
//     over the same bytes (metric x-xxh64). On CPUs with AVX-512, blocks
//     of the default size are hashed eight at a time in vector registers
//     beside the chain (xxh64x8_amd64.s); elsewhere one xxhash.Sum64 per
//     block.
//
// BenchmarkIndexMixed compares a concurrent lookup/event mix with an
// RWMutex-guarded map. BENCHMARKS.md has the figures.
package radix
