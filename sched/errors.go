package sched

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvfast/kvfast/internal/configerr"
)

var (
	// ErrNoEligibleWorker means no healthy worker passes the request's
	// filters (model, pin, allow-list). Waiting would not help, so the
	// request is refused rather than queued.
	ErrNoEligibleWorker = errors.New("kvfast: no eligible worker")

	// ErrPinExcluded means the request's own filters (its model, its
	// allow-list, its endpoint's stage) exclude the worker it pins: the
	// request contradicts itself, which waiting cannot mend. It is an
	// ErrNoEligibleWorker too.
	ErrPinExcluded = fmt.Errorf("%w: the request's model, allow-list or endpoint excludes the pinned worker", ErrNoEligibleWorker)

	// ErrPinnedWorkerNotFound means the pinned (worker id, DP rank) pair is
	// not in the worker set. The rank is never guessed: rank 0 is a real
	// rank, and an unknown rank is this error rather than a fallback.
	ErrPinnedWorkerNotFound = errors.New("kvfast: pinned worker not found")

	// ErrOverloaded means every eligible worker is busy and the admission
	// queue is full. It always arrives wrapped in an *OverloadError that
	// carries a retry hint.
	ErrOverloaded = errors.New("kvfast: overloaded")

	// ErrInvalidRequest means the request contradicts itself (more block
	// hashes than its token count can fill, a negative length, ...).
	ErrInvalidRequest = errors.New("kvfast: invalid routing request")

	// ErrInvalidConfig means a configuration or cost parameter is out of
	// range (negative, NaN, infinite, or inconsistent with the router).
	ErrInvalidConfig = errors.New("kvfast: invalid scheduler configuration")
)

// invalidf is an error matching ErrInvalidConfig whose text is the formatted
// message alone.
func invalidf(format string, args ...any) error {
	return configerr.New(ErrInvalidConfig, format, args...)
}

// OverloadError refuses a request because every eligible worker is busy and
// the admission queue is full. The front end turns it into a 429 with a
// Retry-After header of RetryAfter, rounded up to whole seconds.
//
// The scheduler hands out shared values, one per retry hint it can give,
// so that a refusal allocates nothing (Scheduler.overload): callers must
// not modify one. How many requests were waiting is in Stats.
type OverloadError struct {
	RetryAfter time.Duration // how long the client should wait before retrying
}

func (e *OverloadError) Error() string {
	return fmt.Sprintf("cannot queue request: the admission queue is full (retry after %s): %v",
		e.RetryAfter, ErrOverloaded)
}

func (e *OverloadError) Unwrap() error { return ErrOverloaded }

// PinError reports a pin that cannot be honoured: the pair is unknown
// (ErrPinnedWorkerNotFound), excluded by the request's own filters
// (ErrPinExcluded), or unhealthy (ErrNoEligibleWorker).
type PinError struct {
	WorkerID uint64
	DPRank   uint32
	Err      error
}

func (e *PinError) Error() string {
	return fmt.Sprintf("cannot route to pinned worker %d rank %d: %v", e.WorkerID, e.DPRank, e.Err)
}

func (e *PinError) Unwrap() error { return e.Err }
