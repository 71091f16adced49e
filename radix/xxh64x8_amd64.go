package radix

import "golang.org/x/sys/cpu"

// Block hashing in assembly, for the default block size on CPUs with
// AVX-512. Scalar XXH64 of a 64-byte block takes 30 multiplies where
// XXH64 streaming over the same bytes takes 16 (merging four accumulators
// and the avalanche are paid per block), so per-block xxhash.Sum64, or
// the same arithmetic written out in Go, is bound by the multiplier at
// about 2.6× xxhash.Sum64 over the prompt, before the chain. Here eight
// blocks' XXH64s run in the eight 64-bit lanes of ZMM registers, one
// VPMULLQ per multiply, while the scalar chain (link) of the batch before
// runs beside them, so the chain's critical path, two dependent multiplies
// per block, is what is left: 1.23× xxhash.Sum64 over the same bytes, from
// 3.2× (BenchmarkHashBlocksXXH64; README, "Hand-written where a tool
// exists"). TestHashBlocks8 holds it to the per-block path.

// vectorBlockBytes is the one block size hashBlocks8 hashes: the default,
// 16 tokens of 4 bytes.
const vectorBlockBytes = 4 * DefaultBlockSize

// haveHashBlocks8 reports whether hashBlocks8 may run here: it needs
// AVX-512 with its 64-bit multiply (DQ).
var haveHashBlocks8 = cpu.X86.HasAVX512F && cpu.X86.HasAVX512DQ

// hashBlocks8 writes to dst the chained hashes (AppendBlockHashes) of
// 8*batches blocks of 64 bytes at src, the first of which has parent
// parent, and returns the last. dst must have room for 8*batches hashes.
//
//go:noescape
func hashBlocks8(dst *uint64, src *byte, batches int, parent uint64) uint64
