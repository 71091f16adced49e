package radix

import (
	"sync/atomic"
	"unsafe"
)

// A table is one shard's open-addressing hash table of 16-byte slots in the
// region: a key word and a value word. Probing is linear, so a probe stays
// within adjacent cache lines; deletion shifts later entries back (no
// tombstones), so churn never lengthens probes or fills the table with dead
// slots.
//
// The engine map's tables are plain: one uniform home per key.
//
// The block table is grouped. A key's near home is its group's base slot
// plus its counter (see hash.go), in the shard its group bits pick, so the
// eight blocks of a group land in about three consecutive cache lines and
// a prompt costs one miss per group rather than one per block. Siblings
// share a near home, though (every continuation of a popular prefix
// inherits the same group), so a key is kept near only within window slots
// of its home. One that finds the window full spills: it goes to a second,
// uniform home in a shard picked by a mix of the whole key, so that
// thousands of siblings neither pile into one cluster nor fill one shard.
// Every entry is reachable by one of the two probes a reader makes:
//
//	near:  from the near home, at most window slots, stopping at an empty slot;
//	spill: from the spill home (in the spill shard), stopping at an empty slot.
//
// A spill count per span of spillSpan near homes says how many entries
// with their home in that span, at least, are spilled. It lets a probe skip
// the spill path, one random miss, when nothing near its home ever
// spilled: every miss of a new key, and every lookup but a few in crowded
// windows. Counts saturate at spillSticky and then stay until Repair.
//
// Concurrency: any number of lock-free readers, one writer at a time (the
// shard's mutex, held by the caller of every method marked "writer").
// Readers never see a torn entry: a writer fills a slot's value before its
// key, parks the key at busyKey while rewriting a slot, and brackets a
// backward shift with an odd moveSeq so that a reader whose probe raced a
// shift retries instead of reporting a miss. An entry never changes shard.
type table struct {
	slots    unsafe.Pointer
	n        uint32 // slots
	limit    uint32 // live entries allowed
	window   uint32 // slots the near probe covers
	grouped  bool
	locShift uint8  // grouped: key>>locShift is the group locator
	locBits  uint8  // grouped: width of the locator
	self     uint64 // this table's shard
	mask     uint64 // shard mask
	counts   spillCounts
	moveSeq  *atomic.Uint64
	live     *atomic.Uint64
	overflow *atomic.Uint64
	// damaged is the index's flag (Index.Damaged), set when the table
	// proves it was written by something other than its writers.
	damaged *atomic.Bool
}

type slot struct {
	key atomic.Uint64
	val atomic.Uint64
}

// Reserved key words. Keys that collide with them are remapped by
// storedKey; that merges at most three hash values out of 2^64.
const (
	emptyKey = 0
	busyKey  = 1
)

// storedKey maps a 64-bit hash onto the keys a slot may hold.
func storedKey(h uint64) uint64 {
	if h < 2 {
		return h + 2
	}
	return h
}

const notFound = ^uint32(0)

// maxReadRetries bounds how often a reader restarts a probe that raced a
// writer. With one writer per shard a retry almost always succeeds; the
// bound keeps a reader wait-free even against a pathological writer.
const maxReadRetries = 8

// nearWindow is how far from its home the block table keeps a key before
// spilling it. Groups make clusters long (a group needs eight free slots
// together, so at 3/4 load the mean displacement is ~8 slots rather than
// ~1), and 128 slots spill under one key in a hundred in normal use, while
// still bounding the scan that a window crowded with siblings costs.
const nearWindow = 128

// nearWindowFor is the window of a shard of n slots: nearWindow, or a
// quarter of a small shard, so that small tables (tests, fuzzing) spill
// too and no window ever covers the whole table.
func nearWindowFor(n uint32) uint32 {
	return min(nearWindow, max(n/4, 1))
}

// Shard selection. A block's near shard comes from its group bits, so a
// whole group lands in one shard; its spill shard from the same mix as its
// spill home. Engine-map keys use bits 32 and up, above their home's bits.
func nearShard(key, mask uint64) uint64  { return key >> groupShift & mask }
func spillShard(key, mask uint64) uint64 { return mix64(key) >> 32 & mask }
func mapShard(key, mask uint64) uint64   { return key >> 32 & mask }

func (t *table) at(i uint32) *slot {
	return (*slot)(unsafe.Add(t.slots, uintptr(i)*slotSize))
}

