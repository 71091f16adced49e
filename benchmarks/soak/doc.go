// Package soak runs a whole kvfast node under faults for a while and then
// checks that nothing leaked: the fault and soak suite behind `make soak`
// and the two-minute version that `make test` runs.
//
// # Responsibility
//
// Run starts a router (package node) with a shm segment in a temporary
// directory, healthy mock engines that register there (package mocker),
// and three sick engines as static workers: one that never answers, one
// that answers every request 500 while passing /health, and one that
// answers every stream with garbage. Clients send a mix of streaming and
// non-streaming completions over shared prefixes, and cancel some of them
// at random times. Meanwhile a fault loop kills and restarts engines,
// restarts the router on the same segment (which it must reattach warm),
// floods it with large bodies and with idle connections. At the end it
// stops the load and waits, with generous deadlines, for what must hold:
// no load booked on any worker, every booking released, goroutines back
// within a slack of their baseline (16 plus one per client: idle
// connections that close late; a leak grows past it), resident memory
// under its bound, and the index
// holding exactly the blocks each live engine caches. Report says what
// ran and what was seen; Run's error lists every check that failed.
//
// # Ownership
//
// Run owns everything it starts and stops all of it before it returns,
// whatever failed. It listens only on 127.0.0.1 with ephemeral ports.
//
// # Concurrency
//
// Run is one call; it runs the clients, the fault loop and the servers
// on goroutines of its own and joins them all before returning.
package soak
