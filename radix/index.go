package radix

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/kvfast/kvfast/internal/invariants"
	"github.com/kvfast/kvfast/workers"
)

// Index maps chained block hashes to the set of workers caching each block,
// and a per-worker engine hash to the kvfast hash of the same block.
//
// All state lives in the region; the Index value only holds views into it
// plus one writer mutex per shard, which is why a router that restarts can
// Attach to a region another process filled and route on it at once.
type Index struct {
	region []byte
	geo    geometry
	shards []shard

	unverified atomic.Int64 // write work since the last invariant check (see wrote)

	// A worker's share of the index (share.go): the most blocks, and
	// engine-hash mappings, one worker may hold per shard, and the stores
	// refused per worker for want of room. Process-local.
	blockQuota, mapQuota atomic.Uint32
	refused              [workers.Max]atomic.Uint64

	// damaged: a table was found full below its limit (Damaged).
	damaged atomic.Bool

	// Hybrid workers (keyspace.go): process-local, set by the feed.
	hybridMu  sync.Mutex // serialises SetHybrid
	hybrid    [workers.Max]atomic.Pointer[Hybrid]
	hybridSet atomic.Uint64 // workers.Set of slots with a Hybrid
}

type shard struct {
	mu     sync.Mutex // serialises writers of this shard; readers never take it
	blocks table
	engine table
	meta   *shardMeta
	// mapped is the set of workers that may have engine-hash mappings in
	// this shard, so that forgetting a worker scans only the shards it
	// mapped into since it was last forgotten: a scan of every shard's map
	// (2M slots by default) cost 2.2 ms, and a publisher sending nothing
	// but clears (18 bytes each) kept a core busy at 450 of them a second,
	// starving the other workers' rings. Process-local, under mu: all
	// set when the index is opened, since a segment may hold another
	// process's mappings, and only the process that writes the index
	// clears it (a router that becomes the ingester stays it until it
	// exits).
	mapped workers.Set
	// mapHeld counts each worker's engine-hash mappings in this shard, for
	// its share of the map (share.go). Process-local, under mu: counted
	// when the index is attached and again by Repair, which a process runs
	// before it writes a region others wrote. mapped stays beside it
	// because forgetting must never skip a shard, and a count taken while
	// another process wrote may be short.
	mapHeld [workers.Max]uint32
}

// shardMeta is the region-resident part of a shard (384 bytes; see layout.go).
type shardMeta struct {
	blockMoveSeq atomic.Uint64
	mapMoveSeq   atomic.Uint64
	_            [6]uint64

	blockLive          atomic.Uint64
	blockOverflow      atomic.Uint64
	mapLive            atomic.Uint64
	mapOverflow        atomic.Uint64
	unresolvedRemovals atomic.Uint64
	_                  [3]uint64

	workerBlocks [workers.Max]atomic.Uint32
}

func init() {
	if unsafe.Sizeof(shardMeta{}) != shardMetaSize || unsafe.Sizeof(slot{}) != slotSize {
		panic("BUG: radix: in-memory layout does not match layout.go")
	}
}

// NewHeap returns an index on the Go heap: for tests, benchmarks and the
// approximate mode, where nothing needs to outlive the process.
func NewHeap(cfg Config) (*Index, error) {
	size, err := RegionSize(cfg)
	if err != nil {
		return nil, err
	}
	return Format(alignedHeap(size), cfg)
}

// Format lays out an empty index in region, overwriting what was there.
// region must be 64-byte aligned and at least RegionSize(cfg) bytes.
func Format(region []byte, cfg Config) (*Index, error) {
	g, err := cfg.geometry()
	if err != nil {
		return nil, err
	}
	if err := checkRegion(region, g.size); err != nil {
		return nil, err
	}
	clear(region[:g.size])
	g.encodeHeader(region[:headerSize])
	return open(region, g), nil
}

// Attach opens an index that Format laid out earlier, possibly in another
// process. The header is validated before anything else is read; a region
// that fails any check is refused with a *CorruptError.
func Attach(region []byte) (*Index, error) {
	g, err := decodeHeader(region)
	if err != nil {
		return nil, err
	}
	if err := checkRegion(region, g.size); err != nil {
		return nil, err
	}
	ix := open(region, g)
	for i := range ix.shards {
		ix.shards[i].recountMap()
	}
	return ix, nil
}

