package guard

import "github.com/kvfast/kvfast/sched"

// Test-only views of a guard.

// Reason returns why the request aborted (ReasonNone otherwise).
func (h Handle) Reason() Reason {
	w, err := h.load()
	if err != nil {
		return ReasonNone
	}
	return reasonOf(w)
}

// Decision returns the selection's outcome.
func (h Handle) Decision() sched.Decision {
	if _, err := h.load(); err != nil {
		return sched.Decision{}
	}
	return h.g.dec
}
