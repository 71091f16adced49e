package radix

import (
	"math/rand/v2"
	"testing"

	"github.com/kvfast/kvfast/workers"
)

func TestKeyspaceHashKeepsGroupingAndSeparatesSpaces(t *testing.T) {
	hashes := AppendBlockHashes(nil, NamespaceSeed("m", "", ""), seqTokens(64*16, 1), 16)
	seen := map[uint64]bool{}
	for g := range 3 {
		for tier := workers.TierGPU; tier < workers.Tiers; tier++ {
			for i, h := range hashes {
				k := KeyspaceHash(h, g, tier)
				if g == 0 && tier == workers.TierGPU && k != h {
					t.Fatalf("group 0 on the GPU must be the plain hash")
				}
				if seen[k] {
					t.Fatalf("group %d tier %v block %d: key %#x collides with another keyspace's", g, tier, i, k)
				}
				seen[k] = true
				if k>>counterShift&counterMask != h>>counterShift&counterMask {
					t.Fatalf("group %d tier %v block %d: counter changed", g, tier, i)
				}
				if i > 0 && h>>counterShift&counterMask != 0 && (k^KeyspaceHash(hashes[i-1], g, tier))&groupMask != 0 {
					t.Fatalf("group %d tier %v block %d: left its group", g, tier, i)
				}
			}
		}
	}
}

func TestTieredMatchesCreditEveryTierOfThePrefix(t *testing.T) {
	ix := newTestIndex(t, Config{Capacity: 4096})
	hashes := AppendBlockHashes(nil, NamespaceSeed("m", "", ""), seqTokens(16*16, 2), 16)
	on := func(w workers.Slot, tier workers.Tier, from, to int) {
		for _, h := range hashes[from:to] {
			ix.Stored(w, []uint64{KeyspaceHash(h, 0, tier)})
		}
	}
	on(0, workers.TierGPU, 0, 4) // GPU 0-3, host 4-9, disk 10-11, then nothing
	on(0, workers.TierHost, 4, 10)
	on(0, workers.TierDisk, 10, 12)
	on(1, workers.TierGPU, 0, 16) // GPU everywhere, and host copies that must not count
	on(1, workers.TierHost, 0, 16)
	on(2, workers.TierHost, 0, 3) // host only, then a gap, then GPU that is not a prefix
	on(2, workers.TierGPU, 4, 16)
	on(3, workers.TierGPU, 0, 2)  // GPU 0-1, host 2-3, then GPU copies the engine would not use:
	on(3, workers.TierHost, 2, 4) // vLLM loads from its connector only after the GPU prefix
	on(3, workers.TierGPU, 4, 16)

	var out workers.Overlaps
	var lower workers.LowerTiers
	matched := ix.FindTieredMatches(hashes, &out, &lower)
	want := map[workers.Slot][3]uint32{0: {12, 6, 2}, 1: {16, 0, 0}, 2: {3, 3, 0}, 3: {4, 2, 0}}
	if matched != workers.SetOf(0)|workers.SetOf(1)|workers.SetOf(2)|workers.SetOf(3) {
		t.Fatalf("matched %b", matched)
	}
	for w, x := range want {
		if got := [3]uint32{out[w], lower.Blocks(workers.TierHost, w), lower.Blocks(workers.TierDisk, w)}; got != x {
			t.Errorf("worker %d: prefix, host, disk = %v, want %v", w, got, x)
		}
	}
	ix.FindMatches(hashes, &out)
	if out[0] != 4 || out[1] != 16 || out[2] != 0 {
		t.Errorf("FindMatches must see the GPU only: %v", out[:3])
	}
	// Evicting the host copies of worker 1 leaves its GPU blocks alone.
	for _, h := range hashes {
		ix.Removed(1, []uint64{KeyspaceHash(h, 0, workers.TierHost)})
	}
	ix.FindTieredMatches(hashes, &out, &lower)
	if out[1] != 16 {
		t.Errorf("worker 1 after its host copies went: %d", out[1])
	}
}

// hybridModel is the engine's rule by brute force: the longest l no
// longer than group 0's prefix such that every full-attention group holds
// blocks [0,l) and every windowed group blocks [max(0,l-window), l).
func hybridModel(held [][]bool, h *Hybrid) uint32 {
	prefix := 0
	for prefix < len(held[0]) && held[0][prefix] {
		prefix++
	}
	for l := prefix; l > 0; l-- {
		ok := true
		for g := 1; g < h.N && ok; g++ {
			from := 0
			if h.Groups[g].Kind == Windowed {
				from = max(0, l-h.Groups[g].WindowBlocks)
			}
			for i := from; i < l && ok; i++ {
				ok = held[g][i]
			}
		}
		if ok {
			return uint32(l)
		}
	}
	return 0
}

func TestHybridMatchesNeverOverClaim(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 9))
	const blocks = 24
	hashes := AppendBlockHashes(nil, NamespaceSeed("m", "", ""), seqTokens(blocks*16, 3), 16)
	for trial := range 400 {
		ix := newTestIndex(t, Config{Capacity: 4096})
		h := &Hybrid{N: 2 + r.IntN(3)}
		for g := 1; g < h.N; g++ {
			if r.IntN(3) > 0 {
				h.Groups[g] = GroupSpec{Kind: Windowed, WindowBlocks: 1 + r.IntN(6)}
			}
		}
		held := make([][]bool, h.N)
		for g := range held {
			held[g] = make([]bool, blocks)
			p := []float64{0.97, 0.8, 0.5}[r.IntN(3)]
			for i := range held[g] {
				if held[g][i] = r.Float64() < p; held[g][i] {
					ix.Stored(5, []uint64{KeyspaceHash(hashes[i], g, workers.TierGPU)})
				}
			}
		}
		ix.SetHybrid(5, h)
		var out workers.Overlaps
		matched := ix.FindMatches(hashes, &out)
		want := hybridModel(held, h)
		if out[5] != want {
			t.Fatalf("trial %d (%+v): matched %d blocks, the engine's rule allows %d", trial, h.Groups[:h.N], out[5], want)
		}
		if matched.Has(5) != (want > 0) {
			t.Fatalf("trial %d: matched set %b with %d blocks", trial, matched, want)
		}
	}
}

func TestHybridWindowRule(t *testing.T) {
	ix := newTestIndex(t, Config{Capacity: 4096})
	hashes := AppendBlockHashes(nil, NamespaceSeed("m", "", ""), seqTokens(10*16, 4), 16)
	ix.Stored(0, hashes) // full attention holds all ten
	for i, h := range hashes {
		if i != 6 { // the window group lost block 6 (a sliding window freed it)
			ix.Stored(0, []uint64{KeyspaceHash(h, 1, workers.TierGPU)})
		}
	}
	var out workers.Overlaps
	for _, tc := range []struct {
		window int
		want   uint32
	}{{1, 10}, {3, 10}, {4, 6}, {6, 6}, {7, 6}, {12, 6}} {
		ix.SetHybrid(0, &Hybrid{N: 2, Groups: [MaxGroups]GroupSpec{1: {Kind: Windowed, WindowBlocks: tc.window}}})
		ix.FindMatches(hashes, &out)
		if out[0] != tc.want {
			t.Errorf("window %d blocks: matched %d, want %d", tc.window, out[0], tc.want)
		}
	}
	ix.SetHybrid(0, nil)
	ix.FindMatches(hashes, &out)
	if out[0] != 10 {
		t.Errorf("no longer hybrid: matched %d, want 10", out[0])
	}
}