func open(region []byte, g geometry) *Index {
	ix := &Index{region: region, geo: g, shards: make([]shard, g.shards)}
	ix.blockQuota.Store(g.blockLimit)
	ix.mapQuota.Store(g.mapLimit)
	base := unsafe.Pointer(unsafe.SliceData(region))
	for i := range ix.shards {
		meta := (*shardMeta)(unsafe.Add(base, g.shardMetaBase+i*shardMetaSize))
		sh := &ix.shards[i]
		sh.meta = meta
		sh.mapped = workers.AllSlots
		sh.blocks = table{
			slots:    unsafe.Add(base, g.tableOff+i*int(g.blockSlots)*slotSize),
			n:        g.blockSlots,
			limit:    g.blockLimit,
			window:   nearWindowFor(g.blockSlots),
			grouped:  true,
			locShift: uint8(groupShift + g.shardBits),
			locBits:  uint8(groupBits - g.shardBits),
			self:     uint64(i),
			mask:     g.shardMask,
			counts:   spillCounts{base: unsafe.Add(base, g.spillOff), stride: uintptr(g.spillStride)},
			moveSeq:  &meta.blockMoveSeq,
			live:     &meta.blockLive,
			overflow: &meta.blockOverflow,
			damaged:  &ix.damaged,
		}
		sh.engine = table{
			slots:    unsafe.Add(base, g.mapOff+i*int(g.mapSlots)*slotSize),
			n:        g.mapSlots,
			limit:    g.mapLimit,
			window:   g.mapSlots,
			self:     uint64(i),
			mask:     g.shardMask,
			moveSeq:  &meta.mapMoveSeq,
			live:     &meta.mapLive,
			overflow: &meta.mapOverflow,
			damaged:  &ix.damaged,
		}
	}
	return ix
}

func (ix *Index) nearShard(key uint64) *shard {
	return &ix.shards[nearShard(key, ix.geo.shardMask)]
}

func (ix *Index) spillShard(key uint64) *shard {
	return &ix.shards[spillShard(key, ix.geo.shardMask)]
}

func (ix *Index) mapShard(key uint64) *shard {
	return &ix.shards[mapShard(key, ix.geo.shardMask)]
}

// Lookup returns the workers that hold the block with hash h.
func (ix *Index) Lookup(h uint64) workers.Set {
	v, _ := ix.lookupBlock(storedKey(h))
	return workers.Set(v)
}

// lookupBlock is the careful block lookup: the near probe, then, if the
// spill count allows, the spill probe. A miss is reported only when
// neither table moved an entry meanwhile. Lock-free.
func (ix *Index) lookupBlock(key uint64) (uint64, bool) {
	a := &ix.nearShard(key).blocks
	home := a.home(key)
	for attempt := 0; attempt < maxReadRetries; attempt++ {
		seqA := a.moveSeq.Load()
		v, st := a.probe(key, home, a.window)
		var b *table
		var seqB uint64
		if st == probeMiss && a.counts.get(a.self, home) != 0 {
			b = &ix.spillShard(key).blocks
			seqB = b.moveSeq.Load()
			v, st = b.probe(key, b.spillHome(key), b.n)
		}
		switch st {
		case probeHit:
			return v, true
		case probeMiss:
			if seqA&1 == 0 && a.moveSeq.Load() == seqA && (b == nil || seqB&1 == 0 && b.moveSeq.Load() == seqB) {
				return 0, false
			}
		}
	}
	return 0, false
}

// FindMatches is software-pipelined. Every block's home is computable
// from its hash alone, so while it resolves block i it has already asked
// for the lines of the groups prefetchAhead blocks further on: a batch of
// prefetches retires without waiting for memory, so those misses overlap
// each other and the resolving, which then mostly hits the cache, and the
// early exit still stops at the first block no worker holds (what was
// prefetched past it is only wasted bandwidth).
//
// Prefetching is per group, not per block: groupLines cache lines from
// the group's base slot, which at the block table's load hold 96% of the
// groups whole (BENCHMARKS.md, issue 15, has what else was tried). The
// blocks of a group after its first are resolved by guessing that each
// follows the one before, as writers place them (see runCursor), the
// rest of a group in one tight loop while no worker drops out; a wrong
// guess costs one slot read, then the slots after it (seek), and falls
// back to the full probe (probeBlock), which mostly meets only its
// group's first block.
const (
	prefetchBatch = 4 * groupSize // blocks whose groups are prefetched at once
	// prefetchAhead: eight groups ahead measured slightly faster than
	// sixteen, whose extra prefetches in flight hold up the misses of
	// probes that go past the prefetched lines.
	prefetchAhead = 2 * prefetchBatch
	groupLines    = 5
	// batchLines bounds one batch's prefetches: a batch's first block may
	// start mid-group, so it spans one group more than it holds whole.
	batchLines = (prefetchBatch/groupSize + 1) * groupLines
)

