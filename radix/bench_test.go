package radix

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvfast/kvfast/workers"
)

func BenchmarkHashBlocks(b *testing.B) {
	tokens := seqTokens(8192, 1)
	dst := make([]uint64, 0, 512)
	seed := NamespaceSeed("llama", "", "")
	b.ReportAllocs()
	b.SetBytes(int64(len(tokens) * 4))
	for b.Loop() {
		dst = AppendBlockHashes(dst[:0], seed, tokens, 16)
	}
	b.ReportMetric(float64(len(tokens))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkHashBlocksXXH64 holds AppendBlockHashes to plain XXH64 over the
// same bytes in one loop, so that machine noise hits both alike: every
// iteration hashes an 8K-token prompt in 16-token blocks and times
// xxhash.Sum64 over its 32 KiB, taking turns at going first. x-xxh64 is
// the block hashing's median time over XXH64's (pairTimes).
func BenchmarkHashBlocksXXH64(b *testing.B) {
	tokens := seqTokens(8192, 1)
	raw := tokenBytes(tokens)
	dst := make([]uint64, 0, 512)
	seed := NamespaceSeed("llama", "", "")
	times := new(pairTimes)
	var sum uint64
	b.ReportAllocs()
	b.SetBytes(int64(len(raw)))
	i := 0
	for b.Loop() {
		t0 := time.Now()
		if i%2 == 0 {
			dst = AppendBlockHashes(dst[:0], seed, tokens, 16)
			t1 := time.Now()
			sum += xxhash.Sum64(raw)
			times.add(t1.Sub(t0), time.Since(t1))
		} else {
			sum += xxhash.Sum64(raw)
			t1 := time.Now()
			dst = AppendBlockHashes(dst[:0], seed, tokens, 16)
			times.add(time.Since(t1), t1.Sub(t0))
		}
		i++
	}
	probeSink += sum
	b.ReportMetric(times.ratio(), "x-xxh64")
	b.ReportMetric(float64(times.median(times.a[:]).Nanoseconds()), "blocks-ns")
	b.ReportMetric(float64(times.median(times.b[:]).Nanoseconds()), "xxh64-ns")
}

// warmIndex builds the benchmark's standing state: prompts of promptBlocks
// blocks (chained hashes of random tokens) forking from each other, each
// cached on one to three of 8 workers, until the index holds at least
// minBlocks distinct blocks.
func warmIndex(b testing.TB, minBlocks, promptBlocks int) (*Index, [][]uint64) {
	b.Helper()
	ix, err := NewHeap(Config{Capacity: minBlocks + minBlocks/8})
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(42, 42))
	var prompts [][]uint64
	for ix.Stats().Entries < uint64(minBlocks) {
		for range 256 {
			p := make([]uint64, 0, promptBlocks)
			if len(prompts) > 0 && r.IntN(4) == 0 {
				src := prompts[r.IntN(len(prompts))]
				p = append(p, src[:r.IntN(promptBlocks/2)]...)
			}
			p = extendChain(r, testSeed, p, promptBlocks-len(p))
			for range 1 + r.IntN(3) {
				ix.Stored(workers.Slot(r.IntN(8)), p)
			}
			prompts = append(prompts, p)
		}
	}
	return ix, prompts
}

var benchIndex struct {
	once    sync.Once
	ix      *Index
	prompts [][]uint64
}

func sharedWarmIndex(b testing.TB) (*Index, [][]uint64) {
	benchIndex.once.Do(func() { benchIndex.ix, benchIndex.prompts = warmIndex(b, 1<<20, 512) })
	return benchIndex.ix, benchIndex.prompts
}

// BenchmarkFindMatches: a 512-block prompt that one worker holds entirely,
// among 8 workers, on a warm index of over a million blocks.
func BenchmarkFindMatches(b *testing.B) {
	ix, prompts := sharedWarmIndex(b)
	st := ix.Stats()
	var out workers.Overlaps
	r := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		ix.FindMatches(prompts[(i*7919+r.IntN(4))%len(prompts)], &out)
		i++
	}
	b.ReportMetric(float64(512*b.N)/b.Elapsed().Seconds(), "blocks/s")
	b.ReportMetric(float64(st.Entries), "indexblocks")
	b.ReportMetric(float64(st.BlockTableBytes)/float64(st.Entries), "tablebytes/block")
	b.ReportMetric(float64(st.EngineMapBytes)/float64(st.Capacity), "mapbytes/block")
}

