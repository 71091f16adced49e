package dispatch

import (
	"errors"
	"net"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// engineConn enforces the first-byte and idle timeouts on one pooled engine
// connection. fasthttp only knows a deadline for the whole response, which
// a long stream would outlive; so the connection sets its own read deadline
// before every read, from what the connection is waiting for, and ignores
// fasthttp's.
//
// A connection serves one request at a time and fasthttp hands it from the
// goroutine that sends the request to the one that reads the streamed body
// with a happens-before edge, so its fields need no synchronisation. Close,
// the only method called concurrently (to cancel a stream), touches only
// the engine's connection set, which locks.
type engineConn struct {
	net.Conn
	firstByte, idle time.Duration
	// awaiting is set from the request's forwarding until its response's
	// headers are read (gotHeaders), and for an event stream until its
	// body's first bytes: the first-byte timeout applies, as one deadline,
	// headersBy, so that an engine dribbling its headers a byte at a time
	// cannot stretch it. vLLM's API server sends a stream's headers at
	// once and its first event after queueing and prefill, which may take
	// minutes: the wait for a first token is the first-byte timeout's,
	// streamed or not, not a pause inside an answer under way.
	awaiting    bool
	bodyFirst   bool // awaiting a stream's first body bytes, its headers read
	headersBy   time.Time
	hasDeadline bool
	// endBy, when set, bounds the reads that follow a stream's [DONE]:
	// all that may still come is the end of the body (expectEnd). It is a
	// deadline, not a timeout per read, so that an engine that goes on
	// sending after [DONE] is cut all the same.
	endBy time.Time
	// pieceBy, when set, is when the piece of the answer being read (one
	// event of a stream, or a plain answer's body) must be whole: its
	// first byte's arrival plus the idle timeout, so that an engine
	// dribbling it a byte at a time, each byte resetting the idle
	// timeout, cannot hold the request for hours.
	pieceBy time.Time
	set     *connSet
	// used: the connection has carried a request (roundtrip.go's stale
	// retry applies only to such a one).
	used bool
	// raw and peek look for bytes on an idle connection (unsolicited).
	raw      syscall.RawConn
	peek     func(fd uintptr)
	peekN    uintptr
	peekErr  syscall.Errno
	peekByte [1]byte
}

// Close forgets the connection in its engine's set and closes it.
func (c *engineConn) Close() error {
	c.set.remove(c)
	return c.Conn.Close()
}

// forwarding starts a request's round trip: until gotHeaders, reads are
// bounded by the first-byte timeout from now.
func (c *engineConn) forwarding() {
	c.awaiting, c.bodyFirst, c.endBy, c.headersBy, c.pieceBy = true, false, time.Time{}, time.Time{}, time.Time{}
	if c.firstByte > 0 {
		c.headersBy = time.Now().Add(c.firstByte)
	}
}

// gotHeaders ends the first-byte timeout: the response's status and
// headers have been read, and the body's reads are bounded by the idle
// timeout. For a stream none of whose body was read with its headers
// (bodyPending), it ends with the body's first bytes instead.
func (c *engineConn) gotHeaders(bodyPending bool) { c.awaiting, c.bodyFirst = bodyPending, bodyPending }

// awaitBodyBy brings the deadline of a stream's first bytes forward to t,
// a bound of the call's own (Call.DoWithin).
func (c *engineConn) awaitBodyBy(t time.Time) {
	if c.bodyFirst && (c.headersBy.IsZero() || t.Before(c.headersBy)) {
		c.headersBy = t
	}
}

// expectEnd bounds the reads until the next request by d from now: the
// response has said its last word, and an engine that does not end the
// body soon after is not waited for. A later call can only shorten the
// bound (the relay repeats it after [DONE], which shortens the one the
// last finish_reason set).
func (c *engineConn) expectEnd(d time.Duration) {
	if by := time.Now().Add(d); c.endBy.IsZero() || by.Before(c.endBy) {
		c.endBy = by
	}
}

// pieceStarted starts the clock of a piece of the answer (pieceBy);
// pieceEnded stops it.
func (c *engineConn) pieceStarted() {
	if c.idle > 0 {
		c.pieceBy = time.Now().Add(c.idle)
	}
}

func (c *engineConn) pieceEnded() { c.pieceBy = time.Time{} }

// pieceDelayed moves a running piece's deadline d later.
func (c *engineConn) pieceDelayed(d time.Duration) {
	if !c.pieceBy.IsZero() {
		c.pieceBy = c.pieceBy.Add(d)
	}
}

func (c *engineConn) Read(p []byte) (int, error) {
	awaiting := c.awaiting
	var deadline time.Time
	switch {
	case awaiting:
		deadline = c.headersBy // zero when the first-byte timeout is off
	case c.idle > 0:
		deadline = time.Now().Add(c.idle)
	}
	if !c.endBy.IsZero() && (deadline.IsZero() || c.endBy.Before(deadline)) {
		deadline = c.endBy
	}
	if !awaiting && !c.pieceBy.IsZero() && (deadline.IsZero() || c.pieceBy.Before(deadline)) {
		deadline = c.pieceBy
	}
	if !deadline.IsZero() {
		if err := c.Conn.SetReadDeadline(deadline); err != nil {
			return 0, err
		}
		c.hasDeadline = true
	} else if c.hasDeadline {
		if err := c.Conn.SetReadDeadline(time.Time{}); err != nil {
			return 0, err
		}
		c.hasDeadline = false
	}
	n, err := c.Conn.Read(p)
	if n > 0 && c.bodyFirst {
		c.awaiting, c.bodyFirst = false, false
	}
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			if awaiting {
				return n, errFirstByte
			}
			return n, errIdle
		}
	}
	return n, err
}

