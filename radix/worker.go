package radix

import (
	"iter"
	"math/bits"
)

// MaxWorkers is the number of worker slots one index can tell apart. A slot
// is one engine rank on this node: (worker id, DP rank) pairs are mapped to
// slots by the shm registry or the static configuration.
const MaxWorkers = 64

// WorkerSlot names one of the MaxWorkers slots.
type WorkerSlot uint8

// Valid reports whether the slot is in range.
func (w WorkerSlot) Valid() bool { return w < MaxWorkers }

// WorkerSet is a set of worker slots, bit i standing for slot i. It is the
// value the index stores for every block.
type WorkerSet uint64

// AllWorkers contains every slot.
const AllWorkers = ^WorkerSet(0)

// SetOf returns the set holding only w.
func SetOf(w WorkerSlot) WorkerSet { return 1 << (w & (MaxWorkers - 1)) }

// Has reports whether w is in s.
func (s WorkerSet) Has(w WorkerSlot) bool { return s&SetOf(w) != 0 }

// Len returns how many slots s holds.
func (s WorkerSet) Len() int { return bits.OnesCount64(uint64(s)) }

// First returns the lowest slot in s and the set without it. It is the
// allocation-free way to iterate: for s != 0 { w, s = s.First(); ... }.
func (s WorkerSet) First() (WorkerSlot, WorkerSet) {
	return WorkerSlot(bits.TrailingZeros64(uint64(s))), s & (s - 1)
}

// All yields the slots in s in ascending order. The loop body is inlined
// into the caller, so ranging over it allocates nothing.
func (s WorkerSet) All() iter.Seq[WorkerSlot] {
	return func(yield func(WorkerSlot) bool) {
		for s != 0 {
			var w WorkerSlot
			w, s = s.First()
			if !yield(w) {
				return
			}
		}
	}
}

// Overlaps holds, per worker slot, how many leading blocks of a prompt that
// worker already caches. Callers own it (usually on the stack) so that
// lookups make no allocation.
type Overlaps [MaxWorkers]uint32
