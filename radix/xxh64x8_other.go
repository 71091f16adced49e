//go:build !amd64

package radix

// haveHashBlocks8 is false where kvfast has no vector XXH64: block
// hashing then calls xxhash.Sum64 per block.
const haveHashBlocks8 = false

const vectorBlockBytes = 4 * DefaultBlockSize

func hashBlocks8(dst *uint64, src *byte, batches int, parent uint64) uint64 {
	panic("BUG: radix: no vector XXH64 on this architecture")
}
