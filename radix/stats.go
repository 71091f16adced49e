package radix

import (
	"errors"
	"fmt"

	"github.com/kvfast/kvfast/workers"
)

// Stats is a point-in-time summary of an index, for metrics and inspect.
// Counters are read without stopping writers, so under load the fields
// may be mutually off by the few operations in flight.
type Stats struct {
	Capacity           uint64 // configured distinct blocks
	Entries            uint64 // distinct blocks held
	Overflow           uint64 // stores refused because a shard was full
	EngineMapCapacity  uint64
	EngineMapEntries   uint64
	EngineMapOverflow  uint64
	UnresolvedRemovals uint64 // removals whose engine hash had no mapping
	RegionBytes        int
	BlockTableBytes    int // bytes of the block table alone
	EngineMapBytes     int // bytes of the engine map alone
	Shards             []ShardStats
	WorkerBlocks       [workers.Max]uint64 // blocks held per worker slot
	// WorkerRefused counts, per worker slot, the blocks and engine-hash
	// mappings refused for want of room: a full table, or the worker's
	// share of it (SetWorkerShare). This process's writes only; a slot's
	// count starts again when RemoveWorker frees it.
	WorkerRefused [workers.Max]uint64
}

// ShardStats describes one shard.
type ShardStats struct {
	Entries, Limit, Slots, Overflow   uint64
	MapEntries, MapLimit, MapOverflow uint64
}

// Stats gathers the counters of every shard.
func (ix *Index) Stats() Stats {
	g := ix.geo
	st := Stats{
		Capacity:          g.capacity,
		EngineMapCapacity: g.mapCapacity,
		RegionBytes:       g.size,
		BlockTableBytes:   int(g.shards) * int(g.blockSlots) * slotSize,
		EngineMapBytes:    int(g.shards) * int(g.mapSlots) * slotSize,
		Shards:            make([]ShardStats, len(ix.shards)),
	}
	for i := range ix.shards {
		m := ix.shards[i].meta
		ss := ShardStats{
			Entries: m.blockLive.Load(), Limit: uint64(g.blockLimit), Slots: uint64(g.blockSlots),
			Overflow:   m.blockOverflow.Load(),
			MapEntries: m.mapLive.Load(), MapLimit: uint64(g.mapLimit), MapOverflow: m.mapOverflow.Load(),
		}
		st.Shards[i] = ss
		st.Entries += ss.Entries
		st.Overflow += ss.Overflow
		st.EngineMapEntries += ss.MapEntries
		st.EngineMapOverflow += ss.MapOverflow
		st.UnresolvedRemovals += m.unresolvedRemovals.Load()
		for w := range m.workerBlocks {
			st.WorkerBlocks[w] += uint64(m.workerBlocks[w].Load())
		}
	}
	for w := range ix.refused {
		st.WorkerRefused[w] = ix.refused[w].Load()
	}
	return st
}

// Verify checks the index's structural invariants: every entry is where
// a reader finds it (reachable, and no earlier copy hides it), belongs in
// its shard, has a non-empty worker set, and the live, per-worker and
// spill counters agree with the slots. It takes every shard's writer lock,
// so it sees a quiescent index; readers go on. It is for tests, fuzzing and
// `kvfast inspect --verify`; builds with internal/invariants enabled also
// run it after writes, sampled (see wrote).
func (ix *Index) Verify() error {
	ix.lockAll()
	defer ix.unlockAll()
	var errs []error
	for si := range ix.shards {
		sh := &ix.shards[si]
		var perWorker [workers.Max]uint64
		if err := ix.verifyBlocks(sh, &perWorker); err != nil {
			errs = append(errs, fmt.Errorf("shard %d block table: %w", si, err))
		}
		for w := range perWorker {
			if got := uint64(sh.meta.workerBlocks[w].Load()); got != perWorker[w] {
				errs = append(errs, fmt.Errorf("shard %d worker %d: counter %d, table holds %d", si, w, got, perWorker[w]))
			}
		}
		if err := sh.engine.verifyMap(); err != nil {
			errs = append(errs, fmt.Errorf("shard %d engine map: %w", si, err))
		}
	}
	counts := ix.countSpills()
	for si := range ix.shards {
		t := &ix.shards[si].blocks
		for b, n := range counts[si] {
			// A spill count may exceed the truth (see spillCounts.add), never fall short.
			if got := t.counts.get(t.self, uint32(b)*spillSpan); got < n {
				errs = append(errs, fmt.Errorf("shard %d: spill count of homes %d-%d is %d, %d entries spilled from there",
					si, b*spillSpan, b*spillSpan+spillSpan-1, got, n))
			}
		}
	}
	return errors.Join(errs...)
}

func (ix *Index) lockAll() {
	for i := range ix.shards {
		ix.shards[i].mu.Lock()
	}
}

func (ix *Index) unlockAll() {
	for i := range ix.shards {
		ix.shards[i].mu.Unlock()
	}
}

// findBlock is what a reader finds for key: the table and slot, or false.
// Writer, holding the locks of the key's near and spill shards.
func (ix *Index) findBlock(key uint64) (*table, uint32, bool) {
	a := &ix.nearShard(key).blocks
	home := a.home(key)
	if i, found := a.scan(key, home, a.window); found {
		return a, i, true
	}
	if a.counts.get(a.self, home) == 0 {
		return nil, notFound, false
	}
	b := &ix.spillShard(key).blocks
	if j, found := b.scan(key, b.spillHome(key), b.n); found {
		return b, j, true
	}
	return nil, notFound, false
}

