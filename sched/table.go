package sched

import "math/bits"

// activeTable counts, for every prompt block of an in-flight request, how
// many requests on each worker hold it. One entry per distinct block hash
// serves all 64 workers: its mask says which workers hold the block, so a
// single pass over a prompt's hashes yields every worker's shared-block
// count at once (see laneCounter), with no lookup per block per worker.
//
// Per-(block, worker) reference counts are bit-sliced: low[j] holds bit j of
// all 64 workers' counts, so an entry is one cache line and incrementing
// worker w's count is a ripple through at most lanePlanes words. Counts
// past 2^lanePlanes-1 carry into the high map, which a hot shared prefix
// touches once per 2^lanePlanes requests, not on every one.
//
// Entries whose counts all return to zero stay indexed (idle): the next
// request with that prefix finds them instead of re-inserting. A clock hand
// reclaims idle entries when the table is full. An entry referenced by any
// booking is never idle, so a booking may keep entry numbers instead of
// hashes and release without probing.
//
// The table is not safe for concurrent use: the Scheduler serialises it
// with one lock per selection or release, never one per block.
type activeTable struct {
	entries   []entry
	slots     []uint64 // open addressing: tag<<32 | entry+1, 0 = empty
	slotMask  uint64
	shift     uint8 // 64 - log2(len(slots))
	next      uint32
	hand      uint32
	live      int               // entries with a nonzero mask
	high      map[uint64]uint32 // entry<<6|worker -> count >> lanePlanes
	untracked uint64            // bookings of blocks that found no free entry
}

const (
	lanePlanes = 5
	laneLow    = 1<<lanePlanes - 1 // the largest count held in the entry itself
	// noEntry marks a booked block the full table could not track; it is
	// counted as a distinct block of its worker.
	noEntry = ^uint32(0)
	// evictScan bounds the clock hand's search for an idle entry, so that
	// a table full of in-flight blocks degrades to untracked blocks
	// instead of a long scan under the lock.
	evictScan = 256
)

type entry struct {
	key  uint64
	mask uint64 // workers holding the block at least once
	ovf  uint64 // workers whose count has a high part in activeTable.high
	low  [lanePlanes]uint64
}

func newActiveTable(capacity int) *activeTable {
	n := 1
	for n < capacity {
		n <<= 1
	}
	slots := 2 * n
	return &activeTable{
		entries:  make([]entry, n),
		slots:    make([]uint64, slots),
		slotMask: uint64(slots - 1),
		shift:    uint8(64 - bits.TrailingZeros(uint(slots))),
		high:     make(map[uint64]uint32),
	}
}

// home is the probe start for h. Block hashes are xxhash outputs already;
// the multiply only protects the table from a caller passing structured
// values (sequence numbers in tests, a hostile client's raw hashes).
func (t *activeTable) home(h uint64) uint64 { return (h * 0x9E3779B97F4A7C15) >> t.shift }

func tagOf(h uint64) uint64 { return h & 0xFFFFFFFF00000000 }

func (t *activeTable) find(h uint64) uint32 {
	tag := tagOf(h)
	for pos := t.home(h); ; pos = (pos + 1) & t.slotMask {
		s := t.slots[pos]
		if s == 0 {
			return noEntry
		}
		if s&0xFFFFFFFF00000000 == tag {
			if e := uint32(s) - 1; t.entries[e].key == h {
				return e
			}
		}
	}
}

// insert adds h, which must be absent, and returns its entry, or noEntry
// when every entry is in use.
func (t *activeTable) insert(h uint64) uint32 {
	e, ok := t.alloc()
	if !ok {
		return noEntry
	}
	t.entries[e] = entry{key: h}
	pos := t.home(h)
	for t.slots[pos] != 0 {
		pos = (pos + 1) & t.slotMask
	}
	t.slots[pos] = tagOf(h) | uint64(e+1)
	return e
}

func (t *activeTable) alloc() (uint32, bool) {
	if int(t.next) < len(t.entries) {
		e := t.next
		t.next++
		return e, true
	}
	if t.live == len(t.entries) {
		return 0, false
	}
	n := uint32(len(t.entries))
	for range evictScan {
		e := t.hand
		t.hand = (t.hand + 1) & (n - 1)
		if t.entries[e].mask == 0 {
			t.unindex(e)
			return e, true
		}
	}
	return 0, false
}

// unindex removes entry e's slot, shifting later members of its probe run
// back so that lookups never need tombstones.
func (t *activeTable) unindex(e uint32) {
	want := uint64(e + 1)
	pos := t.home(t.entries[e].key)
	for uint64(uint32(t.slots[pos])) != want {
		pos = (pos + 1) & t.slotMask
	}
	// pos is the hole. A later slot of the run moves into it when the hole
	// lies on that slot's probe path (its home is no nearer than the hole).
	for next := (pos + 1) & t.slotMask; ; next = (next + 1) & t.slotMask {
		s := t.slots[next]
		if s == 0 {
			break
		}
		h := t.home(t.entries[uint32(s)-1].key)
		if (next-h)&t.slotMask >= (next-pos)&t.slotMask {
			t.slots[pos] = s
			pos = next
		}
	}
	t.slots[pos] = 0
}

