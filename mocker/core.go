package mocker

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kvfast/kvfast/radix"
)

// Errors a request can be refused with.
var (
	ErrEmptyPrompt       = errors.New("kvfast: prompt is empty")
	ErrBadMaxTokens      = errors.New("kvfast: max_tokens must be at least 1")
	ErrTooLong           = errors.New("kvfast: prompt plus max_tokens exceeds the model length")
	ErrAlreadySubmitted  = errors.New("kvfast: request was already submitted")
	ErrCacheBusy         = errors.New("kvfast: prefix cache is in use by running requests")
	ErrClosed            = errors.New("kvfast: mock engine is closed")
	ErrRequestNotRunning = errors.New("kvfast: request is not in the engine")
)

type reqState uint8

const (
	stateNew reqState = iota
	stateWaiting
	stateRunning
	stateFinished
	stateAborted
)

// Request is one generation request inside a Core. Set Prompt and
// MaxTokens, then Add it; the Core owns it from then on.
type Request struct {
	Prompt    []uint32
	MaxTokens int
	// LoRA and CacheSalt put the request's blocks in their own namespace,
	// as vLLM hashes an adapter's name into every block and the salt into
	// the first: they share cached blocks only with requests of the same
	// adapter and salt. "" for none.
	LoRA, CacheSalt string
	// MM are the prompt's multimodal inputs (images), sorted by offset:
	// the blocks overlapping one are hashed with its keys, as vLLM does.
	MM []radix.MMItem
	// KeepBlocks holds the request's blocks when it finishes, for a
	// remote decode to pull (disagg.go); ReleaseKept lets them go.
	KeepBlocks bool
	// Transferred is how many leading prompt blocks a remote prefill
	// computed: their KV arrives by transfer and is not computed here.
	Transferred int

	seed uint64 // the namespace's: the first block's parent hash

	tokens    []uint32 // prompt then generated tokens
	hashes    []uint64 // engine hashes of tokens' full blocks, computed lazily
	blocks    []int32  // blocks held, in sequence order
	committed int      // leading blocks registered in the cache
	winFrom   int      // hybrid engines: leading blocks the sliding window has passed
	computed  int      // tokens whose KV is in blocks
	outSeed   uint64
	state     reqState
	cached    int // prompt tokens found in the cache when first scheduled; -1 before

	preemptions               int
	arrival, firstTok, finish time.Duration // simulated

	// Delivery to the HTTP goroutine serving the request; written only by
	// the engine loop.
	pubProduced atomic.Int32
	pubCached   atomic.Int32
	pubDone     atomic.Uint32 // 0 pending, doneFinished, doneAborted
	notify      chan struct{}
}

const (
	doneFinished = 1
	doneAborted  = 2
)

// StepReport describes one step.
type StepReport struct {
	Duration      time.Duration // simulated
	PrefillTokens int           // tokens computed in prefill chunks
	DecodeSeqs    int           // sequences that decoded one token
	Preempted     int
	// Progressed holds the requests that generated a token in this step,
	// finished ones included. It is valid until the next Step.
	Progressed []*Request
}

// Stats counts what a Core has done.
type Stats struct {
	Steps              uint64 `json:"steps"`
	Requests           uint64 `json:"requests"` // added
	Finished           uint64 `json:"finished"`
	Aborted            uint64 `json:"aborted"`
	Preemptions        uint64 `json:"preemptions"`
	PromptTokens       uint64 `json:"prompt_tokens"`        // of requests scheduled at least once
	CachedPromptTokens uint64 `json:"cached_prompt_tokens"` // of those, served from the prefix cache
	GeneratedTokens    uint64 `json:"generated_tokens"`
	PrefillTokens      uint64 `json:"prefill_tokens"` // computed in prefill chunks, recomputation included
	BlocksStored       uint64 `json:"blocks_stored"`  // blocks published as Stored
	BlocksEvicted      uint64 `json:"blocks_evicted"` // blocks published as Removed
	// Host pool (Config.HostBlocks): blocks copied there on eviction,
	// loaded back for a request, and dropped from it.
	BlocksOffloaded   uint64 `json:"blocks_offloaded"`
	BlocksLoaded      uint64 `json:"blocks_loaded"`
	HostBlocksEvicted uint64 `json:"host_blocks_evicted"`
	// Hybrid engines (Config.SlidingWindow): blocks the sliding-window
	// group freed, and prompt blocks cached in group 0 that a request
	// could not reuse because group 1 had freed their window.
	WindowBlocksFreed  uint64 `json:"window_blocks_freed"`
	WindowMissedBlocks uint64 `json:"window_missed_blocks"`
	PublishErrors      uint64 `json:"publish_errors"`
	Running            int    `json:"running"`
	Waiting            int    `json:"waiting"`
	KVHeld             int    `json:"kv_held"`   // blocks referenced by running requests
	KVCached           int    `json:"kv_cached"` // blocks findable by hash, held or not
	KVTotal            int    `json:"kv_total"`
	HostCached         int    `json:"host_cached"` // blocks in the host pool
	// Disaggregated serving (disagg.go): prompt blocks whose KV a remote
	// prefill computed and this engine pulled instead of computing them.
	BlocksTransferred uint64        `json:"blocks_transferred"`
	SimulatedTime     time.Duration `json:"simulated_time_ns"` // Core.Now
	BusyTime          time.Duration `json:"busy_time_ns"`      // simulated time spent in non-empty steps
}

