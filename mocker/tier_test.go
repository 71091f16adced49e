package mocker

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
)

// placementKey tells apart the copies a consumer tracks.
type placementKey struct {
	tier  workers.Tier
	group int
}

// eventView replays a Recorder's events per placement, as a router does,
// checking on the way what a router relies on: a host copy is announced
// while the GPU's copy is still known (vLLM's connector names it only by
// its engine hash), every stored block hashes from its parent and tokens,
// and group 1 only ever holds blocks group 0 holds.
type eventView struct {
	t        *testing.T
	rec      *Recorder
	seed     uint64
	consumed int
	held     map[placementKey]map[uint64]bool
}

func newEventView(t *testing.T, rec *Recorder) *eventView {
	return &eventView{t: t, rec: rec, seed: EngineSeed(DefaultModel), held: map[placementKey]map[uint64]bool{}}
}

func (v *eventView) set(tier workers.Tier, group int) map[uint64]bool {
	k := placementKey{tier, group}
	if v.held[k] == nil {
		v.held[k] = map[uint64]bool{}
	}
	return v.held[k]
}

func (v *eventView) update() {
	t := v.t
	t.Helper()
	evs := v.rec.Events()
	gpu := v.set(workers.TierGPU, 0)
	for _, e := range evs[v.consumed:] {
		in := v.set(e.At.Tier, e.At.Group)
		switch e.Kind {
		case EventStored:
			parent := v.seed
			if e.HasParent {
				parent = e.Parent
			}
			for _, b := range e.Blocks {
				if h := radix.ChainBlockHash(parent, b.Tokens); h != b.Hash {
					t.Fatalf("%+v: stored hash %x, but parent and tokens hash to %x", e.At, b.Hash, h)
				}
				if in[b.Hash] {
					t.Fatalf("%+v: hash %x stored while already held", e.At, b.Hash)
				}
				if e.At.Tier == workers.TierHost && !gpu[b.Hash] {
					t.Fatalf("host copy of %x announced after the GPU's copy was removed", b.Hash)
				}
				if e.At.Group == 1 && !gpu[b.Hash] {
					t.Fatalf("group 1 stored %x, which group 0 does not hold", b.Hash)
				}
				in[b.Hash] = true
				parent = b.Hash
			}
		case EventRemoved:
			for _, h := range e.Hashes {
				if !in[h] {
					t.Fatalf("%+v: hash %x removed but not held", e.At, h)
				}
				delete(in, h)
				if e.At.OnGPU() && v.set(workers.TierGPU, 1)[h] {
					t.Fatalf("group 0 evicted %x before group 1 did", h)
				}
			}
		case EventCleared:
			for _, s := range v.held {
				clear(s)
			}
		}
	}
	v.consumed = len(evs)
}

// wantCache checks that the view equals the cache, copy for copy.
func (v *eventView) wantCache(c *kvCache) {
	t := v.t
	t.Helper()
	v.update()
	want := map[placementKey]map[uint64]bool{{workers.TierGPU, 0}: {}, {workers.TierGPU, 1}: {}, {workers.TierHost, 0}: {}}
	for h, id := range c.byHash {
		want[placementKey{workers.TierGPU, 0}][h] = true
		if c.blocks[id].inWindow {
			want[placementKey{workers.TierGPU, 1}][h] = true
		}
	}
	if c.host != nil {
		for h := range c.host.byHash {
			want[placementKey{workers.TierHost, 0}][h] = true
		}
	}
	for k, w := range want {
		if got := v.set(k.tier, k.group); !maps.Equal(got, w) {
			t.Fatalf("tier %v group %d: the events say %d blocks are held, the cache holds %d", k.tier, k.group, len(got), len(w))
		}
	}
}

func TestHostTierEventsMatchCache(t *testing.T) {
	rec := &Recorder{}
	c := newTestCore(t, Config{BlockSize: 4, KVBlocks: 40, MaxBatchedTokens: 48, MaxSeqs: 8, HostBlocks: 30}, rec)
	v := newEventView(t, rec)
	all := randomWorkload(t, c, 7, func() {
		c.cache.checkInvariants()
		v.wantCache(&c.cache)
	})
	st := c.Stats()
	if st.BlocksOffloaded == 0 || st.BlocksLoaded == 0 || st.HostBlocksEvicted == 0 || st.HostCached != 30 {
		t.Fatalf("workload too tame to prove anything: %+v", st)
	}
	for _, r := range all {
		if r.Finished() {
			wantOutput(t, r)
		}
	}
	if err := c.ResetPrefixCache(); err != nil {
		t.Fatal(err)
	}
	v.wantCache(&c.cache)
	if c.Stats().HostCached != 0 {
		t.Fatal("host copies survived a reset")
	}
}

