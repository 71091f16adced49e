package feed

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfast/kvfast/internal/logthrottle"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
)

// DefaultHeartbeatGrace is how long a registered engine may stay silent
// before it is taken for dead.
const DefaultHeartbeatGrace = 5 * time.Second

// DefaultDownRetention is how long the index keeps the blocks of an
// engine marked down for a stale heartbeat. An engine only paused past
// the grace (stopped, swapped out, a long collection) resumes with its
// cache intact and announces nothing it already holds, so blocks dropped
// at the mark would stay unclaimed until evicted; an engine that is dead
// holds index room it will not use for this long.
const DefaultDownRetention = 2 * time.Minute

// DefaultRepairBudget is how long the index repair at Acquire may take
// before the index is dropped instead. A sound 1M-block index repairs in
// a fraction of a second (BENCHMARKS.md), so the budget is only reached
// by an index far larger than that on a slow host, where starting empty
// costs less than keeping ingestion off.
const DefaultRepairBudget = 10 * time.Second

// Config tunes an Ingester. Zero values take the defaults.
type Config struct {
	// HeartbeatGrace is how long a live worker may go without a heartbeat
	// before it is marked down (routed to no more). Default
	// DefaultHeartbeatGrace.
	HeartbeatGrace time.Duration
	// DownRetention is how long a worker marked down keeps its blocks, and
	// its ring is still applied, in case it resumes; past it the blocks
	// are removed. Default DefaultDownRetention; negative: none, the
	// blocks are removed at the mark.
	DownRetention time.Duration
	// RegistryEvery is how often the registry is rescanned for new,
	// restarted, closed and silent workers. Default 5ms.
	RegistryEvery time.Duration
	// IdleSpin is how long the ingester keeps polling after the last
	// record before it sleeps on the doorbell. Default 50µs.
	IdleSpin time.Duration
	// MaxSleep bounds one sleep: publishers that cannot ring the doorbell
	// (the Python one) are seen at most this late. Default 1ms.
	MaxSleep time.Duration
	// StandbyPoll is how often a router that is not the ingester retries
	// the ingester lock. Default 100ms.
	StandbyPoll time.Duration
	// StallAfter is how long a standby watches events wait in the rings
	// while the holder of the lock consumes none of them before it calls
	// the holder stalled (Stats.IngesterStalled, and a warning once a
	// minute): a router that hangs alive (stopped, stuck) keeps the lock
	// and freezes the index of every router on the segment. Default 30s.
	StallAfter time.Duration
	// Budget caps the records taken from one ring per pass, so one busy
	// worker cannot starve the others; a resync after a gap counts as a
	// sixteenth of it. Default 1024.
	Budget int
	// RepairBudget bounds the index repair Acquire runs; past it, or when
	// the index is damaged beyond repair, the index is reset and refills
	// from the engines' events. Default DefaultRepairBudget.
	RepairBudget time.Duration
	// Logger receives the repair's progress and outcome, and why a
	// worker's entries were dropped (a gap, garbage, a bad cursor), once a
	// minute per worker. Default: discard.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.HeartbeatGrace, DefaultHeartbeatGrace)
	if c.DownRetention == 0 {
		c.DownRetention = DefaultDownRetention
	}
	def(&c.RegistryEvery, 5*time.Millisecond)
	def(&c.IdleSpin, 50*time.Microsecond)
	def(&c.MaxSleep, time.Millisecond)
	def(&c.StandbyPoll, 100*time.Millisecond)
	def(&c.StallAfter, 30*time.Second)
	def(&c.RepairBudget, DefaultRepairBudget)
	if c.Budget <= 0 {
		c.Budget = 1024
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// worker is the ingester's view of one registry slot.
type worker struct {
	gen       uint32 // generation whose blocks the index holds for this slot
	lastSeq   uint64 // mirror of the ring's persisted cursor
	state     shm.WorkerState
	seed      uint64 // namespace seed of the worker's model
	blockSize int
	seen      bool // registry slot read at least once since Acquire
	poisoned  bool // ring held garbage; re-examined once its head moves (poisonHead)
	// poisonHead is the ring's head when it was found to hold garbage: a
	// head that stays wrong (unaligned, past the ring) is not counted
	// again at every scan, only once the producer writes.
	poisonHead uint64
	removed    bool  // RemoveWorker done for a down or closed worker
	downAt     int64 // when this process saw the slot go down (monotonic ns)
	claimAt    int64 // when the slot was first seen Claiming (monotonic ns)
	// resumed: a record was applied since Acquire, so the next one cannot
	// be a predecessor's, cut short by its death and applied again.
	resumed bool
	// beat is the last heartbeat read and beatAt when it was first read
	// (monotonic ns): a heartbeat that has not moved for the grace is
	// stale whatever its value, one from the future included.
	beat, beatAt int64
}

// Ingester applies every worker's ring to the segment's index. Exactly
// one Ingester per segment may run at a time; Run and Acquire enforce it
// with the segment's ingester lock.
type Ingester struct {
	seg *shm.Segment
	ix  *radix.Index
	// mended: the index was repaired (mend) for damage found while
	// ingesting, and not reset since.
	mended  bool
	cfg     Config
	readers [workers.Max]*shm.RingReader
	workers [workers.Max]worker
	apply   applier
	rec     shm.Record // the record being applied; a field so onApply cannot make it escape per call
	c       counters
	pub     published
	// stale: live slots whose heartbeat is past the grace but which could
	// not be marked down (the registry lock was held): the router treats
	// them as down all the same (Stale).
	stale   atomic.Uint64
	held    bool
	lastReg time.Time
	// throttle keeps resyncs that repeat (a ring that keeps overflowing)
	// to one log line a minute per worker.
	throttle *logthrottle.Throttle
	holder   holderWatch // a standby's watch on the lock holder (watchHolder)

	// settled is closed once the first Acquire has decided: the role
	// taken and the index repaired (or reset), or left to another holder.
	settled     chan struct{}
	settledOnce sync.Once

	// onApply, if set, is called after each record is applied and
	// committed. Tests set it to prove exactly-once delivery.
	onApply func(slot workers.Slot, rec *shm.Record)
}

// New returns an ingester for seg, which must have been opened with its
// index (shm.Open).
func New(seg *shm.Segment, cfg Config) *Ingester {
	if seg.Index() == nil {
		panic("BUG: feed: segment opened without its index")
	}
	// No record holds more block hashes than fit in a ring, so the scratch
	// never grows.
	return &Ingester{seg: seg, ix: seg.Index(), cfg: cfg.withDefaults(),
		apply: newApplier(seg.Index(), seg.Header().RingBytes/8), settled: make(chan struct{}),
		throttle: logthrottle.New(time.Minute)}
}

// Settled is closed once the first Acquire (or Run's first attempt) has
// decided: this process took the role and its index is repaired, or
// another process holds the role. Until then the index may be one that a
// dead ingester left half-written, or worse, and the router should not
// call itself ready.
func (in *Ingester) Settled() <-chan struct{} { return in.settled }

func (in *Ingester) settle() { in.settledOnce.Do(func() { close(in.settled) }) }

// Acquire tries to take the ingester role without waiting. On success
// the ingester has made the index safe to write (see repair) and resumes
// every ring from its persisted cursor. When ctx ends during the repair,
// it gives the role back and returns ctx's error.
func (in *Ingester) Acquire(ctx context.Context) (bool, error) {
	if in.held {
		return true, nil
	}
	ok, err := in.seg.TryLockIngester()
	if !ok {
		if err == nil {
			in.settle() // another process ingests and keeps the index
		}
		return false, err
	}
	in.held = true
	// Every start checks: whether the last ingester stopped in the middle
	// of a write (a crash) is not recorded anywhere.
	if err := in.repair(ctx, "checking the index before ingesting (an ingester that stopped mid-write leaves it half written)"); err != nil {
		_ = in.Release()
		return false, err
	}
	for i := range in.readers {
		in.readers[i] = in.seg.Reader(workers.Slot(i))
		gen, last := in.readers[i].Cursor()
		in.workers[i] = worker{gen: gen, lastSeq: last}
		// Before anything else writes the index: the static workers' ZMQ
		// feeds start once this process ingests, and a reserved slot's
		// new generation must not wipe what they write.
		if st, gen, _ := in.seg.SlotState(workers.Slot(i)); st == shm.StateReserved {
			in.reserved(workers.Slot(i), &in.workers[i], gen)
		}
	}
	in.lastReg = time.Time{}
	in.pub.ingesting.Store(true)
	in.publish()
	in.settle()
	return true, nil
}

// repair makes the index safe to write before the first write. A previous
// ingester may have died inside an index write (a half-done deletion
// shift, a parked slot), which radix's Repair undoes; bytes nobody wrote,
// or a repair over the budget, get the index reset instead: engines cannot
// replay what they stored through the segment, so it refills from their
// next events, which is what a resync of one worker does too. Readers go
// on meanwhile. Only the end of ctx (shutdown) is an error.
func (in *Ingester) repair(ctx context.Context, why string) error {
	log := in.cfg.Logger
	start := time.Now()
	st := in.ix.Stats()
	log.Info(why, "entries", st.Entries, "region_bytes", st.RegionBytes, "budget", in.cfg.RepairBudget)
	rctx, cancel := context.WithTimeout(ctx, in.cfg.RepairBudget)
	defer cancel()
	var lastLog time.Time
	n, err := in.ix.Repair(rctx, radix.RepairOptions{Progress: func(p radix.RepairProgress) {
		if now := time.Now(); now.Sub(lastLog) >= time.Second {
			lastLog = now
			log.Info("index repair progress", "phase", p.Phase, "slots_done", p.Done, "slots", p.Total, "elapsed", now.Sub(start).Round(time.Millisecond))
		}
	}})
	in.c.repairedSlots += uint64(n)
	switch {
	case err == nil && n == 0:
		log.Info("index checked: nothing to repair", "entries", in.ix.Stats().Entries, "elapsed", time.Since(start).Round(time.Millisecond))
		return nil
	case err == nil:
		log.Info("index repaired", "dropped_slots", n, "entries", in.ix.Stats().Entries, "elapsed", time.Since(start).Round(time.Millisecond))
		return nil
	case ctx.Err() != nil:
		log.Warn("index repair stopped: shutting down", "elapsed", time.Since(start).Round(time.Millisecond))
		return ctx.Err()
	}
	reason := "damaged beyond repair"
	if !errors.Is(err, radix.ErrBeyondRepair) {
		reason = "repair over its budget"
	}
	in.ix.Reset()
	in.c.indexResets++
	log.Warn("dropped the index: "+reason+"; it refills from the engines' next KV events, and routing meanwhile ignores what they cached before",
		"err", err, "elapsed", time.Since(start).Round(time.Millisecond))
	return nil
}

// mend repairs an index that a write found damaged while ingesting (a
// table full below its limit: some process wrote over the segment), which
// would otherwise refuse every store into that table until a restart, and
// resets it if the damage is found again before the next reset: a repair
// that keeps leaving it is not one to trust.
func (in *Ingester) mend(ctx context.Context) {
	in.cfg.Logger.Warn("the index refuses stores while it has room: its bytes were changed by something other than the ingester; repairing it")
	if in.mended {
		in.ix.Reset()
		in.c.indexResets++
		in.mended = false
		in.cfg.Logger.Warn("dropped the index: damaged again after its repair; it refills from the engines' next KV events")
		return
	}
	resets := in.c.indexResets
	if err := in.repair(ctx, "repairing the index while ingesting"); err == nil && in.c.indexResets == resets {
		in.mended = true
	}
}

// Release gives the ingester role up.
func (in *Ingester) Release() error {
	if !in.held {
		return nil
	}
	in.held = false
	in.pub.ingesting.Store(false)
	return in.seg.UnlockIngester()
}

// Run waits to become the ingester (taking over when the holder dies)
// and then ingests until ctx is done. It returns ctx.Err().
func (in *Ingester) Run(ctx context.Context) error {
	defer in.Release()
	defer in.settle() // on every path: a router that stops is not waiting for this
	// Everything below reads the segment's mapping, which a truncated
	// file makes fault: each step runs guarded, and a step that faulted
	// has detached the segment (shm/fault.go), so the next reads it empty.
	standby := false
	for {
		var ok bool
		var err error
		if !in.seg.Guard(func() { ok, err = in.Acquire(ctx) }) {
			// Faulted half-way (the repair, the cursors): give the role
			// back, and take it again from the start over the detached,
			// empty segment.
			_ = in.Release()
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if ok {
			if standby {
				in.cfg.Logger.Info("took over ingesting the segment's KV events", "segment", in.seg.Path())
			}
			in.pub.holderStalled.Store(false)
			break
		}
		if !standby {
			// Otherwise nothing says why this router's feed counters
			// stay at zero: it routes on the index the other keeps.
			standby = true
			in.cfg.Logger.Info("another router ingests the segment's KV events; this one routes on the index it keeps and takes over if it stops",
				"segment", in.seg.Path(), "ingester_pid", in.seg.Ingester().PID)
		}
		in.seg.Guard(func() { in.watchHolder(time.Now()) })
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(in.cfg.StandbyPoll):
		}
	}
	lastWork := time.Now()
	for ctx.Err() == nil {
		if in.ix.Damaged() {
			in.seg.Guard(func() { in.mend(ctx) })
		}
		var polled int
		in.seg.Guard(func() { polled = in.Poll() })
		if polled > 0 {
			lastWork = time.Now()
			continue
		}
		idle := time.Since(lastWork)
		if idle < in.cfg.IdleSpin {
			runtime.Gosched()
			continue
		}
		sleep := in.cfg.MaxSleep
		if untilReg := in.cfg.RegistryEvery - time.Since(in.lastReg); untilReg < sleep {
			sleep = max(untilReg, time.Microsecond)
		}
		in.seg.Guard(func() { in.seg.WaitForEvents(sleep, in.watched()) })
	}
	return ctx.Err()
}

// holderWatch is a standby's view of the lock holder's progress: the
// rings' consumer cursors as last read, and since when none has moved
// while events waited.
type holderWatch struct {
	tails   [workers.Max]uint64
	idle    time.Time // zero: some cursor moved, or nothing waited, at the last look
	started bool
}

// watchHolder looks, from a standby, whether the holder of the ingester
// lock still consumes the rings. The lock alone cannot say: the kernel
// drops it when its holder dies, not when it hangs alive (stopped, stuck
// in a write), and then no router applies events and every router's
// index goes stale, silently but for the rings' lag. Stalled: events
// waited in some ring, and no cursor moved, for StallAfter.
func (in *Ingester) watchHolder(now time.Time) {
	hw := &in.holder
	moved, waiting := !hw.started, uint64(0)
	for i := range hw.tails {
		st := in.seg.RingState(workers.Slot(i))
		if st.Tail != hw.tails[i] {
			hw.tails[i], moved = st.Tail, true
		}
		// Only a live worker's ring must be consumed: a closed one's
		// rest is left until the slot is registered again. A head that is
		// not 8-aligned is a producer's garbage, which the holder resyncs
		// past to the aligned word below it and then leaves, a few bytes
		// short of it, until the head moves again: no work waiting.
		if state, _, _ := in.seg.SlotState(workers.Slot(i)); state == shm.StateLive && st.Head%8 == 0 {
			waiting += st.Lag()
		}
	}
	hw.started = true
	if moved || waiting == 0 {
		hw.idle = time.Time{}
		in.pub.holderStalled.Store(false)
		return
	}
	if hw.idle.IsZero() {
		hw.idle = now
	}
	if stalled := now.Sub(hw.idle); stalled >= in.cfg.StallAfter {
		in.throttle.Log(in.cfg.Logger, slog.LevelWarn, "holder-stalled",
			"the router that ingests the segment's KV events has applied none of those waiting in its rings: if it is hung (stopped, stuck), stop it and this router takes over; until then every router on the segment routes on a stale index",
			"segment", in.seg.Path(), "ingester_pid", in.seg.Ingester().PID, "stalled_for", stalled.Round(time.Second), "waiting_bytes", waiting)
		in.pub.holderStalled.Store(true) // after the warning, which a reader of the flag may look for
	}
}

// watched is the set of rings Poll would drain.
func (in *Ingester) watched() workers.Set {
	var set workers.Set
	for i := range in.workers {
		if w := &in.workers[i]; w.seen && !w.poisoned {
			set |= workers.SetOf(workers.Slot(i))
		}
	}
	return set
}

// Poll rescans the registry when due and drains every ring once (up to
// Budget records each). It returns the number of records consumed. The
// caller must hold the ingester role (Acquire) and call Poll from one
// goroutine.
func (in *Ingester) Poll() int {
	if !in.held {
		panic("BUG: feed: Poll without the ingester lock")
	}
	if time.Since(in.lastReg) >= in.cfg.RegistryEvery {
		in.scanRegistry()
	}
	n := 0
	for i := range in.readers {
		if w := &in.workers[i]; w.seen && !w.poisoned && in.readers[i].Pending() {
			n += in.drain(workers.Slot(i), w)
		}
	}
	in.publish()
	return n
}

func (in *Ingester) scanRegistry() {
	in.lastReg = time.Now()
	now := shm.MonotonicNow()
	grace := in.cfg.HeartbeatGrace.Nanoseconds()
	for i := range in.workers {
		slot := workers.Slot(i)
		w := &in.workers[i]
		if w.poisoned && in.readers[i].Head() != w.poisonHead {
			w.poisoned = false
		}
		st, gen, beat := in.seg.SlotState(slot)
		if st != shm.StateClaiming {
			w.claimAt = 0
		}
		if st != shm.StateLive {
			in.stale.And(^uint64(workers.SetOf(slot)))
		}
		switch st {
		case shm.StateFree:
			w.state = st
		case shm.StateReserved:
			in.reserved(slot, w, gen)
			// Left by a router that is gone: free for publishers again
			// (closed: emptied at the next scan).
			_, _ = in.seg.ReleaseStale(slot)
		case shm.StateClaiming:
			if w.claimAt == 0 {
				w.claimAt = now
			} else if now-w.claimAt > grace {
				in.seg.ExpireClaim(slot)
			}
		case shm.StateLive:
			if gen != w.gen || !w.seen || w.state != shm.StateLive {
				if !in.adopt(slot, w) {
					continue
				}
			}
			if beat != w.beat || w.beatAt == 0 {
				w.beat, w.beatAt = beat, now
			}
			// A heartbeat ahead of this clock (a publisher's bad clock, a
			// scribble) would never age by its value alone: it is stale
			// too once it has stood still for the grace.
			bit := uint64(workers.SetOf(slot))
			if now-beat > grace || now-w.beatAt > grace {
				if ok, _ := in.seg.MarkDown(slot, gen, beat); ok {
					// Its blocks stay for DownRetention (scanDown): the
					// registry's state keeps the worker out of routing.
					w.state, w.downAt = shm.StateDown, now
					in.c.workersDown++
					in.stale.And(^bit)
				} else if in.stale.Or(bit)&bit == 0 {
					// Another process holds the registry lock (an engine
					// registering takes it for a moment; a hung or hostile
					// one for ever): the dead engine must not stay
					// routable meanwhile.
					in.throttle.Log(in.cfg.Logger, slog.LevelWarn, "stale/"+strconv.Itoa(i),
						"a worker's heartbeat stopped but the registry lock is held elsewhere: it is routed around until it can be marked down",
						"slot", slot, "heartbeat_age", time.Duration(now-beat), "lock_holder_pid", in.seg.RegistryLockHolder())
				}
			} else {
				in.stale.And(^bit)
			}
		case shm.StateDown:
			w.seen = true
			if w.state != st {
				w.state, w.downAt = st, now // down before this process looked, or marked by it
			}
			// Another generation's down slot (a registration that died
			// while claiming it) holds none of these blocks' engine. The
			// heartbeat's age bounds the retention across router restarts,
			// downAt when that heartbeat is from the future.
			retain := in.cfg.DownRetention.Nanoseconds()
			if !w.removed && (gen != w.gen || now-w.downAt > retain || now-beat > grace+retain) {
				in.removeWorker(slot, w)
			}
			if !w.removed && w.blockSize == 0 {
				// Down before this process took over: its ring is still
				// applied, which needs its model and block size (adopt
				// reads them only for a live slot).
				if info, ok := in.seg.Worker(slot); ok && info.Generation == w.gen {
					w.seed, w.blockSize = radix.NamespaceSeed(info.Model, "", ""), info.BlockSize
				}
			}
		case shm.StateClosed:
			w.seen = true
			if !w.removed {
				in.removeWorker(slot, w)
			}
			if w.state != st {
				in.c.workersClosed++
				w.state = st
			}
		}
	}
}

// removeWorker drops every block and engine-hash mapping the index holds
// for a worker that is gone.
func (in *Ingester) removeWorker(slot workers.Slot, w *worker) {
	in.ix.RemoveWorker(slot)
	in.apply.forgetCopies(slot)
	w.removed = true
}

// reserved notes a slot a router reserved for a static worker (its ZMQ
// feed, or nothing, writes its blocks): its ring is not read, and a new
// reservation (a new generation) starts with no blocks, since what the
// index holds for the slot is an earlier engine's.
func (in *Ingester) reserved(slot workers.Slot, w *worker, gen uint32) {
	if gen != w.gen {
		in.ix.RemoveWorker(slot)
		in.apply.forgetCopies(slot)
		in.readers[slot].BeginGeneration(gen)
		w.gen, w.lastSeq = gen, 0
	}
	w.state, w.seen, w.removed = shm.StateReserved, false, false
}

// adopt reads a live slot's registration and, if its generation differs
// from the one whose blocks the index holds, drops those blocks: the
// engine restarted (or another engine took the slot) and its cache is
// gone. It reports false if the slot could not be read consistently.
func (in *Ingester) adopt(slot workers.Slot, w *worker) bool {
	info, ok := in.seg.Worker(slot)
	if !ok || info.State != shm.StateLive {
		return false
	}
	gen := info.Generation
	if gen != w.gen {
		if w.gen != 0 || w.seen {
			in.c.generationBumps++
		}
		in.ix.RemoveWorker(slot)
		in.apply.forgetCopies(slot)
		in.readers[slot].BeginGeneration(gen)
		w.gen, w.lastSeq = gen, 0
	} else if w.state == shm.StateDown {
		// Its publisher revived the registration: the engine was paused,
		// not dead, and still holds what it cached.
		in.c.workersRevived++
		if !w.removed {
			in.throttle.Log(in.cfg.Logger, slog.LevelInfo, "revived/"+strconv.Itoa(int(slot)),
				"a worker marked down resumed: its blocks were kept", "slot", slot, "generation", gen,
				"down_for", time.Duration(shm.MonotonicNow()-w.downAt))
		}
	}
	w.seed = radix.NamespaceSeed(info.Model, "", "")
	w.blockSize = info.BlockSize
	w.state, w.seen, w.removed = shm.StateLive, true, false
	return true
}

// drain consumes up to Budget records of one ring.
func (in *Ingester) drain(slot workers.Slot, w *worker) int {
	r := in.readers[slot]
	rec := &in.rec
	n, resyncWork := 0, 0
	for ; n+resyncWork < in.cfg.Budget; n++ {
		ok, err := r.Next(rec)
		if err != nil {
			// Garbage: no boundary after it can be trusted, and whatever
			// it described is lost, so the worker's entries are suspect.
			in.noteResync(slot, "a worker's ring holds bytes no publisher writes: its index entries were dropped", "err", err)
			in.c.garbage++
			in.c.resyncBytes += r.Resync()
			in.resync(slot)
			// A producer that keeps writing garbage (say, an unaligned head)
			// must not keep the ingester spinning, nor the garbage count
			// climbing: look again once it has written since.
			w.poisoned, w.poisonHead = true, r.Head()
			return n
		}
		if !ok {
			break
		}
		if int32(rec.Gen-w.gen) < 0 {
			// Older, counted modulo 2^32: after 0xffffffff the registry's
			// next generation is 1, which is newer, not stale.
			in.c.stale++
			r.Skip(rec)
			continue
		}
		if rec.Gen != w.gen || w.state != shm.StateLive {
			// The engine re-registered (a new generation) or came back
			// after it was marked down, and published before our registry
			// scan noticed: adopt it now if the registry agrees, else the
			// record is from an engine that is down, forged, or from the
			// future. Checked before the state, or what a re-registered
			// engine publishes first would be lost.
			wasLive := w.state == shm.StateLive
			if !in.adopt(slot, w) || w.gen != rec.Gen {
				ownDown := w.state == shm.StateDown && rec.Gen == w.gen
				switch {
				case ownDown && !w.removed:
					// Presumed dead, its blocks kept for a revival: its
					// records keep them true (it is routed to meanwhile by
					// no one).
				case wasLive:
					in.c.rejected++
					r.Skip(rec)
					continue
				case ownDown && rec.Seq > w.lastSeq:
					// Its blocks are gone; consumed in order all the same,
					// so that a revival is not taken for lost records.
					in.c.skippedDown++
					r.Commit(rec)
					w.lastSeq = rec.Seq
					continue
				default:
					in.c.skippedDown++
					r.Skip(rec)
					continue
				}
			}
		}
		if rec.Seq < w.lastSeq {
			// Only the record a crash left between Commit's two stores
			// comes again (Seq == lastSeq); one further behind means
			// the persisted cursor is wrong (corrupt bytes, or another
			// writer), and trusting it would skip this worker's records
			// until the engine restarts. Start over from this record.
			in.noteResync(slot, "a worker's ring cursor is ahead of its records: its index entries were dropped",
				"cursor_seq", w.lastSeq, "record_seq", rec.Seq)
			in.c.gaps++
			in.resync(slot)
			w.lastSeq = rec.Seq - 1
		}
		if rec.Seq == w.lastSeq {
			// Applied before a crash that came between our lastSeq and
			// tail stores; applying it again would double it.
			in.c.duplicate++
			r.Skip(rec)
			continue
		}
		if rec.Seq != w.lastSeq+1 {
			in.noteResync(slot, "a worker's publisher dropped events (its ring was full): its index entries were dropped",
				"last_applied_seq", w.lastSeq, "record_seq", rec.Seq)
			in.c.gaps++
			in.resync(slot)
			// A resync scans the index's shards for the worker's blocks,
			// far more work than a record: it takes a share of the pass,
			// so that a ring whose every record leaves a gap cannot hold
			// the other rings' records back (one such publisher had
			// delayed them by 164 ms at the median).
			resyncWork += resyncCost(in.cfg.Budget)
		}
		// The first record after taking over may be one a killed
		// predecessor applied in part: its blocks are stored again, not
		// copied (apply.go's copies).
		in.apply.countCopies = w.resumed
		in.applyRecord(slot, w, rec)
		r.Commit(rec)
		w.lastSeq, w.resumed = rec.Seq, true
		if in.onApply != nil {
			in.onApply(slot, rec)
		}
	}
	return n
}

// resyncCost is what a resync takes of a ring's per-pass budget: a
// sixteenth, so that a ring gets at most sixteen resyncs a pass.
func resyncCost(budget int) int { return max(budget/16, 1) }

// noteResync says why a worker's entries are dropped, at most once a
// minute per worker: the counters alone do not tell an operator which
// worker lost its view, nor why.
func (in *Ingester) noteResync(slot workers.Slot, msg string, args ...any) {
	in.throttle.Log(in.cfg.Logger, slog.LevelWarn, "resync/"+strconv.Itoa(int(slot)), msg, append([]any{"slot", slot}, args...)...)
}

// resync drops the blocks the index holds for slot. Engines cannot
// replay through shm, so clearing is the only way back to a state that
// never claims a block the engine may not have.
func (in *Ingester) resync(slot workers.Slot) {
	in.apply.cleared(slot)
	in.c.resyncs++
}

// applyRecord writes one record through the shared apply path (apply.go),
// after skipping and counting what the router cannot route on.
func (in *Ingester) applyRecord(slot workers.Slot, w *worker, rec *shm.Record) {
	in.c.records++
	n := uint64(len(rec.Hashes))
	switch rec.Kind {
	case shm.KindStored:
		if rec.BlockSize != w.blockSize {
			// The router hashes prompts in the registered block size; blocks
			// of another size could never match.
			in.c.blockSizeMismatch += n
			return
		}
		parent, ok := in.apply.parent(slot, gpu, w.seed, rec.Parent, rec.HasParent)
		if !ok {
			in.c.unresolvedParent += n
			return
		}
		in.c.storedBlocks += uint64(in.apply.stored(slot, gpu, parent, rec.Hashes, rec.Tokens, nil, rec.BlockSize))
	case shm.KindRemoved:
		removed := uint64(in.apply.removed(slot, gpu, rec.Hashes))
		in.c.unknownRemoved += n - removed
		in.c.removedBlocks += removed
	case shm.KindCleared:
		in.apply.engineCleared(slot)
		in.c.cleared++
	}
}

// counters are owned by the ingest goroutine; publish copies them into
// published for concurrent Stats readers, once per pass rather than per
// record.
type counters struct {
	records, storedBlocks, removedBlocks, cleared       uint64
	stale, duplicate, skippedDown, rejected             uint64
	unresolvedParent, unknownRemoved, blockSizeMismatch uint64
	garbage, resyncBytes, gaps, resyncs                 uint64
	generationBumps, workersDown, workersClosed         uint64
	repairedSlots, indexResets, workersRevived          uint64
}

type published struct {
	c             [21]atomic.Uint64
	last          counters
	ingesting     atomic.Bool
	holderStalled atomic.Bool
}

func (c *counters) array() [21]uint64 {
	return [21]uint64{c.records, c.storedBlocks, c.removedBlocks, c.cleared,
		c.stale, c.duplicate, c.skippedDown, c.rejected,
		c.unresolvedParent, c.unknownRemoved, c.blockSizeMismatch,
		c.garbage, c.resyncBytes, c.gaps, c.resyncs,
		c.generationBumps, c.workersDown, c.workersClosed, c.repairedSlots, c.indexResets, c.workersRevived}
}

func (in *Ingester) publish() {
	if in.c == in.pub.last {
		return
	}
	in.pub.last = in.c
	for i, v := range in.c.array() {
		in.pub.c[i].Store(v)
	}
}

// Stats is a snapshot of the ingester's counters. Records counts records
// applied; the others count records or blocks by what happened to them.
type Stats struct {
	Ingesting bool `json:"ingesting"` // this process holds the ingester role
	// IngesterStalled: this process is a standby and has seen the lock's
	// holder consume none of the events waiting in the rings for
	// Config.StallAfter.
	IngesterStalled bool `json:"ingester_stalled"`

	Records       uint64 `json:"records"`        // records applied to the index
	StoredBlocks  uint64 `json:"stored_blocks"`  // blocks stored
	RemovedBlocks uint64 `json:"removed_blocks"` // blocks removed (engine hash resolved)
	Cleared       uint64 `json:"cleared"`        // Cleared records applied

	Stale       uint64 `json:"stale"`        // records of an older generation, skipped
	Duplicate   uint64 `json:"duplicates"`   // records already applied before a restart, skipped
	SkippedDown uint64 `json:"skipped_down"` // records of a down or closed worker, skipped
	Rejected    uint64 `json:"rejected"`     // records claiming a generation the registry does not show

	UnresolvedParent  uint64 `json:"unresolved_parent_blocks"`   // blocks skipped: parent engine hash unknown
	UnknownRemoved    uint64 `json:"unknown_removed_blocks"`     // removed hashes with no mapping
	BlockSizeMismatch uint64 `json:"block_size_mismatch_blocks"` // blocks skipped: size differs from the registration

	Garbage     uint64 `json:"garbage"`      // corrupt records (each triggers a resync)
	ResyncBytes uint64 `json:"resync_bytes"` // ring bytes discarded by resyncs
	Gaps        uint64 `json:"gaps"`         // sequence gaps (publisher dropped records)
	Resyncs     uint64 `json:"resyncs"`      // times a worker's entries were cleared to recover

	GenerationBumps uint64 `json:"generation_bumps"` // engine restarts seen
	WorkersDown     uint64 `json:"workers_down"`     // workers marked down for a stale heartbeat
	WorkersRevived  uint64 `json:"workers_revived"`  // workers marked down whose publisher resumed the registration
	WorkersClosed   uint64 `json:"workers_closed"`   // workers that closed cleanly
	RepairedSlots   uint64 `json:"repaired_slots"`   // index slots dropped repairing a dead ingester's half-done writes
	IndexResets     uint64 `json:"index_resets"`     // times the index was dropped: damaged beyond repair, or repair over its budget

	LagBytes [workers.Max]uint64 `json:"-"` // committed ring bytes not yet consumed
}

// Stale returns the live slots whose heartbeat stopped but which could
// not be marked down yet: to be routed as down.
func (in *Ingester) Stale() workers.Set { return workers.Set(in.stale.Load()) }

// Ingesting reports whether this process holds the ingester role. Unlike
// Stats it reads nothing from the segment.
func (in *Ingester) Ingesting() bool { return in.pub.ingesting.Load() }

// Stats returns the counters as of the end of the last pass, plus the
// current ring lags (read from the segment: callers guard it, shm/fault.go).
// Safe to call from any goroutine.
func (in *Ingester) Stats() Stats {
	var a [21]uint64
	for i := range a {
		a[i] = in.pub.c[i].Load()
	}
	st := Stats{Ingesting: in.pub.ingesting.Load(), IngesterStalled: in.pub.holderStalled.Load(),
		Records: a[0], StoredBlocks: a[1], RemovedBlocks: a[2], Cleared: a[3],
		Stale: a[4], Duplicate: a[5], SkippedDown: a[6], Rejected: a[7],
		UnresolvedParent: a[8], UnknownRemoved: a[9], BlockSizeMismatch: a[10],
		Garbage: a[11], ResyncBytes: a[12], Gaps: a[13], Resyncs: a[14],
		GenerationBumps: a[15], WorkersDown: a[16], WorkersClosed: a[17], RepairedSlots: a[18], IndexResets: a[19], WorkersRevived: a[20]}
	for i := range st.LagBytes {
		st.LagBytes[i] = in.seg.RingState(workers.Slot(i)).Lag()
	}
	return st
}
