package shm

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"

	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
)

// The byte layout of a segment. docs/shm-layout.md is the cross-language
// contract for everything here; change both together and bump
// LayoutVersion whenever any offset, size or meaning changes, because
// publishers in other languages hard-code these numbers.
const (
	// LayoutVersion is the only version this build reads or writes.
	LayoutVersion = 2

	magic = "KVFASTSG"

	headerSize   = 4096
	headerSumOff = 248 // FNV-1a 64 of bytes [0, headerSumOff)

	controlOff  = headerSize
	controlSize = 4096

	slotSize     = 512
	registryOff  = controlOff + controlSize
	registrySize = workers.Max * slotSize

	loadPageSize = 128
	loadOff      = registryOff + registrySize
	loadSize     = workers.Max * loadPageSize

	ringsOff        = loadOff + loadSize
	ringControlSize = 256

	// MinRingBytes and MaxRingBytes bound one worker's ring data area.
	MinRingBytes = 4 << 10
	MaxRingBytes = 1 << 30
	// DefaultRingBytes holds about 60 full 512-block BlockStored batches at
	// block size 16; tmpfs backs only the pages actually written.
	DefaultRingBytes = 1 << 20

	pageSize = 4096
)

// Header field offsets (little-endian).
const (
	hMagic          = 0
	hVersion        = 8
	hHeaderSize     = 12
	hFileSize       = 16
	hSegmentID      = 24
	hCreated        = 32
	hMaxWorkers     = 40
	hSlotSize       = 44
	hControlOff     = 48
	hControlSize    = 56
	hRegistryOff    = 64
	hRegistrySize   = 72
	hLoadOff        = 80
	hLoadSize       = 88
	hRingsOff       = 96
	hRingStride     = 104
	hRingBytes      = 112
	hIndexOff       = 120
	hIndexSize      = 128
	hIndexCapacity  = 136
	hIndexShards    = 144
	hIndexMapCap    = 152
	hLoadPageSize   = 160
	hRingControlSz  = 164
	hBindingsOff    = 168 // since version 2
	hBindingsSize   = 176 // since version 2
	controlDoorbell = 0   // u32 futex word, bumped when a sleeping consumer must wake
	controlSleepers = 64  // u32, nonzero while the consumer may be blocked on the doorbell
	controlRetired  = 128 // u64, nonzero once a router recreated the segment under a new file
	controlIngPID   = 192 // u64 pid of the ingester holding the lock
	controlIngEpoch = 200 // u64 times the ingester lock changed hands
	controlIngSince = 208 // u64 monotonic ns when the current ingester took over
)

// layout is the geometry of one segment, derived from the two free
// parameters (ring size and index size) so that a header can be checked by
// recomputing it rather than by trusting any offset it stores.
type layout struct {
	ringBytes  int
	ringStride int
	indexOff   int
	indexSize  int
	fileSize   int
	indexCfg   radix.Config
	// The sticky-session bindings region follows the index.
	bindingsOff  int
	bindingsSize int
}

func newLayout(ringBytes, indexSize, bindingsSize int, cfg radix.Config) (layout, error) {
	if ringBytes < MinRingBytes || ringBytes > MaxRingBytes || ringBytes&(ringBytes-1) != 0 {
		return layout{}, fmt.Errorf("cannot use ring size %d: must be a power of two from %d to %d", ringBytes, MinRingBytes, MaxRingBytes)
	}
	if indexSize <= 0 || indexSize > 1<<40 {
		return layout{}, fmt.Errorf("cannot use index region size %d: out of range", indexSize)
	}
	if n := bindingsSize / bindingBucketSize; n == 0 || bindingsSize%bindingBucketSize != 0 || n&(n-1) != 0 || bindingsSize > MaxBindings/bindingWays*bindingBucketSize {
		return layout{}, fmt.Errorf("cannot use bindings region size %d: must be a power of two of %d-byte buckets, at most %d", bindingsSize, bindingBucketSize, MaxBindings/bindingWays*bindingBucketSize)
	}
	l := layout{ringBytes: ringBytes, ringStride: ringControlSize + ringBytes, indexSize: indexSize, indexCfg: cfg, bindingsSize: bindingsSize}
	l.indexOff = alignUp(ringsOff+workers.Max*l.ringStride, pageSize)
	l.bindingsOff = alignUp(l.indexOff+indexSize, pageSize)
	l.fileSize = alignUp(l.bindingsOff+bindingsSize, pageSize)
	return l, nil
}

