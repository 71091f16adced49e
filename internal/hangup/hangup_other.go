//go:build !linux

package hangup

import "net"

// Watcher watches connections for their peer's hang-up; here it cannot.
type Watcher struct{}

// Registration is one watched request.
type Registration struct{}

// New reports ErrUnsupported: this system has no epoll.
func New() (*Watcher, error) { return nil, ErrUnsupported }

// Watch reports ErrUnsupported.
func (w *Watcher) Watch(net.Conn, Target) (Registration, error) {
	return Registration{}, ErrUnsupported
}

// Stop does nothing.
func (Registration) Stop() {}

// HangUpAll does nothing: nothing is watched.
func (w *Watcher) HangUpAll() {}

// Close does nothing.
func (w *Watcher) Close() {}
