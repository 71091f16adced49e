package sched

import (
	"maps"
	"sync/atomic"
	"unicode"
	"unicode/utf8"

	"github.com/kvfast/kvfast/internal/clock"
	"github.com/kvfast/kvfast/workers"
)

// WorkerInfo describes one engine rank. The shm registry and the static
// configuration both feed it in through Upsert.
type WorkerInfo struct {
	ID               uint64
	DPRank           uint32
	Slot             workers.Slot
	Model            string
	Endpoint         string
	BlockSize        int          // 0 means the router's block size; anything else must equal it
	KVCapacityBlocks uint64       // 0 if unknown (the load page's total is used instead)
	Role             workers.Role // disaggregated serving's part for the worker (roles.go)
	// BootstrapPort is an SGLang prefill engine's bootstrap port, when it
	// is not the one every prefill engine uses (co-located engines each
	// need their own); 0: the router's --disagg-bootstrap-port.
	BootstrapPort int
	// Generation tells apart successive engines of one identity in one
	// slot (the shm registry bumps it when an engine re-registers, as a
	// restarted one does): a new value is a new engine, whose cache,
	// timing and progress start afresh. Static workers leave it 0.
	Generation uint32
}

type workerKey struct {
	id   uint64
	rank uint32
}

// workerSet is an immutable snapshot of the worker identities. Selection
// loads it with one atomic read; writers copy, edit and publish a new one.
// Changes are rare (workers join and leave), selections are not.
type workerSet struct {
	present workers.Set
	info    [workers.Max]WorkerInfo
	bySlot  map[workerKey]workers.Slot
	byModel map[string]workers.Set
	// onlyPrefill, onlyDecode and onlyEncode are the workers whose workers.Role
	// excludes the other stages (roles.go); workers.RoleBoth workers are in none.
	onlyPrefill, onlyDecode, onlyEncode workers.Set
}

func (ws *workerSet) clone() *workerSet {
	c := *ws
	c.bySlot = maps.Clone(ws.bySlot)
	c.byModel = maps.Clone(ws.byModel)
	return &c
}

func (ws *workerSet) drop(w workers.Slot) {
	if !ws.present.Has(w) {
		return
	}
	old := ws.info[w]
	delete(ws.bySlot, workerKey{old.ID, old.DPRank})
	if m := ws.byModel[old.Model] &^ workers.SetOf(w); m != 0 {
		ws.byModel[old.Model] = m
	} else {
		delete(ws.byModel, old.Model)
	}
	ws.present &^= workers.SetOf(w)
	ws.setRole(w, workers.RoleBoth)
	ws.info[w] = WorkerInfo{}
}

// workerLive is the per-slot state that changes on every request: the
// router's own bookings, the engine's load page and the slot's last
// round-robin turn. Fixed per slot and atomic, so selection reads it
// without locks; exactly 64 bytes (TestLayoutSizes) so that different
// workers' counters mostly sit on different cache lines.
type workerLive struct {
	activeBlocks  atomic.Int64 // distinct prompt blocks of in-flight requests
	outputUnits   atomic.Int64 // output blocks × outputUnit, after decay
	prefillTokens atomic.Int64 // booked prompt tokens awaiting their first output token
	requests      atomic.Int64
	running       atomic.Uint32
	waiting       atomic.Uint32
	kvUsed        atomic.Uint64
	kvTotal       atomic.Uint64
	lastTurn      atomic.Uint64 // Scheduler.turns when round-robin last picked the slot; 0: never
}

// outputUnit is the fixed-point scale of output blocks, so that decayed
// fractional charges add and subtract exactly and every counter returns to
// zero when its requests finish.
const outputUnit = 1024

// WorkerLoad is a snapshot of one worker's load.
type WorkerLoad struct {
	Healthy bool
	// Stalled: requests have waited on the worker without an answer for
	// longer than CostParams.StallAfter, so its in-flight prompts earn no
	// credit and its free memory does not count (stall.go).
	Stalled bool
	// Router bookings.
	ActiveBlocks  int64   // distinct prompt blocks of in-flight requests
	OutputBlocks  float64 // tracked output blocks, after decay
	PrefillTokens int64   // booked prompt tokens still in prefill
	Requests      int64   // in-flight requests
	// The engine's load page.
	EngineRunning, EngineWaiting uint32
	EngineKVUsed, EngineKVTotal  uint64
}

