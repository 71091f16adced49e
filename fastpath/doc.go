// Package fastpath is kvfast's HTTP front end: the OpenAI-compatible
// endpoints, the route-only endpoint, metrics and health, and the
// zero-allocation parsing of request bodies that routing depends on.
//
// # Responsibility
//
// It turns a client request into a routing decision and hands it on: parse
// the body (Parser), hash the prompt into block hashes (radix for token
// prompts, AppendApproxHashes for text and chat prompts), look up every
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
// Parsing reads only what selection needs: model, prompt or messages,
// stream, max_tokens / max_completion_tokens and cache_salt. It validates
// the whole body as JSON, as strictly as encoding/json does, so a body the
// router accepts is one the engine can read; it builds no tree, decodes
// token ids straight into a pooled ParsedRequest, and refuses wrong types,
// out-of-range token ids, empty prompts, batches and oversized bodies with a
// RequestError that renders as an OpenAI error body.
//
// # What it owns
//
// The HTTP listener and its limits, the pool of exchanges (and the
// ParsedRequest values and hash buffers inside them), the approximate
// index, the model-to-namespace table, and the Prometheus registry. The text-chunk hash namespace of approximate mode (ApproxSeed),
// kept apart from token-block hashes of the same model, adapter and salt.
//
// # Concurrency
//
// A Parser is read-only and serves all goroutines. A ParsedRequest belongs
// to one request at a time. AppendApproxHashes and ApproxSeed are pure.
// The request path reads the worker set, the model table and the index
// without locks; a stream is relayed on fasthttp's stream-writer goroutine,
// which takes the exchange over from the handler. Background goroutines
// poll the registry, expire approximate assumptions and run ingestion.
//
// # Throughput envelope
//
// On one core of the 2-core reference machine, parsing a 4K-token body runs
// at about 1.2 GB/s (~25 µs, ~6 ns per token id) and a 16 KB text or chat
// body at about 4 GB/s, twenty times encoding/json, with zero allocations
// once a pooled ParsedRequest has grown; approximate hashing runs at about
// 4 GB/s. See BenchmarkParseRequest and BenchmarkApproxHashes.
//
// End to end over loopback, a route-only request with a 1K-token prompt
// costs ~30 µs of CPU (client included) and 0 allocations, ~55 K req/s on
// the 2 cores (BenchmarkRouteOnly); forwarding adds ~16–30 µs at p50 to a
// plain response and ~35–55 µs to a 16-event stream
// (benchmarks.BenchmarkProxyOverhead). See BENCHMARKS.md.
package fastpath