// home is where a key's near probe starts. Both variants reduce a field of
// the key onto [0, n) by multiply-shift, which lets n be any size (no
// power-of-two rounding, so no wasted memory). Grouped: the group bits not
// used for the shard locate the group's base, and the counter offsets the
// block from it. Ungrouped: the low 32 bits, which shard selection does
// not use. Every shard has the same geometry, so any shard's table
// computes any key's home.
func (t *table) home(key uint64) uint32 {
	if !t.grouped {
		return uint32((uint64(uint32(key)) * uint64(t.n)) >> 32)
	}
	i := t.groupBase(key) + uint32(key>>counterShift&counterMask)
	if i >= t.n { // n >= groupSize (decodeHeader checks), so once suffices
		i -= t.n
	}
	return i
}

// groupBase is the slot where a grouped key's group starts: its near home
// less its counter.
func (t *table) groupBase(key uint64) uint32 {
	return uint32(((key >> t.locShift) * uint64(t.n)) >> t.locBits)
}

// spillHome is a grouped key's second home, in its spill shard: uniform,
// and different for siblings, whose fresh bits differ.
func (t *table) spillHome(key uint64) uint32 {
	return uint32((uint64(uint32(mix64(key))) * uint64(t.n)) >> 32)
}

func (t *table) next(i uint32) uint32 {
	i++
	if i == t.n {
		return 0
	}
	return i
}

// dist is how many steps a probe takes from a to b.
func (t *table) dist(a, b uint32) uint32 {
	if b >= a {
		return b - a
	}
	return b + t.n - a
}

type probeState uint8

const (
	probeMiss  probeState = iota // an empty slot: the key is not on this path
	probeHit                     // found
	probeRaced                   // a writer was moving this path's entries
	probeOn                      // the limit came first: the path goes on
)

// probe walks at most limit slots from slot i. The limit is at most n so
// that a corrupt region with no empty slot cannot spin a reader forever.
func (t *table) probe(key uint64, i, limit uint32) (uint64, probeState) {
	for range limit {
		s := t.at(i)
		k := s.key.Load()
		if k == key {
			v := s.val.Load()
			if s.key.Load() != key {
				return 0, probeRaced
			}
			return v, probeHit
		}
		if k == emptyKey {
			return 0, probeMiss
		}
		i = t.next(i)
	}
	return 0, probeMiss
}

// lookup returns the value stored under key in an ungrouped table.
// Lock-free.
func (t *table) lookup(key uint64) (uint64, bool) {
	home := t.home(key)
	for attempt := 0; attempt < maxReadRetries; attempt++ {
		seq := t.moveSeq.Load()
		switch v, state := t.probe(key, home, t.n); state {
		case probeHit:
			return v, true
		case probeMiss:
			if seq&1 == 0 && t.moveSeq.Load() == seq {
				return 0, false
			}
		}
	}
	return 0, false
}

// probeNear is FindMatches' optimistic probe: the value and slot of a
// clean hit within limit slots of i, probeMiss at an empty slot, probeOn
// when the limit came first, and probeRaced at any sign of a writer. Only
// the careful lookup may conclude that a key is absent.
func (t *table) probeNear(key uint64, i, limit uint32) (uint64, uint32, probeState) {
	for range limit {
		s := t.at(i)
		k := s.key.Load()
		if k == key {
			v := s.val.Load()
			if s.key.Load() != key {
				return 0, 0, probeRaced
			}
			return v, i, probeHit
		}
		if k <= busyKey { // one test for both reserved keys
			if k == emptyKey {
				return 0, 0, probeMiss
			}
			return 0, 0, probeRaced
		}
		i = t.next(i)
	}
	return 0, i, probeOn
}

// scan walks at most limit slots from i for a writer: the key's slot and
// true, or the first empty slot and false, or notFound and false when the
// walk found neither.
func (t *table) scan(key uint64, i, limit uint32) (uint32, bool) {
	for range limit {
		k := t.at(i).key.Load()
		if k == key {
			return i, true
		}
		if k == emptyKey {
			return i, false
		}
		i = t.next(i)
	}
	return notFound, false
}

// find locates key in an ungrouped table for a writer: its slot and true,
// or the empty slot where it belongs and false, or notFound when the table
// has no empty slot.
func (t *table) find(key uint64) (uint32, bool) {
	return t.scan(key, t.home(key), t.n)
}

// insertAt fills the empty slot i. Writer. It reports false, counting an
// overflow, when the shard is at its live limit.
func (t *table) insertAt(i uint32, key, val uint64) bool {
	if live := t.live.Load(); i == notFound || live >= uint64(t.limit) {
		if (i == notFound && live < uint64(t.limit) || live > uint64(t.limit)) && t.damaged != nil {
			// Kept under its limit (3/4 of the slots), a table always has
			// an empty slot, and no writer counts past the limit: these
			// bytes are not what the writers left.
			t.damaged.Store(true)
		}
		t.overflow.Add(1)
		return false
	}
	s := t.at(i)
	s.val.Store(val)
	s.key.Store(key)
	t.live.Add(1)
	return true
}

