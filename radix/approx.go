package radix

import (
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/kvfast/kvfast/workers"
)

// Approx is the index of the approximate (no-events) mode: instead of
// learning what engines cache from their events, the router records its
// own routing decisions, assuming that the engine it sent a prompt to now
// caches that prompt's blocks, and forgets each assumption after a TTL.
//
// Lookups are the Index's, lock-free. Inserts and expiry share one mutex:
// they come once per routed request, not once per block lookup.
type Approx struct {
	ix  *Index
	ttl time.Duration

	mu   sync.Mutex
	ring []approxRecord // FIFO of assumptions, oldest at head
	head int
	size int
}

type approxRecord struct {
	hash    uint64
	expires int64 // unix nanoseconds
	worker  workers.Slot
	dead    bool // Forget dropped it: popping it touches nothing
}

// NewApprox returns an approximate index holding at most cfg.Capacity
// (worker, block) assumptions, each for ttl. When full, the oldest
// assumption is forgotten early.
func NewApprox(cfg Config, ttl time.Duration) (*Approx, error) {
	if ttl <= 0 {
		return nil, fmt.Errorf("cannot use approximate-mode TTL %v: must be positive", ttl)
	}
	// Every assumption may be a distinct block, and its reference count
	// lives in the engine map, keyed by (worker, block hash).
	cfg.EngineMapCapacity = cfg.Capacity
	ix, err := NewHeap(cfg)
	if err != nil {
		return nil, err
	}
	return &Approx{ix: ix, ttl: ttl, ring: make([]approxRecord, cfg.Capacity)}, nil
}

// ApproxMemory is the memory NewApprox(cfg, ttl) takes: its heap index
// and its ring of assumptions. A process counts it in its soft memory
// limit.
func ApproxMemory(cfg Config) (int, error) {
	cfg.EngineMapCapacity = cfg.Capacity
	n, err := RegionSize(cfg)
	if err != nil {
		return 0, err
	}
	return n + cfg.Capacity*int(unsafe.Sizeof(approxRecord{})), nil
}

// FindMatches is Index.FindMatches over the current assumptions.
func (a *Approx) FindMatches(hashes []uint64, out *workers.Overlaps) workers.Set {
	return a.ix.FindMatches(hashes, out)
}

// FindMatchesFor is FindMatches for the workers in only, over what out
// already holds: each of their entries rises to their overlap in the
// history if that is longer; the others' are left as they were. It
// completes a lookup in the event-fed Index for engines that publish no
// events, whose exact prompts can match only the router's own record of
// what it sent them. It makes no allocation.
func (a *Approx) FindMatchesFor(only workers.Set, hashes []uint64, out *workers.Overlaps) {
	if only == 0 {
		return
	}
	var history workers.Overlaps
	a.ix.FindMatches(hashes, &history)
	for w := range only.All() {
		out[w] = max(out[w], history[w])
	}
}

// Insert records that worker w was just sent a prompt with these block
// hashes. Re-inserting a block extends its life. It makes no allocation.
func (a *Approx) Insert(w workers.Slot, hashes []uint64, now time.Time) {
	a.ix.checkSlot(w)
	nowNs := now.UnixNano()
	expires := nowNs + int64(a.ttl)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.expireLocked(nowNs)
	for _, h := range hashes {
		if a.size == len(a.ring) {
			a.popLocked()
		}
		refs, _ := a.ix.LookupEngineHash(w, h)
		if !a.ix.MapEngineHash(w, h, refs+1) {
			continue // no room for the count: do not assume what we cannot forget
		}
		if refs == 0 {
			a.ix.Stored(w, []uint64{h})
		}
		a.ring[(a.head+a.size)%len(a.ring)] = approxRecord{hash: h, expires: expires, worker: w}
		a.size++
	}
}

// Forget drops every assumption about worker w, whose engine left or was
// replaced: what the router sent the old engine is not in the new one's
// cache. It walks the records once, under the lock Insert takes; engines
// change rarely.
func (a *Approx) Forget(w workers.Slot) {
	a.ix.checkSlot(w)
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range a.size {
		if r := &a.ring[(a.head+i)%len(a.ring)]; r.worker == w {
			r.dead = true
		}
	}
	a.ix.RemoveWorker(w)
}

// Expire forgets every assumption older than the TTL. The router calls it
// periodically so that lookups do not see stale assumptions when no new
// request arrives to trigger expiry.
func (a *Approx) Expire(now time.Time) {
	a.mu.Lock()
	a.expireLocked(now.UnixNano())
	a.mu.Unlock()
}

func (a *Approx) expireLocked(nowNs int64) {
	for a.size > 0 && a.ring[a.head].expires <= nowNs {
		a.popLocked()
	}
}

func (a *Approx) popLocked() {
	r := a.ring[a.head]
	a.head = (a.head + 1) % len(a.ring)
	a.size--
	if r.dead {
		return
	}
	refs, ok := a.ix.LookupEngineHash(r.worker, r.hash)
	switch {
	case !ok:
		panic("BUG: radix: approximate record without a reference count")
	case refs > 1:
		a.ix.MapEngineHash(r.worker, r.hash, refs-1)
	default:
		a.ix.UnmapEngineHash(r.worker, r.hash)
		a.ix.Removed(r.worker, []uint64{r.hash})
	}
}
