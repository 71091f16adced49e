package sdnotify

import (
	"fmt"
	"net"
	"os"
)

// Notify sends state (one or more NAME=value lines, such as "READY=1") to
// the service manager. It reports whether a manager was there to tell:
// false, with a nil error, when $NOTIFY_SOCKET is unset.
func Notify(state string) (bool, error) {
	socket := os.Getenv("NOTIFY_SOCKET")
	if socket == "" {
		return false, nil
	}
	// A name starting with @ is in the abstract namespace; Go's net
	// package reads the @ that way on Linux.
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err != nil {
		return false, fmt.Errorf("cannot reach the service manager at %s: %w", socket, err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return false, fmt.Errorf("cannot notify the service manager: %w", err)
	}
	return true, nil
}
