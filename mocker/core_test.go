package mocker

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
)

// testTiming has round numbers so that expected durations can be worked out
// by hand.
var testTiming = Timing{
	StepOverhead:          1 * time.Millisecond,
	PrefillPerToken:       10 * time.Microsecond,
	PrefillAttentionPer1K: 1 * time.Microsecond,
	DecodePerSequence:     100 * time.Microsecond,
	DecodeAttentionPer1K:  10 * time.Microsecond,
}

func newTestCore(t testing.TB, cfg Config, pub Publisher) *Core {
	t.Helper()
	if cfg.Timing == (Timing{}) {
		cfg.Timing = testTiming
	}
	c, err := NewCore(cfg, pub)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func seq(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func concat(parts ...[]uint32) []uint32 { return slices.Concat(parts...) }

// runAll steps until the core is idle, checking the cache after every
// step, and fails if it takes more than limit steps.
func runAll(t testing.TB, c *Core, limit int) {
	t.Helper()
	for i := 0; !c.Idle(); i++ {
		if i == limit {
			t.Fatalf("core not idle after %d steps", limit)
		}
		c.Step()
		c.cache.checkInvariants()
	}
}

func addReq(t testing.TB, c *Core, prompt []uint32, maxTokens int) *Request {
	t.Helper()
	r := &Request{Prompt: prompt, MaxTokens: maxTokens}
	if err := c.Add(r); err != nil {
		t.Fatal(err)
	}
	return r
}

func wantOutput(t testing.TB, r *Request) {
	t.Helper()
	if !r.Finished() {
		t.Fatalf("request not finished")
	}
	out := r.Output()
	if len(out) != r.MaxTokens {
		t.Fatalf("generated %d tokens, want %d", len(out), r.MaxTokens)
	}
	for i, tok := range out {
		if want := OutputToken(r.OutputSeed(), i); tok != want {
			t.Fatalf("token %d = %d, want %d", i, tok, want)
		}
	}
}

func TestPrefixCaching(t *testing.T) {
	rec := &Recorder{}
	c := newTestCore(t, Config{BlockSize: 4, KVBlocks: 64}, rec)
	base := seq(1000, 10)

	a := addReq(t, c, base, 2)
	runAll(t, c, 100)
	wantOutput(t, a)
	if a.CachedTokens() != 0 {
		t.Fatalf("cold request got %d cached tokens", a.CachedTokens())
	}
	if got := len(rec.Cached()); got != 2 {
		t.Fatalf("after 10-token prompt + 1 computed output: %d blocks published, want 2", got)
	}

	cases := []struct {
		name   string
		prompt []uint32
		cached int
	}{
		// The last prompt token is always recomputed, so 10 tokens hit at most
		// (10-1)/4 = 2 blocks.
		{"same prompt", base, 8},
		{"shares first block", concat(base[:5], seq(5000, 7)), 4},
		{"exact two blocks recompute the last", base[:8], 4},
		{"diverges in first block", concat(base[:3], seq(7000, 9)), 0},
		{"longer prompt extends", concat(base, seq(9000, 20)), 8},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := addReq(t, c, tc.prompt, 1)
			runAll(t, c, 100)
			wantOutput(t, r)
			if got := r.CachedTokens(); got != tc.cached {
				t.Fatalf("cached tokens = %d, want %d", got, tc.cached)
			}
		})
	}

	t.Run("same step shares blocks stored moments before", func(t *testing.T) {
		p := seq(20000, 13)
		x, y := addReq(t, c, p, 1), addReq(t, c, p, 1)
		c.Step()
		if x.CachedTokens() != 0 || y.CachedTokens() != 12 {
			t.Fatalf("cached = %d, %d; want 0, 12", x.CachedTokens(), y.CachedTokens())
		}
		runAll(t, c, 10)
	})

	t.Run("dedup stores each hash once", func(t *testing.T) {
		seen := map[uint64]bool{}
		for _, e := range rec.Events() {
			for _, b := range e.Blocks {
				if seen[b.Hash] {
					t.Fatalf("hash %x stored twice without eviction", b.Hash)
				}
				seen[b.Hash] = true
			}
		}
	})

	st := c.Stats()
	if st.CachedPromptTokens == 0 || st.PrefixHitRate() <= 0 || st.PrefixHitRate() >= 1 {
		t.Fatalf("stats: %+v, hit rate %v", st, st.PrefixHitRate())
	}
	if st.KVHeld != 0 {
		t.Fatalf("%d blocks held with nothing running", st.KVHeld)
	}
}

