// Package shm owns kvfast's shared-memory segment: the file under
// /dev/shm, its versioned layout and mmap, the worker registry, one SPSC
// event ring and one seqlock load page per worker, the embedded radix
// index region, and the publisher library engines link to.
//
// The byte layout is a cross-language contract, written down in
// docs/shm-layout.md; publishers/python implements it too.
//
// # What it owns
//
//   - Segment: create-or-attach (Open), validation of every header field
//     against the file (typed refusals: CorruptError, VersionError,
//     MismatchError, all wrapping ErrIncompatible, all saying how to
//     recreate), retirement on --recreate-segment, the ingester flock and
//     the futex doorbell. Open has the file system back the whole file
//     (fallocate), refusing with a SpaceError where it has no room, since
//     a sparse file on a full tmpfs faults (SIGBUS) at a later write.
//   - Trust: a router (Open) attaches only to a segment this user owns
//     with no group or other permission bits (mode 0600, as create makes
//     it), because whoever can write the segment can register engines,
//     forge KV events and rewrite the index; anything else is refused with
//     an OwnerError that says how to fix it, unless Options.AllowForeign
//     (--allow-foreign-segment). Publishers (Register) may run as other
//     users and are not checked.
//   - Truncation (fault.go): a file shortened under its mapping faults
//     the next access past its end. The router's sections that touch the
//     mapping run with debug.SetPanicOnFault and defer Segment.Catch
//     (Bindings does so itself): a fault in the mapping detaches the
//     segment, replacing its pages with private zero pages that read as
//     an empty segment, and Lost says why. CheckSize finds a shrunk file
//     without waiting for a fault. A Publisher guards its methods the
//     same way and reports ErrRetired.
//   - Registry: 64 slots; Register claims one under a cross-process
//     registry lock (fcntl, so Python can take it with os.lockf);
//     Workers/Worker read consistent snapshots, and ReadWorker says why a
//     slot holds none (a SlotError for bytes no publisher writes, ErrTorn
//     for a writer that never finished); MarkDown/ExpireClaim are the
//     router's transitions.
//   - Rings: Publisher writes records (ringWriter), RingReader decodes and
//     commits them. Records are committed by a release store of head and
//     consumed by a store of tail, which is also the persisted cursor.
//   - Load pages: Publisher.Load writes, Segment.LoadOf reads.
//   - Session bindings (bindings.go): the routers' sticky-session table,
//     bounded, per-bucket seqlocked, expired lazily, so that every router
//     on the node agrees where a session lives. Publishers never touch it.
//
// # Concurrency
//
// Each ring has exactly one producer (the Publisher holding the slot,
// not safe for concurrent use) and one consumer (the holder of the
// ingester lock). Registry transitions are serialised by the registry
// lock; readers never take it. Load pages have one writer and any number
// of lock-free readers. Segment methods are safe for concurrent use.
// Nothing read from the file is trusted: sizes and offsets are validated
// before use, and corrupt data yields a typed error, never a panic or an
// out-of-bounds access.
//
// # Throughput envelope
//
// Publishing and consuming a record make no allocation and no system
// call (the doorbell futex is rung only while the ingester sleeps).
// Registration and heartbeats are slow-path (a lock, a syscall).
// BenchmarkRing compares the ring with a buffered Go channel carrying the
// same event in-process, which, unlike the ring, cannot cross a process or
// survive a restart; BENCHMARKS.md has the figures.
package shm