// FindMatches writes into out, for every worker, how many leading hashes it
// holds on the GPU without a gap, and returns the set of workers whose
// overlap is at least one block. A hybrid worker's overlap is the prefix
// every KV-cache group of its model can serve (SetHybrid). It stops
// probing as soon as no worker is left. It makes no allocation and takes
// no lock.
func (ix *Index) FindMatches(hashes []uint64, out *workers.Overlaps) workers.Set {
	return ix.findMatches(hashes, out, nil)
}

// FindTieredMatches is FindMatches for engines that offload blocks: a
// worker's prefix is the run of blocks it holds on the GPU, continued by
// the run it holds on lower tiers (host memory, storage), and lower
// receives, per tier and worker, how many blocks of out's prefix are
// lower-tier ones. That is how the engines reuse them: vLLM takes the
// GPU prefix and then asks its offloading connector for the blocks that
// follow (a GPU copy after the GPU prefix ended is not used), and
// SGLang's HiCache evicts device copies leaf first, so a device block
// never follows a host-only one. Lower tiers are probed only for workers
// past their GPU run, and the GPU no longer once every worker is, so a
// prompt every worker holds on the GPU costs what FindMatches does.
func (ix *Index) FindTieredMatches(hashes []uint64, out *workers.Overlaps, lower *workers.LowerTiers) workers.Set {
	*lower = workers.LowerTiers{}
	return ix.findMatches(hashes, out, lower)
}

func (ix *Index) findMatches(hashes []uint64, out *workers.Overlaps, lower *workers.LowerTiers) workers.Set {
	*out = workers.Overlaps{}
	var (
		active  = workers.AllSlots
		onGPU   = workers.AllSlots // active workers whose prefix is all on the GPU so far
		matched workers.Set
		run     runCursor
		runs    [workers.Tiers - 1]runCursor // one per lower tier
	)
	tier := workers.TierGPU // whose keys are prefetched
	fetched := 0            // hashes[:fetched] have had their groups prefetched
	for i := 0; i < len(hashes); {
		if onGPU == 0 && tier == workers.TierGPU {
			// Every worker left is past its GPU run: from here on the
			// lookup probes host-memory copies (and, for workers that
			// miss those too, storage, unprefetched). Catch up on the
			// window the GPU keys were prefetched for.
			tier = workers.TierHost
			fetched = i
		}
		for fetched <= i+prefetchAhead && fetched < len(hashes) {
			ix.prefetchGroups(hashes, fetched, tier)
			fetched += prefetchBatch
		}
		next := onGPU
		if onGPU != 0 {
			key := storedKey(hashes[i])
			v, ok := run.guess(key)
			if ok {
				run.advance()
			} else if v, ok = run.seek(key); !ok {
				v, run = ix.probeBlock(key)
			}
			onGPU &= v
			next = onGPU
			if next == active {
				i++
				// The rest of the group, up to its last block (by
				// counter), while each block sits in the run's next
				// slot and every worker still in the match holds it:
				// guess in one tight loop, written out here because a
				// call per group, with the loop's state reloaded
				// around it, cost more than the loop itself. The
				// block it stops at goes the general way; a hash that
				// storedKey remaps never matches a slot, so it does.
				if s := run.next; s != nil && i < len(hashes) {
					// Not past the table's end either: a run that
					// wraps there is left to guess.
					end := min(i+groupSize-int(hashes[i]>>counterShift&counterMask), len(hashes),
						i+int((uintptr(unsafe.Pointer(run.end))-uintptr(unsafe.Pointer(s)))/slotSize))
					for ; i < end; i++ {
						h := hashes[i]
						if s.key.Load() != h {
							break
						}
						v := s.val.Load()
						if s.key.Load() != h || workers.Set(v)&onGPU != onGPU {
							break
						}
						s = (*slot)(unsafe.Add(unsafe.Pointer(s), slotSize))
					}
					if s == run.end {
						s = run.t.at(0)
					}
					run.next = s
				}
				continue
			}
		}
		if next == active {
			i++
			continue
		}
		if lower != nil {
			next |= ix.lowerTiers(hashes[i], active&^next, lower, &runs)
		}
		if i == 0 {
			matched = next
		} else {
			for w := range (active &^ next).All() {
				out[w] = uint32(i)
			}
		}
		active = next
		if active == 0 {
			return ix.finish(hashes, out, lower, matched)
		}
		i++
	}
	for w := range active.All() {
		out[w] = uint32(len(hashes))
	}
	return ix.finish(hashes, out, lower, matched)
}

// lowerTiers returns which of the workers in missing hold the block with
// hash h on a lower tier, and counts it there for each. A worker holding
// it on several is counted on the fastest.
func (ix *Index) lowerTiers(h uint64, missing workers.Set, lower *workers.LowerTiers, runs *[workers.Tiers - 1]runCursor) workers.Set {
	var found workers.Set
	for t := workers.TierHost; t < workers.Tiers && missing != 0; t++ {
		on := missing & ix.resolve(KeyspaceHash(h, 0, t), &runs[t-1])
		for w := range on.All() {
			lower[t-1][w]++
		}
		found |= on
		missing &^= on
	}
	return found
}

