package radix

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvfast/kvfast/workers"
)

// Repair restores a region that a writer left half-written: the previous
// ingester died inside a store or a deletion shift, which leaves at most
// a parked (busy) slot and a duplicated key per table it held, an odd
// move sequence, and counters off by one. Repair drops what readers could
// not find where it is and re-derives every counter from the slots.
//
// Its cost is linear in the region. It first surveys every table in one
// pass: the live entries and the lengths of the runs of occupied slots,
// whose squares bound what the sweeps after it will cost (a probe and a
// shift never leave the run they start in). A table holding more entries
// than any writer can put there, or runs long enough to make the sweeps
// superlinear, is not the trace of a crashed writer but of bytes nobody
// wrote (a stray write, a bad disk page, a hostile process), and Repair
// refuses it with ErrBeyondRepair after that one pass; the caller then
// Resets the index and lets the engines' events fill it again. Before the
// bound existed, random bytes in the block table made every probe walk
// the whole table, and repair took 12 s per MiB.
const (
	// repairSlack is how many entries beyond its live limit a table may
	// hold after a crash: a shift interrupted between writing a key's new
	// slot and clearing its old one leaves the key twice.
	repairSlack = 2
	// repairWorkPerSlot bounds the sum over a region's runs of occupied
	// slots of their squared lengths, per slot. A sound table at its 3/4
	// load limit stays far below it (BenchmarkRepair reports the figure),
	// while it still lets the sweeps cost at most a few hundred slot reads
	// per slot.
	repairWorkPerSlot = 256
	// repairMaxPasses bounds the sweeps: each drop can strand at most an
	// entry of the run it shifted, so a crashed writer's damage is gone
	// after two or three.
	repairMaxPasses = 8
	// repairCheckEvery is how many slots Repair handles between looks at
	// its context; repairReportEvery, between progress reports.
	repairCheckEvery  = 1 << 10
	repairReportEvery = 1 << 16
)

// ErrBeyondRepair says a region holds damage no crashed writer leaves:
// Repair would not finish in time linear in the region, or could only
// guess what the entries meant. The index must be Reset.
var ErrBeyondRepair = errors.New("kvfast: index damaged beyond repair")

// RepairProgress reports how far Repair has come in its current phase:
// "survey", "engine map", "block table" or "recount".
type RepairProgress struct {
	Phase string
	Done  int // slots handled in this phase
	Total int // slots the phase handles (a sweep may take several passes)
}

// RepairOptions tunes Repair.
type RepairOptions struct {
	// Progress, if set, is called from Repair's goroutine at the start and
	// end of every phase and every 65536 slots in between.
	Progress func(RepairProgress)
}

// Repair makes a region consistent after a writer died mid-operation (see
// above). A new writer calls it once after Attach and before its first
// write. It returns how many slots it dropped. It stops early when ctx
// ends, with an error wrapping ctx.Err(), leaving the index as readable as
// before but not yet safe to write; an error wrapping ErrBeyondRepair
// means the index must be Reset. It holds every shard's writer lock
// throughout; lock-free readers go on, and may see entries come and go.
func (ix *Index) Repair(ctx context.Context, opts RepairOptions) (int, error) {
	ix.lockAll()
	defer ix.unlockAll()
	r := repairRun{ctx: ctx, report: opts.Progress}
	if err := ix.survey(&r); err != nil {
		return 0, err
	}
	dropped := 0
	r.begin("engine map", int(ix.geo.shards)*int(ix.geo.mapSlots))
	for si := range ix.shards {
		n, err := ix.shards[si].engine.repairMap(&r)
		dropped += n
		if err != nil {
			return dropped, err
		}
		ix.shards[si].recountMap()
	}
	// Spill counts first, so that findBlock, which trusts them, sees every
	// spilled entry while the passes below decide what to keep.
	ix.resetSpillCounts()
	// A deletion shifts neighbours, which on a damaged table can strand
	// another entry, so sweep until a whole pass finds nothing to drop.
	r.begin("block table", int(ix.geo.shards)*int(ix.geo.blockSlots))
	for pass := 0; ; pass++ {
		if pass == repairMaxPasses {
			return dropped, fmt.Errorf("cannot repair the block table: slots still dropped after %d passes: %w", pass, ErrBeyondRepair)
		}
		n := 0
		for si := range ix.shards {
			k, err := ix.repairBlocks(&ix.shards[si].blocks, &r)
			n += k
			if err != nil {
				return dropped + n, err
			}
		}
		dropped += n
		if n == 0 {
			break
		}
	}
	ix.resetSpillCounts() // exact again: the passes may have left counts high
	ix.damaged.Store(false)
	r.begin("recount", int(ix.geo.shards)*int(ix.geo.blockSlots))
	for si := range ix.shards {
		sh := &ix.shards[si]
		var perWorker [workers.Max]uint32
		for i := uint32(0); i < sh.blocks.n; i++ {
			s := sh.blocks.at(i)
			if s.key.Load() == emptyKey {
				continue
			}
			for w := range (workers.Set(s.val.Load())).All() {
				perWorker[w]++
			}
		}
		for w := range perWorker {
			sh.meta.workerBlocks[w].Store(perWorker[w])
		}
		if err := r.advance(int(sh.blocks.n)); err != nil {
			return dropped, err
		}
	}
	r.end()
	return dropped, nil
}

