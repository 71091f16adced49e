package epp

import (
	"context"
	"net"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/workers"
)

// Test hooks: the picker's scheduler and index, the slot an endpoint
// holds, and how many ext_proc streams are open.

func (p *Picker) Sched() *sched.Scheduler { return p.sched }
func (p *Picker) Index() *radix.Index     { return p.index }

func (p *Picker) SlotOf(addr string) (workers.Slot, bool) {
	w, ok := (*p.slots.Load())[addr]
	return w, ok
}

func (s *Server) OpenStreams() int { return int(testutil.ToFloat64(s.metrics.streams)) }

func (s *Server) NodeQueryFailures() float64 { return testutil.ToFloat64(s.metrics.nodeQueryFails) }

// Serve is Run on listeners the test opened (hln and mln may be nil).
func Serve(ctx context.Context, cfg Config, src Source, l Listeners, ln, hln, mln net.Listener) error {
	return serve(ctx, cfg, src, l, ln, hln, mln)
}

// ScanChunk runs the response's event scan over chunk, on an exchange of
// its own: chunks without a complete data event touch no booking.
func ScanChunk(chunk []byte) { (&exchange{}).scanEvents(chunk) }

// BodyBytes is the body budget in use.
func (s *Server) BodyBytes() int64 { return s.bodyBytes.Load() }
