package epp

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvfast/kvfast/guard"
)

// watchdog releases the booking of a request its gateway leaves waiting:
// routed, but no response headers come, or an answer of the picker's is
// not taken (a gateway that stops reading its stream blocks Send). The
// stream's goroutine is then blocked in Recv or Send, which only the
// gateway can end, so the booking would hold its endpoint's load for as
// long as the gateway liked. The watchdog's timer aborts it from another
// goroutine, which the guard allows; the stream lives on until the
// gateway ends it, and its later transitions find the guard terminal.
//
// One watchdog belongs to one pooled exchange and is armed only around
// its stream's blocking calls, so the timer is made once and reset.
type watchdog struct {
	timer    *time.Timer
	fired    chan struct{} // expire's end, once per firing
	timeouts prometheus.Counter

	mu sync.Mutex   // orders arm's handle before expire's read
	h  guard.Handle // the booking armed for

	armed bool // only the stream's goroutine reads and writes it
}

func newWatchdog(timeouts prometheus.Counter) *watchdog {
	w := &watchdog{fired: make(chan struct{}, 1), timeouts: timeouts}
	w.timer = time.AfterFunc(time.Hour, w.expire)
	w.timer.Stop()
	return w
}

// arm starts the clock on h: unless disarmed within d, h is aborted.
func (w *watchdog) arm(h guard.Handle, d time.Duration) {
	w.mu.Lock()
	w.h = h
	w.mu.Unlock()
	w.armed = true
	w.timer.Reset(d)
}

// disarm stops the clock, waiting for an expiry already under way, so
// that the exchange may release the guard after it.
func (w *watchdog) disarm() {
	if !w.armed {
		return
	}
	w.armed = false
	if !w.timer.Stop() {
		<-w.fired
	}
}

func (w *watchdog) expire() {
	w.mu.Lock()
	h := w.h
	w.mu.Unlock()
	if !h.State().Terminal() && h.State() != guard.Free {
		_ = h.Abort(guard.ReasonTimeout)
		w.timeouts.Inc()
	}
	w.fired <- struct{}{}
}
