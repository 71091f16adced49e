package rigtest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/kvfast/kvfast/internal/rig"
	"github.com/kvfast/kvfast/node"
)

// Config is a router configuration for tests: node.DefaultConfig with
// indexes of 16K entries (the defaults, a million each, cost more to
// allocate under the race detector than most tests take to run), health
// probes off (no background traffic the test did not ask for), logs
// discarded, the admin endpoints on the API listener, and the registry polled every 10 ms so that engines join
// quickly.
func Config() node.Config {
	cfg := node.DefaultConfig()
	cfg.AdminListen = "" // admin endpoints on the rig's one listener
	cfg.Segment.IndexCapacity = 1 << 14
	cfg.Approx.Capacity = 1 << 14
	cfg.Dispatch.Health.Interval = 0 // no health checks
	cfg.RegistryPoll = 10 * time.Millisecond
	cfg.Logger = slog.New(slog.DiscardHandler)
	return cfg
}

// Start starts a rig, fails the test if it cannot, and closes it when the
// test ends, failing the test if the teardown reports an error.
func Start(tb testing.TB, cfg rig.Config) *rig.Rig {
	tb.Helper()
	r, err := rig.Start(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("cannot start the rig: %v", err)
	}
	tb.Cleanup(func() {
		if err := r.Close(); err != nil {
			tb.Errorf("rig teardown: %v", err)
		}
	})
	return r
}