func alignUp(n, a int) int { return (n + a - 1) &^ (a - 1) }

func (l layout) ringOff(slot int) int { return ringsOff + slot*l.ringStride }

func (l layout) encodeHeader(b []byte, segmentID uint64, created int64) {
	clear(b[:headerSize])
	le := binary.LittleEndian
	copy(b[hMagic:], magic)
	le.PutUint32(b[hVersion:], LayoutVersion)
	le.PutUint32(b[hHeaderSize:], headerSize)
	le.PutUint64(b[hFileSize:], uint64(l.fileSize))
	le.PutUint64(b[hSegmentID:], segmentID)
	le.PutUint64(b[hCreated:], uint64(created))
	le.PutUint32(b[hMaxWorkers:], workers.Max)
	le.PutUint32(b[hSlotSize:], slotSize)
	le.PutUint64(b[hControlOff:], controlOff)
	le.PutUint64(b[hControlSize:], controlSize)
	le.PutUint64(b[hRegistryOff:], registryOff)
	le.PutUint64(b[hRegistrySize:], registrySize)
	le.PutUint64(b[hLoadOff:], loadOff)
	le.PutUint64(b[hLoadSize:], loadSize)
	le.PutUint64(b[hRingsOff:], ringsOff)
	le.PutUint64(b[hRingStride:], uint64(l.ringStride))
	le.PutUint64(b[hRingBytes:], uint64(l.ringBytes))
	le.PutUint64(b[hIndexOff:], uint64(l.indexOff))
	le.PutUint64(b[hIndexSize:], uint64(l.indexSize))
	le.PutUint64(b[hIndexCapacity:], uint64(l.indexCfg.Capacity))
	le.PutUint64(b[hIndexShards:], uint64(l.indexCfg.Shards))
	le.PutUint64(b[hIndexMapCap:], uint64(l.indexCfg.EngineMapCapacity))
	le.PutUint32(b[hLoadPageSize:], loadPageSize)
	le.PutUint32(b[hRingControlSz:], ringControlSize)
	le.PutUint64(b[hBindingsOff:], uint64(l.bindingsOff))
	le.PutUint64(b[hBindingsSize:], uint64(l.bindingsSize))
	le.PutUint64(b[headerSumOff:], headerSum(b))
}

func headerSum(b []byte) uint64 {
	h := fnv.New64a()
	h.Write(b[:headerSumOff])
	return h.Sum64()
}

// Header is the decoded, validated segment header, for inspect and logs.
type Header struct {
	Version     uint32
	FileSize    int64
	SegmentID   uint64
	CreatedUnix int64 // unix nanoseconds
	MaxWorkers  int
	RingBytes   int
	RingStride  int
	RingsOffset int64 // ring i's control block starts at RingsOffset + i*RingStride
	IndexOffset int64
	IndexSize   int64
	IndexConfig radix.Config
	// BindingsOffset and BindingsSize place the sticky-session table;
	// Bindings is how many sessions it holds.
	BindingsOffset int64
	BindingsSize   int64
	Bindings       int
}

// checkMagic refuses head, a file's first bytes (up to len(magic)), unless
// it is the magic, a prefix of it (a segment truncated that short) or
// empty. It runs before any size check: a short file of
// someone's data is not a truncated segment, and calling it one would tell
// the operator that --recreate-segment may replace it. An empty file holds
// nothing to lose.
func checkMagic(path string, head []byte) error {
	if len(head) > 0 && string(head) != magic[:min(len(head), len(magic))] {
		return &NotSegmentError{Path: path}
	}
	return nil
}

