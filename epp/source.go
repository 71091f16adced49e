package epp

import (
	"context"
	"fmt"
	"net"
	"slices"
)

// Endpoint is one engine the gateway can forward to: a pod of the
// InferencePool, or one statically configured.
type Endpoint struct {
	// Address is "ip:port", as the gateway forwards to it and as the
	// destination header names it.
	Address string
	// Events is the engine's ZMQ KV-event PUB socket (tcp://ip:port), ""
	// if it publishes none; Replay its replay socket, "" if none.
	Events, Replay string
	// Name says which pod it is, for the log; it may be empty.
	Name string
}

// Check reports whether e can be routed to.
func (e Endpoint) Check() error {
	if _, _, err := net.SplitHostPort(e.Address); err != nil {
		return fmt.Errorf("cannot use endpoint %q: want ip:port: %w", e.Address, err)
	}
	if e.Events == "" && e.Replay != "" {
		return fmt.Errorf("cannot use endpoint %s: a replay socket belongs to an event feed", e.Address)
	}
	return nil
}

// Source says which endpoints the pool has now. Run polls it; an error
// keeps the endpoints of the last answer that succeeded.
type Source interface {
	Endpoints(ctx context.Context) ([]Endpoint, error)
}

// Static is a fixed list of endpoints.
type Static []Endpoint

// Endpoints returns the list.
func (s Static) Endpoints(context.Context) ([]Endpoint, error) { return slices.Clone(s), nil }
