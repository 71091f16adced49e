package radix

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/kvfast/kvfast/workers"
)

// model is the reference the index must agree with: a plain map from block
// hash to worker set.
type model map[uint64]workers.Set

func (m model) findMatches(hashes []uint64) (workers.Overlaps, workers.Set) {
	var out workers.Overlaps
	active := workers.AllSlots
	var matched workers.Set
	for i, h := range hashes {
		next := active & m[h]
		if i == 0 {
			matched = next
		}
		for w := range (active &^ next).All() {
			out[w] = uint32(i)
		}
		active = next
		if active == 0 {
			return out, matched
		}
	}
	for w := range active.All() {
		out[w] = uint32(len(hashes))
	}
	if len(hashes) == 0 {
		out = workers.Overlaps{}
	}
	return out, matched
}

func newTestIndex(t testing.TB, cfg Config) *Index {
	t.Helper()
	ix, err := NewHeap(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

// chains returns n prompts of length blocks, sharing prefixes the way real
// traffic does: each prompt forks from a random earlier one at a random block.
// The hashes are real chained block hashes of random tokens, so they carry
// the group structure the index places by.
func chains(r *rand.Rand, n, length int) [][]uint64 {
	out := make([][]uint64, n)
	for i := range out {
		p := make([]uint64, 0, length)
		if i > 0 {
			src := out[r.IntN(i)]
			p = append(p, src[:r.IntN(length+1)]...)
		}
		out[i] = extendChain(r, testSeed, p, length-len(p))
	}
	return out
}

var testSeed = NamespaceSeed("test-model", "", "")

// extendChain appends n blocks of random tokens to the chain p (whose first
// block's parent is seed) and returns it.
func extendChain(r *rand.Rand, seed uint64, p []uint64, n int) []uint64 {
	parent := seed
	if len(p) > 0 {
		parent = p[len(p)-1]
	}
	var tokens [DefaultBlockSize]uint32
	for range n {
		for k := range tokens {
			tokens[k] = r.Uint32()
		}
		parent = ChainBlockHash(parent, tokens[:])
		p = append(p, parent)
	}
	return p
}

func TestIndexAgreesWithModel(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ops  int
		tiny bool // hashes from a tiny space, so collisions in home slots are the norm
		// long prompts run FindMatches' pipeline past its start-up, and
		// queries start anywhere in them, often mid-group
		long bool
	}{
		{name: "one shard", cfg: Config{Capacity: 4000, Shards: 1}, ops: 20000},
		{name: "many shards", cfg: Config{Capacity: 4000, Shards: 16}, ops: 20000},
		{name: "small hash space", cfg: Config{Capacity: 500, Shards: 2}, ops: 20000, tiny: true},
		{name: "long prompts", cfg: Config{Capacity: 6000, Shards: 4}, ops: 5000, long: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, uint64(len(tc.name))))
			ix := newTestIndex(t, tc.cfg)
			ref := model{}
			prompts := chains(r, 64, 24)
			if tc.long {
				prompts = chains(r, 16, 8*prefetchAhead/3)
			}
			if tc.tiny {
				// +2 keeps clear of 0 and 1, which the index merges with
				// 2 and 3 (storedKey) and the model would not.
				for _, p := range prompts {
					for j := range p {
						p[j] = p[j]%300 + 2
					}
				}
			}
			var got workers.Overlaps
			for op := 0; op < tc.ops; op++ {
				w := workers.Slot(r.IntN(8))
				if r.IntN(10) == 0 {
					w = workers.Slot(r.IntN(workers.Max))
				}
				p := prompts[r.IntN(len(prompts))]
				lo := r.IntN(len(p))
				hi := lo + r.IntN(len(p)-lo) + 1
				switch k := r.IntN(100); {
				case k < 45:
					ix.Stored(w, p[lo:hi])
					for _, h := range p[lo:hi] {
						ref[h] |= workers.SetOf(w)
					}
				case k < 85:
					ix.Removed(w, p[lo:hi])
					for _, h := range p[lo:hi] {
						if ref[h] &^= workers.SetOf(w); ref[h] == 0 {
							delete(ref, h)
						}
					}
				case k < 88:
					ix.Cleared(w)
					for h := range ref {
						if ref[h] &^= workers.SetOf(w); ref[h] == 0 {
							delete(ref, h)
						}
					}
				default:
					ix.RemoveWorker(w)
					for h := range ref {
						if ref[h] &^= workers.SetOf(w); ref[h] == 0 {
							delete(ref, h)
						}
					}
				}
				q := prompts[r.IntN(len(prompts))]
				q = q[:r.IntN(len(q)+1)]
				if tc.long {
					q = q[r.IntN(len(q)+1):]
				}
				gotSet := ix.FindMatches(q, &got)
				want, wantSet := ref.findMatches(q)
				if got != want || gotSet != wantSet {
					t.Fatalf("op %d: FindMatches disagrees with the model\n got %v %b\nwant %v %b", op, got, gotSet, want, wantSet)
				}
			}
			if st := ix.Stats(); st.Overflow != 0 {
				t.Fatalf("overflow %d in a test sized to avoid it", st.Overflow)
			} else if st.Entries != uint64(len(ref)) {
				t.Fatalf("index holds %d entries, model %d", st.Entries, len(ref))
			}
			if err := ix.Verify(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestFindMatchesAcrossTableEnd: a run guess after a table's last slot is
// its first, and a group whose slots wrap there is found whole.
func TestFindMatchesAcrossTableEnd(t *testing.T) {
	tb := &newTestIndex(t, Config{Capacity: 64, Shards: 2}).shards[1].blocks
	if run := tb.runFrom(tb.n - 1); run.next != tb.at(0) {
		t.Fatalf("the run after slot %d guesses %p, not slot 0 at %p", tb.n-1, run.next, tb.at(0))
	}
	r := rand.New(rand.NewPCG(8, 8))
	for attempt := 0; attempt < 100000; attempt++ {
		ix := newTestIndex(t, Config{Capacity: 64, Shards: 1})
		p := extendChain(r, testSeed, nil, groupSize)
		tb := &ix.shards[0].blocks
		if tb.groupBase(storedKey(p[0])) < tb.n-groupSize/2 {
			continue
		}
		ix.Stored(3, p)
		var out workers.Overlaps
		if set := ix.FindMatches(p, &out); set != workers.SetOf(3) || out[3] != groupSize {
			t.Fatalf("set %b, overlap %d of %d", set, out[3], groupSize)
		}
		if last, i, _ := ix.findBlock(storedKey(p[groupSize-1])); last != tb || i >= groupSize {
			t.Fatalf("the group's last block is in slot %d of %d: the group did not wrap", i, tb.n)
		}
		return
	}
	t.Fatal("no chain's group started near the table's end")
}

func TestFindMatchesIsContiguousPrefix(t *testing.T) {
	ix := newTestIndex(t, Config{Capacity: 1000})
	h := []uint64{10, 11, 12, 13, 14}
	ix.Stored(0, h)                        // whole prompt
	ix.Stored(1, h[:2])                    // prefix of two
	ix.Stored(2, h[1:])                    // everything but the first block: no prefix at all
	ix.Stored(3, []uint64{10, 11, 13, 14}) // a gap at block 2
	var out workers.Overlaps
	set := ix.FindMatches(h, &out)
	want := workers.Overlaps{0: 5, 1: 2, 3: 2}
	if out != want {
		t.Fatalf("overlaps %v, want %v", out[:4], want[:4])
	}
	if set != workers.SetOf(0)|workers.SetOf(1)|workers.SetOf(3) {
		t.Fatalf("matched set %b", set)
	}
}

func TestOverflowIsCountedAndRoutingGoesOn(t *testing.T) {
	ix := newTestIndex(t, Config{Capacity: 100, Shards: 1})
	limit := int(ix.geo.blockLimit)
	hashes := make([]uint64, limit+50)
	for i := range hashes {
		hashes[i] = uint64(i)*0x9e3779b97f4a7c15 + 12345
	}
	ix.Stored(5, hashes)
	st := ix.Stats()
	if st.Entries != uint64(limit) || st.Overflow != 50 {
		t.Fatalf("entries %d overflow %d, want %d and 50", st.Entries, st.Overflow, limit)
	}
	var out workers.Overlaps
	ix.FindMatches(hashes, &out)
	if out[5] != uint32(limit) {
		t.Fatalf("overlap %d, want the %d stored blocks", out[5], limit)
	}
	// Freeing room lets new stores in again.
	ix.Removed(5, hashes[:10])
	ix.Stored(6, hashes[limit:limit+10])
	if st := ix.Stats(); st.Entries != uint64(limit) || st.Overflow != 50 {
		t.Fatalf("after reclaim: entries %d overflow %d", st.Entries, st.Overflow)
	}
	if err := ix.Verify(); err != nil {
		t.Fatal(err)
	}
}

// Churn far beyond capacity must leave the table as short-probed as a fresh
// one: deletion leaves no tombstones to pile up.
func TestChurnDoesNotDegrade(t *testing.T) {
	ix := newTestIndex(t, Config{Capacity: 2000, Shards: 2})
	r := rand.New(rand.NewPCG(7, 7))
	var live []uint64
	for i := 0; i < 200_000; i++ {
		if len(live) < 1500 || r.IntN(2) == 0 {
			h := r.Uint64()
			ix.Stored(workers.Slot(r.IntN(4)), []uint64{h})
			live = append(live, h)
			continue
		}
		k := r.IntN(len(live))
		h := live[k]
		live[k] = live[len(live)-1]
		live = live[:len(live)-1]
		for w := workers.Slot(0); w < 4; w++ {
			ix.Removed(w, []uint64{h})
		}
	}
	if st := ix.Stats(); st.Overflow != 0 || st.Entries != uint64(len(live)) {
		t.Fatalf("after churn: entries %d (want %d), overflow %d", st.Entries, len(live), st.Overflow)
	}
	if err := ix.Verify(); err != nil {
		t.Fatal(err)
	}
	// Mean probe length of a miss stays what linear probing promises at
	// this load (~ (1+1/(1-a)^2)/2, under 10 at a <= 3/4) for each of the
	// two probes a miss makes, never the whole table.
	probes := 0
	for i := 0; i < 10000; i++ {
		probes += missProbeLength(ix, storedKey(r.Uint64()))
	}
	if mean := float64(probes) / 10000; mean > 20 {
		t.Fatalf("mean miss probe length %.1f after churn", mean)
	}
}

// missProbeLength is how many occupied slots a lookup of the absent key
// examines: its near window up to the first empty slot, then, if the spill
// count sends it there, its spill path.
func missProbeLength(ix *Index, key uint64) int {
	n := 0
	tb := &ix.nearShard(key).blocks
	j := tb.home(key)
	for range tb.window {
		if tb.at(j).key.Load() == emptyKey {
			break
		}
		n++
		j = tb.next(j)
	}
	if tb.counts.get(tb.self, tb.home(key)) == 0 {
		return n
	}
	sb := &ix.spillShard(key).blocks
	for j := sb.spillHome(key); sb.at(j).key.Load() != emptyKey; j = sb.next(j) {
		n++
	}
	return n
}

func TestEngineHashMap(t *testing.T) {
	ix := newTestIndex(t, Config{Capacity: 1000})
	for w := workers.Slot(0); w < 4; w++ {
		for e := uint64(0); e < 100; e++ { // sequential engine hashes, the worst case for a naive map
			if !ix.MapEngineHash(w, e, e*1000+uint64(w)) {
				t.Fatal("map full")
			}
		}
	}
	if kv, ok := ix.LookupEngineHash(2, 57); !ok || kv != 57002 {
		t.Fatalf("lookup = %d %v", kv, ok)
	}
	if kv, ok := ix.UnmapEngineHash(3, 9); !ok || kv != 9003 {
		t.Fatalf("unmap = %d %v", kv, ok)
	}
	if _, ok := ix.LookupEngineHash(3, 9); ok {
		t.Fatal("mapping survived unmap")
	}
	if _, ok := ix.UnmapEngineHash(3, 9); ok {
		t.Fatal("unmapped twice")
	}
	ix.RemoveWorker(1)
	if _, ok := ix.LookupEngineHash(1, 5); ok {
		t.Fatal("RemoveWorker kept a mapping")
	}
	if kv, ok := ix.LookupEngineHash(0, 5); !ok || kv != 5000 {
		t.Fatal("RemoveWorker of slot 1 dropped slot 0's mapping")
	}
	st := ix.Stats()
	if st.EngineMapEntries != 299 || st.UnresolvedRemovals != 1 {
		t.Fatalf("map entries %d unresolved %d", st.EngineMapEntries, st.UnresolvedRemovals)
	}
	if err := ix.Verify(); err != nil {
		t.Fatal(err)
	}
}

// TestClearedAllDropsMappings: an engine's own clear takes its blocks and
// its mappings, so rounds of storing and clearing (an engine reset after
// every weight sync) leave the engine map as empty as they found it;
// Cleared, the router's resync, keeps the mappings; neither touches
// another worker's, nor the worker's KV-cache groups.
func TestClearedAllDropsMappings(t *testing.T) {
	ix := newTestIndex(t, Config{Capacity: 1000})
	ix.SetHybrid(1, &Hybrid{N: 2, Groups: [MaxGroups]GroupSpec{{Kind: FullAttention}, {Kind: Windowed, WindowBlocks: 4}}})
	ix.MapEngineHash(2, 7, 7002)
	ix.Stored(2, []uint64{7002})
	for round := range 5 {
		for e := uint64(0); e < 300; e++ {
			kv := uint64(round)<<32 | e
			if !ix.MapEngineHash(1, e+uint64(round)*1000, kv) {
				t.Fatalf("round %d: the engine map is full", round)
			}
			ix.Stored(1, []uint64{kv})
		}
		if round == 0 {
			ix.Cleared(1)
			if _, ok := ix.LookupEngineHash(1, 5); !ok || ix.Stats().WorkerBlocks[1] != 0 {
				t.Fatal("Cleared dropped a mapping, or kept a block")
			}
		}
		ix.ClearedAll(1)
	}
	st := ix.Stats()
	if st.EngineMapEntries != 1 || st.WorkerBlocks[1] != 0 || st.WorkerBlocks[2] != 1 {
		t.Fatalf("after the rounds: map entries %d, worker 1 blocks %d, worker 2 blocks %d", st.EngineMapEntries, st.WorkerBlocks[1], st.WorkerBlocks[2])
	}
	if h := ix.hybrid[1].Load(); h == nil || h.N != 2 {
		t.Fatalf("ClearedAll dropped the worker's groups: %+v", h)
	}
	if err := ix.Verify(); err != nil {
		t.Fatal(err)
	}
}

// TestClearedAllFindsMappingsItDidNotMake: forgetting a worker scans only
// the shards this process mapped it into since it last forgot it, but an
// index opened on a region another process wrote (a router taking over a
// warm segment) scans them all the first time.
func TestClearedAllFindsMappingsItDidNotMake(t *testing.T) {
	ix := newTestIndex(t, Config{Capacity: 1000})
	for e := uint64(0); e < 300; e++ {
		ix.MapEngineHash(1, e, 1000+e)
	}
	successor := open(ix.region, ix.geo)
	successor.ClearedAll(1)
	if st := ix.Stats(); st.EngineMapEntries != 0 {
		t.Fatalf("%d mappings left by the first forget of the worker", st.EngineMapEntries)
	}
	successor.MapEngineHash(1, 7, 7000)
	successor.ClearedAll(1)
	if _, ok := ix.LookupEngineHash(1, 7); ok {
		t.Fatal("a mapping made after the worker was forgotten outlived the next forget")
	}
}

func TestAttachRefusesBadRegions(t *testing.T) {
	cfg := Config{Capacity: 1000, Shards: 4}
	size, err := RegionSize(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fresh := func() []byte {
		r := alignedHeap(size)
		if _, err := Format(r, cfg); err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, tc := range []struct {
		name  string
		spoil func([]byte) []byte
		field string
	}{
		{"truncated", func(b []byte) []byte { return b[:size-1] }, "size"},
		{"shorter than header", func(b []byte) []byte { return b[:10] }, "size"},
		{"bad magic", func(b []byte) []byte { b[0] = 'X'; return b }, "magic"},
		{"wrong version", func(b []byte) []byte { b[8] = 99; return b }, "version"},
		{"flipped size bit", func(b []byte) []byte { b[20] ^= 1; return b }, "checksum"},
		{"zeroed", func(b []byte) []byte { clear(b); return b }, "magic"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Attach(tc.spoil(fresh()))
			var ce *CorruptError
			if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Attach = %v, want a *CorruptError", err)
			}
			if ce.Field != tc.field {
				t.Fatalf("refused on %q, want %q: %v", ce.Field, tc.field, err)
			}
		})
	}
	t.Run("good region attaches warm", func(t *testing.T) {
		r := fresh()
		ix, _ := Attach(r)
		ix.Stored(3, []uint64{1, 2, 3})
		again, err := Attach(r)
		if err != nil {
			t.Fatal(err)
		}
		var out workers.Overlaps
		again.FindMatches([]uint64{1, 2, 3}, &out)
		if out[3] != 3 {
			t.Fatalf("reattached index lost blocks: %v", out[3])
		}
	})
}

func TestRepairAfterInterruptedShift(t *testing.T) {
	ix := newTestIndex(t, Config{Capacity: 1000, Shards: 1})
	hashes := make([]uint64, 200)
	for i := range hashes {
		hashes[i] = uint64(i)*0x9e3779b97f4a7c15 | 7
	}
	ix.Stored(1, hashes)
	// Forge the state a writer dying inside deleteAt leaves: one slot parked
	// busy, one key duplicated further down its cluster, an odd move sequence.
	tb := &ix.shards[0].blocks
	var dupFrom uint32 = notFound
	for i := uint32(0); i < tb.n; i++ {
		if tb.at(i).key.Load() != emptyKey && tb.at(tb.next(i)).key.Load() == emptyKey {
			dupFrom = i
			break
		}
	}
	s := tb.at(dupFrom)
	d := tb.at(tb.next(dupFrom))
	d.val.Store(s.val.Load())
	d.key.Store(s.key.Load())
	var busy uint32
	for busy = 0; tb.at(busy).key.Load() != emptyKey; busy++ {
	}
	tb.at(busy).key.Store(busyKey)
	tb.moveSeq.Add(1)
	if ix.Verify() == nil {
		t.Fatal("Verify accepted a broken table")
	}
	if n, err := ix.Repair(context.Background(), RepairOptions{}); err != nil || n != 2 {
		t.Fatalf("Repair dropped %d slots (%v), want 2", n, err)
	}
	if err := ix.Verify(); err != nil {
		t.Fatal(err)
	}
	var out workers.Overlaps
	ix.FindMatches(hashes, &out)
	if out[1] != 200 {
		t.Fatalf("overlap %d after repair, want 200", out[1])
	}
}

func TestApproxExpires(t *testing.T) {
	a, err := NewApprox(Config{Capacity: 100}, 10e9)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time0()
	h := []uint64{101, 102, 103}
	a.Insert(4, h, t0)
	a.Insert(4, h[:1], t0.Add(5e9)) // refresh block 1 only
	var out workers.Overlaps
	if a.FindMatches(h, &out); out[4] != 3 {
		t.Fatalf("overlap %d right after insert", out[4])
	}
	a.Expire(t0.Add(10e9)) // first insert's records expire; block 1 still referenced
	if a.FindMatches(h, &out); out[4] != 1 {
		t.Fatalf("overlap %d after partial expiry, want 1", out[4])
	}
	a.Expire(t0.Add(15e9))
	if a.FindMatches(h, &out); out[4] != 0 || a.Len() != 0 {
		t.Fatalf("overlap %d, %d records after full expiry", out[4], a.Len())
	}
	if st := a.ix.Stats(); st.Entries != 0 || st.EngineMapEntries != 0 {
		t.Fatalf("leftovers after expiry: %+v", st.Entries)
	}
}

func TestApproxFindMatchesForOnlyTouchesItsWorkers(t *testing.T) {
	a, err := NewApprox(Config{Capacity: 100}, 10e9)
	if err != nil {
		t.Fatal(err)
	}
	h := []uint64{101, 102, 103}
	a.Insert(4, h, time0())
	a.Insert(5, h[:2], time0())
	// What an event-fed lookup left: worker 5 caches all three per its
	// events; workers 4 and 7 publish none, so only the history knows
	// what they have, and the longer of the two answers stands.
	out := workers.Overlaps{5: 3, 6: 1, 7: 2}
	a.FindMatchesFor(workers.SetOf(4)|workers.SetOf(7), h, &out)
	want := workers.Overlaps{4: 3, 5: 3, 6: 1, 7: 2}
	if out != want {
		t.Fatalf("overlaps %v, want %v", out[:8], want[:8])
	}
	a.FindMatchesFor(0, h, &out)
	if out != want {
		t.Fatalf("an empty set changed the overlaps to %v", out[:8])
	}
}

// TestApproxForget: a worker whose engine changed keeps no assumption;
// the others keep theirs, and its old records expire without touching
// what is recorded for its new engine.
func TestApproxForget(t *testing.T) {
	a, err := NewApprox(Config{Capacity: 100}, 10e9)
	if err != nil {
		t.Fatal(err)
	}
	h := []uint64{101, 102, 103}
	a.Insert(4, h, time0())
	a.Insert(5, h, time0())
	a.Forget(4)
	var out workers.Overlaps
	if a.FindMatches(h, &out); out[4] != 0 || out[5] != 3 {
		t.Fatalf("after Forget(4): overlaps %v", out[:6])
	}
	a.Insert(4, h[:2], time0().Add(5e9)) // the new engine
	a.Expire(time0().Add(10e9))          // the old engine's records, and worker 5's, expire
	if a.FindMatches(h, &out); out[4] != 2 || out[5] != 0 {
		t.Fatalf("after the old records expired: overlaps %v", out[:6])
	}
	a.Expire(time0().Add(15e9))
	if st := a.ix.Stats(); a.Len() != 0 || st.Entries != 0 || st.EngineMapEntries != 0 {
		t.Fatalf("leftovers: %d records, %+v", a.Len(), st)
	}
	if err := a.ix.Verify(); err != nil {
		t.Fatal(err)
	}
}

func TestApproxEvictsOldestWhenFull(t *testing.T) {
	a, err := NewApprox(Config{Capacity: 50, Shards: 1}, 1e12)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time0()
	for i := uint64(0); i < 80; i++ {
		a.Insert(workers.Slot(i%3), []uint64{i + 100}, t0)
	}
	if a.Len() != 50 {
		t.Fatalf("%d records, want the 50 it holds", a.Len())
	}
	if a.ix.Lookup(100) != 0 || a.ix.Lookup(179) == 0 {
		t.Fatal("oldest assumption kept or newest dropped")
	}
	if err := a.ix.Verify(); err != nil {
		t.Fatal(err)
	}
}

// TestRepeatedResyncsDoNotFillTheEngineMap: the router's resync keeps a
// worker's mappings, including those of blocks whose removals were lost
// with the events it stands for; a worker that keeps losing events must
// not fill the map with them. Once the map is half full, a resync drops
// the worker's mappings, and no store is ever refused.
func TestRepeatedResyncsDoNotFillTheEngineMap(t *testing.T) {
	ix := newTestIndex(t, Config{Capacity: 1000})
	capacity := ix.Stats().EngineMapCapacity
	per := capacity / 8 // mappings a round adds, none of them removed
	for round := range uint64(40) {
		for e := range per {
			kv := round<<32 | e
			if !ix.MapEngineHash(1, round<<32|e, kv) {
				t.Fatalf("round %d: the engine map refused a mapping at %d entries of %d", round, ix.Stats().EngineMapEntries, capacity)
			}
			ix.Stored(1, []uint64{kv})
		}
		before := ix.Stats().EngineMapEntries
		ix.Cleared(1)
		after := ix.Stats().EngineMapEntries
		switch {
		case before <= capacity/2 && after != before:
			t.Fatalf("round %d: a resync with the map %d/%d full dropped mappings (%d left)", round, before, capacity, after)
		case before > capacity/2 && after != 0:
			t.Fatalf("round %d: a resync with the map %d/%d full kept %d mappings", round, before, capacity, after)
		}
	}
	if st := ix.Stats(); st.EngineMapOverflow != 0 || st.WorkerBlocks[1] != 0 {
		t.Fatalf("overflow %d, blocks %d", st.EngineMapOverflow, st.WorkerBlocks[1])
	}
	if err := ix.Verify(); err != nil {
		t.Fatal(err)
	}
}