// Upsert adds a worker or updates the one in its slot. A new identity in a
// slot, or a new generation of the same one (a restarted engine), starts
// healthy with its cache, timing and progress reset; re-upserting the same
// identity and generation keeps them.
// Load booked in the slot stays until its requests release it, so a slot
// handed to a new engine briefly carries its predecessor's in-flight load:
// an over-estimate that drains, never a negative count.
func (s *Scheduler) Upsert(w WorkerInfo) error {
	if !w.Slot.Valid() {
		return invalidf("cannot add worker %d rank %d at slot %d", w.ID, w.DPRank, w.Slot)
	}
	if w.BlockSize != 0 && w.BlockSize != s.blockSize {
		return invalidf("cannot add worker %d rank %d with block size %d: the router's --block-size is %d, and every engine's must equal it",
			w.ID, w.DPRank, w.BlockSize, s.blockSize)
	}
	if !printableName(w.Model) {
		// A model name is a metric label, a log field and a JSON string:
		// bytes that are not text would break each (one such label fails
		// every scrape of /metrics). No served model name has them.
		return invalidf("cannot add worker %d rank %d serving model %q: the name is not printable UTF-8",
			w.ID, w.DPRank, w.Model)
	}
	w.BlockSize = s.blockSize
	s.wmu.Lock()
	old := s.workers.Load()
	key := workerKey{w.ID, w.DPRank}
	if at, ok := old.bySlot[key]; ok && at != w.Slot {
		s.wmu.Unlock()
		return invalidf("cannot add worker %d rank %d at slot %d: it holds slot %d",
			w.ID, w.DPRank, w.Slot, at)
	}
	prev := &old.info[w.Slot]
	same := old.present.Has(w.Slot) && prev.ID == w.ID && prev.DPRank == w.DPRank && prev.Generation == w.Generation
	ws := old.clone()
	ws.drop(w.Slot)
	ws.present |= workers.SetOf(w.Slot)
	ws.info[w.Slot] = w
	ws.bySlot[key] = w.Slot
	ws.byModel[w.Model] |= workers.SetOf(w.Slot)
	ws.setRole(w.Slot, w.Role)
	if !same {
		s.healthy.Or(uint64(workers.SetOf(w.Slot)))
		live := &s.live[w.Slot]
		live.running.Store(0)
		live.waiting.Store(0)
		live.kvUsed.Store(0)
		live.kvTotal.Store(0)
		// A new engine in the slot may be another model or GPU: its
		// timing is learnt afresh.
		s.calib[w.Slot].reset()
		s.written[w.Slot].Store(0)
		s.progress[w.Slot].renew(clock.Now())
	}
	s.workers.Store(ws)
	s.wmu.Unlock()
	if same {
		s.wakeWaiters()
	} else {
		s.wakeAll()
	}
	return nil
}

// Remove takes the worker in slot out of selection. Requests already booked
// on it keep their accounting until they release.
func (s *Scheduler) Remove(slot workers.Slot) {
	if !slot.Valid() {
		return
	}
	s.wmu.Lock()
	old := s.workers.Load()
	if old.present.Has(slot) {
		ws := old.clone()
		ws.drop(slot)
		s.healthy.And(^uint64(workers.SetOf(slot)))
		s.workers.Store(ws)
	}
	s.wmu.Unlock()
	// Waiters pinned to the worker must learn it is gone.
	s.wakeAll()
}

// SetHealthy marks the worker in slot healthy or not (heartbeats, engine
// health checks). Unhealthy workers are never selected.
func (s *Scheduler) SetHealthy(slot workers.Slot, healthy bool) {
	if !slot.Valid() {
		return
	}
	if healthy {
		if !s.workers.Load().present.Has(slot) {
			return
		}
		s.healthy.Or(uint64(workers.SetOf(slot)))
	} else {
		s.healthy.And(^uint64(workers.SetOf(slot)))
	}
	s.wakeWaiters()
}

