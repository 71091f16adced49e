package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/kvfast/kvfast/workers"
)

// Kind is the type of an event record.
type Kind uint8

const (
	KindStored  Kind = 1 // blocks entered the engine's cache
	KindRemoved Kind = 2 // blocks were evicted
	KindCleared Kind = 3 // the engine dropped its whole cache
	kindPad     Kind = 0xff
)

func (k Kind) String() string {
	switch k {
	case KindStored:
		return "stored"
	case KindRemoved:
		return "removed"
	case KindCleared:
		return "cleared"
	case kindPad:
		return "pad"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Record header field offsets (little-endian). Every record starts on an
// 8-byte boundary and its size is a multiple of 8.
const (
	rSize      = 0  // u32 total bytes including header and padding
	rKind      = 4  // u8
	rFlags     = 5  // u8
	rBlockSize = 6  // u16 tokens per block (Stored)
	rSeq       = 8  // u64, 1 for a generation's first record
	rGen       = 16 // u32 publisher's registry generation
	rCount     = 20 // u32 blocks (Stored) or hashes (Removed)
	recordHead = 24
	rParent    = 24 // Stored: u64 parent engine hash, valid iff flagParent

	storedHead = 32 // Stored: header + parent, then hashes, then tokens

	flagParent = 1

	// padHead is all a pad record needs: size and kind.
	padHead = 8
)

// Ring control offsets, relative to the ring's start. The producer's and
// the consumer's words sit on separate 128-byte lines (adjacent-line
// prefetch pairs 64-byte lines) so neither side's stores invalidate the
// line the other side polls.
const (
	ctlHead      = 0   // u64 producer: bytes committed, monotonic
	ctlDropped   = 8   // u64 producer: records dropped on overflow
	ctlPublished = 16  // u64 producer: records committed
	ctlTail      = 128 // u64 consumer: bytes consumed, monotonic (the persistent cursor)
	ctlLastSeq   = 136 // u64 consumer: seq of the last applied record of ctlGen
	ctlGen       = 144 // u32 consumer: generation whose records it is applying
)

// storedSize is the encoded size of a Stored record of n blocks of bs
// tokens, or 0 if it does not fit a u32.
func storedSize(n, bs int) int {
	sz := storedHead + 8*n + alignUp(4*n*bs, 8)
	if n < 0 || bs < 0 || sz > 1<<31 {
		return 0
	}
	return sz
}

// Record is a decoded event. Hashes and Tokens are views into the ring,
// valid until the record is committed; nothing is copied.
type Record struct {
	Kind      Kind
	Parent    uint64 // engine hash of the first block's parent, if HasParent
	HasParent bool
	BlockSize int
	Seq       uint64
	Gen       uint32
	Hashes    []uint64 // engine block hashes
	Tokens    []uint32 // Stored: len(Hashes)*BlockSize token ids
	size      uint64   // encoded bytes, what Commit and Skip consume
}

// RecordError says why bytes in a ring are not a valid record.
type RecordError struct {
	Offset uint64 // ring position of the record
	Reason string
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("kvfast: corrupt event record at ring position %d: %s", e.Offset, e.Reason)
}

// DecodeRecord validates the record at the start of b (which must be
// 8-byte aligned; the ring guarantees it) and fills rec with views into b.
// It never reads outside b, whatever the bytes say.
func DecodeRecord(b []byte, rec *Record) error {
	if len(b) < recordHead {
		return errShort
	}
	le := binary.LittleEndian
	size := uint64(le.Uint32(b[rSize:]))
	kind := Kind(b[rKind])
	flags := b[rFlags]
	switch {
	case size%8 != 0:
		return errors.New("size not a multiple of 8")
	case size < recordHead:
		return errors.New("size smaller than the header")
	case size > uint64(len(b)):
		return errors.New("size runs past the committed bytes")
	case flags&^flagParent != 0:
		return errors.New("unknown flags")
	}
	n := uint64(le.Uint32(b[rCount:]))
	bs := uint64(le.Uint16(b[rBlockSize:]))
	rec.Kind, rec.size = kind, size
	rec.Seq = le.Uint64(b[rSeq:])
	rec.Gen = le.Uint32(b[rGen:])
	rec.HasParent, rec.Parent, rec.BlockSize = false, 0, 0
	rec.Hashes, rec.Tokens = nil, nil
	if rec.Seq == 0 {
		return errors.New("sequence number 0")
	}
	switch kind {
	case KindStored:
		if n == 0 || bs == 0 {
			return errors.New("stored record with no blocks or zero block size")
		}
		// n and bs are < 2^32 and 2^16, so this cannot overflow uint64.
		if want := storedHead + 8*n + (4*n*bs+7)&^7; want != size {
			return fmt.Errorf("stored record of %d blocks of %d tokens needs %d bytes, header says %d", n, bs, want, size)
		}
		rec.HasParent = flags&flagParent != 0
		rec.Parent = le.Uint64(b[rParent:])
		rec.BlockSize = int(bs)
		base := unsafe.Pointer(unsafe.SliceData(b))
		rec.Hashes = unsafe.Slice((*uint64)(unsafe.Add(base, storedHead)), n)
		rec.Tokens = unsafe.Slice((*uint32)(unsafe.Add(base, storedHead+8*n)), n*bs)
	case KindRemoved:
		if n == 0 || flags != 0 || bs != 0 {
			return errors.New("removed record with no hashes, flags or block size")
		}
		if want := recordHead + 8*n; want != size {
			return fmt.Errorf("removed record of %d hashes needs %d bytes, header says %d", n, want, size)
		}
		rec.Hashes = unsafe.Slice((*uint64)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(b)), recordHead)), n)
	case KindCleared:
		if n != 0 || flags != 0 || bs != 0 || size != recordHead {
			return errors.New("cleared record with a body")
		}
	default:
		return fmt.Errorf("unknown record kind %d", uint8(kind))
	}
	return nil
}

