package radix

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/kvfast/kvfast/workers"
)

// The layout rests on this: within a group, each block of a chain lands in
// the same shard as its parent, with its home one slot after the parent's.
func TestGroupHomesAreConsecutive(t *testing.T) {
	ix := newTestIndex(t, Config{Capacity: 100_000})
	r := rand.New(rand.NewPCG(5, 5))
	for _, p := range chains(r, 50, 64) {
		for i := 1; i < len(p); i++ {
			prev, key := storedKey(p[i-1]), storedKey(p[i])
			c := key >> counterShift & counterMask
			if c != uint64(i%groupSize) {
				t.Fatalf("block %d has counter %d, want %d", i, c, i%groupSize)
			}
			if c == 0 {
				continue // an anchor: a fresh group, anywhere
			}
			if ix.nearShard(prev) != ix.nearShard(key) {
				t.Fatalf("block %d left its parent's shard", i)
			}
			if tb := &ix.nearShard(key).blocks; tb.home(key) != tb.next(tb.home(prev)) {
				t.Fatalf("block %d: home %d, parent's %d", i, tb.home(key), tb.home(prev))
			}
		}
	}
}

// Stored at the table's working load, a group's eight blocks occupy about
// three cache lines, where uniform homes would scatter them over eight, and
// a block usually sits in the slot right after its parent's (the guess
// FindMatches makes).
func TestStoredGroupsStayCompact(t *testing.T) {
	const promptBlocks = 64
	r := rand.New(rand.NewPCG(6, 6))
	prompts := make([][]uint64, 3000) // unrelated prompts: siblings are the next test's business
	for i := range prompts {
		prompts[i] = extendChain(r, testSeed, nil, promptBlocks)
	}
	ix := newTestIndex(t, Config{Capacity: 200_000})
	for i, p := range prompts {
		ix.Stored(workers.Slot(i%8), p)
	}
	st := ix.Stats()
	if st.Overflow != 0 {
		t.Fatalf("overflow %d", st.Overflow)
	}
	slotOf := func(h uint64) (*table, uint32) {
		tb, i, found := ix.findBlock(storedKey(h))
		if !found {
			t.Fatalf("stored hash %#x not found", h)
		}
		return tb, i
	}
	var groups, lines, follow, followable, spilled int
	for _, p := range prompts {
		for g := 0; g+groupSize <= len(p); g += groupSize {
			seen := map[uintptr]bool{}
			for c := range groupSize {
				tb, i := slotOf(p[g+c])
				seen[uintptr(unsafe.Pointer(tb.at(i)))/64] = true
				if !tb.isNear(storedKey(p[g+c]), i) {
					spilled++
				}
				if c > 0 {
					_, prev := slotOf(p[g+c-1])
					followable++
					if tb.next(prev) == i {
						follow++
					}
				}
			}
			groups++
			lines += len(seen)
		}
	}
	load := float64(st.Entries) / float64(st.BlockTableBytes/slotSize)
	mean := float64(lines) / float64(groups)
	t.Logf("load %.2f: %.2f lines per group, %.1f%% of blocks right after their parent, %.2f%% spilled",
		load, mean, 100*float64(follow)/float64(followable), 100*float64(spilled)/float64(groups*groupSize))
	if load < 0.6 {
		t.Fatalf("load %.2f: the test should run near the table's working load", load)
	}
	if mean > 4 {
		t.Errorf("a group spans %.2f cache lines on average, want at most 4", mean)
	}
	if float64(follow) < 0.8*float64(followable) {
		t.Errorf("only %d of %d blocks sit right after their parent", follow, followable)
	}
	if float64(spilled) > 0.02*float64(groups*groupSize) {
		t.Errorf("%d of %d blocks spilled", spilled, groups*groupSize)
	}
}

// Every continuation of a shared prefix inherits its group, so thousands of
// siblings share each home of the group's remaining slots. They must not
// pile into one cluster: the window takes some, the rest spill to uniform
// homes, and no lookup scans more than the window plus a short spill run.
func TestSiblingPileUpStaysBounded(t *testing.T) {
	const siblings = 3000
	ix := newTestIndex(t, Config{Capacity: 40_000, Shards: 4})
	r := rand.New(rand.NewPCG(8, 8))
	prefix := extendChain(r, testSeed, nil, 3) // blocks 3..7 of every continuation share the group
	ref := model{}
	convs := make([][]uint64, siblings)
	for i := range convs {
		p := extendChain(r, testSeed, slices.Clone(prefix), 10)
		w := workers.Slot(i % 8)
		ix.Stored(w, p)
		for _, h := range p {
			ref[h] |= workers.SetOf(w)
		}
		convs[i] = p
	}
	if err := ix.Verify(); err != nil {
		t.Fatal(err)
	}
	var out workers.Overlaps
	for i, p := range convs {
		gotSet := ix.FindMatches(p, &out)
		want, wantSet := ref.findMatches(p)
		if out != want || gotSet != wantSet {
			t.Fatalf("conversation %d: FindMatches disagrees with the model", i)
		}
	}
	window := int(ix.shards[0].blocks.window)
	worst, total, n := 0, 0, 0
	for _, p := range convs {
		for _, h := range p[3:8] {
			l := hitProbeLength(ix, storedKey(h))
			worst = max(worst, l)
			total += l
			n++
		}
	}
	t.Logf("window %d: lookups in the pile read %.1f slots on average, %d at most", window, float64(total)/float64(n), worst)
	if limit := window + 256; worst > limit {
		t.Fatalf("a lookup in the pile reads %d slots, want at most %d", worst, limit)
	}
	// Removing everything empties the table; Repair then finds nothing to
	// drop and leaves every spill count at zero (saturated ones included).
	for i, p := range convs {
		ix.Removed(workers.Slot(i%8), p)
	}
	if st := ix.Stats(); st.Entries != 0 {
		t.Fatalf("%d entries left", st.Entries)
	}
	if err := ix.Verify(); err != nil {
		t.Fatal(err)
	}
	if n, err := ix.Repair(context.Background(), RepairOptions{}); err != nil || n != 0 {
		t.Fatalf("Repair dropped %d slots of a sound table (%v)", n, err)
	}
	for si := range ix.shards {
		b := &ix.shards[si].blocks
		for h := uint32(0); h < b.n; h += spillSpan {
			if c := b.counts.get(b.self, h); c != 0 {
				t.Fatalf("shard %d: spill count %d at slot %d of an empty table", si, c, h)
			}
		}
	}
}

// hitProbeLength is how many slots lookup reads to find the present key:
// its near window up to the key or the first empty slot, then, if the key
// was not there and the spill count allows, its spill path up to the key.
func hitProbeLength(ix *Index, key uint64) int {
	n := 0
	tb := &ix.nearShard(key).blocks
	j := tb.home(key)
	for range tb.window {
		n++
		k := tb.at(j).key.Load()
		if k == key {
			return n
		}
		if k == emptyKey {
			break
		}
		j = tb.next(j)
	}
	if tb.counts.get(tb.self, tb.home(key)) == 0 {
		return 1 << 30 // unreachable: makes the caller's bound fail loudly
	}
	sb := &ix.spillShard(key).blocks
	for j := sb.spillHome(key); ; j = sb.next(j) {
		n++
		if sb.at(j).key.Load() == key {
			return n
		}
	}
}
