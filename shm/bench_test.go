package shm

import (
	"runtime"
	"sync"
	"testing"
)

// BenchmarkRing moves one-block Stored events (16 tokens, the common
// case) from a producer goroutine to a consumer goroutine: through the
// shm ring, and through a buffered Go channel of the same event as a
// value, the baseline an in-process design would use.
func BenchmarkRing(b *testing.B) {
	b.Run("shm", func(b *testing.B) {
		seg, _ := openTest(b, Options{RingBytes: 1 << 20})
		p, err := seg.Register(WorkerConfig{WorkerID: 1, BlockSize: 16})
		if err != nil {
			b.Fatal(err)
		}
		r := seg.Reader(p.Slot())
		hashes := []uint64{1}
		tokens := make([]uint32, 16)
		b.ReportAllocs()
		b.ResetTimer()
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < b.N; {
				hashes[0] = uint64(i)
				if p.Stored(0, false, hashes, tokens) == nil {
					i++
				} else {
					p.w.seq-- // a benchmark retries instead of dropping
					runtime.Gosched()
				}
			}
		}()
		var rec Record
		var sum uint64
		for got := 0; got < b.N; {
			ok, err := r.Next(&rec)
			if err != nil {
				b.Fatal(err)
			}
			if !ok {
				runtime.Gosched() // two spinning goroutines need two idle cores
				continue
			}
			sum += rec.Hashes[0]
			r.Commit(&rec)
			got++
		}
		wg.Wait()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	})
	b.Run("chan", func(b *testing.B) {
		type event struct {
			kind   Kind
			seq    uint64
			parent uint64
			hash   uint64
			tokens [16]uint32
		}
		ch := make(chan event, (1<<20)/112)
		var tokens [16]uint32
		b.ReportAllocs()
		b.ResetTimer()
		go func() {
			for i := 0; i < b.N; i++ {
				// Every field Stored writes to the ring, as the shm case does.
				ch <- event{kind: KindStored, seq: uint64(i + 1), parent: 0, hash: uint64(i), tokens: tokens}
			}
		}()
		var sum uint64
		for i := 0; i < b.N; i++ {
			e := <-ch
			sum += e.hash
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	})
}