var errShort = errors.New("fewer committed bytes than a record header")

// ringWriter is the producer half of one worker's ring. Only the
// publisher that holds the slot uses it, from one goroutine at a time.
type ringWriter struct {
	head, tail, dropped, published *uint64
	data                           unsafe.Pointer
	size                           uint64
	maxRecord                      int
	pos                            uint64 // == *head, kept locally
	tailCache                      uint64
	publishedN, droppedN           uint64
	seq                            uint64 // last seq handed out
	gen                            uint32
	slotGen                        *uint32 // the registry slot's generation: another registration's once it moves
	doorbell, sleepers             *uint32
}

func (s *Segment) ringBase(slot int) int { return s.lay.ringOff(slot) }

func (s *Segment) newRingWriter(slot int, gen uint32) ringWriter {
	off := s.ringBase(slot)
	w := ringWriter{
		head:      s.u64(off + ctlHead),
		tail:      s.u64(off + ctlTail),
		dropped:   s.u64(off + ctlDropped),
		published: s.u64(off + ctlPublished),
		data:      unsafe.Add(s.base, off+ringControlSize),
		size:      uint64(s.lay.ringBytes),
		maxRecord: s.lay.ringBytes / 4,
		gen:       gen,
		slotGen:   s.u32(slotOff(slot) + sGeneration),
		doorbell:  s.u32(controlOff + controlDoorbell),
		sleepers:  s.u32(controlOff + controlSleepers),
	}
	// A previous occupant (possibly killed, possibly buggy) left head
	// wherever it was. Continue from it if it is sane relative to the
	// consumer's tail, otherwise start over at the tail: everything before
	// it belongs to an older generation the consumer discards anyway.
	h, t := atomic.LoadUint64(w.head), atomic.LoadUint64(w.tail)
	if h < t || h-t > w.size || h%8 != 0 {
		h = t &^ 7
		atomic.StoreUint64(w.head, h)
	}
	w.pos, w.tailCache = h, t
	w.publishedN = atomic.LoadUint64(w.published)
	w.droppedN = atomic.LoadUint64(w.dropped)
	return w
}

