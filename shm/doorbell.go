package shm

import (
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvfast/kvfast/workers"
	"golang.org/x/sys/unix"
)

// The doorbell lets an idle ingester sleep in the kernel instead of
// polling, and still see a record microseconds after it is committed. It
// is a futex on shared memory (no FUTEX_PRIVATE_FLAG: waiter and waker
// are different processes). Publishers ring it only while the ingester
// has announced it may sleep, so a busy ingester costs them one load of a
// line that rarely changes. Publishers that cannot make the syscall (the
// Python one) simply never ring; the ingester's bounded sleep covers them.

const (
	futexOpWait = 0
	futexOpWake = 1
)

func futexWake(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexOpWake, 1, 0, 0, 0)
}

// WaitForEvents blocks until some ring may have a record, or timeout
// passes. The announce-then-recheck order closes the lost-wake-up race:
// a publisher either commits before our recheck (we see it) or loads
// sleepers after our store (it rings, and the futex value we wait on has
// changed or we get woken).
//
// Only the rings of the slots in watch count as pending, so a ring the
// caller has set aside (a worker stuck on garbage) cannot keep it awake.
func (s *Segment) WaitForEvents(timeout time.Duration, watch workers.Set) {
	sleepers := s.u32(controlOff + controlSleepers)
	bell := s.u32(controlOff + controlDoorbell)
	atomic.StoreUint32(sleepers, 1)
	seen := atomic.LoadUint32(bell)
	if !s.anyPending(watch) {
		ts := unix.NsecToTimespec(timeout.Nanoseconds())
		unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(bell)), futexOpWait, uintptr(seen),
			uintptr(unsafe.Pointer(&ts)), 0, 0)
	}
	atomic.StoreUint32(sleepers, 0)
}

func (s *Segment) anyPending(watch workers.Set) bool {
	for w := range watch.All() {
		off := s.ringBase(int(w))
		if atomic.LoadUint64(s.u64(off+ctlHead)) != atomic.LoadUint64(s.u64(off+ctlTail)) {
			return true
		}
	}
	return false
}
