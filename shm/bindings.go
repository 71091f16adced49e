package shm

import (
	"fmt"
	"math/bits"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// The sticky-session bindings region: a fixed-size hash table of
// session → (worker id, DP rank), shared by every router on the segment so
// that they agree where a conversation's KV lives. docs/shm-layout.md is
// the contract.
//
// The table is bindingBuckets buckets of bindingBucketSize bytes. A bucket
// starts with a seqlock word and holds bindingWays entries; a session
// hashes to one bucket and lives in one of its ways. Writers (Bind,
// Unbind, a lazy expiry) take the bucket's lock with a compare-and-swap;
// readers (Lookup) never lock: they retry while the sequence is odd or
// changed. Nothing scans the table in the background: an entry idle past
// the TTL is dead to Lookup at once and its way is reclaimed by the next
// write into its bucket.
const (
	bindingBucketSize = 256
	bindingEntrySize  = 32
	bindingWays       = (bindingBucketSize - bindingEntrySize) / bindingEntrySize // 7: the first 32 bytes are the bucket header

	// Entry fields (u64 each, little-endian, atomic).
	beKey     = 0  // session key; 0: empty way
	beWorker  = 8  // worker id
	beRank    = 16 // DP rank in the low 32 bits; the high 32 are zero
	beTouched = 24 // CLOCK_MONOTONIC ns of the last bind or refresh

	// MinBindings and MaxBindings bound the sessions a region holds.
	MinBindings = bindingWays
	MaxBindings = bindingWays << 24
	// DefaultBindings is the bindings region's capacity when the segment
	// is created without one: 64K sessions in 2 MiB.
	DefaultBindings = bindingWays << 13

	// bindingLockSteal is how long a bucket lock may stay taken before a
	// writer decides its holder died mid-update and takes it over. A
	// holder does a handful of stores; a second is beyond any stall that
	// is not a dead or stopped process.
	bindingLockSteal = int64(1e9)
	// bindingClockSlack is how far ahead of a reader's clock a lock or
	// touch time may be and still be taken for one (another process's
	// read of the shared monotonic clock racing ours). Further ahead it is
	// garbage: a lock that would never be taken over, a binding that
	// would never expire.
	bindingClockSlack = int64(1e9)
)

// bindingBuckets returns the bucket count that holds capacity sessions: a
// power of two, so that a key's bucket is a mask of its hash.
func bindingBuckets(capacity int) int {
	n := (capacity + bindingWays - 1) / bindingWays
	if n <= 1 {
		return 1
	}
	return 1 << bits.Len(uint(n-1))
}

// BindingsRegionSize returns the bytes a region of capacity sessions takes.
func BindingsRegionSize(capacity int) (int, error) {
	if capacity < MinBindings || capacity > MaxBindings {
		return 0, fmt.Errorf("cannot size a bindings region for %d sessions: must be %d to %d", capacity, MinBindings, MaxBindings)
	}
	return bindingBuckets(capacity) * bindingBucketSize, nil
}

// Binding is where a session is bound.
type Binding struct {
	WorkerID uint64
	DPRank   uint32
	Touched  int64 // CLOCK_MONOTONIC ns of the last bind or refresh
}

// LookupResult says what Lookup found.
type LookupResult uint8

const (
	BindingMiss    LookupResult = iota // no binding
	BindingHit                         // a live binding
	BindingExpired                     // a binding idle past the TTL, now removed
)

// Bindings is a sticky-session table, in a segment or on the heap (a
// router without a segment). All methods are safe for concurrent use by
// any number of goroutines and processes, and make no allocation. Every
// value read from the table is only a hint the caller validates (the
// worker must still be eligible), so a corrupt region misroutes at worst:
// it cannot make a method panic or read outside the region.
type Bindings struct {
	mem     []byte
	base    unsafe.Pointer
	mask    uint64 // buckets - 1
	seed    uint64 // keys are hashed with it, so that ids colliding in one segment do not in another
	monoNow func() int64
	seg     *Segment // whose file backs the table, nil for a heap table: its faults are caught (fault.go)
}

// NewBindings returns a heap-backed table of capacity sessions, for a
// router that runs without a segment.
func NewBindings(capacity int) (*Bindings, error) {
	size, err := BindingsRegionSize(capacity)
	if err != nil {
		return nil, err
	}
	// Backed by uint64s so that every word is 8-byte aligned.
	words := make([]uint64, size/8)
	mem := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(words))), size)
	return attachBindings(mem, 0)
}

