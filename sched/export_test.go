package sched

import (
	"time"

	"github.com/kvfast/kvfast/workers"
)

// Tests change the global parameters while selections run; production sets
// them once, in New.

// Policy returns the global routing policy.
func (s *Scheduler) Policy() Policy { return Policy(s.policy.Load()) }

// SetPolicy replaces the global routing policy for every later selection
// that does not carry its own.
func (s *Scheduler) SetPolicy(p Policy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	s.policy.Store(uint32(p))
	return nil
}

// CostParams returns the global cost parameters.
func (s *Scheduler) CostParams() CostParams { return *s.params.Load() }

// SetCostParams replaces the global cost parameters atomically: a
// selection sees either the old set or the new one, never a mix.
func (s *Scheduler) SetCostParams(p CostParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	s.params.Store(&p)
	return nil
}

// SetBusyThresholds replaces the busy thresholds atomically and lets queued
// requests re-check them.
func (s *Scheduler) SetBusyThresholds(b BusyThresholds) error {
	if err := b.Validate(); err != nil {
		return err
	}
	s.thresholds.Store(&b)
	s.wakeWaiters()
	return nil
}

// Booked reports whether the reservation holds load.
func (r *Reservation) Booked() bool { return r.state == resBooked }

// Slot returns the worker the load is booked on.
func (r *Reservation) Slot() workers.Slot { return r.slot }

// count returns worker w's reference count on entry e.
func (t *activeTable) count(e uint32, w uint) uint32 {
	en := &t.entries[e]
	var c uint32
	for j := range en.low {
		c |= uint32(en.low[j]>>w&1) << j
	}
	return c + t.high[uint64(e)<<6|uint64(w)]<<lanePlanes
}

// backdateProgress moves worker w's last answer d into the past, as if
// its requests had waited that long.
func (s *Scheduler) backdateProgress(w workers.Slot, d time.Duration) {
	s.progress[w].since.Add(-int64(d))
}
