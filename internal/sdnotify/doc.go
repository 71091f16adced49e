// Package sdnotify tells systemd about the router's state: the sd_notify
// protocol, a datagram of NAME=value lines sent to the unix socket named
// by $NOTIFY_SOCKET, which a unit of Type=notify sets.
//
// # Responsibility
//
// Only the sending: node.Run decides what to say and when (READY=1 once
// it serves, STATUS= when it has settled, STOPPING=1 at shutdown).
// Without $NOTIFY_SOCKET, as outside systemd, it does nothing. It is a few
// lines of the protocol rather than a dependency.
//
// # Ownership and concurrency
//
// It holds nothing between calls: each Notify dials, sends one datagram
// and closes, so it is safe from any goroutine.
package sdnotify
