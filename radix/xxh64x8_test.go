package radix

import (
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestHashBlocks8 holds the vector path of AppendBlockHashes to the chain
// of xxhash.Sum64s it replaces, on random tokens, under several seeds
// (whose counters put the anchors anywhere in a batch), with prompts
// around the batch size and with hashes already in dst.
func TestHashBlocks8(t *testing.T) {
	if !haveHashBlocks8 {
		t.Skip("no vector XXH64 on this CPU")
	}
	r := rand.New(rand.NewPCG(15, 15))
	for _, seed := range []uint64{NamespaceSeed("m", "", ""), 0, 1, 5 << counterShift, r.Uint64()} {
		for _, n := range []int{0, 15, 16, 17, 127, 128, 129, 8191, 8192, 8200} {
			tokens := make([]uint32, n)
			for i := range tokens {
				tokens[i] = r.Uint32()
			}
			got := AppendBlockHashes([]uint64{42}, seed, tokens, DefaultBlockSize)
			if len(got) != 1+n/DefaultBlockSize || got[0] != 42 {
				t.Fatalf("seed %#x, %d tokens: %d hashes, first %#x", seed, n, len(got), got[0])
			}
			parent := seed
			for i := range n / DefaultBlockSize {
				parent = link(parent, xxhash.Sum64(tokenBytes(tokens[i*DefaultBlockSize:(i+1)*DefaultBlockSize])))
				if got[1+i] != parent {
					t.Fatalf("seed %#x, %d tokens: block %d: %#x, per block %#x", seed, n, i, got[1+i], parent)
				}
			}
		}
	}
}
