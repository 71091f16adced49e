package radix

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// The index region, byte by byte. Every integer is little-endian; every
// part starts on a 64-byte boundary so that no atomic word straddles a
// cache line and hot words of different shards never share one.
//
//	offset                size                    contents
//	0                     64                      header (below)
//	64                    shards × 384            shard meta, one per shard
//	tableOff              shards × slots × 16     block table: {key u64, workers u64}
//	mapOff                shards × mapSlots × 16  engine map:  {key u64, kvHash u64}
//	spillOff              shards × spillStride    spill counts: u8 per 4 block-table homes
//
//	header:
//	 0  [8]byte magic "KVFXIDX1"
//	 8  u32 layout version (indexVersion)
//	12  u32 header size (64)
//	16  u32 shards (power of two)
//	20  u32 block-table slots per shard
//	24  u32 block-table live limit per shard
//	28  u32 engine-map slots per shard
//	32  u32 engine-map live limit per shard
//	36  u32 reserved, zero
//	40  u64 configured capacity (distinct blocks)
//	48  u64 configured engine-map capacity
//	56  u64 XXH64 of bytes 0..55
//
//	Block-table slots hold keys by the grouped layout of hash.go and
//	table.go: a key's near home is in the shard its group bits pick, at the
//	group's base plus its counter; a spilled key lives in the shard its
//	mix picks. The group locator has 27 bits less the shard bits, so past
//	2^27 slots in all (a 2 GB table) not every slot can be a group's base:
//	lookups stay correct and only clustering grows. spillStride is the
//	shard's spill-count bytes (one per 4 slots) rounded up to 64.
//
//	shard meta (384 bytes, 6 cache lines):
//	  line 0: u64 blockMoveSeq, u64 mapMoveSeq   (read by lock-free readers)
//	  line 1: u64 blockLive, u64 blockOverflow, u64 mapLive, u64 mapOverflow,
//	          u64 unresolvedRemovals
//	  lines 2-5: u32 blocks held per worker slot, 64 of them
const (
	indexMagic      = "KVFXIDX1"
	indexVersion    = 2 // 2: grouped homes, spill counts (hash scheme kvfast/v2)
	headerSize      = 64
	shardMetaSize   = 384
	slotSize        = 16
	maxShards       = 1 << 16
	maxSlotsPer     = math.MaxUint32 / 2
	defaultMaxShard = 64

	// A shard's table is never filled past 3/4: linear probing's miss cost
	// grows with 1/(1-load)², and 3/4 keeps a miss within ~2 cache lines.
	loadNum, loadDen = 3, 4
)

// ErrCorrupt is the sentinel for every refusal to attach a region. The
// concrete error is a *CorruptError naming the field that failed.
var ErrCorrupt = errors.New("kvfast: corrupt or incompatible index region")

// CorruptError says why a region cannot be trusted. It wraps ErrCorrupt.
type CorruptError struct {
	Field  string // which check failed
	Detail string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("kvfast: cannot attach index region: %s: %s", e.Field, e.Detail)
}

func (e *CorruptError) Unwrap() error { return ErrCorrupt }

func corrupt(field, format string, args ...any) error {
	return &CorruptError{Field: field, Detail: fmt.Sprintf(format, args...)}
}

// Config sizes an index. Memory is fixed at Format time.
type Config struct {
	// Capacity is the number of distinct blocks the index holds. Stores
	// beyond it are refused and counted as overflow; routing goes on.
	Capacity int
	// Shards splits the table so that writers to different shards never
	// contend. A power of two; 0 picks one from Capacity (at most 64).
	Shards int
	// EngineMapCapacity bounds the engine-hash to kvfast-hash map. Each
	// (worker, block) pair that arrived with an engine hash takes one
	// entry, so a block cached by 4 workers takes 4. 0 means 2×Capacity.
	EngineMapCapacity int
}

// geometry is the derived, validated shape of a region.
type geometry struct {
	shards        uint32
	blockSlots    uint32 // per shard
	blockLimit    uint32 // per shard
	mapSlots      uint32 // per shard
	mapLimit      uint32 // per shard
	capacity      uint64
	mapCapacity   uint64
	tableOff      int
	mapOff        int
	spillOff      int
	spillStride   int // bytes of spill counts per shard
	size          int
	shardBits     uint
	shardMask     uint64
	shardMetaBase int
}

func (c Config) geometry() (geometry, error) {
	if c.Capacity <= 0 {
		return geometry{}, fmt.Errorf("cannot size index for capacity %d: must be positive", c.Capacity)
	}
	mapCap := c.EngineMapCapacity
	if mapCap == 0 {
		mapCap = 2 * c.Capacity
	}
	if mapCap < 0 {
		return geometry{}, fmt.Errorf("cannot size engine map for capacity %d: must be positive", mapCap)
	}
	shards := c.Shards
	if shards == 0 {
		shards = 1
		for shards < defaultMaxShard && c.Capacity/(shards*2) >= 4096 {
			shards *= 2
		}
	}
	if shards < 1 || shards > maxShards || shards&(shards-1) != 0 {
		return geometry{}, fmt.Errorf("cannot use %d shards: must be a power of two from 1 to %d", shards, maxShards)
	}
	g := geometry{shards: uint32(shards), capacity: uint64(c.Capacity), mapCapacity: uint64(mapCap)}
	var err error
	if g.blockSlots, g.blockLimit, err = shardSize(c.Capacity, shards); err != nil {
		return geometry{}, err
	}
	if g.mapSlots, g.mapLimit, err = shardSize(mapCap, shards); err != nil {
		return geometry{}, err
	}
	return g.finish(), nil
}

