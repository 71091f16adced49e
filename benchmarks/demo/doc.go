// Package demo is the experiment behind kvfast demo: replay a trace once
// per routing policy, each time against a fresh router and fresh mock
// engines, and compare what the client measured and what the engines did.
//
// # Responsibility
//
// Options describes one experiment and DefaultOptions is its only source
// of defaults (the command binds its flags to it); the router itself
// starts from node.DefaultConfig with the demo's policy, block size and
// cost model. Run replays the trace per policy on an internal/rig rig, so
// that no policy inherits another's warm caches, and judges the
// routing-quality targets (Checks), among them kv against the pooled-LRU
// reference and the affinity baseline. With Options.Capacities it
// repeats that at each capacity of a sweep (sweep.go). With
// Options.Disagg it runs one policy twice instead, aggregated and then
// disaggregated (prefill and decode engines, the router speaking vLLM's
// protocol), and judges no targets. With Options.Encode (the multimodal
// workload, images in the conversations) it runs one policy three times:
// on aggregated engines that encode their own images, then with encode
// engines chosen by affinity, then by load alone, and reads the engines'
// encoder counters and the router's encoder metrics (multimodal.go).
// After each replay it checks that the router released every booking. A
// Report writes itself as text
// tables, JSON or the HTML report. Flags, exit codes and files are the
// command's.
//
// # Ownership
//
// Run owns each policy's rig (segment, router, engines) for the length of
// that policy's replay and tears it down before the next starts. A Report
// owns its results; the trace stays the caller's and is only read.
//
// # Concurrency
//
// Run is sequential: one policy at a time, each replay's load on the
// machine alone. It calls Options' hooks (Notef, Warnf) from its own
// goroutine; Progress is written by the replay's progress bar. A Report
// is read-only once Run returns it, so writing it from several goroutines
// is fine.
package demo