// PrefixHitRate is the share of prompt tokens served from the prefix cache.
func (s Stats) PrefixHitRate() float64 {
	if s.PromptTokens == 0 {
		return 0
	}
	return float64(s.CachedPromptTokens) / float64(s.PromptTokens)
}

// Core is the deterministic heart of the mock engine: the KV cache and the
// continuous-batching scheduler, on a simulated clock that only Step
// advances. Given the same configuration and the same sequence of Add,
// Abort and Step calls, it makes the same decisions and publishes the same
// events. It is not safe for concurrent use.
type Core struct {
	cfg  Config
	seed uint64
	// windowBlocks is how many blocks before a prefix's end group 1 must
	// hold for the prefix to be reused (hybrid engines).
	windowBlocks int
	ev           eventSink
	cache        kvCache

	waiting deque
	running []*Request
	now     time.Duration

	progressed []*Request
	scheduled  []*Request

	stats Stats
}

// NewCore makes a Core. cfg's zero fields take their defaults; Listen,
// Speedup, HeartbeatInterval and Segment are ignored. pub may be nil.
func NewCore(cfg Config, pub Publisher) (*Core, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Core{cfg: cfg, seed: EngineSeed(cfg.Model)}
	if cfg.SlidingWindow > 0 {
		c.windowBlocks = (cfg.SlidingWindow - 1 + cfg.BlockSize - 1) / cfg.BlockSize
	}
	c.ev.pub = pub
	c.cache = newKVCache(&c.cfg, &c.ev)
	return c, nil
}

// Now is the simulated time: the sum of all step durations.
func (c *Core) Now() time.Duration { return c.now }

// Idle reports whether no request is waiting or running.
func (c *Core) Idle() bool { return len(c.running) == 0 && c.waiting.len() == 0 }

// Validate checks a request against the engine's limits without adding it.
func (c *Core) Validate(promptLen, maxTokens int) error {
	return c.cfg.validateRequest(promptLen, maxTokens)
}

func (cfg *Config) validateRequest(promptLen, maxTokens int) error {
	switch {
	case promptLen == 0:
		return ErrEmptyPrompt
	case maxTokens < 1:
		return ErrBadMaxTokens
	case int64(promptLen)+int64(maxTokens) > int64(cfg.MaxModelLen):
		return fmt.Errorf("cannot accept %d prompt tokens plus %d max_tokens, limit %d: %w", promptLen, maxTokens, cfg.MaxModelLen, ErrTooLong)
	}
	return nil
}

// Add queues r at the back of the waiting queue.
func (c *Core) Add(r *Request) error {
	if r.state != stateNew {
		return ErrAlreadySubmitted
	}
	if err := c.Validate(len(r.Prompt), r.MaxTokens); err != nil {
		return err
	}
	total := len(r.Prompt) + r.MaxTokens
	bs := c.cfg.BlockSize
	// Sized once so that decoding never grows them.
	r.tokens = append(make([]uint32, 0, total), r.Prompt...)
	r.hashes = make([]uint64, 0, total/bs)
	r.blocks = make([]int32, 0, (total+bs-1)/bs)
	r.outSeed = radix.ChainBlockHash(c.seed^0x6f7574707574, r.Prompt) // "output"
	r.seed = c.seed
	if r.LoRA != "" || r.CacheSalt != "" {
		r.seed = namespacedEngineSeed(c.cfg.Model, r.LoRA, r.CacheSalt)
	}
	r.cached = -1
	r.arrival = c.now
	r.state = stateWaiting
	c.waiting.pushBack(r)
	c.stats.Requests++
	return nil
}

