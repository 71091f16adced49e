// Package workers holds the vocabulary every layer of kvfast shares about
// the engines on one node: a worker Slot, a Set of slots, the per-slot
// prefix Overlaps of a lookup, the storage Tier a cached block sits on
// (with LowerTiers, a lookup's per-tier counts), and the Role a worker
// plays in disaggregated serving (numbered as the shm registry records
// it). It is a leaf: it imports
// nothing of kvfast, so the index, the segment, the scheduler and the
// engine pool can all speak of workers without importing one another.
//
// A slot is one engine rank on this node. The shm registry and the static
// configuration map (worker id, DP rank) pairs to slots; everything below
// them sees only slots.
//
// Sets are values (one uint64) and safe to copy; nothing here holds state.
package workers
