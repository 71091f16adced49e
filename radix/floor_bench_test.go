package radix

import "testing"

var probeSink uint64

// BenchmarkProbeFloor is the memory floor under BenchmarkFindMatches: one
// independent load of each hash's home slot, nothing else. FindMatches can
// only approach it; on a table bigger than the cache, this is what the
// machine's memory system allows.
func BenchmarkProbeFloor(b *testing.B) {
	ix, prompts := sharedWarmIndex(b)
	mask := ix.geo.shardMask
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		var s uint64
		for _, h := range prompts[(i*7919)%len(prompts)] {
			key := storedKey(h)
			t := &ix.shards[(key>>32)&mask].blocks
			s += t.at(t.home(key)).key.Load()
		}
		probeSink += s
		i++
	}
	b.ReportMetric(float64(512*b.N)/b.Elapsed().Seconds(), "blocks/s")
}
