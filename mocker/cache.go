package mocker

import "github.com/kvfast/kvfast/workers"

// kvCache is the engine's paged KV cache: a fixed pool of blocks, a map from
// engine hash to the block that caches it, and two free lists. It is owned
// by one Core and is not safe for concurrent use.
//
// A block is in exactly one of three places:
//   - held: ref > 0, on no list;
//   - empty: ref == 0 and no hash, on the empty list;
//   - cached: ref == 0 with a hash, on the LRU list, still findable by hash.
//
// Allocation takes an empty block first and only then evicts the head of
// the LRU list, so a cached prefix is kept as long as any never-cached
// memory is left. Releasing a cached block appends it to the LRU tail;
// callers release a request's blocks last-to-first so that a prefix's tail
// is evicted before its head, which keeps the most shareable blocks longest.
//
// With a host pool, an evicted block is first copied there (offload). In a
// hybrid engine every cached block is also held in group 1, the
// sliding-window group, until no holder's window covers it any more
// (leaveWindow) or group 0 evicts it.
type kvCache struct {
	blocks []kvBlock
	byHash map[uint64]int32
	empty  blockList
	lru    blockList
	held   int // blocks with ref > 0
	ev     *eventSink

	host   *hostPool // nil without a host pool
	tokens []uint32  // with a host pool: block id's tokens at [id·bs, (id+1)·bs), for offloading
	bs     int

	// Where events place blocks: group 0 on the GPU, group 1 (hybrid
	// engines), and the host pool.
	gpu, window, hostTier Placement

	stored, evicted               uint64 // counters for Stats
	offloaded, loaded, hostEvicts uint64
	windowFreed                   uint64
}

type kvBlock struct {
	hash       uint64
	ref        int32
	cached     bool // hash is registered in byHash
	prev, next int32

	// What an offload announces besides the hash: the block's parent and
	// namespace (its tokens are in kvCache.tokens).
	parent     uint64
	hasParent  bool
	lora, salt string

	// Hybrid engines: inWindow says group 1 holds the block; winRef counts
	// the holders whose sliding window still covers it.
	inWindow bool
	winRef   int32
}

const noBlock = -1

type blockList struct {
	head, tail int32
	n          int
}

func newKVCache(cfg *Config, ev *eventSink) kvCache {
	nblocks := cfg.KVBlocks
	c := kvCache{
		blocks: make([]kvBlock, nblocks),
		byHash: make(map[uint64]int32, nblocks),
		empty:  blockList{head: noBlock, tail: noBlock},
		lru:    blockList{head: noBlock, tail: noBlock},
		ev:     ev,
		bs:     cfg.BlockSize,
	}
	c.hostTier.Tier = workers.TierHost
	if cfg.HostBlocks > 0 {
		c.host = newHostPool(cfg.HostBlocks)
		c.tokens = make([]uint32, nblocks*cfg.BlockSize)
	}
	if cfg.SlidingWindow > 0 {
		c.gpu = Placement{Hybrid: true}
		c.window = Placement{Hybrid: true, Group: 1, SlidingWindow: cfg.SlidingWindow}
	}
	for i := range c.blocks {
		c.blocks[i] = kvBlock{prev: noBlock, next: noBlock}
		c.pushTail(&c.empty, int32(i))
	}
	return c
}

func (c *kvCache) pushTail(l *blockList, id int32) {
	b := &c.blocks[id]
	b.prev, b.next = l.tail, noBlock
	if l.tail == noBlock {
		l.head = id
	} else {
		c.blocks[l.tail].next = id
	}
	l.tail = id
	l.n++
}

func (c *kvCache) unlink(l *blockList, id int32) {
	b := &c.blocks[id]
	if b.prev == noBlock {
		l.head = b.next
	} else {
		c.blocks[b.prev].next = b.next
	}
	if b.next == noBlock {
		l.tail = b.prev
	} else {
		c.blocks[b.next].prev = b.prev
	}
	b.prev, b.next = noBlock, noBlock
	l.n--
}

