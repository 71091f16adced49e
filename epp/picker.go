package epp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfast/kvfast/feed"
	"github.com/kvfast/kvfast/guard"
	"github.com/kvfast/kvfast/internal/logthrottle"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/workers"
)

// Picker is the routing state of one pool: the KV index its endpoints'
// events feed, the approximate index, the scheduler and the guards, and
// which endpoint holds which slot.
type Picker struct {
	cfg Config
	log *slog.Logger
	// throttle keeps what clients and nodes can make repeat at will
	// (refusals, failed node queries) to a line a minute per kind.
	throttle  *logthrottle.Throttle
	index     *radix.Index
	approx    *radix.Approx
	sched     *sched.Scheduler
	guards    *guard.Pool
	nodes     *http.Client // asks the nodes' routers (Config.QueryNodes)
	useApprox bool
	seed      uint64 // the base model's namespace

	// slots is the request path's view of membership: address → slot.
	slots atomic.Pointer[map[string]workers.Slot]
	// adapters is the request path's view of which endpoints list which
	// LoRA adapter of the pool's model (adapters.go).
	adapters atomic.Pointer[map[string]workers.Set]
	// sglang is the endpoints whose engines say they are SGLang (a
	// workers.Set), which alone read SGLang's spellings of an adapter.
	sglang atomic.Uint64
	// silent are the members without an event feed (a workers.Set): their
	// exact prompts route on the router's own history.
	silent atomic.Uint64
	// synced is closed by the first Sync: the picker is ready.
	synced   chan struct{}
	syncOnce sync.Once

	mu      sync.Mutex // serialises Sync and Close
	members map[string]*member
	nextID  uint64
	ctx     context.Context // the subscribers' parent; Close cancels it
	stop    context.CancelFunc
	closed  bool
}

// member is one endpoint in the pool, with its event subscriber.
type member struct {
	ep   Endpoint
	slot workers.Slot
	sub  *feed.ZMQSubscriber // nil without events
	stop context.CancelFunc  // ends the subscriber; nil without one
	done chan struct{}       // closed when the subscriber has returned
}

// NewPicker builds the routing state cfg describes. It has no endpoints
// until Sync (or Run) gives it some; Close stops what Sync started.
func NewPicker(cfg Config) (*Picker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.DestinationNamespace == "" {
		cfg.DestinationNamespace = DefaultDestinationNamespace
	}
	if cfg.SubsetNamespace == "" {
		cfg.SubsetNamespace = DefaultSubsetNamespace
	}
	policy, useApprox, err := sched.ParsePolicy(cfg.Policy)
	if err != nil {
		return nil, err
	}
	p := &Picker{cfg: cfg, log: cfg.Logger, throttle: logthrottle.New(time.Minute), useApprox: useApprox, seed: radix.NamespaceSeed(cfg.Model, "", ""),
		synced: make(chan struct{}), members: map[string]*member{}}
	if p.index, err = radix.NewHeap(radix.Config{Capacity: cfg.IndexCapacity}); err != nil {
		return nil, fmt.Errorf("cannot create the index: %w", err)
	}
	if err := p.index.SetWorkerShare(cfg.IndexWorkerShare); err != nil {
		return nil, err
	}
	if p.approx, err = radix.NewApprox(radix.Config{Capacity: cfg.ApproxCapacity}, cfg.ApproxTTL); err != nil {
		return nil, fmt.Errorf("cannot create the approximate index: %w", err)
	}
	scfg := cfg.Sched
	scfg.Policy = policy
	if p.sched, err = sched.New(scfg); err != nil {
		return nil, err
	}
	p.guards = guard.NewPool(p.sched, guard.Observer{})
	if cfg.QueryNodes {
		p.nodes = newNodeClient(cfg.QueryTimeout)
	}
	empty := map[string]workers.Slot{}
	p.slots.Store(&empty)
	none := map[string]workers.Set{}
	p.adapters.Store(&none)
	p.ctx, p.stop = context.WithCancel(context.Background())
	return p, nil
}

// Ready is closed once the picker knows its endpoints (the first Sync).
func (p *Picker) Ready() <-chan struct{} { return p.synced }

// Endpoints returns how many endpoints the picker routes to.
func (p *Picker) Endpoints() int { return len(*p.slots.Load()) }

