package radix

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/kvfast/kvfast/workers"
)

var probeSink uint64

// floorSlots is, for every prompt of the shared warm index, the slot where
// each of its blocks actually lives, and the mean number of distinct cache
// lines those slots span per prompt.
var floorSlots struct {
	once  sync.Once
	slots [][]*slot
	lines float64
}

func sharedFloorSlots(b *testing.B) (*Index, [][]uint64, [][]*slot, float64) {
	ix, prompts := sharedWarmIndex(b)
	floorSlots.once.Do(func() {
		slots := make([][]*slot, len(prompts))
		lines := 0
		for i, p := range prompts {
			slots[i] = make([]*slot, len(p))
			seen := map[uintptr]bool{}
			for j, h := range p {
				t, k, found := ix.findBlock(storedKey(h))
				if !found {
					b.Fatalf("prompt %d block %d not in the index", i, j)
				}
				slots[i][j] = t.at(k)
				seen[uintptr(unsafe.Pointer(t.at(k)))/64] = true
			}
			lines += len(seen)
		}
		floorSlots.slots, floorSlots.lines = slots, float64(lines)/float64(len(prompts))
	})
	return ix, prompts, floorSlots.slots, floorSlots.lines
}

// probeFloor loads every slot once: independent loads, nothing else.
func probeFloor(slots []*slot) {
	var s uint64
	for _, sp := range slots {
		s += sp.key.Load()
	}
	probeSink += s
}

// BenchmarkProbeFloor is the memory floor under BenchmarkFindMatches: one
// load of the slot where each block of the prompt actually lives, with the
// addresses worked out beforehand, so the loop is nothing but independent
// loads. FindMatches must read at least these cache lines (a group's
// blocks share two or three of them), so on a table bigger than the cache
// this is what the machine's memory system allows.
func BenchmarkProbeFloor(b *testing.B) {
	_, _, slots, lines := sharedFloorSlots(b)
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		probeFloor(slots[(i*7919)%len(slots)])
		i++
	}
	b.ReportMetric(float64(512*b.N)/b.Elapsed().Seconds(), "blocks/s")
	b.ReportMetric(lines, "lines/prompt")
}

// pairTimes compares two operations timed in the same iterations by the
// medians of their last pairSamples times, so that an iteration in which
// the benchmark was descheduled, common on shared machines, moves neither.
type pairTimes struct {
	a, b [pairSamples]time.Duration
	n    int
}

const pairSamples = 1 << 13

func (p *pairTimes) add(a, b time.Duration) {
	p.a[p.n%pairSamples], p.b[p.n%pairSamples] = a, b
	p.n++
}

// ratio is a's median time over b's.
func (p *pairTimes) ratio() float64 {
	return float64(p.median(p.a[:])) / float64(p.median(p.b[:]))
}

func (p *pairTimes) median(d []time.Duration) time.Duration {
	d = slices.Clone(d[:min(p.n, pairSamples)])
	slices.Sort(d)
	return d[len(d)/2]
}

// BenchmarkFindMatchesFloor holds FindMatches to the floor in one loop, so
// that machine noise hits both alike: every iteration times FindMatches on
// one prompt and the floor's loads on another (both cold: a prompt looked
// at second would otherwise find the first one's lines in the cache),
// taking turns at going first. x-floor is FindMatches' median time over
// the floor's.
func BenchmarkFindMatchesFloor(b *testing.B) {
	ix, prompts, slots, _ := sharedFloorSlots(b)
	var out workers.Overlaps
	times := new(pairTimes)
	r := rand.New(rand.NewPCG(3, 4))
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		p := (i*7919 + r.IntN(4)) % len(prompts)
		q := (p + len(prompts)/2) % len(prompts)
		t0 := time.Now()
		if i%2 == 0 {
			ix.FindMatches(prompts[p], &out)
			t1 := time.Now()
			probeFloor(slots[q])
			times.add(t1.Sub(t0), time.Since(t1))
		} else {
			probeFloor(slots[q])
			t1 := time.Now()
			ix.FindMatches(prompts[p], &out)
			times.add(time.Since(t1), t1.Sub(t0))
		}
		i++
	}
	b.ReportMetric(times.ratio(), "x-floor")
	b.ReportMetric(float64(times.median(times.a[:]).Nanoseconds()), "find-ns")
	b.ReportMetric(float64(times.median(times.b[:]).Nanoseconds()), "floor-ns")
}
