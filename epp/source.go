package epp

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/kvfast/kvfast/feed"
	"github.com/kvfast/kvfast/internal/keyvals"
	"github.com/kvfast/kvfast/internal/redact"
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
	// An IP, not a host name: the gateway's original-destination cluster
	// connects to the address named, which the protocol says is ip:port.
	if ap, err := netip.ParseAddrPort(e.Address); err != nil || ap.Port() == 0 {
		return fmt.Errorf("cannot use endpoint %q: want ip:port, an IP address and a port that is not 0", redact.Endpoint(e.Address))
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

// ParseEndpoint reads the --endpoint syntax:
// "ip:port[,zmq=tcp://ip:port[,replay=tcp://ip:port]]".
func ParseEndpoint(v string) (Endpoint, error) {
	addr, list, hasList := strings.Cut(v, ",")
	e := Endpoint{Address: strings.TrimPrefix(strings.TrimSpace(addr), "http://")}
	// The errors show the address redacted and no other part of the value:
	// any item may be the rest of a password cut at a comma.
	shown := redact.Endpoint(e.Address)
	var pairs []keyvals.Pair
	if hasList {
		var err error
		if pairs, err = keyvals.Split(list, map[string]string{"events": "zmq"}); err != nil {
			return e, fmt.Errorf("cannot use endpoint %q: %w", shown, err)
		}
	}
	for i, kv := range pairs {
		k, val := kv.Key, kv.Value
		var err error
		switch k {
		case "zmq", "events":
			e.Events, err = val, feed.CheckZMQEndpoint(val)
		case "replay":
			e.Replay, err = val, feed.CheckZMQEndpoint(val)
		default:
			return e, fmt.Errorf("cannot use the key of item %d after endpoint %q: want zmq or replay", i+2, shown)
		}
		if err != nil {
			return e, fmt.Errorf("cannot parse %s=: %w", k, err) // the error shows the socket redacted
		}
	}
	if e.Replay != "" && e.Replay == e.Events {
		return e, fmt.Errorf("cannot use endpoint %q: replay= must be the engine's replay socket (vLLM's replay_endpoint), not its zmq= event socket", shown)
	}
	return e, e.Check()
}
