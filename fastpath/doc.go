// Package fastpath is kvfast's HTTP front end: the OpenAI-compatible
// endpoints, the route-only endpoint, metrics and health.
//
// # Responsibility
//
// It turns a client request into a routing decision and hands it on: parse
// the body (openai.Parser), hash the prompt into block hashes (radix for
// token prompts, AppendApproxHashes for text and chat prompts), look up every
// worker's cached prefix (the event-fed index, or the approximate index of
// the router's own decisions), ask sched for a worker, put the booking into
// a guard, and let dispatch forward the unchanged body and relay the
// response. Server wires these together with the worker set (the shm
// registry's live engines and static configuration), the metrics, and
// graceful shutdown.
//
// A request's life in the server (exchange.go): the pooled exchange owns
// every per-request buffer and is itself the dispatch.Observer, so engine
// progress becomes guard transitions (Dispatched, first token, items,
// Completed or Aborted) without a closure per request. The booking moves
// into the guard before the engine is called; from then on every path,
// including a panic in the handler and a stream whose client vanished,
// releases it exactly once. A connect failure, the only failure after
// which nothing reached the engine or the client, re-routes to another
// worker.
//
// The OpenAI wire format is package openai's: parsing reads only what
// selection needs, validates the whole body, and refuses a bad one with an
// openai.Error, which is also how fastpath renders its own refusals
// (unknown model, bad routing headers, overload).
//
// # What it owns
//
// The HTTP listener and its limits, the pool of exchanges (and the
// openai.ParsedRequest values and hash buffers inside them), the
// approximate index, the model-to-namespace table, and the Prometheus
// registry. The text-chunk hash namespace of approximate mode (ApproxSeed),
// kept apart from token-block hashes of the same model, adapter and salt.
//
// # Concurrency
//
// AppendApproxHashes and ApproxSeed are pure. The request path reads the
// worker set, the model table and the index without locks; a stream is
// relayed on fasthttp's stream-writer goroutine, which takes the exchange
// over from the handler. Background goroutines poll the registry, expire
// approximate assumptions and run ingestion.
//
// # Throughput envelope
//
// Approximate hashing is measured by BenchmarkApproxHashes; request parsing
// by openai's BenchmarkParseRequest.
//
// End to end over loopback, a route-only request with a 1K-token prompt
// costs ~30 µs of CPU (client included) and 0 allocations, ~55 K req/s on
// the 2 cores (BenchmarkRouteOnly); forwarding adds ~16–30 µs at p50 to a
// plain response and ~35–55 µs to a 16-event stream
// (benchmarks.BenchmarkProxyOverhead). See BENCHMARKS.md.
package fastpath
