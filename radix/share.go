package radix

import (
	"fmt"
	"math"

	"github.com/kvfast/kvfast/workers"
)

// DefaultWorkerShare is the share of the index one worker's blocks may
// take in kvfast serve and the endpoint picker (SetWorkerShare).
const DefaultWorkerShare = 0.5

// A worker's share of the index.
//
// Engines announce each block once, when they store it, and never again:
// a block the index had no room for stays unknown to the router until the
// engine evicts and recomputes it. The index has a fixed capacity, and
// without a bound one worker could take all of it: a publisher that never
// announces its evictions (a bug, a lost removal stream, a hostile
// process) fills the table, and from then on every other worker's new
// blocks are refused and its cache under-claimed, for good. So each
// worker may hold at most a share of each shard's block table and of
// each shard's engine map; a store beyond it is refused and counted as
// overflow, and against the worker (Stats.WorkerRefused), as a store into
// a full table is. The bound is per shard, not over the whole index,
// because a writer holds only its shard's lock; blocks spread over the
// shards by hash, so a worker meets every shard's bound at about the same
// time.
//
// The share bounds what a worker claims, including blocks other workers
// hold too: a claim on a shared entry takes no slot, but counting it keeps
// the bound a statement an operator can check against the worker's
// index_blocks. An index sized well above every engine's cache (the
// default) never meets it in normal operation; one that must hold large
// lower tiers needs --index-capacity raised, or the share.
//
// Process-local: the share is the ingesting process's setting, not the
// segment's, and so are the engine-map counts it is checked against (the
// block counts are the region's per-worker counters). Repair recounts the
// engine map, so a process that becomes the ingester starts exact.

// SetWorkerShare bounds what one worker may hold to share of each shard's
// block table and engine map, share in (0, 1]; 1 lifts the bound (the
// default of an index just opened). It may be called at any time;
// stores already made stay.
func (ix *Index) SetWorkerShare(share float64) error {
	if !(share > 0 && share <= 1) {
		return fmt.Errorf("cannot bound a worker's share of the index at %v: it must be more than 0 and at most 1", share)
	}
	ix.blockQuota.Store(quotaOf(ix.geo.blockLimit, share))
	ix.mapQuota.Store(quotaOf(ix.geo.mapLimit, share))
	return nil
}

// Refused is Stats.WorkerRefused for one worker, without reading the
// region.
func (ix *Index) Refused(w workers.Slot) uint64 {
	ix.checkSlot(w)
	return ix.refused[w].Load()
}

func quotaOf(limit uint32, share float64) uint32 {
	return max(1, uint32(math.Ceil(float64(limit)*share)))
}

// blockOverQuota reports whether worker w may claim no more blocks in shard
// sh, counting the refusal if so. Writer, holding sh's lock.
func (ix *Index) blockOverQuota(sh *shard, w workers.Slot) bool {
	if sh.meta.workerBlocks[w].Load() < ix.blockQuota.Load() {
		return false
	}
	sh.meta.blockOverflow.Add(1)
	ix.refused[w].Add(1)
	return true
}

// mapOverQuota is blockOverQuota for the engine map.
func (ix *Index) mapOverQuota(sh *shard, w workers.Slot) bool {
	if sh.mapHeld[w] < ix.mapQuota.Load() {
		return false
	}
	sh.meta.mapOverflow.Add(1)
	ix.refused[w].Add(1)
	return true
}

// recountMap sets the shard's per-worker engine-map counts from its
// slots. Writer, holding sh's lock, or the index not yet shared.
func (sh *shard) recountMap() {
	var held [workers.Max]uint32
	for i := uint32(0); i < sh.engine.n; i++ {
		if k := sh.engine.at(i).key.Load(); k != emptyKey && k != busyKey {
			held[workers.Slot(k>>mapWorkerShift)]++
		}
	}
	sh.mapHeld = held
}