func TestDecodeBlocksAreCachedAndShared(t *testing.T) {
	rec := &Recorder{}
	c := newTestCore(t, Config{BlockSize: 4, KVBlocks: 64}, rec)
	p := seq(1, 6)
	a := addReq(t, c, p, 11) // 6+11 tokens, 16 computed: 4 blocks
	runAll(t, c, 100)
	wantOutput(t, a)
	if got := c.Stats().BlocksStored; got != 4 {
		t.Fatalf("stored %d blocks, want 4 (prompt and generated)", got)
	}
	// The same prompt generates the same reply, so a second run finds every
	// block already cached: nothing new is stored.
	b := addReq(t, c, p, 11)
	runAll(t, c, 100)
	wantOutput(t, b)
	if !slices.Equal(a.Output(), b.Output()) {
		t.Fatal("identical prompts generated different replies")
	}
	if got := c.Stats().BlocksStored; got != 4 {
		t.Fatalf("stored %d blocks after the repeat, want still 4", got)
	}
}

func TestCacheEvictionOrder(t *testing.T) {
	rec := &Recorder{}
	ev := &eventSink{pub: rec}
	c := newKVCache(&Config{KVBlocks: 6, BlockSize: 16}, ev)
	removed := func() []uint64 {
		ev.flush()
		var out []uint64
		for _, e := range rec.Events() {
			out = append(out, e.Hashes...)
		}
		rec.Reset()
		return out
	}
	ids := make([]int32, 4)
	for i := range ids {
		id, ok := c.allocate()
		if !ok {
			t.Fatal("allocation failed in an empty cache")
		}
		ids[i] = id
		c.commit(id, uint64(100+i), 0, false, seq(i, 4), "", "", blockMM{})
	}
	held, _ := c.allocate() // never cached, never released
	c.checkInvariants()
	for _, i := range []int{2, 0, 3, 1} { // LRU order: 102, 100, 103, 101
		c.release(ids[i], false)
	}
	removed()

	t.Run("empty blocks go before cached ones", func(t *testing.T) {
		id, ok := c.allocate()
		if !ok || len(removed()) != 0 {
			t.Fatal("allocation evicted while an empty block was free")
		}
		c.release(id, false)
	})
	t.Run("least recently released first", func(t *testing.T) {
		id, ok := c.allocate() // the one empty block again
		if !ok {
			t.Fatal("allocation failed")
		}
		ids := []int32{id}
		for range 2 {
			id, ok := c.allocate()
			if !ok {
				t.Fatal("allocation failed")
			}
			ids = append(ids, id)
		}
		if got := removed(); !slices.Equal(got, []uint64{102, 100}) {
			t.Fatalf("evicted %v, want [102 100]", got)
		}
		for _, id := range ids {
			c.release(id, false)
		}
		c.checkInvariants()
	})
	t.Run("a hit refreshes recency", func(t *testing.T) {
		// LRU now: 103, 101, then three empty blocks released above (empty
		// blocks are on their own list). Touch 103: 101 becomes oldest.
		c.release(c.acquireCached(103, true), false)
		var got []int32
		for range 4 {
			id, ok := c.allocate()
			if !ok {
				t.Fatal("allocation failed")
			}
			got = append(got, id)
		}
		if r := removed(); !slices.Equal(r, []uint64{101}) {
			t.Fatalf("evicted %v, want [101]", r)
		}
		for _, id := range got {
			c.release(id, false)
		}
	})
	t.Run("held blocks are never evicted", func(t *testing.T) {
		var got []int32
		for {
			id, ok := c.allocate()
			if !ok {
				break
			}
			got = append(got, id)
		}
		if len(got) != 5 || c.held != 6 {
			t.Fatalf("allocated %d more blocks (held %d), want 5 (6)", len(got), c.held)
		}
		for _, id := range got {
			if id == held {
				t.Fatal("allocated a held block")
			}
			c.release(id, false)
		}
		c.checkInvariants()
	})
}

