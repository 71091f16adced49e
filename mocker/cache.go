package mocker

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
type kvCache struct {
	blocks []kvBlock
	byHash map[uint64]int32
	empty  blockList
	lru    blockList
	held   int // blocks with ref > 0
	ev     *eventSink

	stored, evicted uint64 // counters for Stats
}

type kvBlock struct {
	hash       uint64
	ref        int32
	cached     bool // hash is registered in byHash
	prev, next int32
}

const noBlock = -1

type blockList struct {
	head, tail int32
	n          int
}

func newKVCache(nblocks int, ev *eventSink) kvCache {
	c := kvCache{
		blocks: make([]kvBlock, nblocks),
		byHash: make(map[uint64]int32, nblocks),
		empty:  blockList{head: noBlock, tail: noBlock},
		lru:    blockList{head: noBlock, tail: noBlock},
		ev:     ev,
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

// match returns how many leading hashes are cached, and how many of those
// are unreferenced (so that taking them shrinks what free reports).
func (c *kvCache) match(hashes []uint64) (hit, unreferenced int) {
	for _, h := range hashes {
		id, ok := c.byHash[h]
		if !ok {
			break
		}
		hit++
		if c.blocks[id].ref == 0 {
			unreferenced++
		}
	}
	return hit, unreferenced
}

// acquireCached takes a reference on the block caching h, which must exist.
func (c *kvCache) acquireCached(h uint64) int32 {
	id, ok := c.byHash[h]
	if !ok {
		panic("BUG: mocker: acquiring a block that is not cached")
	}
	c.acquire(id)
	return id
}

func (c *kvCache) acquire(id int32) {
	b := &c.blocks[id]
	if b.ref == 0 {
		c.unlink(&c.lru, id)
		c.held++
	}
	b.ref++
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
		b := &c.blocks[id]
		delete(c.byHash, b.hash)
		b.cached = false
		c.evicted++
		c.ev.remove(b.hash)
	default:
		return noBlock, false
	}
	b := &c.blocks[id]
	b.hash, b.ref = 0, 1
	c.held++
	return id, true
}

// release drops one reference. An unreferenced block goes to the LRU tail
// if it is cached, or back to the empty list if it never filled up.
func (c *kvCache) release(id int32) {
	b := &c.blocks[id]
	if b.ref <= 0 {
		panic("BUG: mocker: releasing an unreferenced block")
	}
	b.ref--
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
	c.byHash[h] = id
	c.stored++
	c.ev.store(parent, hasParent, BlockEvent{Hash: h, Tokens: tokens, LoRA: lora, Salt: salt, MM: mm.items, Start: mm.start})
	return id, false
}

// dropAll forgets every cached block; it requires that none is held.
func (c *kvCache) dropAll() {
	if c.held != 0 {
		panic("BUG: mocker: clearing a cache with held blocks")
	}
	for c.lru.n > 0 {
		id := c.lru.head
		c.unlink(&c.lru, id)
		b := &c.blocks[id]
		b.cached, b.hash = false, 0
		c.pushTail(&c.empty, id)
	}
	clear(c.byHash)
	c.ev.cleared()
}