// attachBindings views region as a bindings table. The region's length
// must be a power-of-two number of buckets and its start 8-byte aligned;
// its contents are not trusted.
func attachBindings(region []byte, seed uint64) (*Bindings, error) {
	n := len(region) / bindingBucketSize
	if n == 0 || len(region)%bindingBucketSize != 0 || n&(n-1) != 0 {
		return nil, fmt.Errorf("cannot attach a bindings region of %d bytes: not a power of two of %d-byte buckets", len(region), bindingBucketSize)
	}
	base := unsafe.Pointer(unsafe.SliceData(region))
	if uintptr(base)%8 != 0 {
		return nil, fmt.Errorf("cannot attach a bindings region at %p: not 8-byte aligned", base)
	}
	return &Bindings{mem: region, base: base, mask: uint64(n - 1), seed: seed, monoNow: monoNow}, nil
}

// Capacity returns how many sessions the table holds.
func (b *Bindings) Capacity() int { return int(b.mask+1) * bindingWays }

// Key hashes a session id into the table's key space. 0 is reserved for
// an empty way, so no id hashes to it.
func (b *Bindings) Key(sessionID []byte) uint64 {
	var d xxhash.Digest
	d.ResetWithSeed(b.seed)
	_, _ = d.Write(sessionID)
	if k := d.Sum64(); k != 0 {
		return k
	}
	return 1
}

// Now returns the clock bindings are stamped with (CLOCK_MONOTONIC, shared
// by every process on the host).
func (b *Bindings) Now() int64 { return b.monoNow() }

func (b *Bindings) word(off uint64) *uint64 { return (*uint64)(unsafe.Add(b.base, off)) }

func (b *Bindings) bucketOf(key uint64) uint64 {
	return (key & b.mask) * bindingBucketSize
}

func entryOff(bucket uint64, way int) uint64 {
	return bucket + bindingEntrySize*uint64(way+1)
}

// live reports whether an entry touched at touched is still bound at now.
// A touch slightly in the future (another process's clock read racing
// ours) counts as now; one further ahead is a corrupt word, and expired.
func live(touched, now, ttl int64) bool {
	idle := now - touched
	return idle <= ttl && idle >= -bindingClockSlack
}

// Lookup returns key's binding. A binding idle longer than ttl is removed
// (lazily, here) and reported as BindingExpired. It never blocks on a
// writer: if the bucket stays locked or keeps changing through a bounded
// number of reads, it reports a miss, and the request routes normally.
func (b *Bindings) Lookup(key uint64, now, ttl int64) (_ Binding, _ LookupResult) {
	var faulted bool // a miss
	defer b.seg.Catch(&faulted)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	return b.lookup(key, now, ttl, true)
}

// Peek is Lookup without the removal: a read that must leave no trace,
// such as a route-only query, so that the session's next real request
// still finds its binding expired (and is counted so).
func (b *Bindings) Peek(key uint64, now, ttl int64) (_ Binding, _ LookupResult) {
	var faulted bool // a miss
	defer b.seg.Catch(&faulted)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	return b.lookup(key, now, ttl, false)
}

func (b *Bindings) lookup(key uint64, now, ttl int64, remove bool) (Binding, LookupResult) {
	bucket := b.bucketOf(key)
	seq := b.word(bucket)
	for try := 0; try < 64; try++ {
		v1 := atomic.LoadUint64(seq)
		if v1&1 != 0 {
			if try > 4 {
				runtime.Gosched()
			}
			continue
		}
		var found Binding
		hit := false
		for way := range bindingWays {
			e := entryOff(bucket, way)
			if atomic.LoadUint64(b.word(e+beKey)) != key {
				continue
			}
			found = Binding{
				WorkerID: atomic.LoadUint64(b.word(e + beWorker)),
				DPRank:   uint32(atomic.LoadUint64(b.word(e + beRank))),
				Touched:  int64(atomic.LoadUint64(b.word(e + beTouched))),
			}
			hit = true
			break
		}
		if atomic.LoadUint64(seq) != v1 {
			continue
		}
		switch {
		case !hit:
			return Binding{}, BindingMiss
		case live(found.Touched, now, ttl):
			return found, BindingHit
		}
		if remove {
			b.expire(key, now, ttl)
		}
		return Binding{}, BindingExpired
	}
	return Binding{}, BindingMiss
}