// TestHostTierLoadsBack: a prompt evicted from the GPU into the host pool
// is served from there: its blocks are loaded back (and stored on the GPU
// again), its cached tokens count them, and it starts sooner than a cold
// prompt, later than one found on the GPU.
func TestHostTierLoadsBack(t *testing.T) {
	timing := testTiming
	timing.HostLoadPerBlock = 20 * time.Microsecond // a block's prefill is 4·100 µs and more
	cfg := Config{BlockSize: 4, KVBlocks: 8, HostBlocks: 16, Timing: timing}
	rec := &Recorder{}
	c := newTestCore(t, cfg, rec)
	v := newEventView(t, rec)
	prompt := seq(1, 21) // 5 full blocks and one token
	first := addReq(t, c, prompt, 1)
	runAll(t, c, 100)
	hashes := radix.AppendBlockHashes(nil, EngineSeed(DefaultModel), prompt, 4)
	for i := range 2 {
		// Another 7-block prompt needs every GPU block but one.
		addReq(t, c, seq(1000*(i+1), 25), 1)
		runAll(t, c, 100)
	}
	v.wantCache(&c.cache)
	for _, h := range hashes {
		if v.set(workers.TierGPU, 0)[h] || !v.set(workers.TierHost, 0)[h] {
			t.Fatalf("block %x is not in the host pool alone", h)
		}
	}
	loadedBefore := c.Stats().BlocksLoaded
	start := c.Now()
	again := addReq(t, c, prompt, 1)
	runAll(t, c, 100)
	v.wantCache(&c.cache)
	if got := again.CachedTokens(); got != 20 || first.CachedTokens() != 0 {
		t.Fatalf("cached tokens %d (first run %d), want 20 (0)", got, first.CachedTokens())
	}
	if got := c.Stats().BlocksLoaded - loadedBefore; got != 5 {
		t.Fatalf("loaded %d blocks, want 5", got)
	}
	for _, h := range hashes {
		if !v.set(workers.TierGPU, 0)[h] || !v.set(workers.TierHost, 0)[h] {
			t.Fatalf("block %x is not on the GPU and in the host pool after the load", h)
		}
	}
	fromHost := again.FirstToken() - start
	cold := ttft(t, newTestCore(t, cfg, nil), prompt)
	warm := newTestCore(t, cfg, nil)
	ttft(t, warm, prompt)
	onGPU := ttft(t, warm, prompt)
	if !(onGPU < fromHost && fromHost < cold) {
		t.Fatalf("time to first token: %v on the GPU, %v from the host, %v cold; want increasing", onGPU, fromHost, cold)
	}
}

// TestHostPoolIsBoundedLRU: the pool keeps the most recently offloaded or
// loaded copies and announces the ones it drops.
func TestHostPoolIsBoundedLRU(t *testing.T) {
	p := newHostPool(3)
	for h := uint64(1); h <= 3; h++ {
		if _, dropped, added := p.put(h); dropped || !added {
			t.Fatalf("put %d into a pool with room: dropped %v added %v", h, dropped, added)
		}
	}
	p.touch(1) // LRU order now 2, 3, 1
	if _, dropped, added := p.put(3); dropped || added {
		t.Fatal("putting a held copy again changed the pool")
	}
	victim, dropped, added := p.put(4) // order was 2, 1, 3
	if !dropped || !added || victim != 2 {
		t.Fatalf("put into a full pool dropped %d (%v), want 2", victim, dropped)
	}
	if got := p.prefix([]uint64{1, 3, 4, 2, 1}); got != 3 || p.len() != 3 {
		t.Fatalf("prefix %d of %d copies, want 3 of 3", got, p.len())
	}
	p.clear()
	if p.len() != 0 || p.prefix([]uint64{1}) != 0 || len(p.free) != 3 {
		t.Fatal("clear left copies")
	}
}