// finish holds hybrid workers to their other groups, which can only
// shorten a match; a shortened match keeps its lower-tier counts capped
// at its new length, which can only under-credit it.
func (ix *Index) finish(hashes []uint64, out *workers.Overlaps, lower *workers.LowerTiers, matched workers.Set) workers.Set {
	if matched&workers.Set(ix.hybridSet.Load()) == 0 {
		return matched
	}
	matched = ix.clampHybrid(hashes, out, matched)
	if lower != nil {
		for t := range lower {
			for w := range workers.Set(ix.hybridSet.Load()).All() {
				lower[t][w] = min(lower[t][w], out[w])
			}
		}
	}
	return matched
}

// prefetchGroups starts loading the groups of the batch of blocks from
// hashes[lo], as held on tier: groupLines lines from the base slot of the
// first block's group and of every later group's anchor. Hashes from
// AppendBlockHashes form a chain, whose counters step by one (and
// KeyspaceHash keeps them), so the anchors are found from the first
// block's counter alone; other hashes are resolved just as correctly,
// only with less of them prefetched. Stepping by each anchor's own
// counter would find the same anchors in a chain, but each anchor's load
// would then wait for the one before, and a cold prompt's hashes miss the
// cache: one miss after another, where these overlap.
func (ix *Index) prefetchGroups(hashes []uint64, lo int, tier workers.Tier) {
	var lines [batchLines]uintptr
	n := 0
	hi := min(lo+prefetchBatch, len(hashes))
	mask := ix.geo.shardMask
	j := lo
	step := groupSize
	if c := int(hashes[lo] >> counterShift & counterMask); c != 0 {
		step -= c
	}
	for j < hi && n+groupLines <= len(lines) {
		key := storedKey(KeyspaceHash(hashes[j], 0, tier))
		t := &ix.shards[nearShard(key, mask)].blocks
		base := t.groupBase(key)
		p := uintptr(unsafe.Pointer(t.at(base)))
		for l := range uintptr(groupLines) {
			lines[n] = p + l*64
			n++
		}
		j += step
		step = groupSize
	}
	prefetchLines(lines[:n])
}

// runCursor follows a run of one group's blocks through the slots. Writers
// store a prompt's blocks in order and place each in the first free slot
// near its home, so a group's blocks usually sit in consecutive slots:
// the block after one found in slot p is most likely in slot p+1. A hit
// there is as good as one by probing (any slot holding a key is its
// entry, and the key is checked around the value read); otherwise the
// full probe decides and restarts the run. After a group's last block the
// guess reads a slot that is almost always in a line already loaded, and
// misses. A cursor is a small value that lookups keep in registers; the
// zero value guesses nothing.
type runCursor struct {
	next *slot  // where the run's next block should be; nil for none
	end  *slot  // one past the run's table, where next wraps
	t    *table // the run's table
}

// guess resolves key by the run's guess, or reports false when it
// missed. Small enough to inline, so that the common case of a lookup
// costs no call; on a hit the caller moves the run on (advance).
func (r *runCursor) guess(key uint64) (workers.Set, bool) {
	s := r.next
	if s == nil || s.key.Load() != key {
		return 0, false
	}
	v := s.val.Load()
	return workers.Set(v), s.key.Load() == key
}

// advance moves the run past the block guess found.
func (r *runCursor) advance() {
	r.next = (*slot)(unsafe.Add(unsafe.Pointer(r.next), slotSize))
	if r.next == r.end {
		r.next = r.t.at(0)
	}
}

// seek looks for a block that guess did not find further on in the run:
// a block whose parent sits in slot p was stored after p (unless a
// deletion has moved entries since), past whatever took p+1, typically
// the continuation of another prompt sharing the parent, so the slots
// from its home up to p need not be read again, as the full probe would.
// It reads at most seekSlots slots, stops at a reserved key, and on a hit
// moves the run there; a miss proves nothing and leaves it to the probe.
// A group's first block has no parent in the run.
func (r *runCursor) seek(key uint64) (workers.Set, bool) {
	s := r.next
	if s == nil || key>>counterShift&counterMask == 0 {
		return 0, false
	}
	// s is guess's slot; the slots after it, short of the table's end.
	n := min(seekSlots, int((uintptr(unsafe.Pointer(r.end))-uintptr(unsafe.Pointer(s)))/slotSize)-1)
	for range n {
		s = (*slot)(unsafe.Add(unsafe.Pointer(s), slotSize))
		k := s.key.Load()
		if k == key {
			v := s.val.Load()
			if s.key.Load() != key {
				return 0, false
			}
			r.next = s
			r.advance()
			return workers.Set(v), true
		}
		if k <= busyKey {
			return 0, false
		}
	}
	return 0, false
}

