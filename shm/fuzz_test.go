package shm

import (
	"encoding/binary"
	"errors"
	"os"
	"testing"
	"unsafe"
)

// aligned copies b into 8-byte-aligned memory, as ring records always are.
func aligned(b []byte) []byte {
	words := make([]uint64, (len(b)+7)/8)
	out := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(words))), len(words)*8)[:len(b)]
	copy(out, b)
	return out
}

func encodedSeeds() [][]byte {
	seg := &ringWriter{size: 1 << 12, maxRecord: 1 << 10}
	buf := make([]uint64, 512)
	seg.data = unsafe.Pointer(&buf[0])
	var h, t, d, pub uint64
	var bell, sl, gen uint32
	seg.head, seg.tail, seg.dropped, seg.published, seg.doorbell, seg.sleepers, seg.slotGen = &h, &t, &d, &pub, &bell, &sl, &gen
	seg.writeStored(5, true, []uint64{1, 2}, make([]uint32, 6), 3)
	seg.writeRemoved([]uint64{7, 8, 9})
	seg.writeCleared()
	all := unsafe.Slice((*byte)(seg.data), seg.pos)
	return [][]byte{all[:int(binary.LittleEndian.Uint32(all))], all, all[56:], all[56+48:]}
}

func FuzzDecodeRecord(f *testing.F) {
	for _, s := range encodedSeeds() {
		f.Add(s)
	}
	f.Add([]byte{})
	f.Add(make([]byte, 24))
	f.Fuzz(func(t *testing.T, in []byte) {
		b := aligned(in)
		var rec Record
		if err := DecodeRecord(b, &rec); err != nil {
			return
		}
		end := uintptr(unsafe.Pointer(unsafe.SliceData(b))) + uintptr(len(b))
		check := func(p unsafe.Pointer, n uintptr) {
			if n > 0 && uintptr(p)+n > end {
				t.Fatalf("view runs past the input")
			}
		}
		check(unsafe.Pointer(unsafe.SliceData(rec.Hashes)), uintptr(len(rec.Hashes))*8)
		check(unsafe.Pointer(unsafe.SliceData(rec.Tokens)), uintptr(len(rec.Tokens))*4)
		if int(rec.size) > len(b) || int(rec.size)%8 != 0 {
			t.Fatalf("size %d of %d bytes", int(rec.size), len(b))
		}
		if rec.Kind == KindStored && len(rec.Tokens) != len(rec.Hashes)*rec.BlockSize {
			t.Fatalf("%d tokens for %d blocks of %d", len(rec.Tokens), len(rec.Hashes), rec.BlockSize)
		}
	})
}

// FuzzRingReader lets the fuzzer write a whole ring (bytes, head and tail)
// and drains it: the reader must terminate without panicking or reading
// outside the ring, whatever a hostile producer wrote.
func FuzzRingReader(f *testing.F) {
	for _, s := range encodedSeeds() {
		f.Add(s, uint64(len(s)), uint64(0))
	}
	f.Add([]byte{8, 0, 0, 0, 0xff}, uint64(4096), uint64(4088))
	seg, err := Open(f.TempDir()+"/seg", Options{Index: testIndex, RingBytes: MinRingBytes})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { seg.Close() })
	f.Fuzz(func(t *testing.T, data []byte, head, tail uint64) {
		off := seg.ringBase(0)
		copy(seg.bytesAt(off+ringControlSize, seg.lay.ringBytes), data)
		*seg.u64(off + ctlHead) = head
		*seg.u64(off + ctlTail) = tail
		r := seg.Reader(0)
		var rec Record
		// A head that stays inconsistent keeps failing (the ingester
		// counts it and moves on); what matters is that every step is
		// bounded and in bounds.
		for i := 0; i < 1000; i++ {
			ok, err := r.Next(&rec)
			if err != nil {
				r.Resync()
				continue
			}
			if !ok {
				return
			}
			if int(rec.size) > seg.lay.ringBytes {
				t.Fatalf("record of %d bytes in a %d-byte ring", int(rec.size), seg.lay.ringBytes)
			}
			r.Commit(&rec)
		}
	})
}

