package replay

// PooledLRU is the finite-capacity reference a measured hit rate is set
// against when the engines' caches cannot hold the working set: the
// prefix hit rate of ONE LRU cache holding all engines' blocks together,
// fed the replayed prompts in arrival order. A router that spreads
// prompts over separate caches can approach it only by keeping each
// prefix in one place and filling every cache evenly; it is not a strict
// upper bound (LRU is not an optimal replacement policy, and engines also
// keep blocks of requests still running), but it is what a perfect pooled
// cache of the same size would report.
//
// The simulation is the engines' own rule, exactly and deterministically:
// a prompt of P tokens is cut into KV blocks of BlockSize tokens; of its
// first (P−1)/BlockSize blocks (the engine always computes the last
// token), the leading run found in the cache is the hit, counted in
// tokens as engines report cached_tokens; then the hit blocks are held
// and every full block of the prompt is touched, last block first, so that a prefix's head is the
// most recently used and its tail is evicted first, as the mock engines
// release blocks. Blocks are identified by the chain of hash ids that
// produces their tokens (TokenSynth), so two prompts share a block exactly
// when the engines would.
type PooledLRU struct {
	Bound
	// CapacityBlocks is the pooled cache's size in KV blocks.
	CapacityBlocks int `json:"capacity_blocks"`
	// WorkingSetBlocks is the number of distinct full KV blocks the
	// replayed prompts contain: the capacity at which the pooled cache
	// never evicts and its hit rate equals the infinite-cache bound's
	// (short of the last-token rule).
	WorkingSetBlocks int `json:"working_set_blocks"`
	// Evicted counts the blocks the pooled cache evicted.
	Evicted int64 `json:"evicted_blocks"`
}

// lruKey names one KV block: the trie node of the hash id holding its
// last token and the block's index in the prompt. The node fixes every
// token up to that hash id's end, and a partial last hash id's tokens are
// a prefix of the full id's, so the key is the block's content.
type lruKey struct {
	node  uint32
	block uint32
}

type lruEntry struct {
	key        lruKey
	prev, next int32
}

// lruCache is a fixed-capacity LRU set of blocks: a map into an array of
// entries threaded on one list, most recent at the head.
type lruCache struct {
	at         map[lruKey]int32
	entries    []lruEntry
	head, tail int32
	evicted    int64
}

func newLRUCache(capacity int) *lruCache {
	return &lruCache{at: make(map[lruKey]int32, capacity), entries: make([]lruEntry, 0, capacity), head: -1, tail: -1}
}

func (c *lruCache) unlink(i int32) {
	e := &c.entries[i]
	if e.prev >= 0 {
		c.entries[e.prev].next = e.next
	} else {
		c.head = e.next
	}
	if e.next >= 0 {
		c.entries[e.next].prev = e.prev
	} else {
		c.tail = e.prev
	}
}

func (c *lruCache) pushFront(i int32) {
	e := &c.entries[i]
	e.prev, e.next = -1, c.head
	if c.head >= 0 {
		c.entries[c.head].prev = i
	}
	c.head = i
	if c.tail < 0 {
		c.tail = i
	}
}

// touch makes k the most recently used block, inserting it (and evicting
// the least recently used block when full) if absent.
func (c *lruCache) touch(k lruKey) {
	if i, ok := c.at[k]; ok {
		c.unlink(i)
		c.pushFront(i)
		return
	}
	var i int32
	if len(c.entries) < cap(c.entries) {
		i = int32(len(c.entries))
		c.entries = append(c.entries, lruEntry{key: k})
	} else {
		i = c.tail
		c.unlink(i)
		delete(c.at, c.entries[i].key)
		c.entries[i].key = k
		c.evicted++
	}
	c.at[k] = i
	c.pushFront(i)
}

// PooledLRU simulates one LRU cache of capacityBlocks KV blocks of
// blockSize tokens over the trace's prompts synthesised with blockTokens
// tokens per hash id (0: the trace's block size). capacityBlocks <= 0
// gives a cache that holds the whole working set.
func (t *Trace) PooledLRU(capacityBlocks, blockTokens, blockSize int) PooledLRU {
	tbs := t.blockSize()
	if blockTokens <= 0 {
		blockTokens = tbs
	}
	if blockSize <= 0 {
		blockSize = 1
	}
	keys, lens := t.blockKeys(blockTokens, blockSize)
	var out PooledLRU
	distinct := make(map[lruKey]struct{})
	for _, ks := range keys {
		for _, k := range ks {
			distinct[k] = struct{}{}
		}
	}
	out.WorkingSetBlocks = len(distinct)
	if capacityBlocks <= 0 {
		capacityBlocks = max(out.WorkingSetBlocks, 1)
	}
	out.CapacityBlocks = capacityBlocks
	c := newLRUCache(capacityBlocks)
	for i, ks := range keys {
		p := lens[i]
		maxHit := (p - 1) / blockSize
		hit := 0
		for hit < maxHit {
			if _, ok := c.at[ks[hit]]; !ok {
				break
			}
			hit++
		}
		out.PromptTokens += int64(p)
		out.HitTokens += int64(hit * blockSize)
		out.TotalBlocks += int64(len(ks))
		out.HitBlocks += int64(hit)
		// The engine holds the blocks it hit before it allocates the
		// rest, so allocation cannot evict them; then it releases the
		// prompt last block first. A prompt longer than the cache keeps
		// only its head.
		for j := hit - 1; j >= 0; j-- {
			c.touch(ks[j])
		}
		for j := min(len(ks), capacityBlocks) - 1; j >= 0; j-- {
			c.touch(ks[j])
		}
	}
	out.Evicted = c.evicted
	if out.PromptTokens > 0 {
		out.Tokens = float64(out.HitTokens) / float64(out.PromptTokens)
	}
	if out.TotalBlocks > 0 {
		out.Blocks = float64(out.HitBlocks) / float64(out.TotalBlocks)
	}
	return out
}

// WorkingSetBlocks is the number of distinct full KV blocks of blockSize
// tokens in the trace's prompts at blockTokens tokens per hash id.
func (t *Trace) WorkingSetBlocks(blockTokens, blockSize int) int {
	return t.PooledLRU(1, blockTokens, blockSize).WorkingSetBlocks
}

// blockKeys returns each record's full KV blocks, named by lruKey, and
// its prompt length in tokens, as TokenSynth builds it.
func (t *Trace) blockKeys(blockTokens, blockSize int) (keys [][]lruKey, lens []int) {
	tbs := t.blockSize()
	trie := make(map[prefixEdge]uint32)
	next := uint32(1)
	keys = make([][]lruKey, len(t.Records))
	lens = make([]int, len(t.Records))
	nodes := make([]uint32, 0, 64)
	for i := range t.Records {
		r := &t.Records[i]
		nodes = nodes[:0]
		node := uint32(0)
		for _, id := range r.HashIDs {
			e := prefixEdge{node, id}
			child, ok := trie[e]
			if !ok {
				child = next
				next++
				trie[e] = child
			}
			node = child
			nodes = append(nodes, node)
		}
		last := scaledBlockLen(r.lastBlockTokens(tbs), tbs, blockTokens)
		p := (len(r.HashIDs)-1)*blockTokens + last
		lens[i] = p
		ks := make([]lruKey, p/blockSize)
		for b := range ks {
			lastToken := (b+1)*blockSize - 1
			ks[b] = lruKey{node: nodes[lastToken/blockTokens], block: uint32(b)}
		}
		keys[i] = ks
	}
	return keys, lens
}
