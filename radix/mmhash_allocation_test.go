//go:build !race && !invariants

package radix

import "testing"

func TestHashBlocksMMAllocatesNothing(t *testing.T) {
	tokens := seqTokens(8192, 3)
	items := []MMItem{{ID: []byte("0123456789abcdef"), Offset: 100, Length: 1000},
		{ID: []byte("fedcba9876543210"), Offset: 2000, Length: 576}}
	dst := make([]uint64, 0, 512)
	seed := NamespaceSeed("m", "", "")
	if n := testing.AllocsPerRun(100, func() {
		dst = AppendBlockHashesMM(dst[:0], seed, tokens, 16, items)
	}); n != 0 {
		t.Fatalf("AppendBlockHashesMM: %v allocs per run", n)
	}
}
