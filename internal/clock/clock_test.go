package clock

import (
	"testing"
	"time"
)

func TestNowIsMonotonic(t *testing.T) {
	a := Now()
	b := Now()
	if b < a {
		t.Fatalf("Now went backwards: %d then %d", a, b)
	}
	if d := Since(a); d < 0 || d > time.Hour {
		t.Fatalf("Since(a) = %v", d)
	}
}

func TestTimeMapsNowToWallClock(t *testing.T) {
	before := time.Now()
	at := Time(Now())
	after := time.Now()
	if at.Before(before) || at.After(after) {
		t.Fatalf("Time(Now()) = %v, want between %v and %v", at, before, after)
	}
}
