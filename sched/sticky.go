package sched

import (
	"time"

	"github.com/kvfast/kvfast/internal/clock"
	"github.com/kvfast/kvfast/workers"
)

// Eligibility is what a sticky session needs to know of its bound worker
// before it pins a request there.
type Eligibility struct {
	Present bool // the slot holds a worker
	Healthy bool // and it is routable
	Busy    bool // and it is over a busy threshold right now
	// BusyFor is how long it has been busy, as the selections that
	// weighed it saw it (0 when it is not busy).
	BusyFor time.Duration
	Model   string // the model it serves
	// Stalled: its requests have waited longer than StallAfter without an
	// answer, counting those given up on since its last answer (stall.go):
	// an engine that hangs while passing its health checks.
	Stalled bool
}

// Eligibility reports slot's state for a sticky binding. Busy is the
// transient condition admission queues on: a session does not leave its
// worker for it (the pinned request waits like any other), only for a
// worker that stays busy (the caller's rule), is down, or is gone.
func (s *Scheduler) Eligibility(slot workers.Slot) Eligibility {
	if !slot.Valid() {
		return Eligibility{}
	}
	ws := s.workers.Load()
	if !ws.present.Has(slot) {
		return Eligibility{}
	}
	now := clock.Now()
	busy := s.busy(ws, workers.SetOf(slot), now) != 0
	e := Eligibility{
		Present: true,
		Healthy: workers.Set(s.healthy.Load()).Has(slot),
		Busy:    busy,
		Model:   ws.info[slot].Model,
		Stalled: s.progress[slot].overdue(now, s.params.Load().StallAfter),
	}
	if busy {
		e.BusyFor = time.Duration(s.stretch[slot].length(now))
	}
	return e
}
