// Package clock is the one monotonic clock of kvfast's request path: a
// nanosecond count since the process started. An int64 packs into atomics
// and pooled structs where a time.Time (24 bytes, with a location
// pointer) would not, and reading it allocates nothing.
//
// Wall-clock time (for logs, TTLs that persist, the shm heartbeat) stays
// time.Now; this clock only measures intervals inside one process.
package clock
