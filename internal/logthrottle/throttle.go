package logthrottle

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// maxKeys bounds the keys a Throttle remembers before it forgets quiet ones.
const maxKeys = 4096

// Throttle lets one line per key through per interval.
type Throttle struct {
	interval time.Duration
	now      func() time.Time

	mu   sync.Mutex
	keys map[string]*entry
}

type entry struct {
	last       time.Time // when a line last got through
	suppressed int       // lines held back since
}

// New returns a throttle that lets a key's line through at most once per
// interval.
func New(interval time.Duration) *Throttle {
	return &Throttle{interval: interval, now: time.Now, keys: map[string]*entry{}}
}

// Allow reports whether a line under key may be written now and, if so,
// how many lines under key it held back since the last one.
func (t *Throttle) Allow(key string) (ok bool, suppressed int) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.keys[key]
	if e == nil {
		if len(t.keys) >= maxKeys {
			t.forgetQuiet(now)
		}
		t.keys[key] = &entry{last: now}
		return true, 0
	}
	if now.Sub(e.last) < t.interval {
		e.suppressed++
		return false, 0
	}
	suppressed = e.suppressed
	e.last, e.suppressed = now, 0
	return true, suppressed
}

func (t *Throttle) forgetQuiet(now time.Time) {
	for k, e := range t.keys {
		if now.Sub(e.last) >= t.interval {
			delete(t.keys, k)
		}
	}
}

// Log writes msg with args at level to log unless a line under key got
// through within the interval; a line that follows held-back ones carries
// their count as "repeated".
func (t *Throttle) Log(log *slog.Logger, level slog.Level, key, msg string, args ...any) {
	ok, suppressed := t.Allow(key)
	if !ok {
		return
	}
	if suppressed > 0 {
		args = append(args, "repeated", suppressed)
	}
	log.Log(context.Background(), level, msg, args...)
}
