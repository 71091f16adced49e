package guard

import (
	"errors"
	"fmt"
)

// State is where a request is in its lifecycle.
type State uint8

const (
	// Free: in the pool, owned by nobody.
	Free State = iota
	// Acquired: handed out, nothing booked yet.
	Acquired
	// Selected: a worker is chosen and its load booked; not sent yet.
	Selected
	// Dispatched: the engine accepted the request.
	Dispatched
	// Completed: a terminal item (stop, EOS, length) or a normal close.
	Completed
	// Aborted: cancelled, failed or dropped, at any point before Completed.
	Aborted
)

var stateNames = [...]string{"Free", "Acquired", "Selected", "Dispatched", "Completed", "Aborted"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", s)
}

// Terminal reports whether s ends the lifecycle.
func (s State) Terminal() bool { return s == Completed || s == Aborted }

// Reason says why a request was aborted.
type Reason uint8

const (
	ReasonNone           Reason = iota
	ReasonClientCancel          // the client went away or cancelled
	ReasonDispatchFailed        // the engine never accepted the request
	ReasonEngineError           // the engine reported an error, or the stream broke
	ReasonTimeout               // a deadline passed
	ReasonPanic                 // a handler panicked with the guard live
	ReasonDropped               // released while live: the stream ended without a close
	ReasonEngineRejected        // the engine refused the request with a 4xx: the client's fault, and an answer
)

var reasonNames = [...]string{"none", "client_cancel", "dispatch_failed", "engine_error", "timeout", "panic", "dropped", "engine_rejected"}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", r)
}

// Finish classifies a stream item.
type Finish uint8

const (
	FinishNone   Finish = iota // more items follow
	FinishStop                 // a stop string or token
	FinishEOS                  // end of sequence
	FinishLength               // the token limit
	FinishError                // the engine reported an error
)

var finishNames = [...]string{"none", "stop", "eos", "length", "error"}

func (f Finish) String() string {
	if int(f) < len(finishNames) {
		return finishNames[f]
	}
	return fmt.Sprintf("Finish(%d)", f)
}

var (
	// ErrStale means the handle outlived its guard: the guard was released
	// (and maybe reused) since the handle was issued. Releasing twice is
	// the usual cause.
	ErrStale = errors.New("kvfast: stale guard handle")
	// ErrAborted means the request was aborted, typically by a concurrent
	// cancel: stop relaying.
	ErrAborted = errors.New("kvfast: request aborted")
	// ErrBadTransition means a lifecycle step out of order (an item before
	// dispatch, a dispatch after completion, ...).
	ErrBadTransition = errors.New("kvfast: illegal guard transition")
)

// TransitionError is an out-of-order lifecycle step.
type TransitionError struct {
	From, To State
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("cannot move guard from %s to %s: %v", e.From, e.To, ErrBadTransition)
}

func (e *TransitionError) Unwrap() error { return ErrBadTransition }