// reserve returns the ring offset at which n bytes (n%8 == 0, n <=
// maxRecord) may be written, writing a pad record first if the record
// would otherwise straddle the end. ok is false when the ring is full.
// The pad is committed together with the record.
func (w *ringWriter) reserve(n uint64) (off uint64, pad uint64, ok bool) {
	off = w.pos & (w.size - 1)
	if off+n > w.size {
		pad = w.size - off
	}
	need := pad + n
	if w.size-(w.pos-w.tailCache) < need {
		t := atomic.LoadUint64(w.tail)
		if t > w.pos || w.pos-t > w.size {
			// The consumer's cursor is nonsense (corrupt, or a consumer of a
			// newer layout). Refuse rather than overwrite unread bytes.
			return 0, 0, false
		}
		w.tailCache = t
		if w.size-(w.pos-t) < need {
			return 0, 0, false
		}
	}
	if pad > 0 {
		p := unsafe.Slice((*byte)(unsafe.Add(w.data, off)), padHead)
		binary.LittleEndian.PutUint32(p[rSize:], uint32(pad))
		p[rKind] = byte(kindPad)
		off = 0
	}
	return off, pad, true
}

// drop accounts for a record that did not fit. Its sequence number is
// used up, so the consumer sees the gap in the next committed record.
// lost reports whether another registration took the slot (its
// generation moved on): its publisher writes the ring now, and two
// writers would interleave records, which the router must then discard
// with every block the worker had.
func (w *ringWriter) lost() bool { return atomic.LoadUint32(w.slotGen) != w.gen }

func (w *ringWriter) drop() error {
	w.seq++
	w.droppedN++
	atomic.StoreUint64(w.dropped, w.droppedN)
	return ErrRingFull
}

// commit publishes everything up to pos+pad+n: the release store of head
// is the commit point, so a publisher killed before it leaves nothing
// visible, and one killed after it leaves a complete record.
func (w *ringWriter) commit(pad, n uint64) {
	w.pos += pad + n
	atomic.StoreUint64(w.head, w.pos)
	w.publishedN++
	// An advisory counter: a plain store spares the producer a second
	// locked instruction per record (x86 stores never tear when aligned).
	*w.published = w.publishedN
	if atomic.LoadUint32(w.sleepers) != 0 {
		atomic.AddUint32(w.doorbell, 1)
		futexWake(w.doorbell)
	}
}

func (w *ringWriter) header(p []byte, size uint64, kind Kind, flags byte, bs int, count int) {
	le := binary.LittleEndian
	w.seq++
	le.PutUint32(p[rSize:], uint32(size))
	p[rKind] = byte(kind)
	p[rFlags] = flags
	le.PutUint16(p[rBlockSize:], uint16(bs))
	le.PutUint64(p[rSeq:], w.seq)
	le.PutUint32(p[rGen:], w.gen)
	le.PutUint32(p[rCount:], uint32(count))
}

// writeStored writes one Stored record; the caller sized it to fit
// maxRecord.
func (w *ringWriter) writeStored(parent uint64, hasParent bool, hashes []uint64, tokens []uint32, bs int) error {
	if w.lost() {
		return ErrSlotLost
	}
	n := uint64(storedSize(len(hashes), bs))
	off, pad, ok := w.reserve(n)
	if !ok {
		return w.drop()
	}
	p := unsafe.Slice((*byte)(unsafe.Add(w.data, off)), n)
	var flags byte
	if hasParent {
		flags = flagParent
	}
	w.header(p, n, KindStored, flags, bs, len(hashes))
	binary.LittleEndian.PutUint64(p[rParent:], parent)
	copy(unsafe.Slice((*uint64)(unsafe.Pointer(&p[storedHead])), len(hashes)), hashes)
	tokOff := storedHead + 8*len(hashes)
	copy(unsafe.Slice((*uint32)(unsafe.Pointer(&p[tokOff])), len(tokens)), tokens)
	if tail := tokOff + 4*len(tokens); tail < int(n) {
		clear(p[tail:]) // deterministic padding
	}
	w.commit(pad, n)
	return nil
}

