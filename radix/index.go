package radix

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"
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
}

type shard struct {
	mu     sync.Mutex // serialises writers of this shard; readers never take it
	blocks table
	engine table
	meta   *shardMeta
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

	workerBlocks [MaxWorkers]atomic.Uint32
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
	return open(region, g), nil
}

func open(region []byte, g geometry) *Index {
	ix := &Index{region: region, geo: g, shards: make([]shard, g.shards)}
	base := unsafe.Pointer(unsafe.SliceData(region))
	for i := range ix.shards {
		meta := (*shardMeta)(unsafe.Add(base, g.shardMetaBase+i*shardMetaSize))
		sh := &ix.shards[i]
		sh.meta = meta
		sh.blocks = table{
			slots:    unsafe.Add(base, g.tableOff+i*int(g.blockSlots)*slotSize),
			n:        g.blockSlots,
			limit:    g.blockLimit,
			moveSeq:  &meta.blockMoveSeq,
			live:     &meta.blockLive,
			overflow: &meta.blockOverflow,
		}
		sh.engine = table{
			slots:    unsafe.Add(base, g.mapOff+i*int(g.mapSlots)*slotSize),
			n:        g.mapSlots,
			limit:    g.mapLimit,
			moveSeq:  &meta.mapMoveSeq,
			live:     &meta.mapLive,
			overflow: &meta.mapOverflow,
		}
	}
	return ix
}

func (ix *Index) shardFor(key uint64) *shard {
	return &ix.shards[(key>>32)&ix.geo.shardMask]
}

// Lookup returns the workers that hold the block with hash h.
func (ix *Index) Lookup(h uint64) WorkerSet {
	key := storedKey(h)
	v, _ := ix.shardFor(key).blocks.lookup(key)
	return WorkerSet(v)
}

// lookupBatch is how many probes FindMatches issues before it consumes any
// result. The first-slot loads of a batch are independent, so the CPU
// overlaps their cache misses instead of paying them one after another.
const lookupBatch = 16

// FindMatches writes into out, for every worker, how many leading hashes it
// holds without a gap, and returns the set of workers whose overlap is at
// least one block. It stops probing as soon as no worker is left. It makes
// no allocation and takes no lock.
func (ix *Index) FindMatches(hashes []uint64, out *Overlaps) WorkerSet {
	*out = Overlaps{}
	var (
		active  = AllWorkers
		matched WorkerSet
		keys    [lookupBatch]uint64
		homes   [lookupBatch]uint32
		firsts  [lookupBatch]uint64
	)
	mask := ix.geo.shardMask
	for base := 0; base < len(hashes); base += lookupBatch {
		n := min(lookupBatch, len(hashes)-base)
		// Phase 1: issue every first-slot load of the batch.
		for j := 0; j < n; j++ {
			key := storedKey(hashes[base+j])
			t := &ix.shards[(key>>32)&mask].blocks
			keys[j] = key
			homes[j] = t.home(key)
			firsts[j] = t.at(homes[j]).key.Load()
		}
		// Phase 2: resolve each in order, walking on from the home slot
		// (usually within the cache line phase 1 brought in).
		for j := 0; j < n; j++ {
			key := keys[j]
			t := &ix.shards[(key>>32)&mask].blocks
			var set WorkerSet
			if v, ok := t.probeFrom(key, homes[j], firsts[j]); ok {
				set = WorkerSet(v)
			} else {
				v, _ := t.lookup(key) // miss, or raced a writer: the careful path
				set = WorkerSet(v)
			}
			i := base + j
			next := active & set
			if i > 0 {
				for gone := active &^ next; gone != 0; {
					var w WorkerSlot
					w, gone = gone.First()
					out[w] = uint32(i)
				}
			} else {
				matched = next
			}
			active = next
			if active == 0 {
				return matched
			}
		}
	}
	for rest := active; rest != 0; {
		var w WorkerSlot
		w, rest = rest.First()
		out[w] = uint32(len(hashes))
	}
	return matched
}

// writeBatch is how many keys a writer warms before it takes the first
// lock. Taking a lock is a full barrier, so a cache miss inside the
// critical section is paid alone; warming the batch's home slots first
// lets their misses overlap, and the locked updates then hit the cache.
const writeBatch = 16

// warm loads the home slot of every key of a batch and returns nothing
// useful: it exists for its cache side effect.
func (ix *Index) warm(hashes []uint64, engine bool, w WorkerSlot) {
	for _, h := range hashes {
		var key uint64
		var t *table
		if engine {
			key = mapKey(w, h)
			t = &ix.shardFor(key).engine
		} else {
			key = storedKey(h)
			t = &ix.shardFor(key).blocks
		}
		t.at(t.home(key)).key.Load()
	}
}

// Stored records that worker w now caches the blocks with these hashes.
// A block the index has no room for is counted as overflow and skipped.
func (ix *Index) Stored(w WorkerSlot, hashes []uint64) {
	ix.checkSlot(w)
	bit := uint64(SetOf(w))
	for len(hashes) > 0 {
		batch := hashes[:min(writeBatch, len(hashes))]
		hashes = hashes[len(batch):]
		ix.warm(batch, false, w)
		for _, h := range batch {
			key := storedKey(h)
			sh := ix.shardFor(key)
			sh.mu.Lock()
			if i, found := sh.blocks.find(key); found {
				s := sh.blocks.at(i)
				if old := s.val.Load(); old&bit == 0 {
					s.val.Store(old | bit)
					sh.meta.workerBlocks[w].Add(1)
				}
			} else if sh.blocks.insertAt(i, key, bit) {
				sh.meta.workerBlocks[w].Add(1)
			}
			sh.mu.Unlock()
		}
	}
}

