// Package guard tracks one routed request from selection to cleanup and
// releases its booked load exactly once, whatever path it takes.
//
// # Responsibility
//
// A guard moves through
//
//	Acquired → Selected → Dispatched → Completed | Aborted
//	           Selected → Aborted            (dispatch failed, cancelled)
//	Acquired → Aborted                       (cancelled while selecting)
//
// with every transition a single compare-and-swap on one word that also
// holds the guard's generation. Selection books straight into the guard's
// embedded sched.Reservation, so the load belongs to the guard before the
// request is sent. The first output token releases the prompt's prefill
// load; output blocks are booked at block boundaries; a terminal item
// completes the request and releases its load before the item is handed
// on. Whoever wins the terminal CAS — the relay, a canceller on another
// goroutine, or Release on a dropped stream or a panic unwinding through
// it — releases the load; nobody else can. The end of every request that
// was dispatched goes to an Observer, for metrics. An action deferred on
// the guard (Defer: an engine session's close) runs once at Release, after
// the load is freed, whatever path led there. docs/routing.md draws
// the state diagram. Builds with internal/invariants enabled (the
// invariants tag, or -race) assert that every transition is an edge of it
// and keeps the handle's generation.
//
// # Ownership
//
// A Pool owns its guards and their reservations' buffers. A caller owns a
// guard from Acquire to Release through a Handle (pointer plus generation).
// Release recycles the guard and bumps its generation, so a handle used
// after release gets ErrStale instead of touching another request.
//
// # Concurrency
//
// One goroutine relays the stream (OnItem, Close); any goroutine may Abort
// concurrently. Progress updates hold a busy bit in the state word while
// they move the reservation, and a terminal transition waits for it, so a
// release never interleaves with a progress update. Release must come
// after every other user of the handle is done (its owner joins them
// first): a guard another goroutine may still touch is never recycled.
//
// # Cost
//
// A whole lifecycle makes no allocation, and intermediate items touch only
// the relay's own fields and one atomic load (BenchmarkGuardLifecycle
// measures it; BENCHMARKS.md has the numbers).
//
// # Two stages
//
// A disaggregated request (fastpath, docs/routing.md) holds two guards
// from one pool, one per stage; each releases its own booking exactly
// once. PrefillRemote (stages.go) drops a decode stage's prefill load
// when another worker computes its prompt. TestTwoStageHammer checks
// random two-stage lifecycles with faults at every step.
package guard
