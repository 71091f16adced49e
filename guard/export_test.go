package guard

// Test-only views of a guard.

// Reason returns why the request aborted (ReasonNone otherwise).
func (h Handle) Reason() Reason {
	w, err := h.load()
	if err != nil {
		return ReasonNone
	}
	return reasonOf(w)
}