func TestEvictionTakesPrefixTailFirst(t *testing.T) {
	rec := &Recorder{}
	c := newTestCore(t, Config{BlockSize: 4, KVBlocks: 4}, rec)
	a := addReq(t, c, seq(1, 12), 1) // 3 blocks, committed then released last-first
	runAll(t, c, 10)
	hashes := radix.AppendBlockHashes(nil, EngineSeed(DefaultModel), a.Prompt, 4)

	rec.Reset()
	addReq(t, c, seq(500, 8), 1) // 2 blocks: the empty one, then one eviction
	runAll(t, c, 10)
	var removed []uint64
	for _, e := range rec.Events() {
		removed = append(removed, e.Hashes...)
	}
	if !slices.Equal(removed, hashes[2:3]) {
		t.Fatalf("evicted %x, want the prefix's last block %x", removed, hashes[2])
	}
	again := addReq(t, c, seq(1, 12), 1)
	runAll(t, c, 10)
	if again.CachedTokens() != 8 {
		t.Fatalf("cached tokens = %d, want 8 (the two surviving head blocks)", again.CachedTokens())
	}
}

func TestPreemption(t *testing.T) {
	rec := &Recorder{}
	// Each request grows to 8+7 computed tokens = 4 blocks; two need 8 of 6.
	c := newTestCore(t, Config{BlockSize: 4, KVBlocks: 6, MaxBatchedTokens: 64}, rec)
	a := addReq(t, c, seq(100, 8), 8)
	b := addReq(t, c, seq(200, 8), 8)
	preempted := 0
	for i := 0; !c.Idle(); i++ {
		if i > 200 {
			t.Fatal("no progress")
		}
		rep := c.Step()
		c.cache.checkInvariants()
		preempted += rep.Preempted
		if c.cache.held > c.cache.total() {
			t.Fatal("held more blocks than exist")
		}
	}
	wantOutput(t, a)
	wantOutput(t, b)
	if preempted == 0 || c.Stats().Preemptions != uint64(preempted) {
		t.Fatalf("preempted %d times (stats %d), want > 0", preempted, c.Stats().Preemptions)
	}
	if a.Preemptions() != 0 || b.Preemptions() == 0 {
		t.Fatalf("preemptions a=%d b=%d: the later request should yield", a.Preemptions(), b.Preemptions())
	}
	if b.Finish() <= a.Finish() {
		t.Fatal("the preempted request finished first")
	}
	// The victim recomputes: more prefill than the prompts alone.
	if st := c.Stats(); st.PrefillTokens <= 16 {
		t.Fatalf("prefill tokens %d: no recomputation seen", st.PrefillTokens)
	}
	if c.cache.held != 0 {
		t.Fatalf("%d blocks still held", c.cache.held)
	}

	t.Run("a lone request preempts nothing", func(t *testing.T) {
		c := newTestCore(t, Config{BlockSize: 4, KVBlocks: 4}, nil)
		r := addReq(t, c, seq(1, 9), 7) // exactly fills the cache
		runAll(t, c, 50)
		wantOutput(t, r)
		if c.Stats().Preemptions != 0 {
			t.Fatal("preempted a request that fits")
		}
	})
}