// SetEngineLoad records the engine's load page for slot: running and
// waiting requests, KV blocks used and total.
func (s *Scheduler) SetEngineLoad(slot workers.Slot, running, waiting uint32, kvUsed, kvTotal uint64) {
	if !slot.Valid() {
		return
	}
	l := &s.live[slot]
	l.running.Store(running)
	l.waiting.Store(waiting)
	l.kvUsed.Store(kvUsed)
	l.kvTotal.Store(kvTotal)
	s.wakeWaiters()
}

// Resolve maps a (worker id, DP rank) pair to its slot.
func (s *Scheduler) Resolve(id uint64, rank uint32) (workers.Slot, bool) {
	w, ok := s.workers.Load().bySlot[workerKey{id, rank}]
	return w, ok
}

// Worker returns the worker in slot, if any.
func (s *Scheduler) Worker(slot workers.Slot) (WorkerInfo, bool) {
	if !slot.Valid() {
		return WorkerInfo{}, false
	}
	ws := s.workers.Load()
	return ws.info[slot], ws.present.Has(slot)
}

// Serves reports whether some worker, healthy or not, serves model.
func (s *Scheduler) Serves(model []byte) bool {
	return s.workers.Load().byModel[string(model)] != 0
}

// ModelWorkers returns the workers that serve model, healthy or not.
func (s *Scheduler) ModelWorkers(model string) workers.Set { return s.workers.Load().byModel[model] }

// Workers returns the set of slots holding a worker.
func (s *Scheduler) Workers() workers.Set { return s.workers.Load().present }

// Load returns slot's current load. It also answers for a removed slot,
// whose bookings drain as their requests finish.
func (s *Scheduler) Load(slot workers.Slot) WorkerLoad {
	if !slot.Valid() {
		return WorkerLoad{}
	}
	l := &s.live[slot]
	return WorkerLoad{
		Healthy:       workers.Set(s.healthy.Load()).Has(slot),
		Stalled:       s.progress[slot].stalled(clock.Now(), s.params.Load().StallAfter),
		ActiveBlocks:  l.activeBlocks.Load(),
		OutputBlocks:  float64(l.outputUnits.Load()) / outputUnit,
		PrefillTokens: l.prefillTokens.Load(),
		Requests:      l.requests.Load(),
		EngineRunning: l.running.Load(),
		EngineWaiting: l.waiting.Load(),
		EngineKVUsed:  l.kvUsed.Load(),
		EngineKVTotal: l.kvTotal.Load(),
	}
}

// busy returns the members of set over a busy threshold, and notes what
// it found at now in each member's busy stretch (busy.go).
func (s *Scheduler) busy(ws *workerSet, set workers.Set, now int64) workers.Set {
	th := s.thresholds.Load()
	if th.DecodeBlocksFraction <= 0 && th.PrefillTokens <= 0 {
		return 0
	}
	out := s.overThreshold(ws, th, set)
	for w := range set.All() {
		s.stretch[w].note(out.Has(w), now)
	}
	return out
}

func (s *Scheduler) overThreshold(ws *workerSet, th *BusyThresholds, set workers.Set) workers.Set {
	var out workers.Set
	for w := range set.All() {
		l := &s.live[w]
		if th.PrefillTokens > 0 && l.prefillTokens.Load() > th.PrefillTokens {
			out |= workers.SetOf(w)
			continue
		}
		if f := th.DecodeBlocksFraction; f > 0 {
			total := l.kvTotal.Load()
			capacity := ws.info[w].KVCapacityBlocks
			if capacity == 0 {
				capacity = total
			}
			decode := float64(l.activeBlocks.Load()) + float64(l.outputUnits.Load())/outputUnit
			if capacity > 0 && decode > f*float64(capacity) ||
				total > 0 && float64(l.kvUsed.Load()) > f*float64(total) {
				out |= workers.SetOf(w)
			}
		}
	}
	return out
}

// printableName reports whether name is valid UTF-8 without control
// characters.
func printableName(name string) bool {
	if !utf8.ValidString(name) {
		return false
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}
