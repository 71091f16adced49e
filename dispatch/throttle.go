package dispatch

import (
	"math/bits"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/internal/clock"
	"github.com/kvfast/kvfast/workers"
)

// An engine that answers 429 has said it is overloaded, and usually for
// how long (Retry-After). Each of its answers is retried elsewhere
// (Failed), but without a memory of it, every request's first attempt
// would still go there and cost a round trip: an engine shedding load
// answers fast, so it looks the least loaded of all. The pool remembers
// the engine's Retry-After instead, bounded, and the caller keeps
// requests off throttled engines while another can take them (Throttled).
// It is no verdict on the engine's health: nothing is ejected, and a
// request that only a throttled engine can serve still goes there.
const (
	// DefaultThrottle is how long an engine that answered 429 without a
	// usable Retry-After is avoided: long enough to spare its next
	// requests' round trips, short enough that a node of such engines
	// finds out soon that one has room again.
	DefaultThrottle = time.Second
	// MaxThrottle bounds an engine's Retry-After: an engine asking for
	// minutes is asked again sooner, and its next 429 says more.
	MaxThrottle = 30 * time.Second
)

// throttleFor returns how long an engine that answered resp (a 429) asks
// not to be sent requests: its Retry-After in delta-seconds or as an HTTP
// date, bounded by MaxThrottle; DefaultThrottle without a usable one. A
// Retry-After of 0 asks for nothing.
func throttleFor(resp *fasthttp.ResponseHeader, now time.Time) time.Duration {
	v := resp.Peek("Retry-After")
	if len(v) == 0 {
		return DefaultThrottle
	}
	if n, err := fasthttp.ParseUint(v); err == nil {
		return time.Duration(min(n, int(MaxThrottle/time.Second))) * time.Second
	} else if allDigits(v) {
		return MaxThrottle // too many seconds to count: a long time
	}
	if t, err := fasthttp.ParseHTTPDate(v); err == nil {
		return min(max(t.Sub(now), 0), MaxThrottle)
	}
	return DefaultThrottle
}

// throttle keeps e out of first choice until d from now, unless an
// earlier 429 asked for longer.
func (e *Engine) throttle(d time.Duration) {
	e.throttles.Add(1)
	if d <= 0 {
		return
	}
	until := clock.Now() + int64(d)
	for {
		cur := e.throttledUntil.Load()
		if cur >= until || e.throttledUntil.CompareAndSwap(cur, until) {
			break
		}
	}
	// After the deadline, so that Throttled never sees the bit without it.
	e.pool.throttled.Or(uint64(workers.SetOf(e.slot)))
}

// Throttled returns the workers whose engines asked, with a 429, not to be
// sent requests for a while that has not passed yet. It allocates nothing:
// the request path calls it for every request, and it is nearly always
// empty.
func (p *Pool) Throttled() workers.Set {
	set := workers.Set(p.throttled.Load())
	if set == 0 {
		return 0
	}
	now := clock.Now()
	for bs := uint64(set); bs != 0; bs &= bs - 1 {
		slot := workers.Slot(bits.TrailingZeros64(bs))
		if e := p.engines[slot].Load(); e != nil && e.throttledUntil.Load() > now {
			continue
		}
		set &^= workers.SetOf(slot)
		p.throttled.And(^uint64(workers.SetOf(slot)))
		// A 429 racing with the clearing may have set a new deadline
		// before the bit went: put the bit back for it.
		if e := p.engines[slot].Load(); e != nil && e.throttledUntil.Load() > now {
			p.throttled.Or(uint64(workers.SetOf(slot)))
			set |= workers.SetOf(slot)
		}
	}
	return set
}

// ThrottleStatus is an engine's 429 state, for operators.
type ThrottleStatus struct {
	Throttles uint64        // 429 answers since the engine was added
	Remaining time.Duration // left of the time its last 429s asked for; 0 when none
}

// Throttle returns e's 429 state. It reads atomics only.
func (e *Engine) Throttle() ThrottleStatus {
	return ThrottleStatus{Throttles: e.throttles.Load(), Remaining: max(0, time.Duration(e.throttledUntil.Load()-clock.Now()))}
}

func allDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return len(b) > 0
}