func TestRejectsWhatCannotFit(t *testing.T) {
	c := newTestCore(t, Config{BlockSize: 4, KVBlocks: 4}, nil)
	for _, tc := range []struct {
		prompt, max int
		ok          bool
	}{{15, 1, true}, {16, 1, false}, {0, 1, false}, {4, 0, false}, {1, 15, true}} {
		err := c.Add(&Request{Prompt: seq(1, tc.prompt), MaxTokens: tc.max})
		if (err == nil) != tc.ok {
			t.Errorf("prompt %d max %d: err %v, want ok=%v", tc.prompt, tc.max, err, tc.ok)
		}
	}
	r := &Request{Prompt: seq(1, 3), MaxTokens: 1}
	if err := c.Add(r); err != nil {
		t.Fatal(err)
	}
	if err := c.Add(r); err != ErrAlreadySubmitted {
		t.Fatalf("second Add: %v", err)
	}
}

// ttft runs one request on a core and returns its simulated time to first
// token.
func ttft(t *testing.T, c *Core, prompt []uint32) time.Duration {
	t.Helper()
	r := addReq(t, c, prompt, 1)
	runAll(t, c, 1000)
	return r.FirstToken() - r.Arrival()
}

func TestTimingMonotoneInUncachedTokens(t *testing.T) {
	t.Run("model", func(t *testing.T) {
		for _, tm := range []Timing{DefaultTiming, testTiming} {
			for c := 0; c <= 4096; c += 512 {
				prev := time.Duration(0)
				for n := 1; n <= 4096; n *= 2 {
					d := tm.Prefill(c, n)
					if d <= prev {
						t.Fatalf("Prefill(%d, %d) = %v not above %v", c, n, d, prev)
					}
					prev = d
				}
			}
		}
	})
	t.Run("documented examples", func(t *testing.T) {
		// docs/mocker.md works these out by hand; keep them true.
		d := DefaultTiming
		decode64 := d.StepOverhead
		for range 64 {
			decode64 += d.Decode(4096)
		}
		for _, tc := range []struct{ got, lo, hi time.Duration }{
			{d.StepOverhead + d.Prefill(0, 8192), 436 * time.Millisecond, 438 * time.Millisecond},
			{d.StepOverhead + d.Prefill(6144, 2048), 115 * time.Millisecond, 117 * time.Millisecond},
			{decode64, 11600 * time.Microsecond, 11800 * time.Microsecond},
		} {
			if tc.got < tc.lo || tc.got > tc.hi {
				t.Errorf("%v outside [%v, %v]", tc.got, tc.lo, tc.hi)
			}
		}
	})
	t.Run("end to end", func(t *testing.T) {
		const bs, blocks = 16, 64
		prompt := seq(1, bs*blocks)
		prev := time.Duration(-1)
		// Warm k blocks of the prompt, then time the whole prompt: the
		// fewer blocks cached, the longer the first token takes.
		for k := blocks - 1; k >= 0; k -= 7 {
			c := newTestCore(t, Config{BlockSize: bs, KVBlocks: 1024, MaxBatchedTokens: 256}, nil)
			if k > 0 {
				ttft(t, c, concat(prompt[:k*bs], []uint32{99999}))
			}
			d := ttft(t, c, prompt)
			if d <= prev {
				t.Fatalf("%d uncached blocks: TTFT %v, not above %v with fewer", blocks-k, d, prev)
			}
			prev = d
		}
	})
}

func TestTimingMonotoneInBatchAndContext(t *testing.T) {
	// decodeStep puts n sequences of prompt length ctx into decode and
	// returns the duration of one pure decode step.
	decodeStep := func(n, ctx int) time.Duration {
		c := newTestCore(t, Config{BlockSize: 16, KVBlocks: 4096, MaxBatchedTokens: 1 << 16}, nil)
		for i := range n {
			addReq(t, c, seq(i*100000, ctx), 10)
		}
		c.Step() // prefill all
		rep := c.Step()
		if rep.DecodeSeqs != n || rep.PrefillTokens != 0 {
			t.Fatalf("step decoded %d and prefilled %d, want %d and 0", rep.DecodeSeqs, rep.PrefillTokens, n)
		}
		return rep.Duration
	}
	prev := time.Duration(0)
	for _, n := range []int{1, 2, 4, 8, 16, 32, 64} {
		d := decodeStep(n, 64)
		if d <= prev {
			t.Fatalf("batch %d: decode step %v not above %v", n, d, prev)
		}
		prev = d
	}
	prev = 0
	for _, ctx := range []int{16, 256, 1024, 4096} {
		d := decodeStep(8, ctx)
		if d <= prev {
			t.Fatalf("context %d: decode step %v not above %v", ctx, d, prev)
		}
		prev = d
	}
	// One decode step, worked out by hand: 1ms + 100µs + 10µs·(64+1)/1024.
	want := time.Millisecond + 100*time.Microsecond + time.Duration(65*int64(10*time.Microsecond)/1024)
	if d := decodeStep(1, 64); d != want {
		t.Fatalf("decode step = %v, want %v", d, want)
	}
}

