//go:build amd64 || arm64

package radix

// prefetchLines asks the CPU to start loading the cache line of every
// address, and returns at once. Unlike a load, a prefetch retires without
// waiting for memory, so a batch of them keeps dozens of misses in flight
// where loads would stall the reorder buffer after a handful. A prefetch
// never faults, so an address may lie past the end of a table.
//
//go:noescape
func prefetchLines(addrs []uintptr)