// repairRun carries a Repair's context and progress.
type repairRun struct {
	ctx         context.Context
	report      func(RepairProgress)
	phase       string
	done, total int
	check       int // done at the next look at ctx
	nextReport  int // done at the next progress report
}

func (r *repairRun) begin(phase string, total int) {
	r.end()
	r.phase, r.done, r.total, r.check, r.nextReport = phase, 0, total, repairCheckEvery, repairReportEvery
	if r.report != nil {
		r.report(RepairProgress{Phase: phase, Total: total})
	}
}

// end reports the phase finished (a sweep's later passes count on past
// its total).
func (r *repairRun) end() {
	if r.report != nil && r.phase != "" {
		r.report(RepairProgress{Phase: r.phase, Done: r.done, Total: r.total})
	}
	r.phase = ""
}

// advance counts n slots handled and, every repairCheckEvery of them,
// looks at the context.
func (r *repairRun) advance(n int) error {
	r.done += n
	if r.done < r.check {
		return nil
	}
	r.check = r.done + repairCheckEvery
	if err := r.ctx.Err(); err != nil {
		return fmt.Errorf("cannot finish repairing the index (%s, %d of %d slots): %w", r.phase, r.done, r.total, err)
	}
	if r.report != nil && r.done >= r.nextReport {
		r.nextReport = r.done + repairReportEvery
		r.report(RepairProgress{Phase: r.phase, Done: r.done, Total: r.total})
	}
	return nil
}

// survey closes every open move sequence, recounts the live entries (so
// that deleteAt's decrements land on a true count), and refuses a region
// whose sweeps would not be linear (see Repair). Writer, holding every
// lock.
func (ix *Index) survey(r *repairRun) error {
	g := ix.geo
	slots := int(g.shards) * (int(g.blockSlots) + int(g.mapSlots))
	r.begin("survey", slots)
	var work uint64
	for si := range ix.shards {
		sh := &ix.shards[si]
		for _, tb := range []struct {
			name string
			t    *table
		}{{"block table", &sh.blocks}, {"engine map", &sh.engine}} {
			live, w := tb.t.survey()
			if live > uint64(tb.t.limit)+repairSlack {
				return fmt.Errorf("cannot repair shard %d's %s: it holds %d entries, its limit is %d: %w",
					si, tb.name, live, tb.t.limit, ErrBeyondRepair)
			}
			work += w
			if err := r.advance(int(tb.t.n)); err != nil {
				return err
			}
		}
	}
	if limit := uint64(slots) * repairWorkPerSlot; work > limit {
		return fmt.Errorf("cannot repair the index: its runs of occupied slots would cost %d slot reads, over the bound of %d: %w",
			work, limit, ErrBeyondRepair)
	}
	return nil
}

// survey closes the table's move sequence, recounts and stores its live
// entries, and returns them with the sum of the squared lengths of its
// runs of occupied slots. Writer.
func (t *table) survey() (live, work uint64) {
	if seq := t.moveSeq.Load(); seq&1 != 0 {
		t.moveSeq.Store(seq + 1)
	}
	// Start after an empty slot, so that a run wrapping past the end is
	// measured whole.
	e := uint32(0)
	for e < t.n && t.at(e).key.Load() != emptyKey {
		e++
	}
	if e == t.n {
		t.live.Store(uint64(t.n))
		return uint64(t.n), uint64(t.n) * uint64(t.n)
	}
	var run uint64
	for i, steps := t.next(e), uint32(0); steps < t.n; i, steps = t.next(i), steps+1 {
		if t.at(i).key.Load() != emptyKey {
			live++
			run++
			continue
		}
		work += run * run
		run = 0
	}
	work += run * run
	t.live.Store(live)
	return live, work
}

