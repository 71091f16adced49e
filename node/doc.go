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
// the front end routes in their own namespace). Serve answers
// HTTP; Shutdown drains and then stops everything; Run does all of it for
// a command line, signals included. Snapshot gathers the per-worker state
// that /admin/workers and /metrics both show.
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
