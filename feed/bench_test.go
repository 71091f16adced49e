package feed

import (
	"context"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
)

const (
	benchBlocks    = 16 // blocks per Stored record
	benchRecords   = 64 // records per round
	benchBlockSize = 16
	// benchIndexCapacity is a 1M-block index, the size of a busy 8-GPU node.
	benchIndexCapacity = 1 << 20
)

// ingestRound prepares one round of records: benchRecords Stored records
// of benchBlocks fresh blocks each, then the removal of the previous
// round's blocks, so the index stays at a steady size.
type ingestRound struct {
	hashes [][]uint64
	tokens []uint32
}

func newIngestRound() *ingestRound {
	r := &ingestRound{tokens: make([]uint32, benchBlocks*benchBlockSize)}
	for i := range r.tokens {
		r.tokens[i] = uint32(i * 7)
	}
	for i := 0; i < benchRecords; i++ {
		r.hashes = append(r.hashes, make([]uint64, benchBlocks))
	}
	return r
}

func (r *ingestRound) next(round int) {
	for i, hs := range r.hashes {
		for j := range hs {
			hs[j] = uint64(round)<<32 | uint64(i*benchBlocks+j) + 1
		}
	}
}

// BenchmarkFeedIngest measures block events (a stored or a removed block)
// applied per second by one ingest goroutine: ring decode, re-hashing of
// the tokens, engine-hash mapping and the index update together. The
// rings are filled with the timer stopped.
func BenchmarkFeedIngest(b *testing.B) {
	seg, err := shm.Open(b.TempDir()+"/seg", shm.Options{Index: radix.Config{Capacity: benchIndexCapacity}, RingBytes: 1 << 22})
	if err != nil {
		b.Fatal(err)
	}
	defer seg.Close()
	p, err := seg.Register(shm.WorkerConfig{WorkerID: 1, Model: "m", BlockSize: benchBlockSize})
	if err != nil {
		b.Fatal(err)
	}
	in := acquire(b, seg, Config{HeartbeatGrace: time.Hour, RegistryEvery: time.Hour})
	in.ScanRegistry()
	cur, prev := newIngestRound(), newIngestRound()
	b.ReportAllocs()
	b.ResetTimer()
	var events uint64
	for round := 0; events < uint64(b.N); round++ {
		b.StopTimer()
		cur.next(round)
		for _, hs := range cur.hashes {
			p.Stored(0, false, hs, cur.tokens)
		}
		if round > 0 {
			for _, hs := range prev.hashes {
				p.Removed(hs)
			}
		}
		b.StartTimer()
		for in.Poll() > 0 {
		}
		events += benchRecords * benchBlocks
		if round > 0 {
			events += benchRecords * benchBlocks
		}
		cur, prev = prev, cur
	}
	b.StopTimer()
	if st := in.Stats(); st.Gaps != 0 || st.UnknownRemoved != 0 {
		b.Fatalf("benchmark workload broken: %+v", st)
	}
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "blockevents/s")
}

// BenchmarkFeedIngestBaseline is the same workload the way an in-process
// Go router would do it: decoded events over a channel into a
// mutex-guarded engine map and block map.
func BenchmarkFeedIngestBaseline(b *testing.B) {
	type event struct {
		stored bool
		hashes []uint64
		tokens []uint32
	}
	ch := make(chan event, 2*benchRecords)
	var mu sync.Mutex
	engine := map[uint64]uint64{}
	blocks := map[uint64]workers.Set{}
	seed := radix.NamespaceSeed("m", "", "")
	cur, prev := newIngestRound(), newIngestRound()
	b.ReportAllocs()
	b.ResetTimer()
	var events uint64
	for round := 0; events < uint64(b.N); round++ {
		cur.next(round)
		go func() {
			for _, hs := range cur.hashes {
				ch <- event{true, hs, cur.tokens}
			}
			if round > 0 {
				for _, hs := range prev.hashes {
					ch <- event{false, hs, nil}
				}
			}
		}()
		n := benchRecords
		if round > 0 {
			n *= 2
		}
		for i := 0; i < n; i++ {
			e := <-ch
			mu.Lock()
			if e.stored {
				parent := seed
				for j, eh := range e.hashes {
					parent = radix.ChainBlockHash(parent, e.tokens[j*benchBlockSize:(j+1)*benchBlockSize])
					engine[eh] = parent
					blocks[parent] |= workers.SetOf(1)
				}
			} else {
				for _, eh := range e.hashes {
					if kv, ok := engine[eh]; ok {
						delete(engine, eh)
						delete(blocks, kv)
					}
				}
			}
			mu.Unlock()
			events += uint64(len(e.hashes))
		}
		cur, prev = prev, cur
	}
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "blockevents/s")
}

