package soak

import (
	"context"
	"os"
	"testing"
	"time"
)

// TestSoak runs the soak for KVFAST_SOAK (a duration, e.g. 2m); make test
// sets it to two minutes and runs this test on its own, without the race
// detector, whose memory would swamp the RSS bound. Unset, it is skipped.
func TestSoak(t *testing.T) {
	d := os.Getenv("KVFAST_SOAK")
	if d == "" {
		t.Skip("KVFAST_SOAK not set (make test runs a two-minute soak)")
	}
	dur, err := time.ParseDuration(d)
	if err != nil {
		t.Fatalf("KVFAST_SOAK=%q: %v", d, err)
	}
	rep, err := Run(context.Background(), Config{Duration: dur, Seed: 1})
	t.Logf("soak report:\n%s", rep)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests == 0 || rep.Outcomes["ok"] == 0 {
		t.Fatalf("the soak sent %d requests, %d of them answered: nothing was soaked", rep.Requests, rep.Outcomes["ok"])
	}
	for _, kind := range []string{"engine-restart", "router-restart", "body-flood", "idle-flood"} {
		if rep.Faults[kind] == 0 && dur >= time.Minute {
			t.Errorf("no %s was injected", kind)
		}
	}
}
