package feed

import (
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
	"slices"
)

// indexWrites is what the apply path does to the index: the engine map
// and the block table of one worker. *radix.Index is the only production
// implementation; tests wrap it to stop the apply path after any single
// write, as a killed ingester would.
type indexWrites interface {
	Lookup(h uint64) workers.Set
	MapEngineHash(w workers.Slot, engine, kv uint64) bool
	LookupEngineHash(w workers.Slot, engine uint64) (uint64, bool)
	MapEngineHashes(w workers.Slot, engines, kvs []uint64, had []int) (int, []int)
	UnmapEngineHashes(w workers.Slot, engines []uint64, dst []uint64) []uint64
	StoredAgain(w workers.Slot, hashes []uint64, again []int) ([]int, int)
	Removed(w workers.Slot, hashes []uint64)
	Cleared(w workers.Slot)
	ClearedAll(w workers.Slot)
}

// applier turns one worker's Stored, Removed and Cleared events into index
// writes. The ring ingester and the ZMQ subscriber both write through it,
// after checking and counting what they skip, so the order of the writes
// is decided here and nowhere else.
//
// The order keeps one invariant at every instant, including after a
// writer killed between any two index writes: each block the index holds
// for worker w is the value of at least one of w's engine-hash mappings
// (bar engine hashes that collide in the map; see doc.go). That is what
// lets a later Removed, which names blocks only by engine hash, take the
// block out again; a block without a mapping would be claimed for w until
// the next resync. The converse is allowed: a mapping may outlive its
// block (Cleared keeps mappings so that blocks stored later still resolve
// their parents). Hence stored maps first and stores only blocks whose
// mapping found room; removed resolves, removes the blocks and unmaps
// last; cleared touches no mapping. The ring's exactly-once commit
// re-applies a record cut short by a crash, and re-applying it completes
// it, because every block still held is still mapped. Routers never read
// the engine map, so the order does not change what they see; radix says
// what a reader sees of each block write.
//
// Each worker slot is written by one applier, from one goroutine: the
// index serialises writers only per shard, and removed reads the map
// between its writes.
type applier struct {
	ix     indexWrites
	kv     []uint64 // scratch: one event's kvfast hashes
	eng    []uint64 // scratch: one event's engine hashes in a keyspace other than the GPU's
	names  []uint64 // scratch: the engine hashes of the blocks store keeps, or removed takes out
	again  []int    // scratch: positions of blocks the worker held already (StoredAgain)
	had    []int    // scratch: positions of engine hashes that named their block already (MapEngineHashes)
	reused uint64   // blocks not stored: their engine hash named another block (takeReused)

	// copies counts, per worker and engine hash, the copies of a block the
	// engine holds beyond the first: vLLM does not de-duplicate its cache
	// (block_pool.py), so two requests computing one prefix at once each
	// cache a copy, announce its store and, later, its eviction. The index
	// holds a block once per worker; the count keeps the first eviction
	// from taking out a block whose other copy is still cached. Bounded
	// by maxCopies: past it, a copy is not counted and its block is
	// under-claimed after the first eviction, as without the count. Local
	// to this process, which is all it needs: a router that restarts
	// forgets the copies in the same way.
	copies map[copyKey]uint32
	// countCopies: a store of a block the worker holds counts as a copy.
	// The ring ingester clears it for the one record a predecessor killed
	// mid-apply may have stored in part, which is re-applied, not copied.
	countCopies bool
}

// copyKey names a block by its worker and engine hash (in its keyspace).
type copyKey struct {
	w      workers.Slot
	engine uint64
}

// maxCopies bounds the copies counted per applier: blocks duplicated at
// once in an engine's cache are a few requests' worth, far below this.
const maxCopies = 1 << 16

// keyspace is where a worker holds an event's blocks: a KV-cache group
// and a tier. Blocks and engine mappings of a keyspace other than group 0
// on the GPU are written under radix.KeyspaceHash of their hashes, so
// each keyspace keeps the invariant above on its own, and evicting a
// block from one tier or group leaves its other copies removable.
type keyspace struct {
	group int
	tier  workers.Tier
}

// gpu is the keyspace of group 0 on the GPU: every block of a model
// without hybrid groups or offloading, and every ring record's.
var gpu keyspace

// keys returns hashes as keyspace k names them, in scratch when k is not
// the GPU's.
func (k keyspace) keys(hashes []uint64, scratch *[]uint64) []uint64 {
	if k == gpu {
		return hashes
	}
	out := (*scratch)[:0]
	for _, h := range hashes {
		out = append(out, radix.KeyspaceHash(h, k.group, k.tier))
	}
	*scratch = out[:0]
	return out
}

