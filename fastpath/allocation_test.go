//go:build !race

package fastpath

import (
	"strings"
	"testing"
)

func TestApproxAllocations(t *testing.T) {
	text := []byte(strings.Repeat("x", 4096))
	dst := make([]uint64, 0, 64)
	seed := ApproxSeed(42)
	if n := testing.AllocsPerRun(50, func() { dst = AppendApproxHashes(dst[:0], seed, text, DefaultApproxChunkBytes) }); n != 0 {
		t.Fatalf("AppendApproxHashes made %v allocations", n)
	}
	if n := testing.AllocsPerRun(50, func() { _ = ApproxSeed(7) }); n != 0 {
		t.Fatalf("ApproxSeed made %v allocations", n)
	}
}
