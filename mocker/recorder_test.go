package mocker

import (
	"slices"
	"sync"

	"github.com/kvfast/kvfast/workers"
)

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
	At        Placement    // Stored, Removed
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
func (r *Recorder) Stored(at Placement, parentHash uint64, hasParent bool, blocks []BlockEvent) error {
	cp := make([]BlockEvent, len(blocks))
	for i, b := range blocks {
		cp[i] = BlockEvent{Hash: b.Hash, Tokens: slices.Clone(b.Tokens), LoRA: b.LoRA, Salt: b.Salt}
	}
	return r.add(Event{Kind: EventStored, At: at, Parent: parentHash, HasParent: hasParent, Blocks: cp})
}

// Removed implements Publisher.
func (r *Recorder) Removed(at Placement, hashes []uint64) error {
	return r.add(Event{Kind: EventRemoved, At: at, Hashes: slices.Clone(hashes)})
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
// engine hashes a consumer would believe the engine caches on the GPU (in
// group 0).
func (r *Recorder) Cached() map[uint64]struct{} { return r.CachedIn(workers.TierGPU, 0) }

// CachedIn is Cached for the blocks held on tier in KV-cache group group.
func (r *Recorder) CachedIn(tier workers.Tier, group int) map[uint64]struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	set := make(map[uint64]struct{})
	for _, e := range r.events {
		if (e.Kind == EventStored || e.Kind == EventRemoved) && (e.At.Tier != tier || e.At.Group != group) {
			continue
		}
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