const seekSlots = 32

// runFrom is the run whose last block was found in slot p.
func (t *table) runFrom(p uint32) runCursor {
	r := runCursor{next: t.at(p), end: t.at(t.n), t: t}
	r.advance()
	return r
}

// resolve returns the workers holding the block with hash h, by the run's
// guess or the full probe, and moves the run on.
func (ix *Index) resolve(h uint64, run *runCursor) workers.Set {
	key := storedKey(h)
	v, ok := run.guess(key)
	if ok {
		run.advance()
	} else {
		v, *run = ix.probeBlock(key)
	}
	return v
}

// probeBlock is resolve's full probe. It scans the whole near window
// before it reads the home's spill count, a line of its own, and only
// then, if the count allows, the spill path: a probe that goes past the
// prefetched lines is in a window crowded by a popular prefix's
// continuations, where counts are often nonzero but the key is mostly
// found near, and reading the count and the spill home first put two
// misses, one after the other, in front of the rest of the scan (the
// scan's own lines are independent loads the CPU overlaps). A key found
// near or on its spill path starts a run.
func (ix *Index) probeBlock(key uint64) (workers.Set, runCursor) {
	t := &ix.nearShard(key).blocks
	home := t.home(key)
	v, p, st := t.probeNear(key, home, t.window)
	if st == probeHit {
		return workers.Set(v), t.runFrom(p)
	}
	if st != probeRaced && t.counts.get(t.self, home) != 0 {
		b := &ix.spillShard(key).blocks
		if v, p, st := b.probeNear(key, b.spillHome(key), b.n); st == probeHit {
			return workers.Set(v), b.runFrom(p)
		}
	}
	// Absent, or raced a writer: the careful path, whose move-sequence
	// checks make a miss trustworthy.
	v, _ = ix.lookupBlock(key)
	return workers.Set(v), runCursor{}
}

// writeBatch is how many keys a writer warms before it takes the first
// lock. Taking a lock is a full barrier, so a cache miss inside the
// critical section is paid alone; warming the batch's home slots first
// lets their misses overlap, and the locked updates then hit the cache.
const writeBatch = 16

// warm loads the slots where the batch's probes start and returns nothing
// useful: it exists for its cache side effect. A block's spill slot is
// warmed too when its spill count says the writer may have to walk there.
func (ix *Index) warm(hashes []uint64, engine bool, w workers.Slot) {
	for _, h := range hashes {
		if engine {
			key := mapKey(w, h)
			t := &ix.mapShard(key).engine
			t.at(t.home(key)).key.Load()
			continue
		}
		key := storedKey(h)
		t := &ix.nearShard(key).blocks
		home := t.home(key)
		t.at(home).key.Load()
		if t.counts.get(t.self, home) != 0 {
			b := &ix.spillShard(key).blocks
			b.at(b.spillHome(key)).key.Load()
		}
	}
}

// Stored records that worker w now caches the blocks with these hashes.
// A block the index has no room for is counted as overflow and skipped.
func (ix *Index) Stored(w workers.Slot, hashes []uint64) {
	ix.store(w, hashes, false, nil)
}

// StoredAgain is Stored that also appends to again the position in hashes
// of each block w held already, and returns it: an engine that keeps
// several copies of one block (vLLM does not de-duplicate) announces each
// copy's store and each copy's eviction, and the feed counts the copies
// so that evicting one leaves the block claimed. It also returns how many
// blocks were refused for want of room, in the table or in w's share.
func (ix *Index) StoredAgain(w workers.Slot, hashes []uint64, again []int) ([]int, int) {
	before := ix.refused[w].Load() // w has one writer (see Stored's callers)
	again = ix.store(w, hashes, true, again)
	return again, int(ix.refused[w].Load() - before)
}

func (ix *Index) store(w workers.Slot, hashes []uint64, collect bool, again []int) []int {
	ix.checkSlot(w)
	if invariants.Enabled {
		defer ix.wrote("Stored", len(hashes))
	}
	for at := 0; at < len(hashes); {
		batch := hashes[at:min(at+writeBatch, len(hashes))]
		ix.warm(batch, false, w)
		for i, h := range batch {
			if ix.updateBlock(storedKey(h), w, true) && collect {
				again = append(again, at+i)
			}
		}
		at += len(batch)
	}
	return again
}