// repairBlocks is one pass of Repair over a block table: it keeps only the
// entries a reader finds where they are. Writer, holding every lock.
func (ix *Index) repairBlocks(t *table, r *repairRun) (int, error) {
	dropped := 0
	for i, seen := uint32(0), 0; i < t.n; {
		if seen++; seen == repairCheckEvery {
			if err := r.advance(seen); err != nil {
				return dropped, err
			}
			seen = 0
		}
		s := t.at(i)
		k := s.key.Load()
		if k == emptyKey && s.val.Load() != 0 {
			// An empty slot with a value no writer left (a stray write):
			// a scan for a worker's blocks reads values, and took its
			// bits for blocks, decrementing counters that never counted
			// them until they wrapped.
			s.val.Store(0)
			dropped++
		}
		drop := k == busyKey
		if k != emptyKey && k != busyKey {
			ft, j, found := ix.findBlock(k)
			drop = !ix.belongs(k, t.self) || s.val.Load() == 0 || !found || ft != t || j != i
		}
		if drop {
			t.deleteAt(i)
			dropped++
			continue
		}
		i++
	}
	return dropped, nil
}

// repairMap is Repair for an engine-map table: sweeps until a pass drops
// nothing. Writer.
func (t *table) repairMap(r *repairRun) (int, error) {
	dropped := 0
	for pass := 0; ; pass++ {
		if pass == repairMaxPasses {
			return dropped, fmt.Errorf("cannot repair shard %d's engine map: slots still dropped after %d passes: %w", t.self, pass, ErrBeyondRepair)
		}
		n := 0
		for i, seen := uint32(0), 0; i < t.n; {
			if seen++; seen == repairCheckEvery {
				if err := r.advance(seen); err != nil {
					return dropped + n, err
				}
				seen = 0
			}
			s := t.at(i)
			k := s.key.Load()
			if k == emptyKey && s.val.Load() != 0 {
				s.val.Store(0) // as in repairBlocks
				n++
			}
			drop := k == busyKey
			if k != emptyKey && k != busyKey {
				j, found := t.find(k)
				drop = mapShard(k, t.mask) != t.self || !found || j != i
			}
			if drop {
				t.deleteAt(i)
				n++
				continue
			}
			i++
		}
		dropped += n
		if n == 0 {
			return dropped, nil
		}
	}
}

// Damaged reports whether a write found a table full while its live count
// was below its limit: bytes its writers did not leave there (a process
// writing over the segment), which make every store into that table
// overflow while the index reports room. Repair and Reset clear it; the
// ingester runs them when it is set.
func (ix *Index) Damaged() bool { return ix.damaged.Load() }

// Reset empties the index in place: every block, engine-hash mapping,
// counter and spill count, keeping the geometry. It is what a caller does
// with a region Repair refused (ErrBeyondRepair); the engines' events then
// fill it again. Writer: it takes every shard's lock. Lock-free readers go
// on and see blocks vanish; a reader whose probe raced the clearing of its
// shard retries, as it does for a deletion.
func (ix *Index) Reset() {
	ix.lockAll()
	defer ix.unlockAll()
	ix.damaged.Store(false)
	for si := range ix.shards {
		sh := &ix.shards[si]
		for _, t := range []*table{&sh.blocks, &sh.engine} {
			if t.moveSeq.Load()&1 == 0 {
				t.moveSeq.Add(1)
			}
			for i := uint32(0); i < t.n; i++ {
				s := t.at(i)
				s.key.Store(emptyKey)
				s.val.Store(0)
			}
			t.live.Store(0)
			t.overflow.Store(0)
			t.moveSeq.Add(1)
		}
		sh.meta.unresolvedRemovals.Store(0)
		sh.mapHeld = [workers.Max]uint32{}
		for w := range sh.meta.workerBlocks {
			sh.meta.workerBlocks[w].Store(0)
		}
		t := &sh.blocks
		for h := uint32(0); h < t.n; h += 4 * spillSpan {
			w, _ := t.counts.word(t.self, h)
			w.Store(0)
		}
	}
}
