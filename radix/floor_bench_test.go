package radix

import (
	"testing"
	"unsafe"
)

var probeSink uint64

// BenchmarkProbeFloor is the memory floor under BenchmarkFindMatches: one
// load of the slot where each block of the prompt actually lives, with the
// addresses worked out beforehand, so the loop is nothing but independent
// loads. FindMatches must read at least these cache lines (a group's
// blocks share two or three of them), so on a table bigger than the cache
// this is what the machine's memory system allows.
func BenchmarkProbeFloor(b *testing.B) {
	ix, prompts := sharedWarmIndex(b)
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
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		var s uint64
		for _, sp := range slots[(i*7919)%len(slots)] {
			s += sp.key.Load()
		}
		probeSink += s
		i++
	}
	b.ReportMetric(float64(512*b.N)/b.Elapsed().Seconds(), "blocks/s")
	b.ReportMetric(float64(lines)/float64(len(prompts)), "lines/prompt")
}