func (w *ringWriter) writeRemoved(hashes []uint64) error {
	if w.lost() {
		return ErrSlotLost
	}
	n := uint64(recordHead + 8*len(hashes))
	off, pad, ok := w.reserve(n)
	if !ok {
		return w.drop()
	}
	p := unsafe.Slice((*byte)(unsafe.Add(w.data, off)), n)
	w.header(p, n, KindRemoved, 0, 0, len(hashes))
	copy(unsafe.Slice((*uint64)(unsafe.Pointer(&p[recordHead])), len(hashes)), hashes)
	w.commit(pad, n)
	return nil
}

func (w *ringWriter) writeCleared() error {
	if w.lost() {
		return ErrSlotLost
	}
	off, pad, ok := w.reserve(recordHead)
	if !ok {
		return w.drop()
	}
	p := unsafe.Slice((*byte)(unsafe.Add(w.data, off)), recordHead)
	w.header(p, recordHead, KindCleared, 0, 0, 0)
	w.commit(pad, recordHead)
	return nil
}

// RingReader is the consumer half of one worker's ring. Only the ingester
// (the holder of the ingester lock) may use it, from one goroutine.
type RingReader struct {
	head, tail, lastSeq *uint64
	gen                 *uint32
	data                unsafe.Pointer
	size                uint64
	pos                 uint64 // == *tail, kept locally
	avail               uint64 // head as last read and validated
}

// Reader returns the consumer half of slot's ring, positioned at the
// persisted cursor.
func (s *Segment) Reader(slot workers.Slot) *RingReader {
	r := &RingReader{}
	s.initReader(r, slot)
	return r
}

func (s *Segment) initReader(r *RingReader, slot workers.Slot) {
	off := s.ringBase(int(slot) & (workers.Max - 1))
	*r = RingReader{
		head:    s.u64(off + ctlHead),
		tail:    s.u64(off + ctlTail),
		lastSeq: s.u64(off + ctlLastSeq),
		gen:     s.u32(off + ctlGen),
		data:    unsafe.Add(s.base, off+ringControlSize),
		size:    uint64(s.lay.ringBytes),
	}
	r.pos = atomic.LoadUint64(r.tail) &^ 7
	r.avail = r.pos
}

// Pending reports whether the producer has committed bytes not yet read.
func (r *RingReader) Pending() bool { return atomic.LoadUint64(r.head) != r.pos }

// Head is the producer's head word as it is now: a consumer that found
// garbage waits for it to move before it reads the ring again.
func (r *RingReader) Head() uint64 { return atomic.LoadUint64(r.head) }

// Cursor returns the persisted generation and last applied sequence
// number: the consumer's position in the publisher's numbering.
func (r *RingReader) Cursor() (gen uint32, lastSeq uint64) {
	return atomic.LoadUint32(r.gen), atomic.LoadUint64(r.lastSeq)
}

// BeginGeneration persists that the consumer now applies gen's records,
// starting from sequence number 1. The sequence is reset before the
// generation is stored, so a crash in between leaves a cursor that still
// names the old generation and is redone.
func (r *RingReader) BeginGeneration(gen uint32) {
	atomic.StoreUint64(r.lastSeq, 0)
	atomic.StoreUint32(r.gen, gen)
}

