package hangup

import (
	"errors"
	"net"
)

// Target is told when the watched connection's peer hangs up.
type Target interface{ HangUp() }

// ErrUnsupported: the system has no way to watch connections (no epoll),
// or the connection is not a socket.
var ErrUnsupported = errors.New("kvfast: watching client connections is not supported here")

// socketOf returns the socket under c, unwrapping connections that expose
// theirs (NetConn, as crypto/tls and connection-limiting wrappers do).
func socketOf(c net.Conn) net.Conn {
	for range 8 {
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return c
		}
		c = u.NetConn()
	}
	return c
}