// total is the capacity in blocks.
func (c *kvCache) total() int { return len(c.blocks) }

// free is how many blocks an allocation could obtain right now, counting
// cached blocks that would have to be evicted.
func (c *kvCache) free() int { return c.empty.n + c.lru.n }

// cachedBlocks is how many blocks are findable by hash, held or not.
func (c *kvCache) cachedBlocks() int { return len(c.byHash) }

// match returns how many leading hashes are cached.
func (c *kvCache) match(hashes []uint64) (hit int) {
	for _, h := range hashes {
		if _, ok := c.byHash[h]; !ok {
			break
		}
		hit++
	}
	return hit
}

// unreferenced returns how many of the cached blocks named hashes no
// request holds (so that taking them shrinks what free reports).
func (c *kvCache) unreferenced(hashes []uint64) (n int) {
	for _, h := range hashes {
		if c.blocks[c.byHash[h]].ref == 0 {
			n++
		}
	}
	return n
}

// windowHit returns the longest prefix of the cached blocks named hashes
// that a hybrid engine can reuse: one whose last window blocks group 1
// holds, or all of whose blocks it holds when the prefix is shorter. This
// is vLLM's sliding-window rule (SlidingWindowManager.find_longest_cache_hit):
// scanning back from the end, a block missing from group 1 moves the
// candidate end to it.
func (c *kvCache) windowHit(hashes []uint64, window int) int {
	end, run := len(hashes), 0
	for i := len(hashes) - 1; i >= 0; i-- {
		if !c.blocks[c.byHash[hashes[i]]].inWindow {
			end, run = i, 0
			continue
		}
		if run++; run >= window {
			break
		}
	}
	return end
}

// acquireCached takes a reference on the block caching h, which must
// exist; inWindow says the taker's sliding window covers it.
func (c *kvCache) acquireCached(h uint64, inWindow bool) int32 {
	id, ok := c.byHash[h]
	if !ok {
		panic("BUG: mocker: acquiring a block that is not cached")
	}
	c.acquire(id, inWindow)
	return id
}

func (c *kvCache) acquire(id int32, inWindow bool) {
	b := &c.blocks[id]
	if b.ref == 0 {
		c.unlink(&c.lru, id)
		c.held++
	}
	b.ref++
	if inWindow {
		b.winRef++
	}
}

// load notes that the blocks named hashes, which the host pool holds, are
// being copied back to the GPU.
func (c *kvCache) load(hashes []uint64) {
	for _, h := range hashes {
		c.host.touch(h)
	}
	c.loaded += uint64(len(hashes))
}

// allocate takes a block for new tokens, evicting the least recently used
// unreferenced cached block if no empty one is left. It reports false when
// every block is held.
func (c *kvCache) allocate() (int32, bool) {
	var id int32
	switch {
	case c.empty.n > 0:
		id = c.empty.head
		c.unlink(&c.empty, id)
	case c.lru.n > 0:
		id = c.lru.head
		c.unlink(&c.lru, id)
		c.evict(id)
	default:
		return noBlock, false
	}
	b := &c.blocks[id]
	b.hash, b.ref, b.winRef = 0, 1, 1
	c.held++
	return id, true
}

// evict drops cached block id from the GPU, copying it to the host pool
// first when there is one: the copy is announced while the GPU's is still
// there, so that a consumer who knows the block only by its GPU copy can
// name the new one.
func (c *kvCache) evict(id int32) {
	b := &c.blocks[id]
	if c.host != nil {
		c.offload(id)
	}
	if b.inWindow {
		b.inWindow = false
		c.ev.remove(c.window, b.hash)
	}
	delete(c.byHash, b.hash)
	b.cached = false
	c.evicted++
	c.ev.remove(c.gpu, b.hash)
}

