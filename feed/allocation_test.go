//go:build !race

package feed

import (
	"testing"
	"time"
)

func TestIngestZeroAllocs(t *testing.T) {
	seg := openSeg(t, 1<<22)
	in := acquire(t, seg, Config{HeartbeatGrace: time.Hour, RegistryEvery: time.Hour})
	p, err := seg.Register(workerCfg(1))
	if err != nil {
		t.Fatal(err)
	}
	in.ScanRegistry()
	hashes := []uint64{1, 2, 3, 4}
	tokens := make([]uint32, 4*testBlockSize)
	round := uint64(0)
	allocs := testing.AllocsPerRun(500, func() {
		round++
		for i := range hashes {
			hashes[i] = round<<8 | uint64(i)
		}
		p.Stored(0, false, hashes, tokens)
		p.Removed(hashes[:2])
		p.Cleared()
		for in.Poll() > 0 {
		}
	})
	if allocs != 0 {
		t.Fatalf("publish+ingest: %v allocs per run", allocs)
	}
	if st := in.Stats(); st.Records < 1500 || st.StoredBlocks < 2000 {
		t.Fatalf("nothing was ingested: %+v", st)
	}
}