// Abort removes r from the engine and frees its blocks. It reports false if
// r is not waiting or running.
func (c *Core) Abort(r *Request) bool {
	switch r.state {
	case stateWaiting:
		if !c.waiting.remove(r) {
			panic("BUG: mocker: waiting request missing from the queue")
		}
	case stateRunning:
		i := indexOf(c.running, r)
		if i < 0 {
			panic("BUG: mocker: running request missing from the batch")
		}
		copy(c.running[i:], c.running[i+1:])
		c.running[len(c.running)-1] = nil
		c.running = c.running[:len(c.running)-1]
		c.releaseBlocks(r)
	default:
		return false
	}
	r.state = stateAborted
	r.finish = c.now
	c.stats.Aborted++
	c.ev.flush()
	return true
}

func indexOf(rs []*Request, r *Request) int {
	for i, x := range rs {
		if x == r {
			return i
		}
	}
	return -1
}

// ResetPrefixCache drops every cached block and publishes Cleared. It fails
// with ErrCacheBusy while any request holds blocks, as vLLM's does.
func (c *Core) ResetPrefixCache() error {
	if c.cache.held != 0 {
		return ErrCacheBusy
	}
	c.cache.dropAll()
	return nil
}

// Load returns the numbers a Load event carries.
func (c *Core) Load() (running, waiting, kvUsed, kvTotal uint64) {
	return uint64(len(c.running)), uint64(c.waiting.len()), uint64(c.cache.held), uint64(c.cache.total())
}

// Stats returns the counters so far.
func (c *Core) Stats() Stats {
	s := c.stats
	s.BlocksStored, s.BlocksEvicted = c.cache.stored, c.cache.evicted
	s.BlocksOffloaded, s.BlocksLoaded, s.HostBlocksEvicted = c.cache.offloaded, c.cache.loaded, c.cache.hostEvicts
	s.WindowBlocksFreed = c.cache.windowFreed
	if c.cache.host != nil {
		s.HostCached = c.cache.host.len()
	}
	s.PublishErrors = c.ev.errors
	s.Running, s.Waiting = len(c.running), c.waiting.len()
	s.KVHeld, s.KVCached, s.KVTotal = c.cache.held, c.cache.cachedBlocks(), c.cache.total()
	s.SimulatedTime = c.now
	return s
}

func (c *Core) blocksFor(tokens int) int { return (tokens + c.cfg.BlockSize - 1) / c.cfg.BlockSize }

// ensureHashes extends r.hashes to cover its first n blocks, which must be
// full.
func (c *Core) ensureHashes(r *Request, n int) {
	bs := c.cfg.BlockSize
	for i := len(r.hashes); i < n; i++ {
		parent := r.seed
		if i > 0 {
			parent = r.hashes[i-1]
		}
		extra, _ := radix.BlockMMExtra(r.MM, 0, i*bs, (i+1)*bs)
		r.hashes = append(r.hashes, radix.ChainBlockHashExtra(parent, r.tokens[i*bs:(i+1)*bs], extra))
	}
}

// allocate gives r need more blocks; the caller has checked there is room.
func (c *Core) allocate(r *Request, need int) {
	for range need {
		id, ok := c.cache.allocate()
		if !ok {
			panic("BUG: mocker: allocation failed after the capacity check")
		}
		r.blocks = append(r.blocks, id)
	}
}

// commitFull registers r's blocks that its computed tokens have filled.
func (c *Core) commitFull(r *Request) {
	bs := c.cfg.BlockSize
	full := r.computed / bs
	if full <= r.committed {
		return
	}
	c.ensureHashes(r, full)
	for i := r.committed; i < full; i++ {
		parent, hasParent := uint64(0), i > 0
		if hasParent {
			parent = r.hashes[i-1]
		}
		id := r.blocks[i]
		if other, dup := c.cache.commit(id, r.hashes[i], parent, hasParent, r.tokens[i*bs:(i+1)*bs], r.LoRA, r.CacheSalt, blockMM{r.MM, i * bs}); dup {
			// Another request computed the same block first: share its copy
			// and give ours back, as a hashing engine deduplicates.
			c.cache.acquire(other, true)
			c.cache.release(id, false)
			r.blocks[i] = other
		}
	}
	if c.cfg.SlidingWindow > 0 {
		// Group 1 caches the same blocks, after group 0, except those the
		// window has already passed (a long prefill chunk).
		for i := max(r.committed, c.windowSkip(r.computed)); i < full; i++ {
			c.cache.enterWindow(r.blocks[i], r.tokens[i*bs:(i+1)*bs])
		}
	}
	r.committed = full
}