// newApplier returns an applier whose scratch holds blocks hashes before
// it grows.
func newApplier(ix indexWrites, blocks int) applier {
	return applier{ix: ix, kv: make([]uint64, 0, blocks), eng: make([]uint64, 0, blocks), names: make([]uint64, 0, blocks),
		countCopies: true}
}

// resolve returns the kvfast hash of worker w's block named engine in
// keyspace k, or, failing that, in another tier of its group: a block's
// kvfast hash is the same in every keyspace, and a block copied to a
// lower tier was on another tier first.
func (a *applier) resolve(w workers.Slot, k keyspace, engine uint64) (uint64, bool) {
	if kv, ok := a.ix.LookupEngineHash(w, radix.KeyspaceHash(engine, k.group, k.tier)); ok || k.tier == workers.TierGPU {
		return kv, ok
	}
	for t := range workers.Tiers {
		if t != k.tier {
			if kv, ok := a.ix.LookupEngineHash(w, radix.KeyspaceHash(engine, k.group, t)); ok {
				return kv, true
			}
		}
	}
	return 0, false
}

// parent returns the kvfast hash an event's first block chains from: the
// namespace seed for a block with no parent, else the parent's mapping.
// It reports false when the parent's engine hash has no mapping: without
// its kvfast hash no block of the event can be named, since the chain
// covers the whole prefix.
func (a *applier) parent(w workers.Slot, k keyspace, seed, engineParent uint64, hasParent bool) (uint64, bool) {
	if !hasParent {
		return seed, true
	}
	if kv, ok := a.resolve(w, k, engineParent); ok || k == gpu {
		return kv, ok
	}
	return a.ix.LookupEngineHash(w, engineParent)
}

// stored records that worker w stored, in keyspace k, the blocks named
// engines, each blockSize tokens of tokens, chained from the kvfast hash
// parent; mm, when not nil, holds each block's multimodal digest (0 for
// none). It returns how many blocks it stored: a block whose mapping
// found no room in the engine map (counted there as overflow) is not
// stored, as nothing could remove it.
func (a *applier) stored(w workers.Slot, k keyspace, parent uint64, engines []uint64, tokens []uint32, mm []uint64, blockSize int) int {
	kv := a.kv[:0]
	for i := range engines {
		var extra uint64
		if mm != nil {
			extra = mm[i]
		}
		parent = radix.ChainBlockHashExtra(parent, tokens[i*blockSize:(i+1)*blockSize], extra)
		kv = append(kv, parent)
	}
	a.kv = kv[:0]
	return a.store(w, k, engines, kv)
}

// storedByReference records that worker w now also holds, in keyspace k,
// blocks it already held elsewhere: vLLM's offloading connector names the
// blocks it copied to a lower tier by their engine hashes alone, without
// tokens. Blocks whose kvfast hash no mapping gives are skipped and
// counted in unresolved.
func (a *applier) storedByReference(w workers.Slot, k keyspace, engines []uint64) (stored, unresolved int) {
	kv, eng := a.kv[:0], a.eng[:0]
	for _, e := range engines {
		h, ok := a.resolve(w, k, e)
		if !ok {
			unresolved++
			continue
		}
		kv, eng = append(kv, h), append(eng, e)
	}
	a.kv, a.eng = kv[:0], eng[:0]
	return a.store(w, k, eng, kv), unresolved
}

// store maps engines[i] to kv[i] in keyspace k, then stores the blocks
// whose mapping found room and whose engine hash did not already name
// another of the worker's blocks (counted in reused).
//
// A block the worker held already, under a name that named it already,
// is another copy of it (copies); one held under another name is not.
// Copies are not counted in the rare event that needed mappedOnly.
func (a *applier) store(w workers.Slot, k keyspace, engines, kv []uint64) int {
	keys := k.keys(engines, &a.eng)
	mapped, had := a.ix.MapEngineHashes(w, keys, kv, a.had[:0])
	a.had = had[:0]
	whole := mapped == len(kv)
	if !whole {
		kv, keys = a.mappedOnly(w, k, keys, kv)
	}
	again, refused := a.ix.StoredAgain(w, k.keys(kv, &a.kv), a.again[:0])
	a.again = again
	if a.countCopies && whole && len(had) > 0 {
		// Both lists are ascending positions in keys: copies are in both.
		j := 0
		for _, i := range a.again {
			for j < len(had) && had[j] < i {
				j++
			}
			if j < len(had) && had[j] == i {
				a.copied(w, keys[i])
			}
		}
	}
	return len(kv) - refused
}

