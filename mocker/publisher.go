package mocker

import (
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
)

// BlockEvent is one block in a Stored event: the engine's own hash for the
// block and the token ids it holds.
type BlockEvent struct {
	Hash   uint64
	Tokens []uint32 // exactly BlockSize ids; valid only during the call
	// LoRA and Salt are the adapter and cache salt of the request that
	// stored the block: its hash (and every block's chained from it)
	// covers them. The blocks of one Stored call share them.
	LoRA, Salt string
	// MM are the multimodal inputs of that request and Start the block's
	// first token in it: the block's hash covers the inputs it overlaps
	// (multimodal.go).
	MM    []radix.MMItem
	Start int
}

// Placement says which copy of a block an event is about. Every block is
// first stored on the GPU in group 0; an engine with a host pool
// (Config.HostBlocks) also holds copies in host memory, and a hybrid
// engine (Config.SlidingWindow) holds each block in two KV-cache groups.
type Placement struct {
	Tier workers.Tier // TierGPU, or TierHost for the host pool
	// Hybrid says the engine has KV-cache groups, so that events name
	// them; Group is then 0 (full attention) or 1 (sliding-window
	// attention over SlidingWindow tokens).
	Hybrid        bool
	Group         int
	SlidingWindow int
}

// OnGPU reports whether p is the engine's own KV cache in group 0, the
// only copy a transport that cannot name tiers or groups may publish.
func (p Placement) OnGPU() bool { return p.Tier == workers.TierGPU && p.Group == 0 }

// Publisher receives the engine's KV-cache events and load. It is the seam
// between the simulated engine and a transport (the shm rings, or a test's
// Recorder).
//
// The engine calls a Publisher from a single goroutine, in the order the
// cache changed, so an implementation needs no locking of its own to be a
// single-producer ring writer. Slices passed in are valid only during the
// call. A returned error is counted in Stats.PublishErrors and otherwise
// ignored: a transport that cannot keep up must drop and flag a gap rather
// than stall the engine.
type Publisher interface {
	// Stored reports blocks newly held at at. They form a chain:
	// blocks[0]'s parent is parentHash (if hasParent), and each later
	// block's parent is the block before it.
	Stored(at Placement, parentHash uint64, hasParent bool, blocks []BlockEvent) error
	// Removed reports blocks no longer held at at.
	Removed(at Placement, hashes []uint64) error
	// Cleared reports that the cache holds no block at all any more.
	Cleared() error
	// Load reports requests running and waiting, and KV blocks referenced
	// by running requests out of the total.
	Load(running, waiting, kvUsed, kvTotal uint64) error
	// Heartbeat says the engine is alive; it is sent periodically even when
	// idle.
	Heartbeat() error
}

// eventSink sits between the cache and the Publisher. It batches
// consecutive removals and consecutive chained stores into one call each,
// while keeping the order in which the cache changed: a remove followed by
// a store of the same hash must reach the consumer in that order.
type eventSink struct {
	pub Publisher // nil: events are counted but go nowhere

	removed      []uint64
	removedAt    Placement
	stored       []BlockEvent
	storedAt     Placement
	storedParent uint64
	storedHasPar bool

	errors uint64
}

func (s *eventSink) remove(at Placement, h uint64) {
	if len(s.stored) > 0 {
		s.flushStored()
	}
	if len(s.removed) > 0 && at != s.removedAt {
		s.flushRemoved()
	}
	s.removedAt = at
	s.removed = append(s.removed, h)
}

func (s *eventSink) store(at Placement, parent uint64, hasParent bool, b BlockEvent) {
	if len(s.removed) > 0 {
		s.flushRemoved()
	}
	// A block chained from the last one is in its namespace, as its hash
	// covers the parent's.
	if n := len(s.stored); n > 0 && (at != s.storedAt || !hasParent || s.stored[n-1].Hash != parent) {
		s.flushStored()
	}
	if len(s.stored) == 0 {
		s.storedAt, s.storedParent, s.storedHasPar = at, parent, hasParent
	}
	s.stored = append(s.stored, b)
}

func (s *eventSink) flush() {
	if len(s.removed) > 0 {
		s.flushRemoved()
	}
	if len(s.stored) > 0 {
		s.flushStored()
	}
}

func (s *eventSink) flushRemoved() {
	if s.pub != nil && s.pub.Removed(s.removedAt, s.removed) != nil {
		s.errors++
	}
	s.removed = s.removed[:0]
}

func (s *eventSink) flushStored() {
	if s.pub != nil && s.pub.Stored(s.storedAt, s.storedParent, s.storedHasPar, s.stored) != nil {
		s.errors++
	}
	clear(s.stored) // drop references to request token slices
	s.stored = s.stored[:0]
}

func (s *eventSink) cleared() {
	s.flush()
	if s.pub != nil && s.pub.Cleared() != nil {
		s.errors++
	}
}

func (s *eventSink) load(running, waiting, used, total uint64) {
	if s.pub != nil && s.pub.Load(running, waiting, used, total) != nil {
		s.errors++
	}
}

func (s *eventSink) heartbeat() {
	if s.pub != nil && s.pub.Heartbeat() != nil {
		s.errors++
	}
}
