// Package rig runs a whole kvfast deployment inside one process: a shm
// segment in a fresh temporary directory, a router (package node) serving
// on 127.0.0.1 with an ephemeral port, and any number of mock engines
// (package mocker) that register in the segment and publish their KV
// events and load there. The demo, the end-to-end tests and the
// benchmarks all stand on it, so that they start and stop a router the
// same way.
//
// # Responsibility
//
// Start brings the parts up in dependency order (segment and router
// first, since engines register in the router's segment; then the
// engines, one at a time so that engine i always holds registry slot i)
// and returns once the router routes to every engine it started. Close
// tears them down in the reverse order: the router first, so that nothing
// is forwarded to a closed engine; then the engines; then the segment's
// directory. WaitWorkers and WaitFor are the one way to wait for what the
// router does asynchronously: they poll a condition until a deadline,
// never sleep for a fixed time as synchronisation.
//
// The package is production code (kvfast demo uses it) and does not import
// testing; rigtest wraps it for tests.
//
// # Ownership
//
// A Rig owns everything it started: the node, the listener, the engines
// and the temporary directory. Routers and engines a caller adds through
// Config (static workers) stay the caller's.
//
// # Concurrency
//
// A Rig's fields are set by Start and read-only afterwards; Close is safe
// to call more than once, and only the first call does anything. WaitFor
// and WaitWorkers may run on any goroutine.
package rig
