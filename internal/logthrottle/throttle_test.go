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

// An engine that left and came back within the interval: the line held
// back last is written once the interval is over, so the log's last word
// on the slot is its state now.
func TestFlushWritesTheLastHeldLine(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	th := NewFlushing(time.Minute)
	clock := time.Unix(1_800_000_000, 0)
	th.now = func() time.Time { return clock }
	th.Log(log, slog.LevelInfo, "member/3", "worker joined", "slot", 3)
	for _, msg := range []string{"worker left", "worker joined", "worker left", "worker joined"} {
		clock = clock.Add(time.Second)
		th.Log(log, slog.LevelInfo, "member/3", msg, "slot", 3)
	}
	clock = clock.Add(time.Second)
	th.Log(log, slog.LevelWarn, "health/3", "engine health changed", "healthy", false)
	clock = clock.Add(time.Second)
	th.Log(log, slog.LevelWarn, "health/3", "engine health changed", "healthy", true)
	th.Flush()
	if n := strings.Count(buf.String(), "\n"); n != 2 {
		t.Fatalf("Flush wrote within the interval:\n%s", buf.String())
	}
	clock = clock.Add(time.Minute)
	buf.Reset()
	th.Flush()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `msg="worker joined"`) || !strings.Contains(lines[0], "held_back=4") ||
		!strings.Contains(lines[1], "healthy=true") || !strings.Contains(lines[1], "held_back=1") {
		t.Fatalf("want the slot's last membership line, then its last health line, each with its count:\n%s", buf.String())
	}
	buf.Reset()
	th.Flush()
	clock = clock.Add(time.Minute)
	th.Flush()
	if buf.Len() != 0 {
		t.Fatalf("a flushed line was written again:\n%s", buf.String())
	}
	if th.held != 0 {
		t.Fatalf("%d held lines counted after the flush", th.held)
	}
}

// A throttle nobody flushes keeps nothing of the lines it holds back.
func TestPlainThrottleKeepsNoLines(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	th := New(time.Minute)
	clock := time.Unix(1_800_000_000, 0)
	th.now = func() time.Time { return clock }
	for range 3 {
		th.Log(log, slog.LevelInfo, "k", "line")
	}
	if th.held != 0 || th.keys["k"].latest != nil {
		t.Fatal("a plain throttle kept a held-back line")
	}
}
