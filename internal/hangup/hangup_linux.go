package hangup

import (
	"fmt"
	"net"
	"sync"
	"syscall"
)

// Watcher watches connections for their peer's hang-up.
type Watcher struct {
	epfd  int
	wake  [2]int // pipe: Close writes wake[1] to end the wait
	start sync.Once
	done  chan struct{}

	// deliverMu is held while targets are told, so that Stop can wait out
	// a delivery already under way.
	deliverMu sync.Mutex

	mu      sync.Mutex
	watched map[int32]entry // by socket descriptor
	seq     int32
	closed  bool
}

type entry struct {
	seq    int32
	target Target
}

// Registration is one watched request; Stop it when the request ends.
type Registration struct {
	w   *Watcher
	raw syscall.RawConn
	fd  int32
	seq int32
}

// New returns a Watcher. Its goroutine starts with the first Watch.
func New() (*Watcher, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("cannot create an epoll set: %w", err)
	}
	w := &Watcher{epfd: epfd, done: make(chan struct{}), watched: map[int32]entry{}}
	if err := syscall.Pipe2(w.wake[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		_ = syscall.Close(epfd)
		return nil, fmt.Errorf("cannot create a wake-up pipe: %w", err)
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(w.wake[0]), Pad: -1}
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, w.wake[0], &ev); err != nil {
		w.closeFDs()
		return nil, fmt.Errorf("cannot watch the wake-up pipe: %w", err)
	}
	return w, nil
}

// Watch tells t when c's peer hangs up, until the registration is
// stopped. A peer that already left is reported at once.
func (w *Watcher) Watch(c net.Conn, t Target) (Registration, error) {
	sc, ok := socketOf(c).(syscall.Conn)
	if !ok {
		return Registration{}, ErrUnsupported
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return Registration{}, fmt.Errorf("cannot reach the connection's socket: %w", err)
	}
	w.start.Do(func() { go w.run() })
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return Registration{}, fmt.Errorf("cannot watch a connection: %w", net.ErrClosed)
	}
	w.seq++
	r := Registration{w: w, raw: raw, seq: w.seq}
	var ctlErr error
	// Under Control the descriptor cannot be closed and reused meanwhile.
	cerr := raw.Control(func(fd uintptr) {
		r.fd = int32(fd)
		ev := syscall.EpollEvent{Events: syscall.EPOLLRDHUP | syscall.EPOLLONESHOT, Fd: r.fd, Pad: r.seq}
		ctlErr = syscall.EpollCtl(w.epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev)
		if ctlErr == nil {
			w.watched[r.fd] = entry{seq: r.seq, target: t}
		}
	})
	w.mu.Unlock()
	if err := firstErr(cerr, ctlErr); err != nil {
		return Registration{}, fmt.Errorf("cannot watch the connection: %w", err)
	}
	return r, nil
}

func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// Stop ends the watch. When it returns the target is not being told and
// will not be, so the caller may recycle it. A target must not call Stop.
func (r Registration) Stop() {
	w := r.w
	if w == nil {
		return
	}
	w.mu.Lock()
	pending := false
	if e, ok := w.watched[r.fd]; ok && e.seq == r.seq {
		delete(w.watched, r.fd)
		pending = true
	}
	// A connection closed meanwhile left the set with its descriptor;
	// Control then fails and the descriptor, maybe reused, is left alone.
	// After Close the epoll descriptor itself may be reused: hands off.
	if !w.closed {
		_ = r.raw.Control(func(fd uintptr) {
			_ = syscall.EpollCtl(w.epfd, syscall.EPOLL_CTL_DEL, int(fd), nil)
		})
	}
	w.mu.Unlock()
	if !pending {
		// The run loop took the entry: wait until it has told the target.
		w.deliverMu.Lock()
		//lint:ignore SA2001 an empty section: waiting for the delivery in progress is the point
		w.deliverMu.Unlock()
	}
}

func (w *Watcher) run() {
	defer close(w.done)
	events := make([]syscall.EpollEvent, 64)
	var due []Target
	for {
		n, err := syscall.EpollWait(w.epfd, events, -1)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return
		}
		due = due[:0]
		w.deliverMu.Lock()
		w.mu.Lock()
		for _, ev := range events[:n] {
			if ev.Pad == -1 && ev.Fd == int32(w.wake[0]) {
				w.mu.Unlock()
				w.deliverMu.Unlock()
				return
			}
			if e, ok := w.watched[ev.Fd]; ok && e.seq == ev.Pad {
				delete(w.watched, ev.Fd)
				due = append(due, e.target)
			}
		}
		w.mu.Unlock()
		for _, t := range due {
			t.HangUp()
		}
		w.deliverMu.Unlock()
	}
}

// HangUpAll tells every watched request that its client is gone, as if
// each had hung up, and ends their watches: a server that cuts its
// connections (closing a socket takes it out of the epoll set unreported)
// uses it to make the requests on them stop waiting. It returns once every
// target has been told. A nil Watcher has nothing to tell.
func (w *Watcher) HangUpAll() {
	if w == nil {
		return
	}
	w.deliverMu.Lock()
	defer w.deliverMu.Unlock()
	w.mu.Lock()
	due := make([]Target, 0, len(w.watched))
	for fd, e := range w.watched {
		delete(w.watched, fd)
		due = append(due, e.target)
	}
	w.mu.Unlock()
	for _, t := range due {
		t.HangUp()
	}
}

// Close stops the watcher. Registrations still open are dropped unreported.
// A nil Watcher may be closed.
func (w *Watcher) Close() {
	if w == nil {
		return
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	w.mu.Unlock()
	started := true
	w.start.Do(func() { started = false })
	if started {
		_, _ = syscall.Write(w.wake[1], []byte{1})
		<-w.done
	}
	w.closeFDs()
}

func (w *Watcher) closeFDs() {
	_ = syscall.Close(w.wake[0])
	_ = syscall.Close(w.wake[1])
	_ = syscall.Close(w.epfd)
}