// copied counts one more copy of worker w's block named engine.
func (a *applier) copied(w workers.Slot, engine uint64) {
	key := copyKey{w, engine}
	if a.copies == nil {
		a.copies = map[copyKey]uint32{}
	}
	if n, ok := a.copies[key]; ok || len(a.copies) < maxCopies {
		a.copies[key] = n + 1
	}
}

// uncopied reports whether worker w's block named engine has a copy left
// after one is evicted, counting that copy off.
func (a *applier) uncopied(w workers.Slot, engine uint64) bool {
	key := copyKey{w, engine}
	switch n := a.copies[key]; n {
	case 0:
		return false
	case 1:
		delete(a.copies, key)
	default:
		a.copies[key] = n - 1
	}
	return true
}

// forgetCopies drops worker w's copy counts, when its blocks go (a
// resync, the engine's own clear, RemoveWorker).
func (a *applier) forgetCopies(w workers.Slot) {
	for key := range a.copies {
		if key.w == w {
			delete(a.copies, key)
		}
	}
}

// mappedOnly keeps the kvfast hashes kv[i] that engines[i] maps to, and
// returns them with their engine hashes; it counts in reused those whose
// engine hash names another block the worker holds. A name whose block
// the worker no longer holds (a resync dropped it and kept the names, or
// its removal was lost) is stale: the new block takes it. Only a full
// engine map or a taken name gets here.
func (a *applier) mappedOnly(w workers.Slot, k keyspace, engines, kv []uint64) (kept, names []uint64) {
	names = a.names[:0]
	n := 0
	for i, e := range engines {
		got, ok := a.ix.LookupEngineHash(w, e)
		switch {
		case ok && got == kv[i]:
		case ok && !a.holds(w, k, got) && !slices.Contains(kv[:i], got):
			if !a.ix.MapEngineHash(w, e, kv[i]) {
				continue
			}
		case ok:
			a.reused++
			continue
		default:
			continue // no room in the map
		}
		kv[n] = kv[i]
		names = append(names, e)
		n++
	}
	a.names = names[:0]
	return kv[:n], names
}

// holds reports whether worker w holds the block kv in keyspace k.
func (a *applier) holds(w workers.Slot, k keyspace, kv uint64) bool {
	if k != gpu {
		kv = radix.KeyspaceHash(kv, k.group, k.tier)
	}
	return a.ix.Lookup(kv).Has(w)
}

// takeReused returns the blocks skipped for a reused engine hash since
// the last call.
func (a *applier) takeReused() uint64 {
	n := a.reused
	a.reused = 0
	return n
}

// removed records that worker w evicted the blocks named engines from
// keyspace k. It returns how many of them resolved to a kvfast hash or
// were a counted copy of a block still cached; the others were never
// stored (or their store was skipped) and are ignored.
func (a *applier) removed(w workers.Slot, k keyspace, engines []uint64) int {
	keys := k.keys(engines, &a.eng)
	copies := 0
	if len(a.copies) > 0 {
		// An evicted copy whose block has another copy cached leaves it.
		names := a.names[:0]
		for _, e := range keys {
			if a.uncopied(w, e) {
				copies++
			} else {
				names = append(names, e)
			}
		}
		a.names, keys = names[:0], names
	}
	kv := a.kv[:0]
	for _, e := range keys {
		if h, ok := a.ix.LookupEngineHash(w, e); ok {
			kv = append(kv, h)
		}
	}
	a.kv = kv[:0]
	a.ix.Removed(w, k.keys(kv, &a.kv))
	// The same hashes resolve again, into the same scratch, which Removed
	// no longer needs.
	a.ix.UnmapEngineHashes(w, keys, kv[:0])
	return len(kv) + copies
}

// cleared drops every block of worker w, keeping its mappings: the feed
// lost track of the engine and must not go on claiming blocks it may have
// dropped, while what the engine reports next may still chain from blocks
// it holds (a resync).
func (a *applier) cleared(w workers.Slot) {
	a.ix.Cleared(w)
	a.forgetCopies(w)
}

// engineCleared drops every block of worker w and its mappings: the engine
// itself reported that it emptied its cache (AllBlocksCleared), so nothing
// it stores later chains from a block it held before.
func (a *applier) engineCleared(w workers.Slot) {
	a.ix.ClearedAll(w)
	a.forgetCopies(w)
}