// inc adds one reference of worker w to entry e and reports whether w did
// not hold the block before. The common case, a block w does not hold yet,
// is small enough to inline into the booking loop.
func (t *activeTable) inc(e uint32, w uint) bool {
	en := &t.entries[e]
	m := uint64(1) << w
	if en.mask&m == 0 {
		if en.mask == 0 {
			t.live++
		}
		en.mask |= m
		en.low[0] |= m
		return true
	}
	t.incShared(en, e, w, m)
	return false
}

//go:noinline
func (t *activeTable) incShared(en *entry, e uint32, w uint, m uint64) {
	for j := range en.low {
		if en.low[j]&m == 0 {
			en.low[j] |= m
			return
		}
		en.low[j] &^= m
	}
	t.high[uint64(e)<<6|uint64(w)]++
	en.ovf |= m
}

// decShared drops one reference of worker w (mask m) from entry e when it
// is not w's only one, which release drops inline, and reports whether w
// no longer holds the block.
//
//go:noinline
func (t *activeTable) decShared(en *entry, e uint32, w uint, m uint64) bool {
	if en.mask&m == 0 {
		panic("BUG: sched: releasing a block its worker does not hold")
	}
	borrowed := true
	for j := range en.low {
		if en.low[j]&m != 0 {
			en.low[j] &^= m
			borrowed = false
			break
		}
		en.low[j] |= m
	}
	if borrowed {
		k := uint64(e)<<6 | uint64(w)
		h := t.high[k]
		if h == 0 {
			panic("BUG: sched: block reference count underflow")
		}
		if h == 1 {
			delete(t.high, k)
			en.ovf &^= m
		} else {
			t.high[k] = h - 1
		}
	}
	if en.ovf&m != 0 || (en.low[0]|en.low[1]|en.low[2]|en.low[3]|en.low[4])&m != 0 {
		return false
	}
	en.mask &^= m
	if en.mask == 0 {
		t.live--
	}
	return true
}

// scan looks every hash up once, records its entry in idx (when idx is not
// nil) and adds each found block's holders among lanes to acc.
func (t *activeTable) scan(hashes []uint64, lanes uint64, idx []uint32, acc *laneCounter) {
	if idx != nil {
		idx = idx[:len(hashes)]
	}
	for i, h := range hashes {
		e := t.find(h)
		if idx != nil {
			idx[i] = e
		}
		if e != noEntry {
			if m := t.entries[e].mask & lanes; m != 0 {
				acc.add(m)
			}
		}
	}
}

// book adds one reference of worker w to every block, given the entries
// scan found (noEntry where absent), and rewrites idx to the entries used.
// It returns how many blocks w did not hold before. Found entries are
// referenced first, so that making room for the missing ones can never
// evict an entry this booking is about to use.
func (t *activeTable) book(hashes []uint64, idx []uint32, w uint) int64 {
	idx = idx[:len(hashes)]
	m := uint64(1) << w
	var fresh int64
	missing := false
	for _, e := range idx {
		if e == noEntry {
			missing = true
			continue
		}
		// inc, by hand: the compiler will not inline it into this loop.
		en := &t.entries[e]
		if en.mask&m == 0 {
			if en.mask == 0 {
				t.live++
			}
			en.mask |= m
			en.low[0] |= m
			fresh++
		} else {
			t.incShared(en, e, w, m)
		}
	}
	if !missing {
		return fresh
	}
	for i, e := range idx {
		if e != noEntry {
			continue
		}
		h := hashes[i]
		// A hash repeated within one prompt was inserted a few blocks ago.
		if e = t.find(h); e == noEntry {
			e = t.insert(h)
		}
		idx[i] = e
		if e == noEntry {
			t.untracked++
			fresh++
		} else if t.inc(e, w) {
			fresh++
		}
	}
	return fresh
}

// release drops the references book added and returns how many blocks
// worker w no longer holds.
func (t *activeTable) release(idx []uint32, w uint) int64 {
	m := uint64(1) << w
	var freed int64
	for _, e := range idx {
		if e == noEntry {
			freed++
			continue
		}
		// w's only reference, the common case, is dropped here: a call
		// would not be inlined into this loop.
		en := &t.entries[e]
		if en.low[0]&m != 0 && (en.ovf|en.low[1]|en.low[2]|en.low[3]|en.low[4])&m == 0 {
			en.low[0] &^= m
			en.mask &^= m
			if en.mask == 0 {
				t.live--
			}
			freed++
		} else if t.decShared(en, e, w, m) {
			freed++
		}
	}
	return freed
}

// laneCounter adds 64 lanes of counters at once: plane j holds bit j of
// every lane, so adding a mask costs a short carry ripple whatever the
// number of lanes set in it.
type laneCounter struct {
	planes [32]uint64
	top    int
}

func (c *laneCounter) add(m uint64) {
	j := 0
	for m != 0 {
		carry := c.planes[j] & m
		c.planes[j] ^= m
		m = carry
		j++
	}
	if j > c.top {
		c.top = j
	}
}

func (c *laneCounter) get(w uint) uint32 {
	var n uint32
	for j := 0; j < c.top; j++ {
		n |= uint32(c.planes[j]>>w&1) << j
	}
	return n
}