// Sync makes eps the pool's endpoints: a new one gets a free slot and, if
// it publishes events, a subscriber; one gone is taken out of selection,
// its subscriber stopped and its blocks forgotten; one whose event
// sockets changed is both. Requests booked on a leaving endpoint keep
// their accounting until they end. At most workers.Max endpoints are
// routed; the rest are refused, in the log.
func (p *Picker) Sync(eps []Endpoint) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	want := make(map[string]Endpoint, len(eps))
	for _, e := range eps {
		if err := e.Check(); err != nil {
			p.log.Error("skipping an endpoint", "pod", e.Name, "err", err)
			continue
		}
		want[e.Address] = e
	}
	for addr, m := range p.members {
		if e, ok := want[addr]; !ok || e.Events != m.ep.Events || e.Replay != m.ep.Replay {
			p.leave(m)
			delete(p.members, addr)
		}
	}
	var used workers.Set
	for _, m := range p.members {
		used |= workers.SetOf(m.slot)
	}
	for addr, e := range want {
		if _, ok := p.members[addr]; ok {
			continue
		}
		free := workers.AllSlots &^ used
		if free == 0 {
			p.log.Error("cannot route to more endpoints than there are slots", "max", workers.Max, "endpoint", addr, "pod", e.Name)
			continue
		}
		slot, _ := free.First()
		m, err := p.join(e, slot)
		if err != nil {
			p.log.Error("cannot route to an endpoint", "endpoint", addr, "pod", e.Name, "err", err)
			continue
		}
		used |= workers.SetOf(slot)
		p.members[addr] = m
	}
	slots := make(map[string]workers.Slot, len(p.members))
	var silent workers.Set
	for addr, m := range p.members {
		slots[addr] = m.slot
		if m.sub == nil {
			silent |= workers.SetOf(m.slot)
		}
	}
	p.slots.Store(&slots)
	if p.cfg.QueryNodes {
		silent = 0 // the nodes answer for their engines; no history is kept
	}
	p.silent.Store(uint64(silent))
	p.syncOnce.Do(func() { close(p.synced) })
}

// join adds e in slot: to the scheduler, then its event subscriber.
func (p *Picker) join(e Endpoint, slot workers.Slot) (*member, error) {
	p.nextID++
	m := &member{ep: e, slot: slot}
	if e.Events != "" {
		sub, err := feed.NewZMQSubscriber(p.index, feed.ZMQConfig{Endpoint: e.Events, Replay: e.Replay, Topic: p.cfg.Topic,
			Slot: slot, Model: p.cfg.Model, BlockSize: p.sched.BlockSize(),
			Logger: p.log.With("endpoint", e.Address, "pod", e.Name)})
		if err != nil {
			return nil, fmt.Errorf("cannot subscribe to its events: %w", err)
		}
		m.sub = sub
	}
	if err := p.sched.Upsert(sched.WorkerInfo{ID: p.nextID, Slot: slot, Model: p.cfg.Model, Endpoint: e.Address}); err != nil {
		return nil, err
	}
	if m.sub != nil {
		ctx, stop := context.WithCancel(p.ctx)
		m.stop, m.done = stop, make(chan struct{})
		go func() {
			defer close(m.done)
			if err := m.sub.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				p.log.Error("ZMQ event feed stopped", "endpoint", e.Address, "events", e.Events, "err", err)
			}
		}()
	}
	p.log.Info("endpoint joined", "endpoint", e.Address, "pod", e.Name, "slot", slot, "events", e.Events)
	return m, nil
}

// leave takes m out of selection, stops its subscriber and, once nothing
// writes its slot any more, forgets its blocks so that the slot can be
// given to another endpoint.
func (p *Picker) leave(m *member) {
	p.sched.Remove(m.slot)
	if m.stop != nil {
		m.stop()
		<-m.done
	}
	p.index.RemoveWorker(m.slot)
	p.approx.Forget(m.slot)
	p.log.Info("endpoint left", "endpoint", m.ep.Address, "pod", m.ep.Name, "slot", m.slot)
}

// FeedStats returns each endpoint's event feed counters, by address, for
// the endpoints that publish events.
func (p *Picker) FeedStats() map[string]feed.ZMQStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]feed.ZMQStats, len(p.members))
	for addr, m := range p.members {
		if m.sub != nil {
			out[addr] = m.sub.Stats()
		}
	}
	return out
}

// Run syncs the endpoints src gives every period until ctx ends. A
// failed poll keeps the endpoints of the last one that succeeded.
func (p *Picker) Run(ctx context.Context, src Source, period time.Duration) {
	t := time.NewTimer(0)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		eps, err := src.Endpoints(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			if !failing {
				p.log.Error("cannot list the pool's endpoints; keeping the last list", "err", err)
			}
			failing = true
		case err == nil:
			if failing {
				p.log.Info("listing the pool's endpoints again")
			}
			failing = false
			p.Sync(eps)
		}
		t.Reset(period)
	}
}

// Close stops every subscriber. Requests in flight keep their guards,
// which release their bookings as they end.
func (p *Picker) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	p.stop()
	for _, m := range p.members {
		if m.done != nil {
			<-m.done
		}
	}
}
