// Package node wires one kvfast router on one host: the shm segment and
// its index, the event feeds (the segment's rings and the engines' ZMQ
// sockets), the scheduler, the engine pool, the prompt renderers and the
// HTTP front end.
//
// # Responsibility
//
// Config is the whole router's configuration and DefaultConfig its only
// source of defaults; cmd/kvfast binds its flags to a DefaultConfig.
// New opens what the configuration names, builds each part, and starts
// the background work: the registry sync (engines joining and leaving
// through the segment, their load pages), approximate-index expiry, event
// ingestion as the segment's elected ingester or its standby, one ZMQ
// subscriber per static worker that publishes KV events, and the poll of
// every engine's GET /v1/models for the LoRA adapters it serves (which
// the front end routes in their own namespace, and which tells a static
// worker configured without a model which one it serves). Serve answers
// HTTP; Shutdown drains and then stops everything; Run does all of it for
// a command line, signals included. Snapshot gathers the per-worker state
// that /admin/workers and /metrics both show.
//
// # Start-up
//
// The router is not ready (GET /ready answers 503, and a request naming a
// model no worker serves yet waits, within the queue timeout, instead of
// getting 404) until its start-up has settled (Settled, the front end's
// Deps.Settled): every static worker's model is known (configured, or
// learned from its engine's GET /v1/models, polled every RegistryPoll
// until then; after DiscoveryTimeout the node settles without it and says
// so), and, with a segment, the ingester has made the index safe to route
// on: repaired it in time linear in the region, or, when the damage is
// more than a crashed writer leaves or the repair overruns its budget,
// dropped it to refill from the engines' events (package feed logs which,
// with the repair's progress). Registered workers are routable when New
// returns: it syncs the registry once itself. Close stops a repair in
// progress (it honours its context), so SIGTERM is obeyed at once.
//
// The segment is attached only if this user owns it with mode 0600
// (SegmentConfig.AllowForeign overrides, with a warning in the log).
// Conditions that every registry poll sees again, a refused registration
// or an unreadable registry slot, and state changes a restart loop repeats
// (joins and leaves, health), are logged once a minute per slot
// (internal/logthrottle); the last line held back is written when the
// minute is over, so the log's last word on a slot is its state now.
//
// # Ownership
//
// A Node owns what it opened: the segment (closed last), the index, the
// ingester and subscribers, the scheduler, the engine pool and the prompt
// registry (package prompt), to whose remote renderers it names the
// healthy engines serving a model (PickEngine). The front end (package
// fastpath) borrows the index, scheduler, pool and renderers, and never
// outlives the node. Worker membership is the node's: it adds and removes
// workers in the scheduler and the pool, then tells the front end.
//
// # Concurrency
//
// After New returns, the node's goroutines run until Close; Close (and
// Shutdown, which calls it) is safe from any goroutine, any number of
// times, and only the first call stops anything. Snapshot is safe
// concurrently with everything. The registry state is touched only by the
// registry loop, after New's own first sync.
package node
