package radix

import (
	"errors"
	"fmt"
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
	WorkerBlocks       [MaxWorkers]uint64 // blocks held per worker slot
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
	return st
}

// Verify checks the index's structural invariants: every entry is reachable
// from its home slot, no key appears twice, no entry has an empty worker
// set, and the live and per-worker counters match the slots. It takes every
// shard's writer lock, so it sees a quiescent table; readers go on. It is
// for tests, fuzzing and `kvfast inspect --verify`.
func (ix *Index) Verify() error {
	var errs []error
	for si := range ix.shards {
		sh := &ix.shards[si]
		sh.mu.Lock()
		var perWorker [MaxWorkers]uint64
		if err := sh.blocks.verify(uint64(si), ix.geo.shardMask, func(v uint64) error {
			if v == 0 {
				return errors.New("entry with no worker")
			}
			for s := WorkerSet(v); s != 0; {
				var w WorkerSlot
				w, s = s.First()
				perWorker[w]++
			}
			return nil
		}); err != nil {
			errs = append(errs, fmt.Errorf("shard %d block table: %w", si, err))
		}
		for w := range perWorker {
			if got := uint64(sh.meta.workerBlocks[w].Load()); got != perWorker[w] {
				errs = append(errs, fmt.Errorf("shard %d worker %d: counter %d, table holds %d", si, w, got, perWorker[w]))
			}
		}
		if err := sh.engine.verify(uint64(si), ix.geo.shardMask, nil); err != nil {
			errs = append(errs, fmt.Errorf("shard %d engine map: %w", si, err))
		}
		sh.mu.Unlock()
	}
	return errors.Join(errs...)
}

func (t *table) verify(shardIndex, shardMask uint64, checkVal func(uint64) error) error {
	seen := make(map[uint64]uint32)
	var live uint64
	for i := uint32(0); i < t.n; i++ {
		s := t.at(i)
		k := s.key.Load()
		if k == emptyKey {
			continue
		}
		if k == busyKey {
			return fmt.Errorf("slot %d left busy", i)
		}
		live++
		if (k>>32)&shardMask != shardIndex {
			return fmt.Errorf("slot %d: key %#x belongs to shard %d", i, k, (k>>32)&shardMask)
		}
		if j, dup := seen[k]; dup {
			return fmt.Errorf("key %#x in slots %d and %d", k, j, i)
		}
		seen[k] = i
		for p := t.home(k); p != i; p = t.next(p) {
			if t.at(p).key.Load() == emptyKey {
				return fmt.Errorf("slot %d: key %#x unreachable, empty slot %d on its probe path", i, k, p)
			}
		}
		if checkVal != nil {
			if err := checkVal(s.val.Load()); err != nil {
				return fmt.Errorf("slot %d: %w", i, err)
			}
		}
	}
	if got := t.live.Load(); got != live {
		return fmt.Errorf("live counter %d, table holds %d", got, live)
	}
	if live > uint64(t.limit) {
		return fmt.Errorf("%d live entries over the limit %d", live, t.limit)
	}
	return nil
}

// Repair makes a region consistent after a writer died mid-operation (the
// previous ingester crashed, say): it drops slots left busy and the second
// copy of a key left by an interrupted shift, re-derives every counter from
// the slots, and closes any open move sequence. A new writer calls it once
// after Attach and before its first write. It returns how many slots it
// dropped.
func (ix *Index) Repair() int {
	dropped := 0
	for si := range ix.shards {
		sh := &ix.shards[si]
		sh.mu.Lock()
		dropped += sh.blocks.repair(uint64(si), ix.geo.shardMask, func(v uint64) bool { return v != 0 })
		dropped += sh.engine.repair(uint64(si), ix.geo.shardMask, nil)
		var perWorker [MaxWorkers]uint32
		for i := uint32(0); i < sh.blocks.n; i++ {
			s := sh.blocks.at(i)
			if s.key.Load() == emptyKey {
				continue
			}
			for set := WorkerSet(s.val.Load()); set != 0; {
				var w WorkerSlot
				w, set = set.First()
				perWorker[w]++
			}
		}
		for w := range perWorker {
			sh.meta.workerBlocks[w].Store(perWorker[w])
		}
		sh.mu.Unlock()
	}
	return dropped
}

// repair is the per-table part of Repair. Writer.
func (t *table) repair(shardIndex, shardMask uint64, keep func(uint64) bool) int {
	if seq := t.moveSeq.Load(); seq&1 != 0 {
		t.moveSeq.Store(seq + 1)
	}
	// Count first so that deleteAt's decrements land on a true count.
	var live uint64
	for i := uint32(0); i < t.n; i++ {
		if t.at(i).key.Load() != emptyKey {
			live++
		}
	}
	t.live.Store(live)
	// A deletion shifts neighbours, which on a damaged table can strand
	// another entry, so sweep until a whole pass finds nothing to drop.
	dropped := 0
	for {
		n := t.repairPass(shardIndex, shardMask, keep)
		if n == 0 {
			return dropped
		}
		dropped += n
	}
}

func (t *table) repairPass(shardIndex, shardMask uint64, keep func(uint64) bool) int {
	dropped := 0
	for i := uint32(0); i < t.n; {
		s := t.at(i)
		k := s.key.Load()
		drop := k == busyKey || (k != emptyKey && ((k>>32)&shardMask != shardIndex || keep != nil && !keep(s.val.Load())))
		if !drop && k != emptyKey {
			// An empty slot on the probe path strands the entry; an earlier
			// copy of the key makes it a duplicate.
			for p := t.home(k); p != i; p = t.next(p) {
				if pk := t.at(p).key.Load(); pk == k || pk == emptyKey {
					drop = true
					break
				}
			}
		}
		if drop {
			t.deleteAt(i)
			dropped++
			continue
		}
		i++
	}
	return dropped
}
