// Package rigtest adapts package rig to tests: a rig that fails the test
// when it cannot start, stops when the test ends, and a router
// configuration sized for tests.
//
// # Responsibility
//
// Start and Config only; the rig itself, its teardown order and its waits
// are package rig's. Config is node.DefaultConfig with what tests need
// changed (small indexes, no health probes, no log output, a fast registry
// poll); it is not a second set of defaults for production.
//
// # Ownership and concurrency
//
// A rig started here belongs to the test that started it and is closed by
// its cleanup. Start must be called from the test's goroutine.
package rigtest
