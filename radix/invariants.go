package radix

import (
	"fmt"

	"github.com/kvfast/kvfast/internal/invariants"
)

// Invariant checks are sampled by work done. A write entry point counts
// one unit per hash it writes and one per scanPerWrite slots it scans (a
// scan step is that much cheaper than a write); once the units reach the
// index's slot count divided by slotsPerWrite, the next writer verifies
// the whole index. Verify costs about a tenth of a hash write per slot, so
// the checks add a bounded fraction to the writes they follow however
// large the index, while small test indexes are verified every few dozen
// hashes written.
const (
	slotsPerWrite = 4
	scanPerWrite  = 16
)

// wrote counts the work of one write entry point and, in builds with
// internal/invariants enabled, verifies the whole index once enough has
// accumulated. A failed check panics: the index is corrupt, and every
// lookup after this write may route on it. Callers hold no shard lock
// (Verify takes them all).
func (ix *Index) wrote(op string, work int) {
	if !invariants.Enabled {
		return
	}
	if ix.unverified.Add(int64(work)) < ix.verifyBudget() {
		return
	}
	ix.unverified.Store(0)
	if err := ix.Verify(); err != nil {
		panic(fmt.Sprintf("BUG: radix: index inconsistent after %s: %v", op, err))
	}
}

func (ix *Index) verifyBudget() int64 {
	g := ix.geo
	return int64(g.shards) * (int64(g.blockSlots) + int64(g.mapSlots)) / slotsPerWrite
}