// Next decodes the next committed record into rec without consuming it;
// Commit or Skip consumes it. It returns false when nothing is committed.
// A *RecordError means the bytes at the cursor are garbage: the caller
// should count it and call Resync, since there is no trustworthy way to
// find the next record boundary.
func (r *RingReader) Next(rec *Record) (bool, error) {
	for {
		if r.pos == r.avail {
			h := atomic.LoadUint64(r.head)
			if h == r.pos {
				return false, nil
			}
			if h < r.pos || h-r.pos > r.size || h%8 != 0 {
				return false, &RecordError{Offset: r.pos, Reason: fmt.Sprintf("producer head %d is inconsistent with tail %d", h, r.pos)}
			}
			r.avail = h
		}
		off := r.pos & (r.size - 1)
		window := r.avail - r.pos
		if toEnd := r.size - off; window > toEnd {
			window = toEnd
		}
		b := unsafe.Slice((*byte)(unsafe.Add(r.data, off)), window)
		if len(b) >= padHead && Kind(b[rKind]) == kindPad {
			// A pad must fill exactly the rest of the ring.
			if sz := uint64(binary.LittleEndian.Uint32(b[rSize:])); sz != r.size-off || sz > window {
				return false, &RecordError{Offset: r.pos, Reason: fmt.Sprintf("pad of %d bytes at offset %d", sz, off)}
			}
			r.pos += window
			atomic.StoreUint64(r.tail, r.pos)
			continue
		}
		if err := DecodeRecord(b, rec); err != nil {
			return false, &RecordError{Offset: r.pos, Reason: err.Error()}
		}
		return true, nil
	}
}

// Commit consumes rec and persists that it was applied: lastSeq first,
// then the tail. A crash between the two leaves the record at the tail
// with seq <= lastSeq, which the ingester skips as already applied.
func (r *RingReader) Commit(rec *Record) {
	atomic.StoreUint64(r.lastSeq, rec.Seq)
	r.pos += rec.size
	atomic.StoreUint64(r.tail, r.pos)
}

// Skip consumes rec without marking it applied (stale generation,
// duplicate, or a worker that is down).
func (r *RingReader) Skip(rec *Record) {
	r.pos += rec.size
	atomic.StoreUint64(r.tail, r.pos)
}

// Resync discards everything committed so far and returns how many bytes
// it skipped. It is the recovery from garbage: the producer's head is the
// only boundary left that the consumer can trust.
func (r *RingReader) Resync() uint64 {
	h := atomic.LoadUint64(r.head) &^ 7
	skipped := h - r.pos
	if h < r.pos || h-r.pos > r.size {
		skipped = 0
	}
	r.pos, r.avail = h, h
	atomic.StoreUint64(r.tail, h)
	return skipped
}

// RingState is a racy snapshot of one ring's control words, for
// inspection and lag metrics.
type RingState struct {
	Head, Tail         uint64 // bytes committed / consumed
	Published, Dropped uint64 // producer's record counters
	Gen                uint32 // generation the consumer applies
	LastSeq            uint64 // last applied sequence number of Gen
}

// Lag is the committed bytes not yet consumed (0 if the words disagree).
func (r RingState) Lag() uint64 {
	if r.Head < r.Tail {
		return 0
	}
	return r.Head - r.Tail
}

// RingState reads slot's ring control words.
func (s *Segment) RingState(slot workers.Slot) RingState {
	off := s.ringBase(int(slot) & (workers.Max - 1))
	return RingState{
		Head:      atomic.LoadUint64(s.u64(off + ctlHead)),
		Tail:      atomic.LoadUint64(s.u64(off + ctlTail)),
		Published: atomic.LoadUint64(s.u64(off + ctlPublished)),
		Dropped:   atomic.LoadUint64(s.u64(off + ctlDropped)),
		Gen:       atomic.LoadUint32(s.u32(off + ctlGen)),
		LastSeq:   atomic.LoadUint64(s.u64(off + ctlLastSeq)),
	}
}
