//go:build !amd64 && !arm64

package radix

// prefetchLines is a no-op where kvfast has no prefetch instruction wired
// up: FindMatches stays correct, its misses are just paid one by one.
func prefetchLines(addrs []uintptr) {}
