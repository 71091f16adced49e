package dispatch

import (
	"net/http"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/workers"
)

func TestThrottleForReadsRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 8, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		header string
		want   time.Duration
	}{
		{"", DefaultThrottle},
		{"5", 5 * time.Second},
		{"0", 0},
		{"3600", MaxThrottle}, // asked again sooner
		{"9223372036854", MaxThrottle},
		{"99999999999999999999", MaxThrottle},
		{"-3", DefaultThrottle},
		{"soon", DefaultThrottle},
		{now.Add(12 * time.Second).Format(http.TimeFormat), 12 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0}, // a date passed asks for nothing
		{now.Add(time.Hour).Format(http.TimeFormat), MaxThrottle},
	} {
		var h fasthttp.ResponseHeader
		if c.header != "" {
			h.Set("Retry-After", c.header)
		}
		if got := throttleFor(&h, now); got != c.want {
			t.Errorf("Retry-After %q: throttled for %v, want %v", c.header, got, c.want)
		}
	}
}

// TestThrottledExpires: a throttled engine returns to Throttled's
// complement once its time passes, and an engine that replaced it in its
// slot starts unthrottled.
func TestThrottledExpires(t *testing.T) {
	p := NewPool(Config{})
	t.Cleanup(p.Close)
	a, err := p.Add(1, "127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Add(2, "127.0.0.1:2")
	if err != nil {
		t.Fatal(err)
	}
	a.throttle(MaxThrottle)
	b.throttle(time.Millisecond)
	b.throttle(0) // counted, but asks for nothing: the earlier time stands
	if got := b.Throttle().Throttles; got != 2 {
		t.Errorf("b's throttles: %d, want 2", got)
	}
	deadline := time.Now().Add(30 * time.Second)
	for p.Throttled() != workers.SetOf(1) {
		if time.Now().After(deadline) {
			t.Fatalf("throttled %b, want only slot 1 once slot 2's millisecond passed", p.Throttled())
		}
		time.Sleep(time.Millisecond)
	}
	if r := a.Throttle().Remaining; r <= 0 || r > MaxThrottle {
		t.Errorf("a's remaining throttle %v, want within (0, %v]", r, MaxThrottle)
	}
	if _, err := p.Add(1, "127.0.0.1:3"); err != nil {
		t.Fatal(err)
	}
	if got := p.Throttled(); got != 0 {
		t.Errorf("throttled %b after slot 1's engine was replaced, want none", got)
	}
}