func FuzzDecodeSlot(f *testing.F) {
	valid := make([]byte, slotSize)
	binary.LittleEndian.PutUint64(valid[sState:], uint64(StateLive))
	binary.LittleEndian.PutUint16(valid[sModelLen:], 3)
	copy(valid[sModel:], "abc")
	f.Add(valid)
	f.Add(make([]byte, 10))
	f.Fuzz(func(t *testing.T, b []byte) {
		var info WorkerInfo
		if err := decodeSlot(b, &info); err != nil {
			return
		}
		if len(info.Model) > MaxModelLen || len(info.Endpoint) > MaxEndpointLen || info.State > StateClosed {
			t.Fatalf("accepted %+v", info)
		}
	})
}

// FuzzLoadOf fills a load page with arbitrary bytes and reads it: a page
// whose seq is odd (a writer mid-update, or one that died there) is
// refused, any other read back exactly as stored.
func FuzzLoadOf(f *testing.F) {
	seg, _ := openTest(f, Options{RingBytes: MinRingBytes})
	f.Add(make([]byte, loadPageSize))
	f.Add([]byte{1})
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		const slot = 3
		page := seg.bytesAt(loadPageOff(slot), loadPageSize)
		clear(page)
		copy(page, b)
		l, err := seg.LoadOf(slot)
		le := binary.LittleEndian
		if le.Uint64(page[lSeq:])&1 != 0 {
			if !errors.Is(err, ErrTorn) {
				t.Fatalf("accepted a page with odd seq: %+v %v", l, err)
			}
			return
		}
		want := Load{
			Running:       le.Uint64(page[lRunning:]),
			Waiting:       le.Uint64(page[lWaiting:]),
			KVUsedBlocks:  le.Uint64(page[lKVUsed:]),
			KVTotalBlocks: le.Uint64(page[lKVTotal:]),
			Updated:       int64(le.Uint64(page[lUpdated:])),
			Generation:    le.Uint32(page[lGen:]),
		}
		if err != nil || l != want {
			t.Fatalf("LoadOf = %+v, %v; the page holds %+v", l, err, want)
		}
	})
}

// FuzzAttach overwrites the header page of a valid segment and attaches:
// the result must be a clean attach or a refusal wrapping ErrIncompatible.
func FuzzAttach(f *testing.F) {
	dir := f.TempDir()
	seg, err := Open(dir+"/template", Options{Index: testIndex, RingBytes: MinRingBytes, Bindings: MinBindings})
	if err != nil {
		f.Fatal(err)
	}
	template := append([]byte(nil), seg.mem...)
	seg.Close()
	f.Add(template[:headerSize], uint32(len(template)))
	f.Add(template[:300], uint32(len(template)/2))
	f.Add([]byte("KVFASTSG"), uint32(4096))
	f.Fuzz(func(t *testing.T, header []byte, length uint32) {
		img := append([]byte(nil), template...)
		copy(img, header)
		if int(length) < len(img) {
			img = img[:length]
		}
		path := t.TempDir() + "/seg"
		if err := os.WriteFile(path, img, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := Open(path, Options{NoCreate: true})
		if err != nil {
			if !errors.Is(err, ErrIncompatible) {
				t.Fatalf("refusal does not wrap ErrIncompatible: %v", err)
			}
			return
		}
		defer s.Close()
		if s.Header().FileSize > int64(len(img)) {
			t.Fatalf("attached a segment larger than its file")
		}
		s.Workers(nil)
		for i := 0; i < 64; i++ {
			s.LoadOf(0)
		}
		b := s.Bindings()
		k := b.Key([]byte("session"))
		b.Bind(k, 1, 0, b.Now(), 1e9)
		b.Lookup(k, b.Now(), 1e9)
	})
}
