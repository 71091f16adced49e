package guard

// Observer receives the end of each request's lifecycle, for metrics.
// Finished is optional. Only requests that reached an engine are reported:
// a request that failed selection or dispatch produces no event.
type Observer struct {
	// Finished runs once at Release, after the load is released, on the
	// releasing goroutine; it must not block. Event is passed by value,
	// so an observer that does not keep it costs no allocation.
	Finished func(Event)
}

// Event describes a request that reached an engine, at its end.
type Event struct {
	State        State  // Completed or Aborted
	Reason       Reason // why it aborted (ReasonNone if it completed)
	PromptTokens int
	OutputTokens int
}
