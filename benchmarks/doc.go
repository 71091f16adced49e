// Package benchmarks holds kvfast's cross-package and end-to-end
// benchmarks: the ones that need several packages, or a whole router on
// loopback, to mean anything. It has no API; everything is in _test.go
// files, run with
//
//	go test -run '^$' -bench . -benchtime 1s ./benchmarks/
//
// # Responsibility
//
// Each benchmark measures one claim the project makes and carries its
// baseline in the same run, so that the claim is a ratio or a difference
// read off one output rather than two numbers from two machines:
//
//   - BenchmarkProxyOverhead: the latency a kvfast router adds in front of
//     an engine, as the difference between calling a stand-in engine
//     directly and through the router, for non-streaming and streaming
//     requests (target: 100 µs or less at p50).
//   - TestRoutingDeterminism: the same seed and trace give the same
//     sequence of routing decisions under the kv policy at temperature 0,
//     with wall-clock effects removed (engines at infinite speed-up, a
//     settle barrier between requests). It runs in make test.
//
// Trace replay against the mock engine lives in the replay subpackage, and
// kvfast demo's experiment (one replay per routing policy, each on a fresh
// router and engines) in the demo subpackage.
//
// # What it owns
//
// Nothing at run time. The benchmarks start their own routers and engines
// (internal/rig) on 127.0.0.1 with ephemeral ports and stop them when they
// end; nothing is sent anywhere but loopback.
//
// # Concurrency
//
// Latency benchmarks use one client and sequential requests, so that a
// percentile describes one request's path and not a queue. Direct and
// routed requests alternate, so that both see the same machine: on the
// shared 2-core reference machine, noise from other processes lands on
// both distributions.
//
// # Performance
//
// What the router adds is mostly the second loopback hop (a write and a
// read each way, per event for streams) and parsing and hashing the
// prompt. BENCHMARKS.md has the figures of a recorded run.
package benchmarks
