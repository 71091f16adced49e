package radix

import (
	"context"
	"testing"

	"github.com/kvfast/kvfast/workers"
)

func spread(n int, salt uint64) []uint64 {
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = mix64(uint64(i)+salt) | 1
	}
	return hashes
}

// A publisher that never evicts must not be able to fill the index for
// every other worker: its stores stop at its share, the others' go on.
func TestWorkerShareKeepsRoomForOthers(t *testing.T) {
	ix := newTestIndex(t, Config{Capacity: 4000, Shards: 4})
	if err := ix.SetWorkerShare(0.5); err != nil {
		t.Fatal(err)
	}
	hog := spread(10_000, 1)
	again, refused := ix.StoredAgain(3, hog, nil)
	if len(again) != 0 {
		t.Fatalf("%d blocks reported held already", len(again))
	}
	st := ix.Stats()
	quota := uint64(ix.blockQuota.Load()) * uint64(len(ix.shards))
	if held := st.WorkerBlocks[3]; held > quota || held < quota*9/10 {
		t.Fatalf("the hog holds %d blocks, want about its share %d", held, quota)
	}
	if refused != len(hog)-int(st.WorkerBlocks[3]) || ix.Refused(3) != uint64(refused) || st.WorkerRefused[3] != uint64(refused) {
		t.Fatalf("refused %d (Refused %d, Stats %d), want %d", refused, ix.Refused(3), st.WorkerRefused[3], len(hog)-int(st.WorkerBlocks[3]))
	}
	fair := spread(1000, 1<<40)
	if _, refused := ix.StoredAgain(4, fair, nil); refused != 0 {
		t.Fatalf("another worker's %d blocks refused: the hog filled the index", refused)
	}
	var out workers.Overlaps
	ix.FindMatches(fair, &out)
	if out[4] != uint32(len(fair)) {
		t.Fatalf("the other worker matches %d of its %d blocks", out[4], len(fair))
	}
	// Claims on blocks others hold count too: the share is what a worker
	// holds, as kvfast_worker_index_blocks shows it.
	if _, refused := ix.StoredAgain(3, fair, nil); refused != len(fair) {
		t.Fatalf("the hog claimed %d of the other worker's blocks past its share", len(fair)-refused)
	}
	// Room it gives back it may use again.
	ix.Removed(3, hog[:500])
	if _, refused := ix.StoredAgain(3, hog[:500], nil); refused != 0 {
		t.Fatalf("%d blocks refused after the hog evicted them", refused)
	}
	if err := ix.Verify(); err != nil {
		t.Fatal(err)
	}
	ix.RemoveWorker(3)
	if ix.Refused(3) != 0 {
		t.Fatal("a freed slot kept its refusals")
	}
}

func TestWorkerShareBoundsTheEngineMap(t *testing.T) {
	ix := newTestIndex(t, Config{Capacity: 2000, Shards: 2})
	if err := ix.SetWorkerShare(0.25); err != nil {
		t.Fatal(err)
	}
	engines := spread(5000, 2)
	mapped, _ := ix.MapEngineHashes(1, engines, engines, nil)
	quota := int(ix.mapQuota.Load()) * len(ix.shards)
	if mapped > quota || mapped < quota*9/10 {
		t.Fatalf("mapped %d, want about the share %d", mapped, quota)
	}
	if ix.Refused(1) != uint64(len(engines)-mapped) {
		t.Fatalf("refused %d, want %d", ix.Refused(1), len(engines)-mapped)
	}
	other := spread(500, 1<<41)
	if n, _ := ix.MapEngineHashes(2, other, other, nil); n != len(other) {
		t.Fatalf("another worker mapped %d of %d", n, len(other))
	}
	// Unmapping gives room back; forgetting the worker gives all of it.
	ix.UnmapEngineHashes(1, engines[:mapped], nil)
	if n, _ := ix.MapEngineHashes(1, engines[:100], engines[:100], nil); n != 100 {
		t.Fatalf("mapped %d of 100 after unmapping", n)
	}
	ix.ClearedAll(1)
	if n, _ := ix.MapEngineHashes(1, engines, engines, nil); n != mapped {
		t.Fatalf("mapped %d after the worker was forgotten, want %d as at first", n, mapped)
	}
}

// The engine-map counts are process-local: a process that attaches to a
// region another filled, or repairs or resets it, counts again.
func TestWorkerShareCountsWhatOthersMapped(t *testing.T) {
	ix := newTestIndex(t, Config{Capacity: 2000, Shards: 2})
	engines := spread(3000, 3)
	filled, _ := ix.MapEngineHashes(1, engines, engines, nil) // no bound here
	successor, err := Attach(ix.region)
	if err != nil {
		t.Fatal(err)
	}
	if err := successor.SetWorkerShare(0.25); err != nil {
		t.Fatal(err)
	}
	more := spread(100, 1<<42)
	if n, _ := successor.MapEngineHashes(1, more, more, nil); n != 0 {
		t.Fatalf("the attached index let a worker already past its share map %d more", n)
	}
	if _, err := successor.Repair(context.Background(), RepairOptions{}); err != nil {
		t.Fatal(err)
	}
	if n, _ := successor.MapEngineHashes(1, more, more, nil); n != 0 {
		t.Fatalf("after Repair a worker past its share mapped %d more", n)
	}
	successor.Reset()
	if n, _ := successor.MapEngineHashes(1, engines[:filled/8], engines[:filled/8], nil); n != filled/8 {
		t.Fatalf("after Reset mapped %d of %d", n, filled/8)
	}
}

func TestSetWorkerShareRefusesNonsense(t *testing.T) {
	ix := newTestIndex(t, Config{Capacity: 100})
	for _, share := range []float64{0, -0.5, 1.5} {
		if err := ix.SetWorkerShare(share); err == nil {
			t.Errorf("share %v accepted", share)
		}
	}
	if err := ix.SetWorkerShare(1); err != nil {
		t.Fatal(err)
	}
	if ix.blockQuota.Load() != ix.geo.blockLimit {
		t.Fatal("share 1 bounds a worker below the table")
	}
}