// BenchmarkFindMatchesTiers: the cost of crediting lower tiers, as
// ratios measured in one loop (each iteration times both lookups on the
// same prompt, so machine noise hits both alike).
//   - unused: FindTieredMatches against FindMatches on BenchmarkFindMatches'
//     index, which holds nothing off the GPU: the extra probes where a
//     worker's GPU prefix ends (metric tiered/plain);
//   - half-host: every holder keeps the first half of a prompt on the GPU
//     and the second half in host memory, against the same prompts held
//     wholly on the GPU (metric half-host/all-gpu).
func BenchmarkFindMatchesTiers(b *testing.B) {
	pair := func(b *testing.B, base func(p []uint64), tiered func(p []uint64), prompts [][]uint64, metric string) {
		r := rand.New(rand.NewPCG(1, 2))
		var tBase, tTiered time.Duration
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			// Whichever runs second finds the prompt's hashes and some
			// lines in cache: take turns.
			p := prompts[(i*7919+r.IntN(4))%len(prompts)]
			first, second, d1, d2 := base, tiered, &tBase, &tTiered
			if i%2 == 1 {
				first, second, d1, d2 = tiered, base, &tTiered, &tBase
			}
			t0 := time.Now()
			first(p)
			t1 := time.Now()
			second(p)
			*d1, *d2 = *d1+t1.Sub(t0), *d2+time.Since(t1)
			i++
		}
		b.ReportMetric(float64(tTiered)/float64(tBase), metric)
		b.ReportMetric(float64(tTiered.Nanoseconds())/float64(b.N), "tiered-ns/op")
	}
	var out workers.Overlaps
	var lower workers.LowerTiers
	b.Run("unused", func(b *testing.B) {
		ix, prompts := sharedWarmIndex(b)
		pair(b, func(p []uint64) { ix.FindMatches(p, &out) },
			func(p []uint64) { ix.FindTieredMatches(p, &out, &lower) }, prompts, "tiered/plain")
	})
	b.Run("half-host", func(b *testing.B) {
		gpu, err := NewHeap(Config{Capacity: 1 << 19})
		if err != nil {
			b.Fatal(err)
		}
		half, err := NewHeap(Config{Capacity: 1 << 19})
		if err != nil {
			b.Fatal(err)
		}
		r := rand.New(rand.NewPCG(42, 43))
		var prompts [][]uint64
		host := make([]uint64, 256)
		for len(prompts) < 400 {
			p := extendChain(r, testSeed, make([]uint64, 0, 512), 512)
			w := workers.Slot(r.IntN(8))
			gpu.Stored(w, p)
			half.Stored(w, p[:256])
			for j, h := range p[256:] {
				host[j] = KeyspaceHash(h, 0, workers.TierHost)
			}
			half.Stored(w, host)
			prompts = append(prompts, p)
		}
		pair(b, func(p []uint64) { gpu.FindTieredMatches(p, &out, &lower) },
			func(p []uint64) { half.FindTieredMatches(p, &out, &lower) }, prompts, "half-host/all-gpu")
	})
}

// mutexMap is the baseline: a Go map behind an RWMutex, taken once per
// lookup call and once per event batch — how most Go routers keep this.
type mutexMap struct {
	mu sync.RWMutex
	m  map[uint64]workers.Set
}

func (mm *mutexMap) findMatches(hashes []uint64, out *workers.Overlaps) {
	*out = workers.Overlaps{}
	mm.mu.RLock()
	active := workers.AllSlots
	for i, h := range hashes {
		next := active & mm.m[h]
		if i > 0 {
			for w := range (active &^ next).All() {
				out[w] = uint32(i)
			}
		}
		active = next
		if active == 0 {
			break
		}
	}
	mm.mu.RUnlock()
	for active != 0 {
		var w workers.Slot
		w, active = active.First()
		out[w] = uint32(len(hashes))
	}
}

func (mm *mutexMap) stored(w workers.Slot, hashes []uint64) {
	mm.mu.Lock()
	for _, h := range hashes {
		mm.m[h] |= workers.SetOf(w)
	}
	mm.mu.Unlock()
}

func (mm *mutexMap) removed(w workers.Slot, hashes []uint64) {
	mm.mu.Lock()
	for _, h := range hashes {
		if s := mm.m[h] &^ workers.SetOf(w); s == 0 {
			delete(mm.m, h)
		} else {
			mm.m[h] = s
		}
	}
	mm.mu.Unlock()
}

