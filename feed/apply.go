package feed

import (
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
)

// indexWrites is what the apply path does to the index: the engine map
// and the block table of one worker. *radix.Index is the only production
// implementation; tests wrap it to stop the apply path after any single
// write, as a killed ingester would.
type indexWrites interface {
	LookupEngineHash(w workers.Slot, engine uint64) (uint64, bool)
	MapEngineHashes(w workers.Slot, engines, kvs []uint64) int
	UnmapEngineHashes(w workers.Slot, engines []uint64, dst []uint64) []uint64
	Stored(w workers.Slot, hashes []uint64)
	Removed(w workers.Slot, hashes []uint64)
	Cleared(w workers.Slot)
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
	ix indexWrites
	kv []uint64 // scratch: one event's kvfast hashes
}

// newApplier returns an applier whose scratch holds blocks hashes before
// it grows.
func newApplier(ix indexWrites, blocks int) applier {
	return applier{ix: ix, kv: make([]uint64, 0, blocks)}
}

// parent returns the kvfast hash an event's first block chains from: the
// namespace seed for a block with no parent, else the parent's mapping.
// It reports false when the parent's engine hash has no mapping: without
// its kvfast hash no block of the event can be named, since the chain
// covers the whole prefix.
func (a *applier) parent(w workers.Slot, seed, engineParent uint64, hasParent bool) (uint64, bool) {
	if !hasParent {
		return seed, true
	}
	return a.ix.LookupEngineHash(w, engineParent)
}

// stored records that worker w stored the blocks named engines, each
// blockSize tokens of tokens, chained from the kvfast hash parent. It
// returns how many blocks it stored: a block whose mapping found no room
// in the engine map (counted there as overflow) is not stored, as nothing
// could remove it.
func (a *applier) stored(w workers.Slot, parent uint64, engines []uint64, tokens []uint32, blockSize int) int {
	kv := a.kv[:0]
	for i := range engines {
		parent = radix.ChainBlockHash(parent, tokens[i*blockSize:(i+1)*blockSize])
		kv = append(kv, parent)
	}
	a.kv = kv[:0]
	if a.ix.MapEngineHashes(w, engines, kv) < len(kv) {
		kv = a.mappedOnly(w, engines, kv)
	}
	a.ix.Stored(w, kv)
	return len(kv)
}

// mappedOnly keeps the kvfast hashes kv[i] that engines[i] maps to. Only
// a full engine map gets here.
func (a *applier) mappedOnly(w workers.Slot, engines, kv []uint64) []uint64 {
	n := 0
	for i, e := range engines {
		if got, ok := a.ix.LookupEngineHash(w, e); ok && got == kv[i] {
			kv[n] = kv[i]
			n++
		}
	}
	return kv[:n]
}

// removed records that worker w evicted the blocks named engines. It
// returns how many of them resolved to a kvfast hash; the others were
// never stored (or their store was skipped) and are ignored.
func (a *applier) removed(w workers.Slot, engines []uint64) int {
	kv := a.kv[:0]
	for _, e := range engines {
		if h, ok := a.ix.LookupEngineHash(w, e); ok {
			kv = append(kv, h)
		}
	}
	a.kv = kv[:0]
	a.ix.Removed(w, kv)
	// The same hashes resolve again, into the same scratch, which Removed
	// no longer needs.
	a.ix.UnmapEngineHashes(w, engines, kv[:0])
	return len(kv)
}

// cleared drops every block of worker w, keeping its mappings: the engine
// emptied its cache, or the feed lost track of it and must not go on
// claiming blocks the engine may have dropped.
func (a *applier) cleared(w workers.Slot) {
	a.ix.Cleared(w)
}
