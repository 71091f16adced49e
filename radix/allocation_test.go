//go:build !race && !invariants

package radix

import (
	"strings"
	"testing"

	"github.com/kvfast/kvfast/workers"
)

func TestHashBlocksAllocatesNothing(t *testing.T) {
	tokens := seqTokens(8192, 3)
	dst := make([]uint64, 0, 512)
	seed := NamespaceSeed("m", "", "")
	if n := testing.AllocsPerRun(100, func() {
		dst = AppendBlockHashes(dst[:0], seed, tokens, 16)
	}); n != 0 {
		t.Fatalf("AppendBlockHashes: %v allocs per run", n)
	}
}

func TestIndexHotPathsAllocateNothing(t *testing.T) {
	ix := newTestIndex(t, Config{Capacity: 10000})
	hashes := AppendBlockHashes(nil, 1, seqTokens(512*16, 0), 16)
	ix.Stored(0, hashes)
	ix.Stored(1, hashes[:100])
	for _, h := range hashes[100:200] {
		ix.Stored(1, []uint64{KeyspaceHash(h, 0, workers.TierHost)})
	}
	ix.SetHybrid(1, &Hybrid{N: 2, Groups: [MaxGroups]GroupSpec{1: {Kind: Windowed, WindowBlocks: 4}}})
	var out workers.Overlaps
	var lower workers.LowerTiers
	for name, fn := range map[string]func(){
		"FindMatches":       func() { ix.FindMatches(hashes, &out) },
		"FindTieredMatches": func() { ix.FindTieredMatches(hashes, &out, &lower) },
		"Lookup":            func() { ix.Lookup(hashes[7]) },
		"Stored":            func() { ix.Stored(2, hashes[:64]) },
		"Removed":           func() { ix.Removed(2, hashes[:64]) },
		"EngineMap": func() {
			ix.MapEngineHash(3, 77, 88)
			ix.LookupEngineHash(3, 77)
			ix.UnmapEngineHash(3, 77)
		},
	} {
		if n := testing.AllocsPerRun(100, fn); n != 0 {
			t.Errorf("%s: %v allocs per run", name, n)
		}
	}
	a, err := NewApprox(Config{Capacity: 10000}, 1e9)
	if err != nil {
		t.Fatal(err)
	}
	now := time0()
	if n := testing.AllocsPerRun(100, func() {
		now = now.Add(1e8)
		a.Insert(4, hashes[:32], now)
		a.FindMatches(hashes, &out)
		a.FindMatchesFor(workers.SetOf(4)|workers.SetOf(9), hashes, &out)
	}); n != 0 {
		t.Errorf("Approx: %v allocs per run", n)
	}
}

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
