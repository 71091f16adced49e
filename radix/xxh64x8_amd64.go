package radix

import "golang.org/x/sys/cpu"

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
