// Package invariants says whether this build checks internal invariants.
//
// # Responsibility
//
// Enabled is a constant: true in builds with the `invariants` tag and in
// race builds (so that `go test -race` exercises every check), false
// otherwise. Code guards its self-checks with `if invariants.Enabled`, and
// the compiler drops them from production builds, so a check may be as
// expensive as it needs to be and still cost nothing where it matters. A
// failed check panics with a message starting "BUG:": an invariant that
// does not hold means the program is wrong, not its input.
//
// Run the checks with
//
//	go test -tags invariants ./...    (or -race, which implies them)
//
// # Ownership
//
// The package owns nothing but the constant; the checks live with the
// code whose invariants they state.
//
// # Concurrency
//
// A constant needs no synchronisation.
package invariants