// Removed records that worker w evicted the blocks with these hashes.
// Hashes the index does not hold for w are ignored.
func (ix *Index) Removed(w workers.Slot, hashes []uint64) {
	ix.checkSlot(w)
	if invariants.Enabled {
		defer ix.wrote("Removed", len(hashes))
	}
	for len(hashes) > 0 {
		batch := hashes[:min(writeBatch, len(hashes))]
		hashes = hashes[len(batch):]
		ix.warm(batch, false, w)
		for _, h := range batch {
			ix.updateBlock(storedKey(h), w, false)
		}
	}
}

// updateBlock adds w to the block key (store) or drops it, and reports
// whether w held it before. It takes the near shard's lock, and the spill
// shard's too when the key may be spilled or must spill, always ending up
// holding them in ascending shard order so that two writers never wait
// for each other's second lock.
func (ix *Index) updateBlock(key uint64, w workers.Slot, store bool) (had bool) {
	bit := uint64(workers.SetOf(w))
	a := ix.nearShard(key)
	at := &a.blocks
	home := at.home(key)
	a.mu.Lock()
	var b *shard
	// Deferred: the region may fault under a truncated segment file, and
	// a caught fault must not leave the shards locked (shm/fault.go).
	defer func() {
		if b != nil && b != a {
			b.mu.Unlock()
		}
		a.mu.Unlock()
	}()
	for {
		i, found := at.scan(key, home, at.window)
		if found {
			had = ix.applyBit(a, i, w, bit, store)
			break
		}
		free := i // an empty slot in the window, or notFound when it is full
		if at.counts.get(at.self, home) == 0 && (free != notFound || !store) {
			if store {
				ix.insertBlock(a, free, key, w, bit)
			}
			break // not spilled, so not present
		}
		if b == nil {
			b = ix.spillShard(key)
			if b != a && !lockSecond(a, b) {
				continue // a was let go meanwhile: look again
			}
		}
		bt := &b.blocks
		j, found := bt.scan(key, bt.spillHome(key), bt.n)
		switch {
		case found:
			had = ix.applyBit(b, j, w, bit, store)
		case !store:
		case free != notFound:
			ix.insertBlock(a, free, key, w, bit)
		default:
			at.counts.add(at.self, home, true) // before the entry is visible
			if !ix.insertBlock(b, j, key, w, bit) {
				at.counts.add(at.self, home, false)
			}
		}
		break
	}
	return had
}

// lockSecond locks b while a is held. If b comes after a, it just waits;
// otherwise it may only try, and on failure lets a go and takes both in
// order, reporting false: what the caller saw under a may have changed.
func lockSecond(a, b *shard) bool {
	if b.blocks.self > a.blocks.self {
		b.mu.Lock()
		return true
	}
	if b.mu.TryLock() {
		return true
	}
	a.mu.Unlock()
	b.mu.Lock()
	a.mu.Lock()
	return false
}

func (ix *Index) applyBit(sh *shard, i uint32, w workers.Slot, bit uint64, store bool) (had bool) {
	s := sh.blocks.at(i)
	had = s.val.Load()&bit != 0
	if !store {
		ix.clearBit(sh, i, w, bit)
		return had
	}
	if !had && !ix.blockOverQuota(sh, w) {
		s.val.Store(s.val.Load() | bit)
		sh.meta.workerBlocks[w].Add(1)
	}
	return had
}

func (ix *Index) insertBlock(sh *shard, i uint32, key uint64, w workers.Slot, bit uint64) bool {
	if ix.blockOverQuota(sh, w) {
		return false
	}
	if !sh.blocks.insertAt(i, key, bit) {
		ix.refused[w].Add(1)
		return false
	}
	sh.meta.workerBlocks[w].Add(1)
	return true
}

// clearBit drops w from slot i, deleting the entry when no worker is left.
// It reports whether the slot now holds another entry (after a shift),
// which callers scanning a shard must examine again. Writer.
func (ix *Index) clearBit(sh *shard, i uint32, w workers.Slot, bit uint64) (shifted bool) {
	s := sh.blocks.at(i)
	old := s.val.Load()
	if old&bit == 0 || s.key.Load() == emptyKey { // an empty slot's value is no block, whatever it holds
		return false
	}
	sh.meta.workerBlocks[w].Add(^uint32(0))
	if rest := old &^ bit; rest != 0 {
		s.val.Store(rest)
		return false
	}
	sh.blocks.deleteAt(i)
	return s.key.Load() != emptyKey
}

// Cleared drops every block of worker w and keeps its engine-hash map:
// the feed's resync, after which the engine's later events may still
// chain from blocks it holds. An engine's own clear is ClearedAll.
//
// The mappings kept include those of blocks the engine evicted in the
// events the resync stands for, whose removals never came: a worker that
// keeps losing events (a ring overflowing under a stalled router) would
// fill the engine map with them until it refuses every worker's stores.
// So once the map is more than half full, a resync drops the worker's
// mappings as ClearedAll does, trading a few continuations that will not
// chain for a map that stays usable.
func (ix *Index) Cleared(w workers.Slot) {
	ix.checkSlot(w)
	if ix.engineMapLive() > ix.geo.mapCapacity/2 {
		ix.forgetWorker(w, "Cleared")
		return
	}
	scanned := ix.clearWorker(w)
	if invariants.Enabled {
		ix.wrote("Cleared", scanned/scanPerWrite)
	}
}

