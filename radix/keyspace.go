package radix

import "github.com/kvfast/kvfast/workers"

// A worker holds a block in one of several keyspaces: on the GPU or on a
// lower tier (host memory, storage), and, in a hybrid model, in each of
// its KV-cache groups. The index keeps them apart without a field of its
// own: a block held in keyspace (group, tier) is stored under
// KeyspaceHash(h, group, tier), which is h itself for group 0 on the GPU,
// and otherwise h with its group and fresh bits flipped by a constant of
// that keyspace. The counter bits are kept, so a keyspace's blocks still
// sit side by side as a prompt's groups of eight, and lookups and writers
// need no change. Engine hashes are mapped per keyspace the same way
// (KeyspaceHash of the engine hash), so that evicting a block from one
// tier or group leaves its other copies removable.

// MaxGroups bounds the KV-cache groups of a hybrid model that the index
// tells apart. vLLM splits a model's layers into groups of equal size, one
// or a few per attention kind (Gemma 3: one full-attention group and five
// sliding-window ones); events of higher groups are skipped by the feed.
const MaxGroups = 16

// KeyspaceHash returns the key under which a block with hash h is held in
// KV-cache group group (0 ≤ group < MaxGroups) on tier tier. It is a
// bijection for each keyspace, and the identity for group 0 on the GPU.
func KeyspaceHash(h uint64, group int, tier workers.Tier) uint64 {
	id := uint64(group)*uint64(workers.Tiers) + uint64(tier)
	if id == 0 {
		return h
	}
	return h ^ mix64(id*0x9e3779b97f4a7c15)&^(counterMask<<counterShift)
}

// GroupKind says which blocks of a prefix a KV-cache group must hold for
// the engine to reuse the prefix.
type GroupKind uint8

const (
	// FullAttention needs every block of the prefix. A kind the feed does
	// not know is taken as this, the strictest rule, so that it can only
	// under-claim.
	FullAttention GroupKind = iota
	// Windowed needs only the WindowBlocks blocks before the prefix's end
	// (sliding-window attention), or every block of a prefix shorter than
	// that. A state-space (mamba) group, whose cache is the state at a
	// block's end, is Windowed with one block.
	Windowed
)

// GroupSpec is one KV-cache group of a hybrid model.
type GroupSpec struct {
	Kind         GroupKind
	WindowBlocks int // Windowed: blocks before the prefix's end that must be held, ≥ 1
}

// Hybrid describes a worker whose model has KV-cache groups beyond group
// 0. FindMatches walks group 0 as for any model, and then shortens each
// hybrid worker's match to the longest prefix its other groups can serve
// (clampHybrid).
type Hybrid struct {
	Groups [MaxGroups]GroupSpec // Groups[0] is the group FindMatches walks
	N      int                  // groups in use, 2 ≤ N ≤ MaxGroups
}

// SetHybrid records that worker w serves a hybrid model with the groups
// in h, or, with h nil, that it does not. The description is process
// local: the feed that learns it from the engine's events sets it, and
// every FindMatches of this process then holds w to it. Safe from any
// goroutine.
func (ix *Index) SetHybrid(w workers.Slot, h *Hybrid) {
	ix.checkSlot(w)
	ix.hybridMu.Lock()
	defer ix.hybridMu.Unlock()
	ix.hybrid[w].Store(h)
	set := workers.Set(ix.hybridSet.Load())
	if h != nil {
		set |= workers.SetOf(w)
	} else {
		set &^= workers.SetOf(w)
	}
	ix.hybridSet.Store(uint64(set))
}

// clampHybrid shortens, for every hybrid worker in matched, out[w] to the
// longest prefix the engine can reuse: one whose blocks every
// full-attention group holds, and whose last WindowBlocks blocks every
// windowed group holds (vLLM's HybridKVCacheCoordinator, which shrinks the
// hit until every group agrees). Each group's condition holds for a
// prefix only if it holds there, so shrinking until none objects ends at
// the longest prefix all accept. It returns the workers still matched.
func (ix *Index) clampHybrid(hashes []uint64, out *workers.Overlaps, matched workers.Set) workers.Set {
	for w := range (matched & workers.Set(ix.hybridSet.Load())).All() {
		h := ix.hybrid[w].Load()
		if h == nil {
			continue
		}
		n := out[w]
		for changed := true; changed && n > 0; {
			changed = false
			for g := 1; g < h.N; g++ {
				var m uint32
				switch spec := h.Groups[g]; spec.Kind {
				case Windowed:
					m = ix.windowEnd(hashes, w, g, n, spec.WindowBlocks)
				default:
					m = ix.groupPrefix(hashes, w, g, n)
				}
				if m < n {
					n, changed = m, true
				}
			}
		}
		out[w] = n
		if n == 0 {
			matched &^= workers.SetOf(w)
		}
	}
	return matched
}

// groupPrefix returns how many of the first n blocks worker w holds in
// group g without a gap.
func (ix *Index) groupPrefix(hashes []uint64, w workers.Slot, g int, n uint32) uint32 {
	var run runCursor
	for i := range n {
		if !ix.resolve(KeyspaceHash(hashes[i], g, workers.TierGPU), &run).Has(w) {
			return i
		}
	}
	return n
}

// windowEnd returns the longest prefix of at most n blocks whose last
// window blocks worker w holds in group g, or whose blocks it holds all
// of when the prefix is shorter than the window. It scans backwards from
// n, as vLLM's SlidingWindowManager does: a missing block at i moves the
// candidate end to i and starts counting again.
func (ix *Index) windowEnd(hashes []uint64, w workers.Slot, g int, n uint32, window int) uint32 {
	end, run := n, 0
	var cur runCursor
	for i := int(n) - 1; i >= 0; i-- {
		if !ix.resolve(KeyspaceHash(hashes[i], g, workers.TierGPU), &cur).Has(w) {
			end, run = uint32(i), 0
			continue
		}
		if run++; run >= window {
			return end
		}
	}
	return end
}
