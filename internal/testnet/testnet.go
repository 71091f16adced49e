package testnet

import (
	"net"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// RefusingAddr returns a loopback host:port that refuses connections
// until the test ends. The port is held by a socket bound to it and never
// listening: a port merely listened on and closed (the usual trick) is
// free again, and under load a server of a test running beside this one
// was given it, so that the "dead" engine answered its health checks and
// the test waited for ever for it to fail. The held socket sets no
// SO_REUSEADDR, so no other bind, which Go's listeners make with it, can
// share the port, and a connection to it is reset.
func RefusingAddr(t testing.TB) string {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("cannot hold a refusing port: %v", err)
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("cannot hold a refusing port: %v", err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatalf("cannot hold a refusing port: %v", err)
	}
	in, ok := sa.(*unix.SockaddrInet4)
	if !ok {
		t.Fatalf("cannot hold a refusing port: bound to %T", sa)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(in.Port))
}