// TestPrefillStallsDecodesInTheSameStep: a prompt admitted while others
// decode shares their step, as vLLM's chunked prefill shares the step's
// token budget, and the step lasts the decodes plus the prefill chunk: the
// decoding sequences' next token waits for it. This is the prefill
// interference that disaggregated serving removes (kvfast demo --disagg).
func TestPrefillStallsDecodesInTheSameStep(t *testing.T) {
	tm := DefaultTiming
	c := newTestCore(t, Config{BlockSize: 16, KVBlocks: 4096, MaxBatchedTokens: 8192, Timing: tm}, nil)
	for i := range 4 {
		addReq(t, c, seq(i*100000, 64), 10)
	}
	c.Step() // prefill all four
	alone := c.Step()
	if alone.DecodeSeqs != 4 || alone.PrefillTokens != 0 {
		t.Fatalf("decode step: %d decodes, %d prefilled", alone.DecodeSeqs, alone.PrefillTokens)
	}
	addReq(t, c, seq(900000, 4000), 2)
	shared := c.Step() // the four decodes and the new prompt, which samples its first token
	if shared.DecodeSeqs != 4 || shared.PrefillTokens != 4000 || len(shared.Progressed) != 5 {
		t.Fatalf("shared step: %d decodes, %d prefilled, %d progressed", shared.DecodeSeqs, shared.PrefillTokens, len(shared.Progressed))
	}
	// The decodes' context grew by one token between the steps.
	grown := time.Duration(0)
	for range 4 {
		grown += tm.Decode(65) - tm.Decode(64)
	}
	if want := alone.Duration + grown + tm.Prefill(0, 4000); shared.Duration != want {
		t.Fatalf("shared step %v, want the decode step %v plus the prefill %v", shared.Duration, alone.Duration+grown, tm.Prefill(0, 4000))
	}
}

func TestChunkedPrefillRespectsBudget(t *testing.T) {
	c := newTestCore(t, Config{BlockSize: 16, KVBlocks: 256, MaxBatchedTokens: 100}, nil)
	r := addReq(t, c, seq(1, 350), 2)
	var chunks []int
	for !c.Idle() {
		rep := c.Step()
		if rep.PrefillTokens+rep.DecodeSeqs > 100 {
			t.Fatalf("step used %d tokens of a 100 budget", rep.PrefillTokens+rep.DecodeSeqs)
		}
		chunks = append(chunks, rep.PrefillTokens)
	}
	if !slices.Equal(chunks, []int{100, 100, 100, 50, 0}) {
		t.Fatalf("prefill chunks %v", chunks)
	}
	wantOutput(t, r)
}

// randomWorkload drives c with requests built from a few shared prefixes,
// so that hits, evictions and preemptions all happen, and aborts some.
func randomWorkload(t *testing.T, c *Core, seed uint64, check func()) []*Request {
	rng := rand.New(rand.NewPCG(seed, 1))
	prefixes := make([][]uint32, 5)
	for i := range prefixes {
		prefixes[i] = seq(i*10000, 8+rng.IntN(40))
	}
	var all, live []*Request
	for step := 0; step < 600; step++ {
		if step < 450 && rng.IntN(3) == 0 {
			p := prefixes[rng.IntN(len(prefixes))]
			p = p[:1+rng.IntN(len(p))]
			prompt := concat(p, seq(1_000_000+rng.IntN(1000), rng.IntN(20)))
			r := addReq(t, c, prompt, 1+rng.IntN(30))
			all, live = append(all, r), append(live, r)
		}
		if len(live) > 0 && rng.IntN(25) == 0 {
			i := rng.IntN(len(live))
			c.Abort(live[i])
			live = slices.Delete(live, i, i+1)
		}
		c.Step()
		check()
		live = slices.DeleteFunc(live, func(r *Request) bool { return r.Finished() })
	}
	runAll(t, c, 10000)
	check()
	return all
}

