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