// clearWorker drops every block of worker w and returns how many slots it
// scanned to find them.
func (ix *Index) clearWorker(w workers.Slot) (scanned int) {
	for si := range ix.shards {
		scanned += ix.clearWorkerIn(&ix.shards[si], w)
	}
	return scanned
}

// clearWorkerIn is clearWorker for one shard. Its lock is released by a
// defer, so that a fault in the region (a truncated segment file,
// shm/fault.go) caught by the caller does not leave it held.
func (ix *Index) clearWorkerIn(sh *shard, w workers.Slot) (scanned int) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.meta.workerBlocks[w].Load() == 0 {
		return 0
	}
	bit := uint64(workers.SetOf(w))
	for i := uint32(0); i < sh.blocks.n; {
		if ix.clearBit(sh, i, w, bit) {
			continue // a later entry moved into i
		}
		i++
	}
	return int(sh.blocks.n)
}

// engineMapLive counts the engine-hash mappings held, over every shard.
func (ix *Index) engineMapLive() uint64 {
	var n uint64
	for i := range ix.shards {
		n += ix.shards[i].meta.mapLive.Load()
	}
	return n
}

// RemoveWorker forgets worker w entirely: its blocks and its engine-hash
// mappings. The slot may then be given to another engine.
func (ix *Index) RemoveWorker(w workers.Slot) {
	ix.SetHybrid(w, nil)
	ix.forgetWorker(w, "RemoveWorker")
	ix.refused[w].Store(0)
}

// ClearedAll is Cleared for an engine that reports it emptied its cache
// (vLLM's reset_prefix_cache, SGLang's flush_cache): its engine-hash
// mappings go too, since no block it stores later can chain from one it
// dropped, and an engine reset after every weight sync would otherwise
// fill the engine map with the mappings of blocks long gone. Its KV-cache
// groups stay: the model is the same.
func (ix *Index) ClearedAll(w workers.Slot) {
	ix.checkSlot(w)
	ix.forgetWorker(w, "ClearedAll")
}

// forgetWorker drops every block and engine-hash mapping of worker w.
func (ix *Index) forgetWorker(w workers.Slot, op string) {
	scanned := ix.clearWorker(w)
	if invariants.Enabled {
		defer ix.wrote(op, (scanned+int(ix.geo.shards)*int(ix.geo.mapSlots))/scanPerWrite)
	}
	for si := range ix.shards {
		unmapWorkerIn(&ix.shards[si], w)
	}
}

// unmapWorkerIn drops worker w's engine-hash mappings from one shard,
// its lock released by a defer as in clearWorkerIn.
func unmapWorkerIn(sh *shard, w workers.Slot) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if !sh.mapped.Has(w) {
		return
	}
	for i := uint32(0); i < sh.engine.n; {
		k := sh.engine.at(i).key.Load()
		if k != emptyKey && k != busyKey && workers.Slot(k>>mapWorkerShift) == w {
			sh.engine.deleteAt(i)
			continue
		}
		i++
	}
	sh.mapped &^= workers.SetOf(w) // after the scan: not if it faulted
	sh.mapHeld[w] = 0
}

func (ix *Index) checkSlot(w workers.Slot) {
	if !w.Valid() {
		panic(fmt.Sprintf("BUG: radix: worker slot %d out of range", w))
	}
}

// The engine map's key carries the worker slot in its top six bits, so
// RemoveWorker can find a worker's entries, and 58 bits of a mix of the
// engine hash below them (a false match needs two engine hashes of one
// worker to agree on 58 mixed bits).
const (
	mapWorkerShift = 58
	mapHashMask    = 1<<mapWorkerShift - 1
)

func mapKey(w workers.Slot, engine uint64) uint64 {
	return storedKey(mix64(engine^uint64(w)*0x9e3779b97f4a7c15)&mapHashMask | uint64(w)<<mapWorkerShift)
}

// MapEngineHash remembers that worker w's block named engine by the engine
// has the kvfast hash kv, so a later removal by engine hash resolves. It
// reports false if the map is full (counted as map overflow).
func (ix *Index) MapEngineHash(w workers.Slot, engine, kv uint64) bool {
	ix.checkSlot(w)
	if invariants.Enabled {
		defer ix.wrote("MapEngineHash", 1)
	}
	return ix.mapEngineHash(w, engine, kv, true)
}