func TestHybridEventsMatchCache(t *testing.T) {
	rec := &Recorder{}
	c := newTestCore(t, Config{BlockSize: 4, KVBlocks: 40, MaxBatchedTokens: 48, MaxSeqs: 8, SlidingWindow: 10}, rec)
	v := newEventView(t, rec)
	all := randomWorkload(t, c, 7, func() {
		c.cache.checkInvariants()
		v.wantCache(&c.cache)
	})
	st := c.Stats()
	if st.WindowBlocksFreed == 0 || st.WindowMissedBlocks == 0 || st.CachedPromptTokens == 0 {
		t.Fatalf("workload too tame to prove anything: %+v", st)
	}
	for _, r := range all {
		if r.Finished() {
			wantOutput(t, r)
		}
	}
	for _, e := range rec.Events() {
		if (e.Kind == EventStored || e.Kind == EventRemoved) && (!e.At.Hybrid || e.At.Group == 1 && e.At.SlidingWindow != 10) {
			t.Fatalf("event %v placed %+v: a hybrid engine names its groups", e.Kind, e.At)
		}
	}
}

// TestHybridWindowRule: group 1 frees the blocks every running request's
// window has passed, and a cached prefix is reused only if group 1 still
// holds the blocks the window needs before its end.
func TestHybridWindowRule(t *testing.T) {
	// A window of 8 tokens needs the ⌈7/4⌉ = 2 blocks before a prefix's end.
	rec := &Recorder{}
	c := newTestCore(t, Config{BlockSize: 4, KVBlocks: 64, SlidingWindow: 8}, rec)
	v := newEventView(t, rec)
	blocks := func(prompt []uint32) []uint64 {
		return radix.AppendBlockHashes(nil, EngineSeed(DefaultModel), prompt, 4)
	}
	inWindow := func(hashes []uint64) (in []int) {
		v.wantCache(&c.cache)
		for i, h := range hashes {
			if v.set(workers.TierGPU, 1)[h] {
				in = append(in, i)
			}
		}
		return in
	}
	run := func(prompt []uint32, maxTokens int) *Request {
		r := addReq(t, c, prompt, maxTokens)
		runAll(t, c, 100)
		return r
	}

	p := seq(1, 25) // 6 full blocks and one token
	run(p, 1)       // 25 tokens computed: the window covers tokens 18..24, blocks 4 and 5
	if got := inWindow(blocks(p)); !slices.Equal(got, []int{4, 5}) {
		t.Fatalf("group 1 holds blocks %v, want [4 5]", got)
	}
	if r := run(p, 1); r.CachedTokens() != 24 {
		t.Fatalf("a repeat reused %d tokens, want 24", r.CachedTokens())
	}

	// The first four blocks are cached in group 0 only: a prompt ending
	// there cannot reuse them.
	missed := c.Stats().WindowMissedBlocks
	if r := run(concat(p[:16], seq(500, 17)), 1); r.CachedTokens() != 0 {
		t.Fatalf("a prefix whose window group 1 freed reused %d tokens", r.CachedTokens())
	}
	if got := c.Stats().WindowMissedBlocks - missed; got != 4 {
		t.Fatalf("missed %d blocks, want 4", got)
	}

	// Decoding moves the window on: 25+11 tokens computed leave only the
	// last two blocks of the sequence (6 and 7, the output's) in group 1.
	q := seq(2000, 25)
	r := run(q, 12)
	if got := inWindow(blocks(concat(q, r.Output()[:11]))); !slices.Equal(got, []int{7, 8}) {
		t.Fatalf("group 1 holds blocks %v, want [7 8]", got)
	}
	if r := run(q, 1); r.CachedTokens() != 0 {
		t.Fatalf("a prompt whose window group 1 freed reused %d tokens", r.CachedTokens())
	}
	// Group 1 caches again what the recompute stored.
	if got := inWindow(blocks(q)); !slices.Equal(got, []int{4, 5}) {
		t.Fatalf("after the recompute group 1 holds blocks %v, want [4 5]", got)
	}
}

// TestHybridNeedsVLLMEvents: only vLLM's events can name KV-cache groups.
func TestHybridNeedsVLLMEvents(t *testing.T) {
	for _, cfg := range []Config{
		{SlidingWindow: 64, Segment: "/dev/shm/nowhere"},
		{SlidingWindow: 64, ZMQ: ZMQConfig{Listen: "tcp://127.0.0.1:0", Format: ZMQSGLang}},
		{SlidingWindow: 64, HostBlocks: 8},
		{SlidingWindow: 1},
		{HostBlocks: -1},
	} {
		if _, err := cfg.withDefaults(); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
	if _, err := (Config{SlidingWindow: 64, ZMQ: ZMQConfig{Listen: "tcp://127.0.0.1:0"}}).withDefaults(); err != nil {
		t.Fatal(err)
	}
}
