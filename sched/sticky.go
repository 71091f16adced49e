package sched

import (
	"github.com/kvfast/kvfast/internal/clock"
	"github.com/kvfast/kvfast/workers"
)

// Eligibility is what a sticky session needs to know of its bound worker
// before it pins a request there.
type Eligibility struct {
	Present bool   // the slot holds a worker
	Healthy bool   // and it is routable
	Busy    bool   // and it is over a busy threshold right now
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
	return Eligibility{
		Present: true,
		Healthy: workers.Set(s.healthy.Load()).Has(slot),
		Busy:    s.busy(ws, workers.SetOf(slot)) != 0,
		Model:   ws.info[slot].Model,
		Stalled: s.progress[slot].overdue(clock.Now(), s.params.Load().StallAfter),
	}
}
