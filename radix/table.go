package radix

import (
	"sync/atomic"
	"unsafe"
)

// A table is one shard's open-addressing hash table of 16-byte slots in the
// region: a key word and a value word. Linear probing keeps a probe inside
// one or two cache lines; deletion shifts later entries back (no
// tombstones), so churn never lengthens probes or fills the table with dead
// slots.
//
// Concurrency: any number of lock-free readers, one writer at a time (the
// shard's mutex, held by the caller of every method marked "writer").
// Readers never see a torn entry: a writer fills a slot's value before its
// key, parks the key at busyKey while rewriting a slot, and brackets a
// backward shift with an odd moveSeq so that a reader whose probe raced a
// shift retries instead of reporting a miss.
type table struct {
	slots    unsafe.Pointer
	n        uint32 // slots
	limit    uint32 // live entries allowed
	moveSeq  *atomic.Uint64
	live     *atomic.Uint64
	overflow *atomic.Uint64
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

func (t *table) at(i uint32) *slot {
	return (*slot)(unsafe.Add(t.slots, uintptr(i)*slotSize))
}

// home reduces the key's low 32 bits onto [0, n) by multiply-shift, which
// lets n be any size (no power-of-two rounding, so no wasted memory).
// Shard selection uses bits 32 and up, so the two never correlate.
func (t *table) home(key uint64) uint32 {
	return uint32((uint64(uint32(key)) * uint64(t.n)) >> 32)
}

func (t *table) next(i uint32) uint32 {
	i++
	if i == t.n {
		return 0
	}
	return i
}

// lookup returns the value stored under key. Lock-free.
func (t *table) lookup(key uint64) (uint64, bool) {
	for attempt := 0; attempt < maxReadRetries; attempt++ {
		seq := t.moveSeq.Load()
		v, state := t.probe(key, t.home(key))
		switch state {
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

type probeState uint8

const (
	probeMiss probeState = iota
	probeHit
	probeRaced
)

// probe walks from slot i. The probe count is bounded by n so that a
// corrupt region with no empty slot cannot spin a reader forever.
func (t *table) probe(key uint64, i uint32) (uint64, probeState) {
	for range t.n {
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

// probeFrom is the optimistic hit path of a batched lookup: first is the
// key already loaded from slot i. It reports ok only for a clean hit; a
// miss, a busy slot or a race sends the caller to lookup, whose move
// sequence check makes misses trustworthy.
func (t *table) probeFrom(key uint64, i uint32, first uint64) (uint64, bool) {
	k := first
	for range t.n {
		if k == key {
			s := t.at(i)
			v := s.val.Load()
			return v, s.key.Load() == key
		}
		if k == emptyKey || k == busyKey {
			return 0, false
		}
		i = t.next(i)
		k = t.at(i).key.Load()
	}
	return 0, false
}

// find locates key for a writer: its slot and true, or the empty slot where
// it belongs and false, or notFound when the table has no empty slot.
func (t *table) find(key uint64) (uint32, bool) {
	i := t.home(key)
	for range t.n {
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

// insertAt fills the empty slot i. Writer. It reports false, counting an
// overflow, when the shard is at its live limit.
func (t *table) insertAt(i uint32, key, val uint64) bool {
	if i == notFound || t.live.Load() >= uint64(t.limit) {
		t.overflow.Add(1)
		return false
	}
	s := t.at(i)
	s.val.Store(val)
	s.key.Store(key)
	t.live.Add(1)
	return true
}

// deleteAt removes the entry in slot p and shifts back every later entry of
// the cluster that may sit earlier, so no probe chain is ever broken and no
// tombstone is left. Writer.
func (t *table) deleteAt(p uint32) {
	hole := p
	moving := false
	for j, steps := t.next(p), uint32(1); steps < t.n; j, steps = t.next(j), steps+1 {
		src := t.at(j)
		k := src.key.Load()
		if k == emptyKey {
			break
		}
		if cyclicIn(hole, t.home(k), j) {
			continue // its home lies after the hole: moving it would hide it
		}
		if !moving {
			t.moveSeq.Add(1) // odd: readers that miss from now on retry
			moving = true
		}
		dst := t.at(hole)
		dst.key.Store(busyKey)
		dst.val.Store(src.val.Load())
		dst.key.Store(k)
		hole = j
	}
	h := t.at(hole)
	h.key.Store(emptyKey)
	h.val.Store(0)
	if moving {
		t.moveSeq.Add(1)
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
