// Package radix owns block hashing and the block index: which engine (worker
// slot) caches which KV block, and how long a prefix of a prompt each
// worker already holds.
//
// # Hashing
//
// A prompt's token IDs are cut into blocks of the engine's block size; each
// full block is hashed with XXH64, seeded by its parent block's hash (the
// first block by a namespace seed from model, LoRA adapter and cache salt).
// One 64-bit value therefore names a whole prefix. docs/hashing.md is the
// normative description, with test vectors.
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
// # Concurrency
//
// Lookups (FindMatches, Lookup, LookupEngineHash) are lock-free and never
// wait for a writer: they may retry a bounded number of times when a probe
// raced a deletion's backward shift, and otherwise read each slot once.
// Writers (Stored, Removed, Cleared, RemoveWorker and the engine map) are
// serialised per shard by a process-local mutex; the design expects one
// ingesting process (elected by package feed), so writers of different
// shards never contend and writers of one shard rarely do. Keeping one
// writer per shard is what makes in-place deletion without tombstones
// safe without a 128-bit compare-and-swap.
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
// shifts later entries back, so churn leaves no dead slots behind.
//
// # Throughput envelope
//
// On the 2-core development machines (see BENCHMARKS.md): hashing ~1 G
// tokens/s, FindMatches of a 512-block prompt on a 1M-block index in tens
// of microseconds, bounded by one random cache-line load per block
// (BenchmarkProbeFloor), and a concurrent lookup/event mix several times
// an RWMutex-guarded map's. Zero allocations on every hot path.
package radix