// nearReachable reports whether a near probe from home reaches slot j: j
// lies within the window and no slot before it is empty. Writer; during a
// shift no slot of the cluster is empty (the hole still holds a stale
// copy), so this sees the probes as they were before the deletion began.
func (t *table) nearReachable(home, j uint32) bool {
	if t.dist(home, j) >= t.window {
		return false
	}
	for p := home; p != j; p = t.next(p) {
		if t.at(p).key.Load() == emptyKey {
			return false
		}
	}
	return true
}

// isNear reports whether the entry k in slot j of a grouped table is one
// its near probe reaches; any other entry there is spilled.
func (t *table) isNear(k uint64, j uint32) bool {
	return nearShard(k, t.mask) == t.self && t.nearReachable(t.home(k), j)
}

// deleteAt removes the entry in slot p and shifts back every later entry of
// the cluster whose probe passed through the hole, so no probe is ever
// broken and no tombstone is left. An entry moves only backwards towards
// the start of the probe that reaches it (its home if the near probe does,
// else its spill home), so a near entry stays near, and a spilled one may
// come near (if this is also its near shard), which its spill count then
// forgets. Writer.
func (t *table) deleteAt(p uint32) {
	var spilled uint64 // the deleted entry, if it was spilled
	if t.grouped {
		if k := t.at(p).key.Load(); k != busyKey && !t.isNear(k, p) {
			spilled = k
		}
	}
	hole := p
	moving := false
	for j, steps := t.next(p), uint32(1); steps < t.n; j, steps = t.next(j), steps+1 {
		src := t.at(j)
		k := src.key.Load()
		if k == emptyKey {
			break
		}
		near := !t.grouped || t.isNear(k, j)
		from := t.home(k)
		if !near {
			from = t.spillHome(k)
		}
		if cyclicIn(hole, from, j) {
			continue // its probe starts after the hole: moving it would hide it
		}
		if !moving {
			t.moveSeq.Add(1) // odd: readers that miss from now on retry
			moving = true
		}
		dst := t.at(hole)
		dst.key.Store(busyKey)
		dst.val.Store(src.val.Load())
		dst.key.Store(k)
		if !near && t.isNear(k, hole) {
			t.counts.add(t.self, t.home(k), false)
		}
		hole = j
	}
	h := t.at(hole)
	h.key.Store(emptyKey)
	h.val.Store(0)
	if moving {
		t.moveSeq.Add(1)
	}
	if spilled != 0 {
		t.counts.add(nearShard(spilled, t.mask), t.home(spilled), false)
	}
	t.live.Add(^uint64(0))
}

// cyclicIn reports whether x lies in the cyclic interval (a, b].
func cyclicIn(a, x, b uint32) bool {
	if a <= b {
		return a < x && x <= b
	}
	return x > a || x <= b
}

// spillCounts addresses every shard's spill counts: a byte per spillSpan
// near homes, packed four to a 32-bit word.
type spillCounts struct {
	base   unsafe.Pointer
	stride uintptr // bytes per shard
}

const (
	spillSpan   = 4
	spillSticky = 0xff
)

func (sc spillCounts) word(shard uint64, home uint32) (*atomic.Uint32, uint32) {
	b := home / spillSpan
	return (*atomic.Uint32)(unsafe.Add(sc.base, uintptr(shard)*sc.stride+uintptr(b&^3))), 8 * (b & 3)
}

// get is how many spilled entries, at least, have their near home in the
// span of home in shard. Lock-free.
func (sc spillCounts) get(shard uint64, home uint32) uint32 {
	w, shift := sc.word(shard, home)
	return w.Load() >> shift & 0xff
}

// add counts one spilled entry more (up) or less. Increments come from the
// near shard's writer, before the entry is stored; decrements, after the
// entry is gone, from whichever shard's writer removed it, hence the CAS.
func (sc spillCounts) add(shard uint64, home uint32, up bool) {
	w, shift := sc.word(shard, home)
	for {
		old := w.Load()
		c := old >> shift & 0xff
		switch {
		case c == spillSticky:
			return
		case up:
			c++
		case c > 0:
			c--
		default:
			return
		}
		if w.CompareAndSwap(old, old&^(0xff<<shift)|c<<shift) {
			return
		}
	}
}
