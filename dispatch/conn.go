package dispatch

import (
	"errors"
	"net"
	"sync"
	"time"
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
	// awaiting is set when a request was written and no byte of the
	// response has come back yet: the first-byte timeout applies.
	awaiting    bool
	hasDeadline bool
	// ending, when set, bounds the reads that follow a stream's [DONE]:
	// all that may still come is the end of the body (expectEnd).
	ending time.Duration
	set    *connSet
	// used: the connection has carried a request (roundtrip.go's stale
	// retry applies only to such a one).
	used bool
}

// Close forgets the connection in its engine's set and closes it.
func (c *engineConn) Close() error {
	c.set.remove(c)
	return c.Conn.Close()
}

func (c *engineConn) Write(p []byte) (int, error) {
	c.awaiting, c.ending = true, 0
	return c.Conn.Write(p)
}

// expectEnd bounds the reads until the next request by d: the response has
// said its last word, and an engine that does not end the body soon after
// is not waited for.
func (c *engineConn) expectEnd(d time.Duration) { c.ending = d }

func (c *engineConn) Read(p []byte) (int, error) {
	awaiting := c.awaiting
	d := c.idle
	if awaiting {
		d = c.firstByte
	}
	if c.ending > 0 && (d <= 0 || c.ending < d) {
		d = c.ending
	}
	if d > 0 {
		if err := c.Conn.SetReadDeadline(time.Now().Add(d)); err != nil {
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
	if n > 0 {
		c.awaiting = false
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
