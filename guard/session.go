package guard

// AfterRelease is work that must wait until a request's booking is freed
// and its guard recycled: closing an engine-side session (SGLang's
// close_session) once the stream that used it has ended, so that the
// engine does not drop the conversation's KV while generation is still
// tearing down. The value is typically the request's pooled state, so
// registering it allocates nothing.
type AfterRelease interface {
	// AfterRelease runs exactly once, on the goroutine that called
	// Release, after the load is released and the handle went stale.
	// ev says how the request ended (Aborted with ReasonDropped when its
	// owner dropped it). It must not block: hand slow work to a goroutine.
	AfterRelease(ev Event)
}

// Defer registers a to run when the request's guard is released, on
// every path: completion, an error or a client's cancel (Abort, then
// Release), a dropped stream or a panic (Release aborts with
// ReasonDropped). A second Defer replaces the first. Only the guard's
// owner may call it, before Release.
func (h Handle) Defer(a AfterRelease) error {
	if _, err := h.load(); err != nil {
		return err
	}
	h.g.after = a
	return nil
}