// decodeHeader checks b (the whole mapped file, or at least its first
// page) against the layout its two free parameters imply. Every stored
// offset and size must equal the recomputed one and fit in fileLen, so a
// header that passes cannot point anywhere outside the file.
func decodeHeader(path string, b []byte, fileLen int64) (layout, Header, error) {
	if err := checkMagic(path, b[:min(len(b), len(magic))]); err != nil {
		return layout{}, Header{}, err
	}
	if fileLen < headerSize || len(b) < headerSize {
		return layout{}, Header{}, &CorruptError{Path: path, Reason: fmt.Sprintf("file is %d bytes, shorter than the %d-byte header (truncated?)", fileLen, headerSize)}
	}
	le := binary.LittleEndian
	if v := le.Uint32(b[hVersion:]); v != LayoutVersion {
		return layout{}, Header{}, &VersionError{Path: path, Have: v, Want: LayoutVersion}
	}
	if got, want := le.Uint64(b[headerSumOff:]), headerSum(b); got != want {
		return layout{}, Header{}, &CorruptError{Path: path, Reason: fmt.Sprintf("header checksum %#x, computed %#x", got, want)}
	}
	ringBytes := le.Uint64(b[hRingBytes:])
	indexSize := le.Uint64(b[hIndexSize:])
	bindingsSize := le.Uint64(b[hBindingsSize:])
	if ringBytes > MaxRingBytes || indexSize > 1<<40 || bindingsSize > 1<<40 {
		return layout{}, Header{}, &CorruptError{Path: path, Reason: fmt.Sprintf("ring size %d or index size %d out of range", ringBytes, indexSize)}
	}
	capacity, shards, mapCap := le.Uint64(b[hIndexCapacity:]), le.Uint64(b[hIndexShards:]), le.Uint64(b[hIndexMapCap:])
	if capacity > 1<<40 || shards > 1<<20 || mapCap > 1<<41 {
		return layout{}, Header{}, &CorruptError{Path: path, Reason: "index configuration out of range"}
	}
	cfg := radix.Config{Capacity: int(capacity), Shards: int(shards), EngineMapCapacity: int(mapCap)}
	l, err := newLayout(int(ringBytes), int(indexSize), int(bindingsSize), cfg)
	if err != nil {
		return layout{}, Header{}, &CorruptError{Path: path, Reason: err.Error()}
	}
	checks := []struct {
		name      string
		got, want uint64
	}{
		{"header size", uint64(le.Uint32(b[hHeaderSize:])), headerSize},
		{"file size", le.Uint64(b[hFileSize:]), uint64(l.fileSize)},
		{"max workers", uint64(le.Uint32(b[hMaxWorkers:])), workers.Max},
		{"slot size", uint64(le.Uint32(b[hSlotSize:])), slotSize},
		{"control offset", le.Uint64(b[hControlOff:]), controlOff},
		{"control size", le.Uint64(b[hControlSize:]), controlSize},
		{"registry offset", le.Uint64(b[hRegistryOff:]), registryOff},
		{"registry size", le.Uint64(b[hRegistrySize:]), registrySize},
		{"load offset", le.Uint64(b[hLoadOff:]), loadOff},
		{"load size", le.Uint64(b[hLoadSize:]), loadSize},
		{"rings offset", le.Uint64(b[hRingsOff:]), ringsOff},
		{"ring stride", le.Uint64(b[hRingStride:]), uint64(l.ringStride)},
		{"index offset", le.Uint64(b[hIndexOff:]), uint64(l.indexOff)},
		{"load page size", uint64(le.Uint32(b[hLoadPageSize:])), loadPageSize},
		{"ring control size", uint64(le.Uint32(b[hRingControlSz:])), ringControlSize},
		{"bindings offset", le.Uint64(b[hBindingsOff:]), uint64(l.bindingsOff)},
	}
	for _, c := range checks {
		if c.got != c.want {
			return layout{}, Header{}, &CorruptError{Path: path, Reason: fmt.Sprintf("%s is %d, the layout implies %d", c.name, c.got, c.want)}
		}
	}
	if fileLen < int64(l.fileSize) {
		return layout{}, Header{}, &CorruptError{Path: path, Reason: fmt.Sprintf("file is %d bytes, header says %d (truncated)", fileLen, l.fileSize)}
	}
	h := Header{
		Version:     LayoutVersion,
		FileSize:    int64(l.fileSize),
		SegmentID:   le.Uint64(b[hSegmentID:]),
		CreatedUnix: int64(le.Uint64(b[hCreated:])),
		MaxWorkers:  workers.Max,
		RingBytes:   l.ringBytes,
		RingStride:  l.ringStride,
		RingsOffset: ringsOff,
		IndexOffset: int64(l.indexOff),
		IndexSize:   int64(l.indexSize),
		IndexConfig: cfg,

		BindingsOffset: int64(l.bindingsOff),
		BindingsSize:   int64(l.bindingsSize),
		Bindings:       l.bindingsSize / bindingBucketSize * bindingWays,
	}
	return l, h, nil
}
