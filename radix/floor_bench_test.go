package radix

import (
	"math/rand/v2"
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

// BenchmarkFindMatchesFloor holds FindMatches to the floor in one loop, so
// that machine noise hits both alike: every iteration times FindMatches on
// one prompt and the floor's loads on another (both cold: a prompt looked
// at second would otherwise find the first one's lines in the cache),
// taking turns at going first. x-floor is FindMatches' total time over the
// floor's.
func BenchmarkFindMatchesFloor(b *testing.B) {
	ix, prompts, slots, _ := sharedFloorSlots(b)
	var out workers.Overlaps
	var tFind, tFloor time.Duration
	r := rand.New(rand.NewPCG(3, 4))
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		p := (i*7919 + r.IntN(4)) % len(prompts)
		q := (p + len(prompts)/2) % len(prompts)
		if i%2 == 0 {
			t0 := time.Now()
			ix.FindMatches(prompts[p], &out)
			t1 := time.Now()
			probeFloor(slots[q])
			tFind, tFloor = tFind+t1.Sub(t0), tFloor+time.Since(t1)
		} else {
			t0 := time.Now()
			probeFloor(slots[q])
			t1 := time.Now()
			ix.FindMatches(prompts[p], &out)
			tFloor, tFind = tFloor+t1.Sub(t0), tFind+time.Since(t1)
		}
		i++
	}
	b.ReportMetric(float64(tFind)/float64(tFloor), "x-floor")
	b.ReportMetric(float64(tFind.Nanoseconds())/float64(b.N), "find-ns/op")
	b.ReportMetric(float64(tFloor.Nanoseconds())/float64(b.N), "floor-ns/op")
}
