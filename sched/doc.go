// Package sched chooses the worker for each request and books the
// request's load on it.
//
// # Responsibility
//
// Workers carry a workers.Role (prefill, decode, encode or both) and a request a
// Stage, which keeps only the workers that can run that stage of a
// disaggregated request (roles.go); encoders serve StageEncode only.
//
// Given a request's block hashes, its length and the per-worker prefix
// overlap the caller got from the radix index, sched filters the workers
// (model, health, pin, allow-list, busy thresholds), scores each with
// Dynamo's cost model, picks one by the routing policy, and books the
// request's prompt blocks, prefill tokens and, optionally, output blocks
// on it. The kv policy picks by cost (argmin with random tie-break, or a
// softmax sample), with an eviction term once a worker's cache is full
// (capacity.go); affinity picks the longest cached prefix, load only
// breaking ties (affinity.go); round-robin, random and least-loaded
// ignore the cache.
// Policies differ only in that choice: filters, thresholds, admission and
// booking are shared, and "approx" is kv fed with overlaps from an
// approximate index, so sched has no mode for it. When every eligible
// worker is busy the request waits in a bounded priority queue or is
// refused with an *OverloadError carrying a retry hint. docs/routing.md
// describes the model and the policies with worked examples.
//
// sched also calibrates the model (calibrate.go, fit.go): from each
// booked request's first token and normal end it fits, per worker, the
// engine's prefill time per token and decode time per step and per
// sequence, robustly and online, and derives the prefill load scale that
// puts the cost's two terms in the same unit of time. With
// CostParams.AutoPrefillLoadScale (kvfast serve's default) selection uses
// the median of the workers' scales (a disaggregated pool's: its prefill
// workers' prefill speed against its decode workers' decode cost). The
// same answers feed stall detection (stall.go): a worker with requests
// waiting that has never answered, or whose requests have waited
// CostParams.StallAfter in all since its last answer, loses its
// in-flight credit and its eviction term's discount for free memory, so
// that an engine that swallows requests does not draw traffic.
//
// # Ownership
//
// sched owns the worker set (fed by the shm registry and static config
// through Upsert/Remove/SetHealthy/SetEngineLoad), the active-load
// accounting of in-flight requests, each worker's timing calibration, the
// count of uncached blocks booked on each worker (how full its cache is),
// each worker's progress (stall.go),
// the global cost parameters, routing
// policy and busy thresholds, the round-robin rotation, and the admission
// queue. It does not own the radix index (the caller runs FindMatches)
// nor a request's lifecycle: a Reservation is booked into storage the
// caller owns (package guard embeds it) and the caller releases it
// exactly once.
//
// # Concurrency
//
// Everything is safe for concurrent use. The worker set is an immutable
// snapshot behind an atomic pointer; per-worker load counters are atomics
// in a fixed array; the global parameters and policy are read through
// atomics (New sets them; tests swap them while selections run). The
// active-block table is guarded by one mutex taken once per selection
// (scan, score, choose and book in one section, so concurrent selections
// see each other's load and never take the same round-robin turn) and
// once per release, never per block. Each worker's calibration has its
// own mutex, taken at a request's first token and at its end by the
// goroutine relaying it; selection reads the derived scale through an
// atomic. A Reservation's own methods are not
// concurrent: its owner serialises them.
//
// # Cost
//
// Select and Release make no allocation under any policy (the allocation
// tests assert it): one pass over the prompt's hashes counts every
// worker's shared blocks at once through per-block worker bitmasks,
// booking re-uses the entries that pass found, and release walks the
// entry numbers the booking kept without hashing. The table lock is what
// bounds a single scheduler's selection rate. BenchmarkSelect measures a
// selection against a mutex-guarded map baseline; BENCHMARKS.md has the
// figures.
package sched
