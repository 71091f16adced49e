package shm

import (
	"runtime"
	"sync/atomic"

	"github.com/kvfast/kvfast/workers"
)

// Load page field offsets (little-endian). The page is a seqlock: the
// writer makes seq odd, stores the fields, then makes it even again; a
// reader retries until it reads the same even seq before and after.
const (
	lSeq     = 0  // u64
	lRunning = 8  // u64 requests running
	lWaiting = 16 // u64 requests queued
	lKVUsed  = 24 // u64 KV blocks in use
	lKVTotal = 32 // u64 KV blocks in the engine's pool
	lUpdated = 40 // u64 CLOCK_MONOTONIC ns of the write
	lGen     = 48 // u32 generation of the writer
)

// Load is one engine's load as it reported it.
type Load struct {
	Running, Waiting uint64
	KVUsedBlocks     uint64
	KVTotalBlocks    uint64
	Updated          int64  // CLOCK_MONOTONIC ns, filled in by the publisher
	Generation       uint32 // the publisher's generation, filled in by the publisher
}

func loadPageOff(slot int) int { return loadOff + slot*loadPageSize }

// writeLoad is the seqlock writer. One writer per page (the slot's
// publisher), so the odd/even protocol needs no compare-and-swap.
func (s *Segment) writeLoad(slot int, l Load) {
	off := loadPageOff(slot)
	seq := s.u64(off + lSeq)
	v := atomic.LoadUint64(seq)
	if v&1 != 0 {
		v++ // a previous writer died mid-update; resume from an even value
	}
	atomic.StoreUint64(seq, v+1)
	atomic.StoreUint64(s.u64(off+lRunning), l.Running)
	atomic.StoreUint64(s.u64(off+lWaiting), l.Waiting)
	atomic.StoreUint64(s.u64(off+lKVUsed), l.KVUsedBlocks)
	atomic.StoreUint64(s.u64(off+lKVTotal), l.KVTotalBlocks)
	atomic.StoreUint64(s.u64(off+lUpdated), uint64(l.Updated))
	atomic.StoreUint32(s.u32(off+lGen), l.Generation)
	atomic.StoreUint64(seq, v+2)
}

// LoadOf returns a consistent snapshot of slot's load page. Every field
// is read atomically and the snapshot is accepted only if seq was even
// and unchanged across the reads, so a torn read is impossible. It gives
// up with ErrTorn after a bounded number of attempts (a writer that died
// mid-update leaves seq odd until its slot is registered again).
func (s *Segment) LoadOf(slot workers.Slot) (Load, error) {
	off := loadPageOff(int(slot) & (workers.Max - 1))
	seq := s.u64(off + lSeq)
	for try := 0; try < 128; try++ {
		v1 := atomic.LoadUint64(seq)
		if v1&1 != 0 {
			if try > 8 {
				runtime.Gosched()
			}
			continue
		}
		l := Load{
			Running:       atomic.LoadUint64(s.u64(off + lRunning)),
			Waiting:       atomic.LoadUint64(s.u64(off + lWaiting)),
			KVUsedBlocks:  atomic.LoadUint64(s.u64(off + lKVUsed)),
			KVTotalBlocks: atomic.LoadUint64(s.u64(off + lKVTotal)),
			Updated:       int64(atomic.LoadUint64(s.u64(off + lUpdated))),
			Generation:    atomic.LoadUint32(s.u32(off + lGen)),
		}
		if atomic.LoadUint64(seq) == v1 {
			return l, nil
		}
	}
	return Load{}, ErrTorn
}