// belongs reports whether the block key may live in shard si at all.
func (ix *Index) belongs(key uint64, si uint64) bool {
	m := ix.geo.shardMask
	return nearShard(key, m) == si || spillShard(key, m) == si
}

func (ix *Index) verifyBlocks(sh *shard, perWorker *[workers.Max]uint64) error {
	t := &sh.blocks
	var live uint64
	for i := uint32(0); i < t.n; i++ {
		s := t.at(i)
		k := s.key.Load()
		if k == emptyKey {
			if v := s.val.Load(); v != 0 {
				// A worker scan reads the value, not the key: it would
				// take these bits for blocks.
				return fmt.Errorf("empty slot %d holds value %#x", i, v)
			}
			continue
		}
		if k == busyKey {
			return fmt.Errorf("slot %d left busy", i)
		}
		live++
		if !ix.belongs(k, t.self) {
			return fmt.Errorf("slot %d: key %#x belongs to shards %d and %d", i, k, nearShard(k, t.mask), spillShard(k, t.mask))
		}
		switch ft, j, found := ix.findBlock(k); {
		case !found:
			return fmt.Errorf("slot %d: key %#x unreachable by its near and spill probes", i, k)
		case ft != t || j != i:
			return fmt.Errorf("key %#x in slot %d of shard %d and slot %d of shard %d", k, j, ft.self, i, t.self)
		}
		v := s.val.Load()
		if v == 0 {
			return fmt.Errorf("slot %d: entry with no worker", i)
		}
		for w := range (workers.Set(v)).All() {
			perWorker[w]++
		}
	}
	return t.verifyCounters(live)
}

func (t *table) verifyCounters(live uint64) error {
	if got := t.live.Load(); got != live {
		return fmt.Errorf("live counter %d, table holds %d", got, live)
	}
	if live > uint64(t.limit) {
		return fmt.Errorf("%d live entries over the limit %d", live, t.limit)
	}
	return nil
}

func (t *table) verifyMap() error {
	var live uint64
	for i := uint32(0); i < t.n; i++ {
		k := t.at(i).key.Load()
		switch {
		case k == emptyKey:
			if v := t.at(i).val.Load(); v != 0 {
				return fmt.Errorf("empty slot %d holds value %#x", i, v)
			}
			continue
		case k == busyKey:
			return fmt.Errorf("slot %d left busy", i)
		case mapShard(k, t.mask) != t.self:
			return fmt.Errorf("slot %d: key %#x belongs to shard %d", i, k, mapShard(k, t.mask))
		}
		live++
		switch j, found := t.find(k); {
		case !found:
			return fmt.Errorf("slot %d: key %#x unreachable, empty slot on its probe path", i, k)
		case j != i:
			return fmt.Errorf("key %#x in slots %d and %d", k, j, i)
		}
	}
	return t.verifyCounters(live)
}

// countSpills counts, per shard and span of spill counts, the entries only
// their spill probe reaches, saturating like the counts do. One pass per
// table: an entry is near when this is its near shard and its home lies
// within the window and within the run of occupied slots that holds it.
// Writer, holding every lock.
func (ix *Index) countSpills() [][]uint32 {
	counts := make([][]uint32, len(ix.shards))
	for si := range counts {
		counts[si] = make([]uint32, (ix.geo.blockSlots+spillSpan-1)/spillSpan)
	}
	for si := range ix.shards {
		t := &ix.shards[si].blocks
		count := func(k uint64, i, runStart uint32) {
			home := t.home(k)
			if nearShard(k, t.mask) == t.self {
				if d := t.dist(home, i); d < t.window && d <= t.dist(runStart, i) {
					return
				}
			}
			c := &counts[nearShard(k, t.mask)][home/spillSpan]
			*c = min(*c+1, spillSticky)
		}
		// Start after an empty slot, so that every run is seen whole.
		e := uint32(0)
		for e < t.n && t.at(e).key.Load() != emptyKey {
			e++
		}
		runStart := t.next(e % t.n)
		for i, steps := runStart, uint32(0); steps < t.n; i, steps = t.next(i), steps+1 {
			switch k := t.at(i).key.Load(); k {
			case emptyKey:
				runStart = t.next(i)
			case busyKey:
			default:
				if e == t.n {
					// No empty slot anywhere (only a damaged region): the
					// run is the whole table, which one past i expresses.
					runStart = t.next(i)
				}
				count(k, i, runStart)
			}
		}
	}
	return counts
}

// resetSpillCounts rewrites every spill count from the slots. Writer,
// holding every lock.
func (ix *Index) resetSpillCounts() {
	counts := ix.countSpills()
	for si := range ix.shards {
		t := &ix.shards[si].blocks
		for b := 0; b < len(counts[si]); b += 4 {
			var w uint32
			for k := 0; k < 4 && b+k < len(counts[si]); k++ {
				w |= counts[si][b+k] << (8 * k)
			}
			word, _ := t.counts.word(t.self, uint32(b)*spillSpan)
			word.Store(w)
		}
	}
}
