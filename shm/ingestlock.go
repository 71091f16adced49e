package shm

import (
	"fmt"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

var pid = os.Getpid()

// TryLockIngester tries to become the segment's single ingester. The lock
// is an flock on the segment file, so the kernel releases it the moment
// its holder dies, however it dies; a standby router calls this
// periodically and takes over. It is held until Close or UnlockIngester.
func (s *Segment) TryLockIngester() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return false, ErrClosed
	}
	if s.locked {
		return true, nil
	}
	var err error
	for {
		err = unix.Flock(int(s.f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err != unix.EINTR {
			break
		}
	}
	if err == unix.EWOULDBLOCK {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("cannot lock ingester of %s: %w", s.path, err)
	}
	s.locked = true
	atomic.StoreUint64(s.u64(controlOff+controlIngPID), uint64(pid))
	atomic.AddUint64(s.u64(controlOff+controlIngEpoch), 1)
	atomic.StoreUint64(s.u64(controlOff+controlIngSince), uint64(monoNow()))
	return true, nil
}

// UnlockIngester gives the ingester role up.
func (s *Segment) UnlockIngester() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.locked || s.closed.Load() {
		return nil
	}
	s.locked = false
	return unix.Flock(int(s.f.Fd()), unix.LOCK_UN)
}

// IngesterHeld reports whether some process (this one included) holds
// the ingester role now: the flock, which the kernel drops with its
// holder, not the recorded PID, which outlives it and names a process of
// another PID namespace when the router runs in a container. It probes
// with a shared lock taken, and at once released, on a description of
// its own of the same file.
func (s *Segment) IngesterHeld() (bool, error) {
	if s.closed.Load() {
		return false, ErrClosed
	}
	// Closing any descriptor of the file drops this process's POSIX record
	// locks on it, the registry lock among them (as Close, wait for
	// registrations in flight).
	registryMu.Lock()
	defer registryMu.Unlock()
	f, err := os.Open(fmt.Sprintf("/proc/self/fd/%d", s.f.Fd()))
	if err != nil {
		return false, fmt.Errorf("cannot probe the ingester lock of %s: %w", s.path, err)
	}
	defer f.Close()
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
		if err != unix.EINTR {
			break
		}
	}
	switch {
	case err == unix.EWOULDBLOCK:
		return true, nil
	case err != nil:
		return false, fmt.Errorf("cannot probe the ingester lock of %s: %w", s.path, err)
	}
	return false, nil // closing f drops the shared lock
}

// IngesterInfo is who ingests, as recorded by the lock holder.
type IngesterInfo struct {
	PID   uint64
	Epoch uint64 // how many times the role was taken
	Since int64  // CLOCK_MONOTONIC ns
}

// Ingester returns the recorded ingester. The PID is that of the last
// holder; it may have died since (the flock is the truth).
func (s *Segment) Ingester() IngesterInfo {
	return IngesterInfo{
		PID:   atomic.LoadUint64(s.u64(controlOff + controlIngPID)),
		Epoch: atomic.LoadUint64(s.u64(controlOff + controlIngEpoch)),
		Since: int64(atomic.LoadUint64(s.u64(controlOff + controlIngSince))),
	}
}
