// Package testnet gives tests network addresses with a known behaviour.
//
// # Responsibility
//
// RefusingAddr only: a loopback address that refuses connections for as
// long as the test runs. Tests use it for an engine that is down.
//
// # Ownership and concurrency
//
// The address belongs to the test that asked for it and is released by
// its cleanup. Safe for concurrent use.
package testnet