func TestEveryStoreAndEvictionPublished(t *testing.T) {
	rec := &Recorder{}
	c := newTestCore(t, Config{BlockSize: 4, KVBlocks: 40, MaxBatchedTokens: 48, MaxSeqs: 8}, rec)
	seed := EngineSeed(DefaultModel)
	live := map[uint64]bool{}
	consumed := 0
	var storedN, removedN uint64
	check := func() {
		c.cache.checkInvariants()
		evs := rec.Events()
		for _, e := range evs[consumed:] {
			switch e.Kind {
			case EventStored:
				parent := seed
				if e.HasParent {
					parent = e.Parent
				}
				for _, b := range e.Blocks {
					if len(b.Tokens) != 4 {
						t.Fatalf("stored block with %d tokens", len(b.Tokens))
					}
					if h := radix.ChainBlockHash(parent, b.Tokens); h != b.Hash {
						t.Fatalf("stored hash %x, but parent and tokens hash to %x", b.Hash, h)
					}
					if live[b.Hash] {
						t.Fatalf("hash %x stored while already cached", b.Hash)
					}
					live[b.Hash] = true
					parent = b.Hash
					storedN++
				}
			case EventRemoved:
				for _, h := range e.Hashes {
					if !live[h] {
						t.Fatalf("hash %x removed but not cached", h)
					}
					delete(live, h)
					removedN++
				}
			case EventCleared:
				clear(live)
			}
		}
		consumed = len(evs)
		// The consumer's view must equal the cache, block for block.
		if len(live) != len(c.cache.byHash) {
			t.Fatalf("consumer sees %d blocks, cache holds %d", len(live), len(c.cache.byHash))
		}
		for h := range c.cache.byHash {
			if !live[h] {
				t.Fatalf("cached hash %x never published", h)
			}
		}
	}
	all := randomWorkload(t, c, 7, check)
	st := c.Stats()
	if st.BlocksStored != storedN || st.BlocksEvicted != removedN {
		t.Fatalf("stats stored/evicted %d/%d, events %d/%d", st.BlocksStored, st.BlocksEvicted, storedN, removedN)
	}
	if st.BlocksEvicted == 0 || st.CachedPromptTokens == 0 || st.Aborted == 0 {
		t.Fatalf("workload too tame to prove anything: %+v", st)
	}
	for _, r := range all {
		if r.Finished() {
			wantOutput(t, r)
		}
	}

	t.Run("reset publishes cleared", func(t *testing.T) {
		if err := c.ResetPrefixCache(); err != nil {
			t.Fatal(err)
		}
		check()
		if len(live) != 0 || c.cache.cachedBlocks() != 0 {
			t.Fatal("blocks survived a reset")
		}
		r := addReq(t, c, seq(1, 20), 5)
		c.Step()
		if err := c.ResetPrefixCache(); err != ErrCacheBusy {
			t.Fatalf("reset while running: %v", err)
		}
		runAll(t, c, 100)
		wantOutput(t, r)
	})
}