// lock takes bucket's lock and returns the sequence to restore (plus two)
// on unlock, or false when another writer holds it. A lock held past
// bindingLockSteal is taken over: its holder died between its stores,
// which leaves at worst one entry half-written, and entries are hints.
func (b *Bindings) lock(bucket uint64, now int64) (uint64, bool) {
	seq := b.word(bucket)
	for try := 0; try < 64; try++ {
		v := atomic.LoadUint64(seq)
		if v&1 != 0 {
			held := int64(v >> 1)
			if age := now - held; age <= bindingLockSteal && age >= -bindingClockSlack {
				if try > 4 {
					runtime.Gosched()
				}
				continue
			}
		}
		if atomic.CompareAndSwapUint64(seq, v, uint64(now)<<1|1) {
			// A stolen lock's sequence is gone: restart from the lock
			// time, which readers cannot have seen as an even value.
			if v&1 != 0 {
				v = uint64(now) << 1
			}
			return v, true
		}
	}
	return 0, false
}

func (b *Bindings) unlock(bucket, v uint64) { atomic.StoreUint64(b.word(bucket), v+2) }

// expire removes key's entry if it is still idle past ttl.
func (b *Bindings) expire(key uint64, now, ttl int64) {
	bucket := b.bucketOf(key)
	v, ok := b.lock(bucket, now)
	if !ok {
		return
	}
	for way := range bindingWays {
		e := entryOff(bucket, way)
		if atomic.LoadUint64(b.word(e+beKey)) == key && !live(int64(atomic.LoadUint64(b.word(e+beTouched))), now, ttl) {
			atomic.StoreUint64(b.word(e+beKey), 0)
		}
	}
	b.unlock(bucket, v)
}

// BindResult says what Bind did.
type BindResult uint8

const (
	BindFailed    BindResult = iota // the bucket stayed locked; nothing changed
	BindRefreshed                   // the same binding, touched again
	BindNew                         // a new binding in a free or expired way
	BindReplaced                    // key was bound elsewhere; now here
	BindEvicted                     // a new binding that evicted the bucket's least recently used live one
	BindHeld                        // Claim: key already had a live binding, left as it was
)

// Bind binds key to (workerID, rank) at now, or refreshes the binding if
// it is already there. When key's bucket is full of live bindings the
// least recently touched one is evicted: the table is bounded, and an
// evicted session just routes normally next time.
func (b *Bindings) Bind(key, workerID uint64, rank uint32, now, ttl int64) (_ BindResult) {
	var faulted bool // BindFailed
	defer b.seg.Catch(&faulted)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	_, res := b.bind(key, workerID, rank, now, ttl, false)
	return res
}

// Claim is Bind for a session found unbound a moment ago: it binds key
// to (workerID, rank) unless key has a live binding by now, which it
// leaves as it is and returns with BindHeld. Concurrent first requests of
// one session thus agree on one worker, the first to claim it. Unlike
// Bind it evicts no live binding: in a full bucket it is BindFailed.
func (b *Bindings) Claim(key, workerID uint64, rank uint32, now, ttl int64) (_ Binding, _ BindResult) {
	var faulted bool // BindFailed
	defer b.seg.Catch(&faulted)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	return b.bind(key, workerID, rank, now, ttl, true)
}

// Touch refreshes key's binding to now if it still names (workerID,
// rank), even idle past ttl but not yet removed: a turn that ran longer
// than the TTL keeps its session, whose idle time starts when the turn
// ends. It reports whether it did.
func (b *Bindings) Touch(key, workerID uint64, rank uint32, now int64) (_ bool) {
	var faulted bool // not touched
	defer b.seg.Catch(&faulted)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	return b.onEntry(key, workerID, rank, now, func(e uint64) bool {
		atomic.StoreUint64(b.word(e+beTouched), uint64(now))
		return true
	})
}

// onEntry runs act, under the bucket's lock, on key's entry if it names
// (workerID, rank), and reports whether act did anything.
func (b *Bindings) onEntry(key, workerID uint64, rank uint32, now int64, act func(entry uint64) bool) bool {
	bucket := b.bucketOf(key)
	v, ok := b.lock(bucket, now)
	if !ok {
		return false
	}
	acted := false
	for way := range bindingWays {
		e := entryOff(bucket, way)
		if atomic.LoadUint64(b.word(e+beKey)) == key &&
			atomic.LoadUint64(b.word(e+beWorker)) == workerID &&
			uint32(atomic.LoadUint64(b.word(e+beRank))) == rank {
			acted = act(e) || acted
		}
	}
	b.unlock(bucket, v)
	return acted
}

