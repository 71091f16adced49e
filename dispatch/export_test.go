package dispatch

import (
	"bufio"
	"time"

	"github.com/valyala/fasthttp"
)

// StreamWriter relays the response and then releases the call, for a test
// server's RequestCtx.SetBodyStreamWriter; fastpath has its own.
func (c *Call) StreamWriter() fasthttp.StreamWriter {
	return func(w *bufio.Writer) {
		_ = c.Relay(w)
		c.Release()
	}
}

// EndEjection ends e's ejection now, as its timer would, so that tests of
// the growing backoff need not wait for it.
func (e *Engine) EndEjection() { e.unEject() }

// Failures is the passive-health failures counted in the current window.
func (e *Engine) Failures() int32 { return e.out.failures.Load() }

// HasUnsolicited reports whether one of e's connections, idle in its pool,
// has bytes waiting, as the next request's acquire would see them.
func (e *Engine) HasUnsolicited() bool {
	e.conns.mu.Lock()
	defer e.conns.mu.Unlock()
	for c := range e.conns.conns {
		if c.unsolicited() {
			return true
		}
	}
	return false
}

// setFinishGrace shortens the grace after a stream's last finish_reason
// for a test, which must not run in parallel with others; the returned
// func restores it.
func setFinishGrace(d time.Duration) (restore func()) {
	old := finishGrace
	finishGrace = d
	return func() { finishGrace = old }
}
