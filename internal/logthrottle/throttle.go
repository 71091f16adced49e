package logthrottle

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// maxKeys bounds the keys a Throttle remembers before it forgets quiet ones.
const maxKeys = 4096

// Throttle lets one line per key through per interval.
type Throttle struct {
	interval time.Duration
	now      func() time.Time
	keep     bool // hold the last line per key for Flush (NewFlushing)

	mu   sync.Mutex
	keys map[string]*entry
	held int // entries with a held line (Flush's fast path)
}

type entry struct {
	last       time.Time // when a line last got through
	suppressed int       // lines held back since
	latest     *line     // the last line Log held back, for Flush
}

// line is a log line held back, as Log was given it.
type line struct {
	log   *slog.Logger
	level slog.Level
	msg   string
	args  []any
	at    time.Time
}

// New returns a throttle that lets a key's line through at most once per
// interval.
func New(interval time.Duration) *Throttle {
	return &Throttle{interval: interval, now: time.Now, keys: map[string]*entry{}}
}

// NewFlushing is New for a throttle whose owner calls Flush: it keeps the
// last line it held back under each key, which Flush writes once the
// key's interval is over. Keeping costs an allocation per line held back,
// which a throttle never flushed should not pay.
func NewFlushing(interval time.Duration) *Throttle {
	t := New(interval)
	t.keep = true
	return t
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
	if e.latest != nil {
		e.latest = nil
		t.held--
	}
	return true, suppressed
}

func (t *Throttle) forgetQuiet(now time.Time) {
	for k, e := range t.keys {
		if now.Sub(e.last) >= t.interval {
			if e.latest != nil {
				t.held--
			}
			delete(t.keys, k)
		}
	}
}

// Log writes msg with args at level to log unless a line under key got
// through within the interval; a line that follows held-back ones carries
// their count as "repeated".
//
// A flushing throttle (NewFlushing) keeps the line held back last under
// each key, and Flush writes it once the interval is over: a condition
// that changes (an engine that left and came back within the minute)
// must not have the log's last word on it be a state that no longer
// holds.
func (t *Throttle) Log(log *slog.Logger, level slog.Level, key, msg string, args ...any) {
	ok, suppressed := t.Allow(key)
	if !ok {
		if t.keep {
			t.hold(key, &line{log: log, level: level, msg: msg, args: args, at: t.now()})
		}
		return
	}
	if suppressed > 0 {
		args = append(args, "repeated", suppressed)
	}
	log.Log(context.Background(), level, msg, args...)
}

func (t *Throttle) hold(key string, l *line) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.keys[key]
	if e == nil {
		return // forgotten meanwhile
	}
	if e.latest == nil {
		t.held++
	}
	e.latest = l
}

// Flush writes, for every key whose interval is over, the last line Log
// held back under it, with how many were held back in all ("held_back"),
// in the order they were held back. It is cheap when nothing is held;
// call it on a timer (a poll loop) for the log to catch up within one
// interval.
func (t *Throttle) Flush() {
	now := t.now()
	t.mu.Lock()
	if t.held == 0 {
		t.mu.Unlock()
		return
	}
	type due struct {
		l *line
		n int
	}
	var out []due
	for _, e := range t.keys {
		if e.latest == nil || now.Sub(e.last) < t.interval {
			continue
		}
		out = append(out, due{e.latest, e.suppressed})
		e.last, e.suppressed, e.latest = now, 0, nil
		t.held--
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b due) int { return cmp.Compare(a.l.at.UnixNano(), b.l.at.UnixNano()) })
	for _, d := range out {
		d.l.log.Log(context.Background(), d.l.level, d.l.msg, append(d.l.args, "held_back", d.n)...)
	}
}
