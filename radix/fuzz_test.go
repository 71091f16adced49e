package radix

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/kvfast/kvfast/workers"
)

// FuzzApplyEvents decodes the input as a stream of index operations over a
// small hash space and applies it to the index and to the model. They must
// agree after every operation and the structure must verify at the end.
func FuzzApplyEvents(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{0x00, 0x10, 0x41, 0x10, 0x82, 0x33, 0xc3, 0x01, 0x00, 0x11, 0x40, 0x11})
	f.Add(binary.LittleEndian.AppendUint64(nil, 0xdeadbeefcafef00d))
	f.Add([]byte{0x3c, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0x3c, 1, 9, 10, 11, 12, 13, 14, 15, 16, 0x3c, 2, 17, 18, 19, 20, 21, 22, 23, 24, 0x3d, 0, 1, 2, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		ix, err := NewHeap(Config{Capacity: 64, Shards: 2})
		if err != nil {
			t.Fatal(err)
		}
		ref := model{}
		var out workers.Overlaps
		hashes := make([]uint64, 0, 8)
		for len(data) >= 2 {
			op, arg := data[0], data[1]
			data = data[2:]
			w := workers.Slot(arg % 5)
			hashes = hashes[:0]
			for i := 0; i < int(op>>2)%8+1 && i < len(data); i++ {
				h := uint64(data[i]%48)*0x9e3779b97f4a7c15 + 64
				if op&0x20 != 0 {
					// siblings: one group, one counter, so one near home for
					// all 48 hashes, more than its window holds
					h = 1<<groupShift | h&freshMask | 1<<32
				}
				hashes = append(hashes, h)
			}
			switch op & 3 {
			case 0:
				ix.Stored(w, hashes)
				for _, h := range hashes {
					if ref[h]&workers.SetOf(w) == 0 && ix.Lookup(h).Has(w) {
						ref[h] |= workers.SetOf(w)
					}
				}
			case 1:
				ix.Removed(w, hashes)
				for _, h := range hashes {
					if ref[h] &^= workers.SetOf(w); ref[h] == 0 {
						delete(ref, h)
					}
				}
			case 2:
				ix.Cleared(w)
				for h := range ref {
					if ref[h] &^= workers.SetOf(w); ref[h] == 0 {
						delete(ref, h)
					}
				}
			case 3:
				ix.MapEngineHash(w, uint64(arg), uint64(op))
				if kv, ok := ix.LookupEngineHash(w, uint64(arg)); !ok && ix.Stats().EngineMapOverflow == 0 || ok && kv != uint64(op) {
					t.Fatalf("engine map lost (%d,%d)", w, arg)
				}
			}
			got := ix.FindMatches(hashes, &out)
			want, wantSet := ref.findMatches(hashes)
			if out != want || got != wantSet {
				t.Fatalf("disagreement with the model:\n got %v\nwant %v", out[:5], want[:5])
			}
		}
		if err := ix.Verify(); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzAttach feeds arbitrary bytes, and mutations of a valid region, to
// Attach. It must refuse or accept without panicking, and an accepted
// region must survive lookups and verification.
func FuzzAttach(f *testing.F) {
	cfg := Config{Capacity: 64, Shards: 2}
	size, _ := RegionSize(cfg)
	good := alignedHeap(size)
	ix, _ := Format(good, cfg)
	ix.Stored(1, []uint64{100, 200, 300})
	f.Add(append([]byte(nil), good...), uint16(0), byte(0))
	f.Add(append([]byte(nil), good...), uint16(20), byte(0xff))
	f.Add([]byte("KVFXIDX1"), uint16(0), byte(0))
	f.Fuzz(func(t *testing.T, data []byte, at uint16, x byte) {
		region := alignedHeap(len(data))
		copy(region, data)
		if len(region) > 0 {
			region[int(at)%len(region)] ^= x
		}
		ix, err := Attach(region)
		if err != nil {
			return
		}
		var out workers.Overlaps
		ix.FindMatches([]uint64{100, 200, 300, 400}, &out)
		_ = ix.Verify() // may report damage in the slots; must not panic
		if _, err := ix.Repair(context.Background(), RepairOptions{}); errors.Is(err, ErrBeyondRepair) {
			ix.Reset()
		} else if err != nil {
			t.Fatal(err)
		}
		if err := ix.Verify(); err != nil {
			t.Fatalf("Repair left the index inconsistent: %v", err)
		}
		ix.Stored(2, []uint64{500})
		ix.Removed(1, []uint64{100})
	})
}