// Removed records that worker w evicted the blocks with these hashes.
// Hashes the index does not hold for w are ignored.
func (ix *Index) Removed(w WorkerSlot, hashes []uint64) {
	ix.checkSlot(w)
	bit := uint64(SetOf(w))
	for len(hashes) > 0 {
		batch := hashes[:min(writeBatch, len(hashes))]
		hashes = hashes[len(batch):]
		ix.warm(batch, false, w)
		for _, h := range batch {
			key := storedKey(h)
			sh := ix.shardFor(key)
			sh.mu.Lock()
			if i, found := sh.blocks.find(key); found {
				ix.clearBit(sh, i, w, bit)
			}
			sh.mu.Unlock()
		}
	}
}

// clearBit drops w from slot i, deleting the entry when no worker is left.
// It reports whether the slot now holds another entry (after a shift),
// which callers scanning a shard must examine again. Writer.
func (ix *Index) clearBit(sh *shard, i uint32, w WorkerSlot, bit uint64) (shifted bool) {
	s := sh.blocks.at(i)
	old := s.val.Load()
	if old&bit == 0 {
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

// Cleared drops every block of worker w, as when the engine reports that
// it emptied its cache. The engine-hash map is kept.
func (ix *Index) Cleared(w WorkerSlot) {
	ix.checkSlot(w)
	bit := uint64(SetOf(w))
	for si := range ix.shards {
		sh := &ix.shards[si]
		sh.mu.Lock()
		if sh.meta.workerBlocks[w].Load() != 0 {
			for i := uint32(0); i < sh.blocks.n; {
				if ix.clearBit(sh, i, w, bit) {
					continue // a later entry moved into i
				}
				i++
			}
		}
		sh.mu.Unlock()
	}
}

// RemoveWorker forgets worker w entirely: its blocks and its engine-hash
// mappings. The slot may then be given to another engine.
func (ix *Index) RemoveWorker(w WorkerSlot) {
	ix.Cleared(w)
	for si := range ix.shards {
		sh := &ix.shards[si]
		sh.mu.Lock()
		for i := uint32(0); i < sh.engine.n; {
			k := sh.engine.at(i).key.Load()
			if k != emptyKey && k != busyKey && WorkerSlot(k>>mapWorkerShift) == w {
				sh.engine.deleteAt(i)
				continue
			}
			i++
		}
		sh.mu.Unlock()
	}
}

func (ix *Index) checkSlot(w WorkerSlot) {
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

func mapKey(w WorkerSlot, engine uint64) uint64 {
	return storedKey(mix64(engine^uint64(w)*0x9e3779b97f4a7c15)&mapHashMask | uint64(w)<<mapWorkerShift)
}

// mix64 is a bijective finaliser (SplitMix64's): engine hashes may be
// anything, even small sequential integers, and the table needs uniform
// bits for sharding and probing.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// MapEngineHash remembers that worker w's block named engine by the engine
// has the kvfast hash kv, so a later removal by engine hash resolves. It
// reports false if the map is full (counted as map overflow).
func (ix *Index) MapEngineHash(w WorkerSlot, engine, kv uint64) bool {
	ix.checkSlot(w)
	key := mapKey(w, engine)
	sh := ix.shardFor(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i, found := sh.engine.find(key)
	if found {
		sh.engine.at(i).val.Store(kv)
		return true
	}
	return sh.engine.insertAt(i, key, kv)
}

// LookupEngineHash resolves worker w's engine hash to the kvfast hash.
func (ix *Index) LookupEngineHash(w WorkerSlot, engine uint64) (uint64, bool) {
	ix.checkSlot(w)
	key := mapKey(w, engine)
	return ix.shardFor(key).engine.lookup(key)
}

// UnmapEngineHash resolves and forgets worker w's engine hash.
func (ix *Index) UnmapEngineHash(w WorkerSlot, engine uint64) (uint64, bool) {
	ix.checkSlot(w)
	key := mapKey(w, engine)
	sh := ix.shardFor(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i, found := sh.engine.find(key)
	if !found {
		sh.meta.unresolvedRemovals.Add(1)
		return 0, false
	}
	kv := sh.engine.at(i).val.Load()
	sh.engine.deleteAt(i)
	return kv, true
}

// MapEngineHashes is MapEngineHash for a batch: engines[i] maps to kvs[i].
// It returns how many mappings found room.
func (ix *Index) MapEngineHashes(w WorkerSlot, engines, kvs []uint64) int {
	if len(engines) != len(kvs) {
		panic("BUG: radix: MapEngineHashes with unequal slices")
	}
	mapped := 0
	for len(engines) > 0 {
		n := min(writeBatch, len(engines))
		ix.warm(engines[:n], true, w)
		for i := range n {
			if ix.MapEngineHash(w, engines[i], kvs[i]) {
				mapped++
			}
		}
		engines, kvs = engines[n:], kvs[n:]
	}
	return mapped
}

// UnmapEngineHashes is UnmapEngineHash for a batch: it appends to dst the
// kvfast hash of every engine hash that resolved, and returns dst.
func (ix *Index) UnmapEngineHashes(w WorkerSlot, engines []uint64, dst []uint64) []uint64 {
	for len(engines) > 0 {
		n := min(writeBatch, len(engines))
		ix.warm(engines[:n], true, w)
		for _, e := range engines[:n] {
			if kv, ok := ix.UnmapEngineHash(w, e); ok {
				dst = append(dst, kv)
			}
		}
		engines = engines[n:]
	}
	return dst
}