// unsolicited reports whether an idle pooled connection has something to
// read, or was closed by its engine: bytes that no request asked for (an
// engine that sent more than its response's framing said, or a second
// response) would be read as the next request's answer, handing one
// client another's completion. Such a connection is not reused. It costs
// one non-blocking recv with MSG_PEEK and allocates nothing.
func (c *engineConn) unsolicited() bool {
	if c.raw == nil {
		return false
	}
	c.peekN, c.peekErr = 0, 0
	// Control, not Read: Read would refuse at once under the read
	// deadline the last response left (a stream's end grace), and this
	// never waits anyway.
	if err := c.raw.Control(c.peek); err != nil {
		return true // closed under us
	}
	switch {
	case c.peekErr == syscall.EAGAIN:
		return false // nothing waiting: a clean idle connection
	case c.peekErr != 0, c.peekN == 0: // an error, or the engine closed it (EOF)
		return true
	}
	return true // bytes nobody asked for
}

// peekOnce is c.peek: one non-blocking MSG_PEEK recv of a byte.
func (c *engineConn) peekOnce(fd uintptr) {
	n, _, errno := syscall.Syscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&c.peekByte[0])), 1,
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	c.peekN, c.peekErr = n, errno
}

// SetReadDeadline ignores fasthttp's deadlines: Read owns them.
func (c *engineConn) SetReadDeadline(time.Time) error { return nil }

// SetDeadline keeps fasthttp's write deadline and drops its read deadline.
func (c *engineConn) SetDeadline(t time.Time) error { return c.Conn.SetWriteDeadline(t) }

// connTimeout is what engineConn.Read returns when a deadline passes. It is
// a net.Error with Timeout() true, as fasthttp expects of a timeout.
type connTimeout struct{ kind error }

func (e *connTimeout) Error() string   { return e.kind.Error() }
func (e *connTimeout) Unwrap() error   { return e.kind }
func (e *connTimeout) Timeout() bool   { return true }
func (e *connTimeout) Temporary() bool { return false }

var (
	errFirstByte = &connTimeout{ErrFirstByteTimeout}
	errIdle      = &connTimeout{ErrIdleTimeout}
)

// dialError marks a failure to establish a connection, the one failure that
// lets a request go to another worker.
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

func dialEngine(addr string, connect, firstByte, idle time.Duration, set *connSet) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, connect)
	if err != nil {
		return nil, &dialError{err}
	}
	ec := &engineConn{Conn: c, firstByte: firstByte, idle: idle, set: set}
	if sc, ok := c.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			ec.raw = raw
			ec.peek = ec.peekOnce // bound once: a method value per check would allocate
		}
	}
	if !set.add(ec) {
		_ = c.Close()
		return nil, &dialError{errAbandoned}
	}
	return ec, nil
}

// errAbandoned refuses a connection to an engine Pool.Abandon gave up.
var errAbandoned = errors.New("the router gave the engine up as gone")

// connSet is an engine's open connections. Dialing and closing a
// connection touch it, not a request: a keep-alive connection carries
// many.
type connSet struct {
	mu        sync.Mutex
	conns     map[*engineConn]struct{}
	abandoned bool
}

// add records c, unless the engine was abandoned meanwhile.
func (s *connSet) add(c *engineConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.abandoned {
		return false
	}
	if s.conns == nil {
		s.conns = make(map[*engineConn]struct{})
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *connSet) remove(c *engineConn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// closeAll closes every connection and refuses new ones. A read or write
// the close breaks reports net.ErrClosed, an engine failure.
func (s *connSet) closeAll() {
	s.mu.Lock()
	s.abandoned = true
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()
	for c := range conns {
		_ = c.Conn.Close()
	}
}