// examined is how many hashes a lookup had to resolve: up to and including
// the first one no remaining worker held.
func examined(out *workers.Overlaps, n int) int {
	best := 0
	for _, o := range out {
		best = max(best, int(o))
	}
	return min(best+1, n)
}

// BenchmarkIndexMixed runs the same concurrent mix on both structures: on
// every goroutine, 7 of 8 operations look up a 256-block prompt, and 1 of 8
// applies an event pair (a worker evicts a 32-block tail, then stores it
// again). blockops/s counts every block hash resolved or applied.
func BenchmarkIndexMixed(b *testing.B) {
	const promptBlocks, eventBlocks = 256, 32
	r := rand.New(rand.NewPCG(9, 9))
	prompts := chains(r, 4096, promptBlocks)
	owners := make([]workers.Slot, len(prompts))
	for i := range owners {
		owners[i] = workers.Slot(r.IntN(8))
	}

	run := func(b *testing.B, find func([]uint64, *workers.Overlaps), stored, removed func(workers.Slot, []uint64)) {
		for i, p := range prompts {
			stored(owners[i], p)
		}
		var ops atomic.Int64
		var seq atomic.Uint64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			gr := rand.New(rand.NewPCG(seq.Add(1), 1))
			var out workers.Overlaps
			local := 0
			for pb.Next() {
				k := gr.IntN(len(prompts))
				if gr.IntN(8) == 0 {
					tail := prompts[k][promptBlocks-eventBlocks:]
					removed(owners[k], tail)
					stored(owners[k], tail)
					local += 2 * eventBlocks
					continue
				}
				find(prompts[k], &out)
				local += examined(&out, promptBlocks)
			}
			ops.Add(int64(local))
		})
		b.ReportMetric(float64(ops.Load())/b.Elapsed().Seconds(), "blockops/s")
	}

	b.Run("kvfast", func(b *testing.B) {
		ix, err := NewHeap(Config{Capacity: 4096 * promptBlocks})
		if err != nil {
			b.Fatal(err)
		}
		run(b, func(h []uint64, o *workers.Overlaps) { ix.FindMatches(h, o) }, ix.Stored, ix.Removed)
	})
	b.Run("mutexmap", func(b *testing.B) {
		mm := &mutexMap{m: make(map[uint64]workers.Set, 4096*promptBlocks)}
		run(b, mm.findMatches, mm.stored, mm.removed)
	})
}

// BenchmarkClearedAll is an engine that reports its cache emptied, over and
// over (a publisher sending nothing else, or clearing after each block),
// on an index of the router's default capacity: the worker forgotten has
// no mappings, or the one block it stored since the last clear.
func BenchmarkClearedAll(b *testing.B) {
	ix, err := NewHeap(Config{Capacity: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	const w = workers.Slot(3)
	for _, tc := range []struct {
		name   string
		stores bool
	}{{"nothing-stored", false}, {"one-block-each", true}} {
		b.Run(tc.name, func(b *testing.B) {
			ix.ClearedAll(w)
			b.ReportAllocs()
			var engine uint64
			for b.Loop() {
				if tc.stores {
					engine++
					ix.MapEngineHash(w, engine, xxhash.Sum64String("block"))
				}
				ix.ClearedAll(w)
			}
		})
	}
}

// BenchmarkStoreShare is the writers' cost of the per-worker share
// (share.go): the same store and removal of 32-block tails with the bound
// at 0.5 (kvfast serve's default) and lifted (1), in one run.
func BenchmarkStoreShare(b *testing.B) {
	const eventBlocks = 32
	r := rand.New(rand.NewPCG(11, 11))
	prompts := chains(r, 4096, eventBlocks)
	for _, share := range []float64{1, DefaultWorkerShare} {
		b.Run(fmt.Sprintf("share=%v", share), func(b *testing.B) {
			ix, err := NewHeap(Config{Capacity: 1 << 20})
			if err != nil {
				b.Fatal(err)
			}
			if err := ix.SetWorkerShare(share); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				p := prompts[i%len(prompts)]
				ix.Stored(workers.Slot(i%8), p)
				ix.Removed(workers.Slot(i%8), p)
				i++
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*2*eventBlocks), "ns/block")
		})
	}
}
