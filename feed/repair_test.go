package feed

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/internal/invariants"
	"github.com/kvfast/kvfast/internal/syncbuf"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
)

// scribbleIndex writes random bytes over the index region of the segment
// file from offset from (past the index header) for n bytes, through the
// file rather than the mapping, as a stray writer would.
func scribbleIndex(t *testing.T, seg *shm.Segment, from, n int64) {
	t.Helper()
	h := seg.Header()
	if n < 0 {
		n = h.IndexSize - from
	}
	junk := make([]byte, n)
	r := rand.New(rand.NewPCG(9, 9))
	for i := range junk {
		junk[i] = byte(r.Uint32())
	}
	f, err := os.OpenFile(seg.Path(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(junk, h.IndexOffset+from); err != nil {
		t.Fatal(err)
	}
}

// fillIndex publishes and ingests enough blocks that damage lands on some.
func fillIndex(t *testing.T, seg *shm.Segment) {
	t.Helper()
	in := acquire(t, seg, Config{})
	p, err := seg.Register(workerCfg(1))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i, o := range genOps(3, 2000) {
		publishOp(p, o)
		if i%100 == 0 {
			drainAll(in)
		}
	}
	drainAll(in)
	if err := in.Release(); err != nil {
		t.Fatal(err)
	}
}

func TestAcquireRepairsOrResetsADamagedIndex(t *testing.T) {
	for _, tc := range []struct {
		name      string
		from, n   int64
		wantReset bool
	}{
		// Everything past the index header: more live entries than any
		// writer could store, so no repair can be trusted.
		{"whole region", 64, -1, true},
		{"one KiB", 64 << 10, 1 << 10, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seg := openSeg(t, 1<<20)
			fillIndex(t, seg)
			scribbleIndex(t, seg, tc.from, tc.n)
			var log syncbuf.Buffer
			in := New(seg, Config{Logger: slog.New(slog.NewTextHandler(&log, nil))})
			select {
			case <-in.Settled():
				t.Fatal("settled before Acquire")
			default:
			}
			ok, err := in.Acquire(context.Background())
			if !ok || err != nil {
				t.Fatalf("Acquire: %v %v", ok, err)
			}
			defer in.Release()
			select {
			case <-in.Settled():
			default:
				t.Fatal("not settled after Acquire")
			}
			if err := seg.Index().Verify(); err != nil {
				t.Fatalf("index inconsistent after Acquire: %v", err)
			}
			st := in.Stats()
			out := log.String()
			if got := st.IndexResets == 1; got != tc.wantReset {
				t.Fatalf("index resets %d, want reset %v; log:\n%s", st.IndexResets, tc.wantReset, out)
			}
			for _, want := range []string{"checking the index before ingesting"} {
				if !strings.Contains(out, want) {
					t.Fatalf("log lacks %q:\n%s", want, out)
				}
			}
			want := "index repaired"
			if tc.wantReset {
				want = "dropped the index: damaged beyond repair"
			}
			if !strings.Contains(out, want) {
				t.Fatalf("log lacks %q:\n%s", want, out)
			}
			// Ingestion goes on on the repaired index.
			p, err := seg.Register(workerCfg(2))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			m := newModel()
			for _, o := range genOps(4, 200) {
				publishOp(p, o)
				m.apply(o)
			}
			drainAll(in)
			m.check(t, seg.Index(), p.Slot())
		})
	}
}

func TestAcquireCancelledDuringRepairGivesTheRoleBack(t *testing.T) {
	seg := openSeg(t, 1<<20)
	in := New(seg, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if ok, err := in.Acquire(ctx); ok || err == nil {
		t.Fatalf("Acquire with an ended context: %v %v", ok, err)
	}
	// The lock is free again: another ingester takes it.
	other := New(seg, Config{})
	if ok, err := other.Acquire(context.Background()); !ok || err != nil {
		t.Fatalf("the role was not given back: %v %v", ok, err)
	}
	other.Release()
}

// TestDamageWhileIngestingIsMended: random bytes written over the block
// table while a router ingests (a process writing over the segment) made
// every later store overflow, with the index reporting room, until a
// restart. The ingester now repairs, here resets, the index and ingests on.
//
// The index's self-checks (internal/invariants, on in race builds) take
// damage for a writer's bug and panic, as they should; make test runs this
// test once more without them.
func TestDamageWhileIngestingIsMended(t *testing.T) {
	if invariants.Enabled {
		t.Skip("runs without invariants (make test's second pass): the self-checks panic on the damage this test makes")
	}
	seg := openSeg(t, 1<<20)
	var log syncbuf.Buffer
	in := New(seg, Config{Logger: slog.New(slog.NewTextHandler(&log, nil))})
	runUntilCleanup(t, in)
	p, err := seg.Register(workerCfg(1))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ops := genOps(6, 400)
	for _, o := range ops[:200] {
		publishOp(p, o)
	}
	waitFor(t, func() bool { return seg.Index().Stats().Entries > 0 }, func() any { return in.Stats() })
	st := seg.Index().Stats()
	// layout.go: the index header (64 bytes), then 384 bytes of meta per
	// shard, then the block table.
	scribbleIndex(t, seg, 64+int64(len(st.Shards))*384, int64(st.BlockTableBytes))
	for _, o := range ops[200:] {
		publishOp(p, o)
	}
	waitFor(t, func() bool { return in.Stats().IndexResets == 1 }, func() any { return log.String() })
	if !strings.Contains(log.String(), "refuses stores while it has room") {
		t.Fatalf("the log does not say why:\n%s", log.String())
	}
	if seg.Index().Damaged() {
		t.Fatal("still damaged after the reset")
	}
	// It ingests on: a new worker's blocks are all stored.
	q, err := seg.Register(workerCfg(2))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	hashes := radix.AppendBlockHashes(nil, radix.NamespaceSeed(testModel, "", ""), make([]uint32, 8*testBlockSize), testBlockSize)
	if err := q.Stored(0, false, []uint64{1, 2, 3, 4, 5, 6, 7, 8}, make([]uint32, 8*testBlockSize)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		var out workers.Overlaps
		seg.Index().FindMatches(hashes, &out)
		return out[q.Slot()] == 8
	}, func() any { return seg.Index().Stats().WorkerBlocks[q.Slot()] })
}
