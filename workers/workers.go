package workers

import (
	"fmt"
	"iter"
	"math/bits"
)

// Max is the number of worker slots one node can tell apart.
const Max = 64

// MaxBlockSize is the most tokens per KV block a router or an engine's
// registration may give: a shared-memory record carries one block's
// tokens, and engines' block sizes are far smaller (16 to a few thousand
// for hybrid models).
const MaxBlockSize = 1 << 15

// Slot names one of the Max slots.
type Slot uint8

// Valid reports whether the slot is in range.
func (w Slot) Valid() bool { return w < Max }

// Set is a set of worker slots, bit i standing for slot i. It is the
// value the index stores for every block.
type Set uint64

// AllSlots contains every slot.
const AllSlots = ^Set(0)

// SetOf returns the set holding only w.
func SetOf(w Slot) Set { return 1 << (w & (Max - 1)) }

// Has reports whether w is in s.
func (s Set) Has(w Slot) bool { return s&SetOf(w) != 0 }

// Len returns how many slots s holds.
func (s Set) Len() int { return bits.OnesCount64(uint64(s)) }

// First returns the lowest slot in s and the set without it.
func (s Set) First() (Slot, Set) {
	return Slot(bits.TrailingZeros64(uint64(s))), s & (s - 1)
}

// All yields the slots in s in ascending order. The loop body is inlined
// into the caller, so ranging over it allocates nothing.
func (s Set) All() iter.Seq[Slot] {
	return func(yield func(Slot) bool) {
		for s != 0 {
			var w Slot
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
type Overlaps [Max]uint32

// Tier is the medium a worker holds a KV block on. Engines that offload
// evicted blocks keep them reusable at a lower cost than a recompute:
// loading a block from host memory or storage is cheaper than computing
// it again, dearer than finding it on the GPU.
type Tier uint8

const (
	TierGPU  Tier = iota // the engine's own KV cache
	TierHost             // host memory (vLLM CPU, SGLang HiCache CPU_PINNED)
	TierDisk             // storage: local disk, a shared file system, object stores
	Tiers                // how many tiers there are
)

func (t Tier) String() string {
	switch t {
	case TierGPU:
		return "gpu"
	case TierHost:
		return "host"
	case TierDisk:
		return "disk"
	}
	return "tier?"
}

// LowerTiers holds, per tier below the GPU and per worker slot, how many
// blocks of the worker's matched prefix (its Overlaps entry) are held only
// on that tier. A block a worker holds on the GPU and elsewhere counts as
// GPU. LowerTiers[t-1] is tier t's.
type LowerTiers [Tiers - 1]Overlaps

// Blocks returns how many of w's matched blocks are held on tier t, which
// must be below the GPU.
func (l *LowerTiers) Blocks(t Tier, w Slot) uint32 { return l[t-1][w] }

// Role is the part a worker plays when serving is disaggregated: it
// computes prompts for others (prefill), generates from prompts others
// computed (decode), does both (the zero value: every aggregated engine),
// or only encodes multimodal inputs for the others (encode). The shm
// registry records it in this numbering, so it must not change.
type Role uint8

const (
	RoleBoth Role = iota
	RolePrefill
	RoleDecode
	RoleEncode
)

// ParseRole reads a role's name: "prefill", "decode", "encode" or "both"
// ("" too).
func ParseRole(s string) (Role, error) {
	switch s {
	case "", "both":
		return RoleBoth, nil
	case "prefill":
		return RolePrefill, nil
	case "decode":
		return RoleDecode, nil
	case "encode":
		return RoleEncode, nil
	}
	return RoleBoth, fmt.Errorf("cannot use role %q: want prefill, decode, encode or both", s)
}

func (r Role) String() string {
	switch r {
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	case RoleEncode:
		return "encode"
	case RoleBoth:
		return "both"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}
