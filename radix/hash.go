package radix

import (
	"slices"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// DefaultBlockSize is the number of tokens in one KV block when neither the
// operator nor the engine says otherwise. It must equal the engine's block
// size, or no hash the router computes will ever match one the engine stores.
const DefaultBlockSize = 16

// namespaceDomain prefixes every namespace so that a future scheme can never
// produce the same seed as this one for the same model. v2 is the grouped
// layout below; v1 was a plain seeded XXH64 chain.
const namespaceDomain = "kvfast/v2"

// A block hash has three fields, so that the index can keep the blocks of
// one prompt side by side without knowing their depth (docs/hashing.md):
//
//	bits 37..63  group   inherited from the group's anchor block
//	bits 34..36  counter the block's position in its group, 0..7
//	bits  0..33  fresh   this block's own
//
// A block whose parent's counter is 7 is an anchor: counter 0 and all other
// bits fresh. Any other block copies its parent's group bits and counts
// one up. Eight consecutive blocks of a chain therefore share a group and
// have consecutive counters, and the index places them in consecutive slots.
const (
	freshBits    = 34
	counterShift = freshBits
	counterMask  = 7
	groupShift   = counterShift + 3
	groupBits    = 64 - groupShift
	freshMask    = 1<<freshBits - 1
	groupMask    = ^uint64(0) >> groupShift << groupShift
	anchorParent = counterMask << counterShift // counter 7: the next block is an anchor
	groupSize    = counterMask + 1
)

// NamespaceSeed derives the seed of the first block's hash from the model,
// the LoRA adapter and the cache salt. Two requests share cached blocks only
// if all three are equal, which is exactly the isolation engines apply.
//
// The seed is XXH64(seed=0) over the bytes
// "kvfast/v2" 0x00 model 0x00 lora 0x00 salt, with its counter field set
// to 7 so that every prompt's first block is an anchor.
func NamespaceSeed(model, lora, salt string) uint64 {
	var d xxhash.Digest
	d.Reset()
	d.WriteString(namespaceDomain)
	d.Write(zeroByte[:])
	d.WriteString(model)
	d.Write(zeroByte[:])
	d.WriteString(lora)
	d.Write(zeroByte[:])
	d.WriteString(salt)
	return d.Sum64() | anchorParent
}

var zeroByte [1]byte

// AppendBlockHashes appends the chained hash of every full block of tokens
// to dst and returns the extended slice. A trailing partial block is not
// hashed: engines do not cache it either.
//
// Block i's hash is ChainBlockHash(hash of block i-1, block i's tokens);
// block 0's parent is seed, which should come from NamespaceSeed (a seed
// whose counter field is not 7 still hashes correctly, but the first
// blocks of every prompt under it then share a group). One value thus
// names a whole prefix, and a block can be hashed from its parent's hash
// alone, which is what lets the feed hash an engine's BlockStored event.
//
// It makes no allocation when dst has room for len(tokens)/blockSize more
// hashes. blockSize must be positive.
func AppendBlockHashes(dst []uint64, seed uint64, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 {
		panic("BUG: radix: block size must be positive")
	}
	step := 4 * blockSize
	b := tokenBytes(tokens)
	parent := seed
	if step == vectorBlockBytes && haveHashBlocks8 {
		// Whole batches of eight default-sized blocks: their XXH64s eight
		// at a time in vector registers, beside the chain (xxh64x8_amd64.s).
		if batches := len(b) / (8 * step); batches > 0 {
			n := 8 * batches
			dst = slices.Grow(dst, n)
			parent = hashBlocks8(unsafe.SliceData(dst[len(dst):len(dst)+n]), &b[0], batches, parent)
			dst = dst[:len(dst)+n]
			b = b[n*step:]
		}
	}
	for len(b) >= step {
		parent = link(parent, xxhash.Sum64(b[:step]))
		dst = append(dst, parent)
		b = b[step:]
	}
	return dst
}

// ChainBlockHash returns the hash of one block of tokens whose parent block
// hashed to parent (or whose namespace seed is parent, for the first block).
func ChainBlockHash(parent uint64, tokens []uint32) uint64 {
	return link(parent, xxhash.Sum64(tokenBytes(tokens)))
}

// link is the whole scheme but the block's own XXH64, sum. sum does not
// depend on the parent, so consecutive blocks hash in parallel and the
// chain's critical path is one mix64 rather than one XXH64: the XXH64s of
// a prompt's blocks overlap in the pipeline (BenchmarkHashBlocks).
func link(parent, sum uint64) uint64 {
	raw := sum ^ mix64(parent)
	if c := parent >> counterShift & counterMask; c != counterMask {
		return parent&groupMask | (c+1)<<counterShift | raw&freshMask
	}
	return raw &^ (counterMask << counterShift)
}

// mix64 is SplitMix64's finaliser, a bijection whose every output bit
// depends on every input bit. In the chain it folds the parent into the
// block's hash; in the engine map it spreads engine hashes, which may be
// anything, even small sequential integers, over the table.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// tokenBytes views tokens as their little-endian byte encoding without a
// copy. kvfast builds only for little-endian targets (see endian.go), so
// the in-memory layout of []uint32 is already the wire layout.
func tokenBytes(tokens []uint32) []byte {
	if len(tokens) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), len(tokens)*4)
}
