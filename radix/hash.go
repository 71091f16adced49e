package radix

import (
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// DefaultBlockSize is the number of tokens in one KV block when neither the
// operator nor the engine says otherwise. It must equal the engine's block
// size, or no hash the router computes will ever match one the engine stores.
const DefaultBlockSize = 16

// namespaceDomain prefixes every namespace so that a future scheme can never
// produce the same seed as this one for the same model.
const namespaceDomain = "kvfast/v1"

// NamespaceSeed derives the seed of the first block's hash from the model,
// the LoRA adapter and the cache salt. Two requests share cached blocks only
// if all three are equal, which is exactly the isolation engines apply.
//
// The seed is XXH64(seed=0) over the bytes
// "kvfast/v1" 0x00 model 0x00 lora 0x00 salt.
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
	return d.Sum64()
}

var zeroByte [1]byte

// AppendBlockHashes appends the chained hash of every full block of tokens
// to dst and returns the extended slice. A trailing partial block is not
// hashed: engines do not cache it either.
//
// Block i's hash is XXH64 over block i's tokens as little-endian uint32,
// seeded with block i-1's hash; block 0 is seeded with seed. One value thus
// names a whole prefix, and a block can be hashed from its parent's hash
// alone, which is what lets the feed hash an engine's BlockStored event.
//
// It makes no allocation when dst has room for len(tokens)/blockSize more
// hashes. blockSize must be positive.
func AppendBlockHashes(dst []uint64, seed uint64, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 {
		panic("BUG: radix: block size must be positive")
	}
	var d xxhash.Digest
	parent := seed
	for len(tokens) >= blockSize {
		parent = chain(&d, parent, tokens[:blockSize])
		dst = append(dst, parent)
		tokens = tokens[blockSize:]
	}
	return dst
}

// ChainBlockHash returns the hash of one block of tokens whose parent block
// hashed to parent (or whose namespace seed is parent, for the first block).
func ChainBlockHash(parent uint64, tokens []uint32) uint64 {
	var d xxhash.Digest
	return chain(&d, parent, tokens)
}

func chain(d *xxhash.Digest, parent uint64, tokens []uint32) uint64 {
	d.ResetWithSeed(parent)
	d.Write(tokenBytes(tokens))
	return d.Sum64()
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
