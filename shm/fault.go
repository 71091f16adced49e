package shm

import (
	"bytes"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A segment file that shrinks under its mapping.
//
// Any process that can open the file can truncate it (a publisher opening
// it with O_TRUNC by mistake, a hostile one on purpose), and a tmpfs file
// cannot be sealed against that. A page past the new end then faults
// (SIGBUS) in whichever process touches it next, and the Go runtime
// crashes on such a fault unless the goroutine asked for a panic instead
// (debug.SetPanicOnFault). So every section of the router that touches
// the mapping runs under a guard:
//
//	defer seg.Catch(&faulted)
//	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
//
// A fault inside the mapping detaches the segment: its pages are replaced
// by private zero pages, which read as an empty registry, index, rings and
// session table (what a fresh segment holds, and what every reader already
// handles), so no later access faults, and Lost reports it. Nothing the
// file held can be trusted after a truncation anyway: a shorter file that
// grew back reads as zeros too. A fault anywhere else is not the
// segment's and panics on, as it would have crashed. CheckSize, which the
// router calls on every registry poll, detaches as soon as the file is
// shorter than the mapping, so that an unguarded reader (there should be
// none) meets the zero pages rather than the fault.
//
// A Publisher guards its own methods the same way: one whose segment was
// detached reports ErrRetired, and an engine registers again by path, as
// after a recreation, once a router has made the file whole.

// faultState is a Segment's record of a detach.
type faultState struct {
	base   unsafe.Pointer         // the mapping, fixed at Open
	lo, hi uintptr                // its address range
	mu     sync.Mutex             // serialises detach against Close
	lost   atomic.Pointer[string] // why the segment was detached; nil while it is not
}

// Catch is deferred by a section that touches the mapping, with
// debug.SetPanicOnFault set for it (see above). A memory fault inside the
// mapping detaches the segment and sets *faulted; any other panic
// continues. s may be nil (no segment): every panic continues.
func (s *Segment) Catch(faulted *bool) {
	v := recover()
	if v == nil {
		return
	}
	if !s.caught(v) {
		panic(v)
	}
	*faulted = true
}

// caught reports whether v, recovered from a panic, is a memory fault in
// the mapping, detaching the segment if it is.
func (s *Segment) caught(v any) bool {
	f, ok := v.(interface{ Addr() uintptr })
	return ok && s != nil && s.inMapping(f.Addr()) &&
		s.detach(fmt.Sprintf("a read or write at offset %d of the segment faulted: the file is shorter than its mapping (truncated)", f.Addr()-s.fault.lo))
}

// Guard runs f with faults in the mapping caught (Catch) and reports
// whether f ran to its end. For slow paths: f is a closure.
func (s *Segment) Guard(f func()) (ok bool) {
	var faulted bool
	defer s.Catch(&faulted)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	f()
	return true
}

func (s *Segment) inMapping(addr uintptr) bool { return addr >= s.fault.lo && addr < s.fault.hi }

// CheckSize detaches the segment if its file is now shorter than the
// mapping, or if its header, immutable once written, changed (a file
// truncated and grown again reads as zeros), and reports whether the
// segment is lost. It costs one fstat and a read of the header.
func (s *Segment) CheckSize() bool {
	var st unix.Stat_t
	if err := unix.Fstat(int(s.f.Fd()), &st); err == nil && st.Size < int64(s.fault.hi-s.fault.lo) {
		s.detach(fmt.Sprintf("the file shrank to %d bytes under a %d-byte mapping (truncated)", st.Size, s.fault.hi-s.fault.lo))
	}
	if s.Lost() == "" && s.hdr.SegmentID != 0 {
		// Every byte of it: a version or size rewritten in place leaves
		// the router serving while every publisher, inspect and the next
		// router refuse the file.
		var same bool
		s.Guard(func() { same = bytes.Equal(s.mem[:len(s.header)], s.header[:]) })
		if s.Lost() == "" && !same {
			s.detach("the file's header changed under the router (truncated and grown again, or overwritten)")
		}
	}
	return s.Lost() != ""
}

// Lost says why the segment was detached from its file, or "" if it was
// not. A lost segment reads as empty and talks to no publisher: the
// router must be restarted, with --recreate-segment since the file is
// damaged.
func (s *Segment) Lost() string {
	if why := s.fault.lost.Load(); why != nil {
		return *why
	}
	return ""
}

// detach replaces the mapping with private zero pages, once, and reports
// whether the segment is detached (false only after Close, when the range
// may belong to someone else and a fault in it is a bug).
func (s *Segment) detach(why string) bool {
	s.fault.mu.Lock()
	defer s.fault.mu.Unlock()
	if s.closed.Load() {
		return false
	}
	if s.fault.lost.Load() != nil {
		return true
	}
	// MAP_FIXED swaps the pages in one call: a reader sees the file's page
	// or a zero page, never a hole.
	_, err := unix.MmapPtr(-1, 0, s.fault.base, s.fault.hi-s.fault.lo,
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED)
	if err != nil {
		// Out of address space or memory: the file's pages stay, and
		// every guarded access past its end faults and is caught again.
		why += fmt.Sprintf("; cannot replace the mapping: %v", err)
	}
	s.fault.lost.Store(&why)
	return true
}