func (c *kvCache) offload(id int32) {
	b := &c.blocks[id]
	victim, dropped, added := c.host.put(b.hash)
	if dropped {
		c.hostEvicts++
		c.ev.remove(c.hostTier, victim)
	}
	if added {
		c.offloaded++
		c.ev.store(c.hostTier, b.parent, b.hasParent, BlockEvent{Hash: b.hash,
			Tokens: c.tokens[int(id)*c.bs : int(id+1)*c.bs], LoRA: b.lora, Salt: b.salt})
	}
}

// leaveWindow notes that a holder's sliding window has passed block id.
// When no holder's window covers it any more, group 1 frees it, long
// before group 0 evicts it.
func (c *kvCache) leaveWindow(id int32) {
	b := &c.blocks[id]
	if b.winRef <= 0 {
		panic("BUG: mocker: leaving the window of a block no window covers")
	}
	if b.winRef--; b.winRef == 0 && b.inWindow {
		b.inWindow = false
		c.windowFreed++
		c.ev.remove(c.window, b.hash)
	}
}

// enterWindow stores cached block id in group 1 if it is not there, with
// the tokens it holds.
func (c *kvCache) enterWindow(id int32, tokens []uint32) {
	b := &c.blocks[id]
	if b.inWindow || !b.cached {
		return
	}
	b.inWindow = true
	c.ev.store(c.window, b.parent, b.hasParent, BlockEvent{Hash: b.hash, Tokens: tokens, LoRA: b.lora, Salt: b.salt})
}

// release drops one reference; leftWindow says the holder's window had
// already passed the block. An unreferenced block goes to the LRU tail if
// it is cached, or back to the empty list if it never filled up; a cached
// one stays in group 1 if it is there.
func (c *kvCache) release(id int32, leftWindow bool) {
	b := &c.blocks[id]
	if b.ref <= 0 {
		panic("BUG: mocker: releasing an unreferenced block")
	}
	b.ref--
	if !leftWindow {
		b.winRef--
	}
	if b.ref > 0 {
		return
	}
	c.held--
	if b.cached {
		c.pushTail(&c.lru, id)
	} else {
		c.pushTail(&c.empty, id)
	}
}

// commit registers a held, full block under hash h and publishes it. If
// another block already caches h, nothing changes and that block's id is
// returned with dup set: the caller switches to it (hash dedup).
func (c *kvCache) commit(id int32, h uint64, parent uint64, hasParent bool, tokens []uint32, lora, salt string, mm blockMM) (existing int32, dup bool) {
	if other, ok := c.byHash[h]; ok {
		return other, true
	}
	b := &c.blocks[id]
	if b.ref <= 0 || b.cached {
		panic("BUG: mocker: committing a block that is not held or already cached")
	}
	b.hash, b.cached = h, true
	b.parent, b.hasParent, b.lora, b.salt = parent, hasParent, lora, salt
	if c.tokens != nil {
		copy(c.tokens[int(id)*c.bs:], tokens)
	}
	c.byHash[h] = id
	c.stored++
	c.ev.store(c.gpu, parent, hasParent, BlockEvent{Hash: h, Tokens: tokens, LoRA: lora, Salt: salt, MM: mm.items, Start: mm.start})
	return id, false
}

// dropAll forgets every cached block, the host pool's copies included; it
// requires that none is held.
func (c *kvCache) dropAll() {
	if c.held != 0 {
		panic("BUG: mocker: clearing a cache with held blocks")
	}
	for c.lru.n > 0 {
		id := c.lru.head
		c.unlink(&c.lru, id)
		b := &c.blocks[id]
		b.cached, b.hash, b.inWindow = false, 0, false
		b.lora, b.salt = "", ""
		c.pushTail(&c.empty, id)
	}
	clear(c.byHash)
	if c.host != nil {
		c.host.clear()
	}
	c.ev.cleared()
}
