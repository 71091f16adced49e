package guard

import (
	"time"

	"github.com/kvfast/kvfast/radix"
)

// Observer receives lifecycle events for metrics. Every field is optional.
// Only requests that reached an engine are reported: a request that failed
// selection or dispatch produces no event. Callbacks run on the goroutine
// that drives the step and must not block; Event is passed by value, so an
// observer that does not keep it costs no allocation.
type Observer struct {
	// Dispatched runs when the engine accepts the request.
	Dispatched func(Event)
	// FirstToken runs at the first output token.
	FirstToken func(Event)
	// Finished runs once at Release, after the load is released, with the
	// final state (Completed or Aborted) and reason.
	Finished func(Event)
}

// Event describes a request at one step of its lifecycle.
type Event struct {
	Slot          radix.WorkerSlot
	WorkerID      uint64
	DPRank        uint32
	State         State
	Reason        Reason // why it aborted (Finished only)
	Finish        Finish // the terminal item's kind (Finished only)
	PromptTokens  int
	OverlapBlocks uint32
	OutputTokens  int
	Queued        time.Duration // waited for admission
	TTFT          time.Duration // dispatch to first token; 0 if none came
	Duration      time.Duration // dispatch to the end (Finished only)
}