// windowSkip is how many leading blocks of a sequence with computed tokens
// in KV the sliding window no longer covers: those whose every token is
// more than SlidingWindow−1 tokens before the last (vLLM's
// SlidingWindowManager.get_num_skipped_tokens).
func (c *Core) windowSkip(computed int) int {
	return max(computed-c.cfg.SlidingWindow+1, 0) / c.cfg.BlockSize
}

// skipWindow frees from group 1 the blocks of r that r's window has
// passed and no other holder's window covers.
func (c *Core) skipWindow(r *Request) {
	if c.cfg.SlidingWindow == 0 {
		return
	}
	for to := min(c.windowSkip(r.computed), r.committed); r.winFrom < to; r.winFrom++ {
		c.cache.leaveWindow(r.blocks[r.winFrom])
	}
}

// releaseBlocks drops r's references, last block first so that the LRU
// evicts the tail of a prefix before its head.
func (c *Core) releaseBlocks(r *Request) {
	for i := len(r.blocks) - 1; i >= 0; i-- {
		c.cache.release(r.blocks[i], i < r.winFrom)
	}
	r.blocks = r.blocks[:0]
	r.committed = 0
	r.computed = 0
	r.winFrom = 0
}

// preempt sends r back to the front of the waiting queue; it will recompute
// from whatever of its prefix is still cached.
func (c *Core) preempt(r *Request) {
	c.releaseBlocks(r)
	r.state = stateWaiting
	r.preemptions++
	c.waiting.pushFront(r)
	c.stats.Preemptions++
}

// Step runs one scheduling step: it picks the batch within the token budget,
// allocates blocks (evicting or preempting as needed), advances the clock by
// the batch's cost and samples one token for every sequence whose tokens
// are all computed. An idle Core returns a zero report.
func (c *Core) Step() StepReport {
	c.progressed = c.progressed[:0]
	c.scheduled = c.scheduled[:0]
	if c.Idle() {
		return StepReport{}
	}
	rep := StepReport{}
	budget := c.cfg.MaxBatchedTokens
	var cost time.Duration

	// Running requests first, in arrival order; on a full cache the most
	// recently scheduled one is preempted (recompute), possibly r itself.
	for i := 0; i < len(c.running) && budget > 0; i++ {
		r := c.running[i]
		n := min(len(r.tokens)-r.computed, budget)
		need := c.blocksFor(r.computed+n) - len(r.blocks)
		for need > c.cache.free() {
			last := len(c.running) - 1
			victim := c.running[last]
			c.running[last] = nil
			c.running = c.running[:last]
			c.preempt(victim)
			rep.Preempted++
			if victim == r {
				r = nil
				break
			}
		}
		if r == nil {
			break
		}
		c.allocate(r, need)
		decoding := n == 1 && len(r.tokens) > len(r.Prompt) && r.computed == len(r.tokens)-1
		if decoding {
			cost += c.cfg.Timing.Decode(r.computed)
			rep.DecodeSeqs++
		} else {
			cost += c.cfg.Timing.Prefill(r.computed, n)
			rep.PrefillTokens += n
		}
		r.computed += n
		c.commitFull(r)
		c.skipWindow(r)
		budget -= n
		c.scheduled = append(c.scheduled, r)
	}

	// Then waiting requests, unless this step had to preempt: FCFS, each
	// starting from its longest cached prefix, chunked to the budget. A
	// prefix the GPU lacks may continue in the host pool: those blocks are
	// loaded back rather than computed.
	bs := c.cfg.BlockSize
	for rep.Preempted == 0 && budget > 0 && len(c.running) < c.cfg.MaxSeqs && c.waiting.len() > 0 {
		r := c.waiting.front()
		// The last token is always computed, so that there are logits to
		// sample from; a fully cached prompt still recomputes its last block.
		maxHit := (len(r.tokens) - 1) / bs
		c.ensureHashes(r, maxHit)
		hit := c.cache.match(r.hashes[:maxHit])
		missed := 0
		if c.cfg.SlidingWindow > 0 {
			short := c.cache.windowHit(r.hashes[:hit], c.windowBlocks)
			hit, missed = short, hit-short
		}
		loaded := 0
		if c.cache.host != nil {
			loaded = c.cache.host.prefix(r.hashes[hit:maxHit])
		}
		transferred := max(0, min(r.Transferred, maxHit)-hit-loaded)
		computed := (hit + loaded + transferred) * bs
		n := min(len(r.tokens)-computed, budget)
		need := c.blocksFor(computed+n) - hit
		if need > c.cache.free()-c.cache.unreferenced(r.hashes[:hit]) {
			break
		}
		c.waiting.popFront()
		// Blocks the window has passed already are reused in group 0 only.
		r.winFrom = min(c.windowSkip(hit*bs), hit)
		if c.cfg.SlidingWindow == 0 {
			r.winFrom = 0
		}
		for j := range hit {
			r.blocks = append(r.blocks, c.cache.acquireCached(r.hashes[j], j >= r.winFrom))
		}
		r.committed = hit
		if loaded > 0 {
			// Refresh the copies before allocating, which may offload GPU
			// blocks and push the least recent copies out.
			c.cache.load(r.hashes[hit : hit+loaded])
			cost += time.Duration(loaded) * c.cfg.Timing.HostLoadPerBlock
		}
		c.allocate(r, need)
		if r.cached < 0 {
			// cached_tokens counts this engine's cache only, not the KV
			// a remote prefill computed.
			local := computed - transferred*bs
			r.cached = local
			c.stats.BlocksTransferred += uint64(transferred)
			c.stats.PromptTokens += uint64(len(r.Prompt))
			c.stats.CachedPromptTokens += uint64(min(local, len(r.Prompt)))
			c.stats.WindowMissedBlocks += uint64(missed)
		}
		cost += c.cfg.Timing.Prefill(computed, n)
		rep.PrefillTokens += n
		r.computed = computed + n
		c.commitFull(r)
		c.skipWindow(r)
		budget -= n
		r.state = stateRunning
		c.running = append(c.running, r)
		c.scheduled = append(c.scheduled, r)
	}

	if len(c.scheduled) == 0 {
		// Every accepted request fits an empty cache and running requests
		// always make progress by preempting, so this cannot happen.
		panic("BUG: mocker: a non-idle step scheduled nothing")
	}
	cost += c.cfg.Timing.StepOverhead
	c.now += cost
	rep.Duration = cost
	c.stats.Steps++
	c.stats.BusyTime += cost
	c.stats.PrefillTokens += uint64(rep.PrefillTokens)

	// Sample one token for every sequence that is fully computed.
	finished := 0
	for _, r := range c.scheduled {
		if r.state != stateRunning || r.computed != len(r.tokens) {
			continue
		}
		out := len(r.tokens) - len(r.Prompt)
		if out == 0 {
			r.firstTok = c.now
		}
		r.tokens = append(r.tokens, OutputToken(r.outSeed, out))
		c.stats.GeneratedTokens++
		c.progressed = append(c.progressed, r)
		if out+1 == r.MaxTokens {
			if !r.KeepBlocks {
				c.releaseBlocks(r)
			}
			r.state = stateFinished
			r.finish = c.now
			c.stats.Finished++
			finished++
		}
	}
	if finished > 0 {
		kept := c.running[:0]
		for _, r := range c.running {
			if r.state == stateRunning {
				kept = append(kept, r)
			}
		}
		clear(c.running[len(kept):])
		c.running = kept
	}
	c.ev.flush()
	clear(c.scheduled)
	rep.Progressed = c.progressed
	return rep
}

