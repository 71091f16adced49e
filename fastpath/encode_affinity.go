package fastpath

import (
	"sync"
	"time"

	"github.com/kvfast/kvfast/workers"
)

// encoderAffinity remembers which encoder recently encoded which
// multimodal item (prompt.MediaItem.ID), as a model of the encoders'
// caches: an engine keeps an item's embeddings in its encoder cache, so
// the encoder that encoded an item last is the one likeliest to have it.
// It is bounded per encoder (an encoder's cache holds only so many items:
// the least recently used of an encoder's items goes first) and in time
// (an entry older than ttl is not trusted). An item is remembered on one
// encoder only, the last that encoded it.
//
// Its entries come from a fixed pool made once, so that remembering an
// item allocates nothing but the map's growth up to its bound.
type encoderAffinity struct {
	mu         sync.Mutex
	perEncoder int
	ttl        time.Duration
	byItem     map[uint64]*affinityEntry
	lru        [workers.Max]affinityList // per encoder, most recent first
	free       *affinityEntry            // unused entries, linked by next
}

type affinityEntry struct {
	id         uint64
	slot       workers.Slot
	at         time.Time
	prev, next *affinityEntry
}

type affinityList struct {
	head, tail *affinityEntry
	n          int
}

func newEncoderAffinity(perEncoder int, ttl time.Duration) *encoderAffinity {
	return &encoderAffinity{perEncoder: perEncoder, ttl: ttl, byItem: map[uint64]*affinityEntry{}}
}

// lookup returns the encoder that last encoded item id, if it did so
// within the ttl.
func (a *encoderAffinity) lookup(id uint64, now time.Time) (workers.Slot, bool) {
	if a == nil {
		return 0, false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.byItem[id]
	if e == nil {
		return 0, false
	}
	if now.Sub(e.at) > a.ttl {
		a.drop(e)
		return 0, false
	}
	return e.slot, true
}

// record remembers that encoder slot has just encoded item id.
func (a *encoderAffinity) record(id uint64, slot workers.Slot, now time.Time) {
	if a == nil || a.perEncoder <= 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.byItem[id]
	if e != nil {
		a.unlink(e)
	}
	if l := &a.lru[slot]; l.n >= a.perEncoder {
		a.drop(l.tail)
	}
	if e != nil {
		e.slot, e.at = slot, now
		a.pushFront(e)
		return
	}
	e = a.alloc()
	e.id, e.slot, e.at = id, slot, now
	a.byItem[id] = e
	a.pushFront(e)
}

// forget drops item id if encoder slot holds it: the encoder failed it,
// and may have lost its cache.
func (a *encoderAffinity) forget(id uint64, slot workers.Slot) {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if e := a.byItem[id]; e != nil && e.slot == slot {
		a.drop(e)
	}
}

func (a *encoderAffinity) alloc() *affinityEntry {
	if a.free == nil {
		// Entries come in chunks, so that a router whose encoders never
		// fill their bound never pays for it.
		chunk := make([]affinityEntry, 256)
		for i := range chunk {
			chunk[i].next = a.free
			a.free = &chunk[i]
		}
	}
	e := a.free
	a.free = e.next
	*e = affinityEntry{}
	return e
}

func (a *encoderAffinity) drop(e *affinityEntry) {
	a.unlink(e)
	delete(a.byItem, e.id)
	*e = affinityEntry{next: a.free}
	a.free = e
}

func (a *encoderAffinity) pushFront(e *affinityEntry) {
	l := &a.lru[e.slot]
	e.prev, e.next = nil, l.head
	if l.head != nil {
		l.head.prev = e
	}
	l.head = e
	if l.tail == nil {
		l.tail = e
	}
	l.n++
}

func (a *encoderAffinity) unlink(e *affinityEntry) {
	l := &a.lru[e.slot]
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		l.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		l.tail = e.prev
	}
	e.prev, e.next = nil, nil
	l.n--
}