// shardSize gives each shard room for its fair share plus a margin of four
// standard deviations: hashes split across shards binomially, and without
// the margin the luckiest shard would overflow long before the index is full.
func shardSize(capacity, shards int) (slots, limit uint32, err error) {
	per := float64(capacity) / float64(shards)
	lim := math.Ceil(per + 4*math.Sqrt(per) + 4)
	sl := math.Ceil(lim * loadDen / loadNum)
	if sl > maxSlotsPer {
		return 0, 0, fmt.Errorf("cannot size index for capacity %d over %d shards: shard too large", capacity, shards)
	}
	return uint32(sl), uint32(lim), nil
}

func (g geometry) finish() geometry {
	g.shardMetaBase = headerSize
	g.tableOff = headerSize + int(g.shards)*shardMetaSize
	g.mapOff = g.tableOff + align64(int(g.shards)*int(g.blockSlots)*slotSize)
	g.spillOff = g.mapOff + align64(int(g.shards)*int(g.mapSlots)*slotSize)
	g.spillStride = align64((int(g.blockSlots) + spillSpan - 1) / spillSpan)
	g.size = g.spillOff + int(g.shards)*g.spillStride
	for 1<<g.shardBits < g.shards {
		g.shardBits++
	}
	g.shardMask = uint64(g.shards - 1)
	return g
}

func align64(n int) int { return (n + 63) &^ 63 }

// RegionSize is the number of bytes Format needs for cfg.
func RegionSize(cfg Config) (int, error) {
	g, err := cfg.geometry()
	if err != nil {
		return 0, err
	}
	return g.size, nil
}

func (g geometry) encodeHeader(b []byte) {
	copy(b[0:8], indexMagic)
	le := binary.LittleEndian
	le.PutUint32(b[8:], indexVersion)
	le.PutUint32(b[12:], headerSize)
	le.PutUint32(b[16:], g.shards)
	le.PutUint32(b[20:], g.blockSlots)
	le.PutUint32(b[24:], g.blockLimit)
	le.PutUint32(b[28:], g.mapSlots)
	le.PutUint32(b[32:], g.mapLimit)
	le.PutUint32(b[36:], 0)
	le.PutUint64(b[40:], g.capacity)
	le.PutUint64(b[48:], g.mapCapacity)
	le.PutUint64(b[56:], xxhash.Sum64(b[:56]))
}

// decodeHeader trusts nothing: every size is checked against the others
// and against the region before any offset is derived from it.
func decodeHeader(region []byte) (geometry, error) {
	if len(region) < headerSize {
		return geometry{}, corrupt("size", "region is %d bytes, shorter than the %d-byte header", len(region), headerSize)
	}
	b := region[:headerSize]
	if string(b[0:8]) != indexMagic {
		return geometry{}, corrupt("magic", "got %q, want %q", b[0:8], indexMagic)
	}
	le := binary.LittleEndian
	if v := le.Uint32(b[8:]); v != indexVersion {
		return geometry{}, corrupt("version", "layout version %d, this build reads version %d", v, indexVersion)
	}
	if sum, want := xxhash.Sum64(b[:56]), le.Uint64(b[56:]); sum != want {
		return geometry{}, corrupt("checksum", "header checksum %#x, computed %#x", want, sum)
	}
	if hs := le.Uint32(b[12:]); hs != headerSize {
		return geometry{}, corrupt("header size", "%d, want %d", hs, headerSize)
	}
	g := geometry{
		shards:      le.Uint32(b[16:]),
		blockSlots:  le.Uint32(b[20:]),
		blockLimit:  le.Uint32(b[24:]),
		mapSlots:    le.Uint32(b[28:]),
		mapLimit:    le.Uint32(b[32:]),
		capacity:    le.Uint64(b[40:]),
		mapCapacity: le.Uint64(b[48:]),
	}
	switch {
	case g.shards == 0 || g.shards > maxShards || g.shards&(g.shards-1) != 0:
		return geometry{}, corrupt("shards", "%d is not a power of two in [1, %d]", g.shards, maxShards)
	case g.blockSlots < groupSize || g.blockSlots > maxSlotsPer || g.blockLimit == 0 || g.blockLimit >= g.blockSlots:
		return geometry{}, corrupt("block table", "%d slots with limit %d per shard", g.blockSlots, g.blockLimit)
	case g.mapSlots == 0 || g.mapSlots > maxSlotsPer || g.mapLimit == 0 || g.mapLimit >= g.mapSlots:
		return geometry{}, corrupt("engine map", "%d slots with limit %d per shard", g.mapSlots, g.mapLimit)
	}
	g = g.finish()
	if g.size > len(region) {
		return geometry{}, corrupt("size", "layout needs %d bytes, region has %d", g.size, len(region))
	}
	return g, nil
}

// checkRegion enforces the alignment that atomic access needs.
func checkRegion(region []byte, need int) error {
	if len(region) < need {
		return fmt.Errorf("cannot use a %d-byte region: the index needs %d", len(region), need)
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(region)))%64 != 0 {
		return errors.New("cannot use region: it must start on a 64-byte boundary")
	}
	return nil
}

// alignedHeap returns a zeroed, 64-byte-aligned byte slice of n bytes on
// the Go heap, for indexes that need no sharing or persistence.
func alignedHeap(n int) []byte {
	words := make([]uint64, (n+63)/8+8)
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(words))), len(words)*8)
	off := (64 - int(uintptr(unsafe.Pointer(&b[0]))%64)) % 64
	return b[off : off+n : off+n]
}