// mapEngineHash maps worker w's engine hash to kv, replacing a mapping to
// another block when replace is set and keeping it otherwise. It reports
// whether engine maps to kv after: false also for a full map.
func (ix *Index) mapEngineHash(w workers.Slot, engine, kv uint64, replace bool) bool {
	ok, _ := ix.mapEngineHashHad(w, engine, kv, replace)
	return ok
}

// mapEngineHashHad is mapEngineHash that also reports whether the engine
// hash named kv already.
func (ix *Index) mapEngineHashHad(w workers.Slot, engine, kv uint64, replace bool) (ok, had bool) {
	key := mapKey(w, engine)
	sh := ix.mapShard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i, found := sh.engine.find(key)
	if !found {
		if ix.mapOverQuota(sh, w) {
			return false, false
		}
		if !sh.engine.insertAt(i, key, kv) {
			ix.refused[w].Add(1)
			return false, false
		}
		sh.mapped |= workers.SetOf(w)
		sh.mapHeld[w]++
		return true, false
	}
	if sh.engine.at(i).val.Load() == kv {
		return true, true
	}
	if replace {
		sh.engine.at(i).val.Store(kv)
		return true, false
	}
	return false, false
}

// LookupEngineHash resolves worker w's engine hash to the kvfast hash.
func (ix *Index) LookupEngineHash(w workers.Slot, engine uint64) (uint64, bool) {
	ix.checkSlot(w)
	key := mapKey(w, engine)
	return ix.mapShard(key).engine.lookup(key)
}

// UnmapEngineHash resolves and forgets worker w's engine hash.
func (ix *Index) UnmapEngineHash(w workers.Slot, engine uint64) (uint64, bool) {
	ix.checkSlot(w)
	if invariants.Enabled {
		defer ix.wrote("UnmapEngineHash", 1)
	}
	return ix.unmapEngineHash(w, engine)
}

func (ix *Index) unmapEngineHash(w workers.Slot, engine uint64) (uint64, bool) {
	key := mapKey(w, engine)
	sh := ix.mapShard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i, found := sh.engine.find(key)
	if !found {
		sh.meta.unresolvedRemovals.Add(1)
		return 0, false
	}
	kv := sh.engine.at(i).val.Load()
	sh.engine.deleteAt(i)
	if w := workers.Slot(key >> mapWorkerShift); sh.mapHeld[w] > 0 {
		sh.mapHeld[w]-- // a count taken while another process wrote may be short
	}
	return kv, true
}

// MapEngineHashes is MapEngineHash for a batch, engines[i] mapping to
// kvs[i], except that an engine hash that already names another block of
// w keeps it: engines that hash each block alone (SGLang releases that
// hash a page's tokens without its prefix) give one name to every copy of
// a page, and the later mapping would leave the earlier block with no
// name, claimed until the next resync. The caller decides (the feed lets
// a new block take a name whose block w no longer holds). It returns how
// many of engines[i] map to kvs[i] afterwards, and appends to had the
// position of each engine hash that named its kvfast hash already: with
// StoredAgain, how the feed tells a block an engine announces once more
// under the same name (another copy of it) from one it names anew.
func (ix *Index) MapEngineHashes(w workers.Slot, engines, kvs []uint64, had []int) (int, []int) {
	if len(engines) != len(kvs) {
		panic("BUG: radix: MapEngineHashes with unequal slices")
	}
	ix.checkSlot(w)
	if invariants.Enabled {
		defer ix.wrote("MapEngineHashes", len(engines))
	}
	mapped := 0
	for at := 0; at < len(engines); {
		n := min(writeBatch, len(engines)-at)
		ix.warm(engines[at:at+n], true, w)
		for i := at; i < at+n; i++ {
			ok, existed := ix.mapEngineHashHad(w, engines[i], kvs[i], false)
			if ok {
				mapped++
			}
			if existed {
				had = append(had, i)
			}
		}
		at += n
	}
	return mapped, had
}

// UnmapEngineHashes is UnmapEngineHash for a batch: it appends to dst the
// kvfast hash of every engine hash that resolved, and returns dst.
func (ix *Index) UnmapEngineHashes(w workers.Slot, engines []uint64, dst []uint64) []uint64 {
	ix.checkSlot(w)
	if invariants.Enabled {
		defer ix.wrote("UnmapEngineHashes", len(engines))
	}
	for len(engines) > 0 {
		n := min(writeBatch, len(engines))
		ix.warm(engines[:n], true, w)
		for _, e := range engines[:n] {
			if kv, ok := ix.unmapEngineHash(w, e); ok {
				dst = append(dst, kv)
			}
		}
		engines = engines[n:]
	}
	return dst
}