// BenchmarkPublishToVisible measures, across processes, the time from a
// child publisher's Stored call to the block being in the index of this
// process's running ingester (Run: spin, then sleep on the doorbell). The
// child stamps CLOCK_MONOTONIC, shared by all processes, into the engine
// hash; p50 and p99 are reported.
func BenchmarkPublishToVisible(b *testing.B) {
	// doorbell: the default idle policy (spin 50µs, then futex sleep);
	// spin: an ingester that never sleeps, trading a core for latency.
	b.Run("doorbell", func(b *testing.B) { benchPublishToVisible(b, Config{}) })
	b.Run("spin", func(b *testing.B) { benchPublishToVisible(b, Config{IdleSpin: time.Hour}) })
}

func benchPublishToVisible(b *testing.B, cfg Config) {
	seg, err := shm.Open(b.TempDir()+"/seg", shm.Options{Index: testIndex, RingBytes: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer seg.Close()
	cfg.HeartbeatGrace = time.Hour
	in := New(seg, cfg)
	lat := make([]int64, 0, b.N)
	var mu sync.Mutex
	got := make(chan struct{})
	in.onApply = func(_ workers.Slot, rec *shm.Record) {
		if rec.Kind != shm.KindStored {
			return
		}
		d := shm.MonotonicNow() - int64(rec.Hashes[0])
		mu.Lock()
		lat = append(lat, d)
		if len(lat) == b.N {
			close(got)
		}
		mu.Unlock()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for !in.Stats().Ingesting {
		time.Sleep(time.Millisecond)
	}
	b.ResetTimer()
	c := startChildB(b, "latency-publisher", seg.Path(), "KVFAST_OPS_N="+strconv.Itoa(b.N))
	select {
	case <-got:
	case <-time.After(time.Duration(b.N)*time.Millisecond + 30*time.Second):
		b.Fatalf("only %d of %d records became visible", len(lat), b.N)
	}
	b.StopTimer()
	c.Kill()
	c.Wait()
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2]), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100]), "p99-ns")
	b.ReportMetric(float64(lat[len(lat)-1]), "max-ns")
}

func latencyPublisher(seg string, n int) error {
	p, err := shm.Register(seg, shm.WorkerConfig{WorkerID: 77, Model: "m", BlockSize: 16})
	if err != nil {
		return err
	}
	tokens := make([]uint32, 16)
	hash := make([]uint64, 1)
	for i := 0; i < n; i++ {
		// Paced like a busy engine (a few thousand block events a second)
		// so each record finds the ingester in its idle path.
		time.Sleep(200 * time.Microsecond)
		tokens[0] = uint32(i)
		hash[0] = uint64(shm.MonotonicNow())
		p.Stored(0, false, hash, tokens)
	}
	time.Sleep(time.Hour)
	return nil
}

func startChildB(b *testing.B, role, seg string, env ...string) *os.Process {
	b.Helper()
	attr := &os.ProcAttr{Env: append(os.Environ(), append([]string{"KVFAST_FEED_CHILD=" + role, "KVFAST_SEG=" + seg}, env...)...),
		Files: []*os.File{nil, nil, os.Stderr}}
	proc, err := os.StartProcess(os.Args[0], []string{os.Args[0], "-test.run=^$"}, attr)
	if err != nil {
		b.Fatal(err)
	}
	return proc
}
