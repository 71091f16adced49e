// Package epp is kvfast as the endpoint picker (EPP) of a Kubernetes
// inference gateway: the Gateway API Inference Extension's protocol,
// served over Envoy's ext_proc gRPC stream, choosing among the pods of an
// InferencePool with kvfast's own index and scheduler.
//
// # Responsibility
//
// Server answers envoy.service.ext_proc.v3.ExternalProcessor/Process. For
// each HTTP request the gateway streams its request headers and body; the
// server parses the body (openai.Parser), hashes the prompt (radix's
// block hashes for token ids, its text-chunk hashes for text and chat
// prompts), looks up every endpoint's cached prefix in the index that the
// engines' ZMQ KV events feed (feed.ZMQSubscriber, one per endpoint),
// asks sched for an endpoint, books the request's load into a guard, and
// names the endpoint the way the protocol says: the
// x-gateway-destination-endpoint header in a header mutation, and the same
// value under that key in the envoy.lb dynamic-metadata namespace,
// optionally followed by fallback endpoints. A subset hint in the request's
// filter metadata (envoy.lb.subset_hint / x-gateway-destination-endpoint-
// subset) restricts the choice. No eligible endpoint is an
// ImmediateResponse with 503; a full admission queue, 429; a body kvfast
// cannot parse, 400. It then follows the response phases (headers, body,
// trailers), passing every chunk through unchanged, and turns them into
// guard transitions: response headers dispatch the request, SSE items
// release its prefill load and book its output, the end of the response
// completes it, and a stream that breaks or ends early aborts it; a
// watchdog (watchdog.go) aborts it when the gateway leaves it waiting
// past Config.ResponseTimeout, for response headers or to take an
// answer. Every booking is released exactly once, on every path. docs/epp.md cites the
// protocol's sources.
//
// Picker owns the routing state (index, approximate index, scheduler,
// guard pool), which endpoints serve which LoRA adapter (RunAdapters
// polls their GET /v1/models, and routes around one that leaves three
// polls in a row unanswered), and the endpoint membership: Sync brings the scheduler and
// the ZMQ subscribers in line with a list of endpoints, which a Source
// gives: a static list (Static) or the InferencePool's ready pods read
// from the Kubernetes API server (Kube, plain HTTPS with the pod's
// service-account token; tests stand in a fake API server). Run polls a
// Source and syncs.
//
// # Ownership
//
// A Picker owns its index, scheduler, guards and subscribers; Close stops
// the subscribers. A Server borrows its Picker. Each ext_proc stream owns
// one pooled exchange (body buffer, parsed request, hashes, guard handle)
// from its first message to its end.
//
// # Concurrency
//
// gRPC runs each stream on its own goroutine; an exchange is touched only
// by its stream's goroutine. The request path reads the endpoint snapshot
// (address → slot) through an atomic pointer; Sync, serialised by a mutex,
// publishes a new one after it changed the scheduler. Each subscriber runs
// on its own goroutine until its endpoint leaves or the Picker closes;
// Sync waits for a leaving subscriber to stop before it forgets the
// endpoint's blocks, so that nothing writes the slot after.
//
// # Cost
//
// Parsing, hashing, lookup and selection are the per-node router's and
// allocate nothing; the ext_proc messages themselves are protobufs built
// per response. BenchmarkDecision measures one request's decision over a
// real gRPC stream (BENCHMARKS.md).
package epp
