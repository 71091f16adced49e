package mocker

import (
	"slices"
	"sync"
)

// BlockEvent is one block in a Stored event: the engine's own hash for the
// block and the token ids it holds.
type BlockEvent struct {
	Hash   uint64
	Tokens []uint32 // exactly BlockSize ids; valid only during the call
}

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
	// Stored reports blocks newly registered in the prefix cache. They form
	// a chain: blocks[0]'s parent is parentHash (if hasParent), and each
	// later block's parent is the block before it.
	Stored(parentHash uint64, hasParent bool, blocks []BlockEvent) error
	// Removed reports blocks evicted from the prefix cache.
	Removed(hashes []uint64) error
	// Cleared reports that the cache holds no block at all any more.
	Cleared() error
	// Load reports requests running and waiting, and KV blocks referenced
	// by running requests out of the total.
	Load(running, waiting, kvUsed, kvTotal uint64) error
	// Heartbeat says the engine is alive; it is sent periodically even when
	// idle.
	Heartbeat() error
}

// EventKind names the kind of a recorded event.
type EventKind uint8

// The kinds of event a Recorder keeps.
const (
	EventStored EventKind = iota + 1
	EventRemoved
	EventCleared
	EventLoad
	EventHeartbeat
)

func (k EventKind) String() string {
	switch k {
	case EventStored:
		return "stored"
	case EventRemoved:
		return "removed"
	case EventCleared:
		return "cleared"
	case EventLoad:
		return "load"
	case EventHeartbeat:
		return "heartbeat"
	}
	return "unknown"
}

// Event is one call a Recorder received, with its slices copied.
type Event struct {
	Kind      EventKind
	Parent    uint64       // Stored
	HasParent bool         // Stored
	Blocks    []BlockEvent // Stored
	Hashes    []uint64     // Removed

	Running, Waiting, KVUsed, KVTotal uint64 // Load
}

// Recorder is a Publisher that keeps every event in memory, for tests and
// for checking that a consumer would see exactly what the cache holds. It is
// safe for concurrent use.
type Recorder struct {
	mu     sync.Mutex
	events []Event
	// Fail, when set, makes every call return it (after recording), to test
	// how the engine copes with a failing transport.
	Fail error
}

var _ Publisher = (*Recorder)(nil)

func (r *Recorder) add(e Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
	return r.Fail
}

// Stored implements Publisher.
func (r *Recorder) Stored(parentHash uint64, hasParent bool, blocks []BlockEvent) error {
	cp := make([]BlockEvent, len(blocks))
	for i, b := range blocks {
		cp[i] = BlockEvent{Hash: b.Hash, Tokens: slices.Clone(b.Tokens)}
	}
	return r.add(Event{Kind: EventStored, Parent: parentHash, HasParent: hasParent, Blocks: cp})
}

// Removed implements Publisher.
func (r *Recorder) Removed(hashes []uint64) error {
	return r.add(Event{Kind: EventRemoved, Hashes: slices.Clone(hashes)})
}

// Cleared implements Publisher.
func (r *Recorder) Cleared() error { return r.add(Event{Kind: EventCleared}) }

// Load implements Publisher.
func (r *Recorder) Load(running, waiting, kvUsed, kvTotal uint64) error {
	return r.add(Event{Kind: EventLoad, Running: running, Waiting: waiting, KVUsed: kvUsed, KVTotal: kvTotal})
}

// Heartbeat implements Publisher.
func (r *Recorder) Heartbeat() error { return r.add(Event{Kind: EventHeartbeat}) }

// Events returns a copy of the events so far, oldest first.
func (r *Recorder) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// Reset forgets every recorded event.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = nil
}

// Cached replays the store, remove and clear events and returns the set of
// engine hashes a consumer would believe the engine caches.
func (r *Recorder) Cached() map[uint64]struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	set := make(map[uint64]struct{})
	for _, e := range r.events {
		switch e.Kind {
		case EventStored:
			for _, b := range e.Blocks {
				set[b.Hash] = struct{}{}
			}
		case EventRemoved:
			for _, h := range e.Hashes {
				delete(set, h)
			}
		case EventCleared:
			clear(set)
		}
	}
	return set
}

// LastLoad returns the most recent Load event, if any.
func (r *Recorder) LastLoad() (Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.events) - 1; i >= 0; i-- {
		if r.events[i].Kind == EventLoad {
			return r.events[i], true
		}
	}
	return Event{}, false
}

// eventSink sits between the cache and the Publisher. It batches
// consecutive removals and consecutive chained stores into one call each,
// while keeping the order in which the cache changed: a remove followed by
// a store of the same hash must reach the consumer in that order.
type eventSink struct {
	pub Publisher // nil: events are counted but go nowhere

	removed      []uint64
	stored       []BlockEvent
	storedParent uint64
	storedHasPar bool

	errors uint64
}

func (s *eventSink) remove(h uint64) {
	if len(s.stored) > 0 {
		s.flushStored()
	}
	s.removed = append(s.removed, h)
}

func (s *eventSink) store(parent uint64, hasParent bool, h uint64, tokens []uint32) {
	if len(s.removed) > 0 {
		s.flushRemoved()
	}
	if n := len(s.stored); n > 0 && (!hasParent || s.stored[n-1].Hash != parent) {
		s.flushStored()
	}
	if len(s.stored) == 0 {
		s.storedParent, s.storedHasPar = parent, hasParent
	}
	s.stored = append(s.stored, BlockEvent{Hash: h, Tokens: tokens})
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
	if s.pub != nil && s.pub.Removed(s.removed) != nil {
		s.errors++
	}
	s.removed = s.removed[:0]
}

func (s *eventSink) flushStored() {
	if s.pub != nil && s.pub.Stored(s.storedParent, s.storedHasPar, s.stored) != nil {
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
