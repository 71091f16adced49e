package logthrottle

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestThrottleLetsOneLinePerKeyPerInterval(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	th := New(time.Minute)
	clock := time.Unix(1_800_000_000, 0)
	th.now = func() time.Time { return clock }
	// A poll every 100 ms for 3 s: one line, not thirty.
	for range 30 {
		th.Log(log, slog.LevelWarn, "slot 3", "cannot route to registered worker", "slot", 3)
		th.Log(log, slog.LevelWarn, "slot 4", "cannot route to registered worker", "slot", 4)
		clock = clock.Add(100 * time.Millisecond)
	}
	if n := strings.Count(buf.String(), "\n"); n != 2 {
		t.Fatalf("%d lines for two keys within one interval, want 2:\n%s", n, buf.String())
	}
	clock = clock.Add(time.Minute)
	buf.Reset()
	th.Log(log, slog.LevelWarn, "slot 3", "cannot route to registered worker", "slot", 3)
	if !strings.Contains(buf.String(), "repeated=29") {
		t.Fatalf("the line after the interval does not count the held-back ones: %s", buf.String())
	}
}

func TestThrottleForgetsQuietKeys(t *testing.T) {
	th := New(time.Second)
	clock := time.Unix(1_800_000_000, 0)
	th.now = func() time.Time { return clock }
	for i := range maxKeys {
		th.Allow(string(rune(i)))
	}
	clock = clock.Add(2 * time.Second)
	th.Allow("new")
	if n := len(th.keys); n != 1 {
		t.Fatalf("%d keys remembered after they all went quiet, want 1", n)
	}
}