// deque is the waiting queue: FCFS, with preempted requests returning to
// the front.
type deque struct {
	buf        []*Request
	head, size int
}

func (q *deque) len() int { return q.size }

func (q *deque) grow() {
	n := max(2*len(q.buf), 16)
	buf := make([]*Request, n)
	for i := range q.size {
		buf[i] = q.buf[(q.head+i)%len(q.buf)]
	}
	q.buf, q.head = buf, 0
}

func (q *deque) pushBack(r *Request) {
	if q.size == len(q.buf) {
		q.grow()
	}
	q.buf[(q.head+q.size)%len(q.buf)] = r
	q.size++
}

func (q *deque) pushFront(r *Request) {
	if q.size == len(q.buf) {
		q.grow()
	}
	q.head = (q.head - 1 + len(q.buf)) % len(q.buf)
	q.buf[q.head] = r
	q.size++
}

func (q *deque) front() *Request { return q.buf[q.head] }

func (q *deque) popFront() *Request {
	r := q.buf[q.head]
	q.buf[q.head] = nil
	q.head = (q.head + 1) % len(q.buf)
	q.size--
	return r
}

func (q *deque) at(i int) *Request { return q.buf[(q.head+i)%len(q.buf)] }

// remove deletes r, keeping the order of the others.
func (q *deque) remove(r *Request) bool {
	for i := range q.size {
		if q.at(i) != r {
			continue
		}
		for j := i; j < q.size-1; j++ {
			q.buf[(q.head+j)%len(q.buf)] = q.at(j + 1)
		}
		q.buf[(q.head+q.size-1)%len(q.buf)] = nil
		q.size--
		return true
	}
	return false
}