func TestCoreIsDeterministic(t *testing.T) {
	for _, cfg := range []Config{
		{BlockSize: 4, KVBlocks: 40, MaxBatchedTokens: 48, MaxSeqs: 8},
		{BlockSize: 4, KVBlocks: 40, MaxBatchedTokens: 48, MaxSeqs: 8, HostBlocks: 30},
		{BlockSize: 4, KVBlocks: 40, MaxBatchedTokens: 48, MaxSeqs: 8, SlidingWindow: 10},
	} {
		run := func() ([]Event, Stats) {
			rec := &Recorder{}
			c := newTestCore(t, cfg, rec)
			randomWorkload(t, c, 11, func() {})
			return rec.Events(), c.Stats()
		}
		e1, s1 := run()
		e2, s2 := run()
		if !reflect.DeepEqual(e1, e2) || s1 != s2 {
			t.Fatalf("%+v: the same inputs gave different events or stats", cfg)
		}
		if s1.Preemptions == 0 {
			t.Logf("note: this workload did not preempt (%+v)", cfg)
		}
	}
}

func TestEventSinkKeepsOrderAndBatches(t *testing.T) {
	rec := &Recorder{}
	s := &eventSink{pub: rec}
	gpu, host := Placement{}, Placement{Tier: workers.TierHost}
	s.store(gpu, 0, false, BlockEvent{Hash: 1})
	s.store(gpu, 1, true, BlockEvent{Hash: 2}) // continues the chain: same call
	s.store(gpu, 0, false, BlockEvent{Hash: 3})
	s.remove(gpu, 2)
	s.remove(gpu, 3)
	s.store(gpu, 1, true, BlockEvent{Hash: 2})
	s.store(host, 2, true, BlockEvent{Hash: 3}) // chained, but elsewhere: another call
	s.remove(host, 3)
	s.remove(gpu, 2) // same kind, another placement: another call
	s.flush()
	var got []string
	for _, e := range rec.Events() {
		var ids []uint64
		for _, b := range e.Blocks {
			ids = append(ids, b.Hash)
		}
		ids = append(ids, e.Hashes...)
		got = append(got, e.At.Tier.String()+" "+e.Kind.String()+fmtIDs(ids))
	}
	want := []string{"gpu stored[1 2]", "gpu stored[3]", "gpu removed[2 3]", "gpu stored[2]",
		"host stored[3]", "host removed[3]", "gpu removed[2]"}
	if !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
}

func fmtIDs(ids []uint64) string {
	s := "["
	for i, id := range ids {
		if i > 0 {
			s += " "
		}
		s += string(rune('0' + id))
	}
	return s + "]"
}

func TestDequeMatchesSlice(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var q deque
	var model []*Request
	reqs := make([]*Request, 200)
	for i := range reqs {
		reqs[i] = &Request{MaxTokens: i}
	}
	next := 0
	for range 5000 {
		switch op := rng.IntN(4); {
		case op == 0 && next < len(reqs):
			q.pushBack(reqs[next])
			model = append(model, reqs[next])
			next++
		case op == 1 && next < len(reqs):
			q.pushFront(reqs[next])
			model = slices.Insert(model, 0, reqs[next])
			next++
		case op == 2 && len(model) > 0:
			if q.popFront() != model[0] {
				t.Fatal("popFront disagrees")
			}
			model = model[1:]
		case op == 3 && len(model) > 0:
			r := model[rng.IntN(len(model))]
			if !q.remove(r) {
				t.Fatal("remove missed")
			}
			model = slices.DeleteFunc(model, func(x *Request) bool { return x == r })
		}
		if next == len(reqs) && len(model) == 0 {
			next = 0
		}
		if q.len() != len(model) {
			t.Fatalf("len %d, want %d", q.len(), len(model))
		}
		for i, r := range model {
			if q.at(i) != r {
				t.Fatalf("element %d differs", i)
			}
		}
	}
}

func TestFailingPublisherIsCountedNotFatal(t *testing.T) {
	rec := &Recorder{Fail: errors.New("ring full")}
	c := newTestCore(t, Config{BlockSize: 4, KVBlocks: 16}, rec)
	r := addReq(t, c, seq(1, 30), 5)
	runAll(t, c, 100)
	wantOutput(t, r)
	if st := c.Stats(); st.PublishErrors == 0 || st.PublishErrors != uint64(len(rec.Events())) {
		t.Fatalf("publish errors %d for %d failed calls", st.PublishErrors, len(rec.Events()))
	}
}