// bind binds key, or with claim only when it has no live binding, and
// returns the binding that holds afterwards.
func (b *Bindings) bind(key, workerID uint64, rank uint32, now, ttl int64, claim bool) (Binding, BindResult) {
	bucket := b.bucketOf(key)
	v, ok := b.lock(bucket, now)
	if !ok {
		return Binding{}, BindFailed
	}
	match, free, lru := -1, -1, -1
	var lruTouched int64
	for way := range bindingWays {
		e := entryOff(bucket, way)
		k := atomic.LoadUint64(b.word(e + beKey))
		if k == key {
			match = way
			if held := (Binding{
				WorkerID: atomic.LoadUint64(b.word(e + beWorker)),
				DPRank:   uint32(atomic.LoadUint64(b.word(e + beRank))),
				Touched:  int64(atomic.LoadUint64(b.word(e + beTouched))),
			}); claim && live(held.Touched, now, ttl) {
				b.unlock(bucket, v)
				return held, BindHeld
			}
			break
		}
		touched := int64(atomic.LoadUint64(b.word(e + beTouched)))
		switch {
		case k == 0 || !live(touched, now, ttl):
			if free < 0 {
				free = way
			}
		case lru < 0 || touched < lruTouched:
			lru, lruTouched = way, touched
		}
	}
	victim, res := lru, BindEvicted
	if claim && match < 0 && free < 0 {
		// A claim evicts no live binding: its request may yet be refused,
		// and a client could churn the table with such requests. The
		// binding is made, evicting, once an engine accepts (Bind).
		b.unlock(bucket, v)
		return Binding{}, BindFailed
	}
	switch {
	case match >= 0:
		e := entryOff(bucket, match)
		victim, res = match, BindRefreshed
		if atomic.LoadUint64(b.word(e+beWorker)) != workerID || uint32(atomic.LoadUint64(b.word(e+beRank))) != rank {
			res = BindReplaced
		}
	case free >= 0:
		victim, res = free, BindNew
	}
	e := entryOff(bucket, victim)
	atomic.StoreUint64(b.word(e+beKey), key)
	atomic.StoreUint64(b.word(e+beWorker), workerID)
	atomic.StoreUint64(b.word(e+beRank), uint64(rank))
	atomic.StoreUint64(b.word(e+beTouched), uint64(now))
	b.unlock(bucket, v)
	return Binding{WorkerID: workerID, DPRank: rank, Touched: now}, res
}

// Unclaim takes back a claim: it removes key's binding if it still names
// (workerID, rank) and was touched at touched, the claim's own stamp, so
// that a binding another request has bound or touched since stays.
func (b *Bindings) Unclaim(key, workerID uint64, rank uint32, touched, now int64) (_ bool) {
	var faulted bool // nothing removed
	defer b.seg.Catch(&faulted)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	return b.onEntry(key, workerID, rank, now, func(e uint64) bool {
		if int64(atomic.LoadUint64(b.word(e+beTouched))) != touched {
			return false
		}
		atomic.StoreUint64(b.word(e+beKey), 0)
		return true
	})
}

// Unbind removes key's binding if it still names (workerID, rank), so that
// a router unbinding a worker it found ineligible cannot undo another
// router's fresh rebind. It reports whether it removed one.
func (b *Bindings) Unbind(key, workerID uint64, rank uint32, now int64) (_ bool) {
	var faulted bool // nothing removed
	defer b.seg.Catch(&faulted)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	return b.unbind(key, workerID, rank, now)
}

func (b *Bindings) unbind(key, workerID uint64, rank uint32, now int64) bool {
	return b.onEntry(key, workerID, rank, now, func(e uint64) bool {
		atomic.StoreUint64(b.word(e+beKey), 0)
		return true
	})
}

// Live counts the bindings not idle past ttl. It reads every bucket
// without locking, for a metrics gauge: a count racing writers may be off
// by the few entries they move.
func (b *Bindings) Live(now, ttl int64) (_ int) {
	var faulted bool // none
	defer b.seg.Catch(&faulted)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	return b.countLive(now, ttl)
}

func (b *Bindings) countLive(now, ttl int64) int {
	n := 0
	for bucket := uint64(0); bucket <= b.mask; bucket++ {
		off := bucket * bindingBucketSize
		for way := range bindingWays {
			e := entryOff(off, way)
			if atomic.LoadUint64(b.word(e+beKey)) != 0 && live(int64(atomic.LoadUint64(b.word(e+beTouched))), now, ttl) {
				n++
			}
		}
	}
	return n
}
