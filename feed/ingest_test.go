package feed

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvfast/kvfast/internal/syncbuf"
	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
)

func TestIngestMatchesModel(t *testing.T) {
	seg := openSeg(t, 1<<20)
	in := acquire(t, seg, Config{})
	pubs := []*shm.Publisher{}
	models := []*model{}
	opsets := [][]op{}
	for w := 0; w < 3; w++ {
		p, err := seg.Register(workerCfg(uint64(w + 1)))
		if err != nil {
			t.Fatal(err)
		}
		pubs = append(pubs, p)
		models = append(models, newModel())
		opsets = append(opsets, genOps(uint64(w+1), 600))
	}
	// Interleave publishing and ingesting, checking the model at points.
	for i := 0; i < 600; i++ {
		for w, p := range pubs {
			if err := publishOp(p, opsets[w][i]); err != nil {
				t.Fatal(err)
			}
			models[w].apply(opsets[w][i])
		}
		if i%97 == 0 || i == 599 {
			drainAll(in)
			for w, p := range pubs {
				models[w].check(t, seg.Index(), p.Slot())
			}
		}
	}
	st := in.Stats()
	if st.Gaps != 0 || st.Garbage != 0 || st.Duplicate != 0 || st.UnresolvedParent != 0 || st.Records != 1800 {
		t.Fatalf("stats %+v", st)
	}
	if err := seg.Index().Verify(); err != nil {
		t.Fatal(err)
	}
}

func TestGenerationBumpDropsStaleBlocks(t *testing.T) {
	seg := openSeg(t, 1<<20)
	in := acquire(t, seg, Config{})
	old, err := seg.Register(workerCfg(7))
	if err != nil {
		t.Fatal(err)
	}
	ops := genOps(5, 50)
	m := newModel()
	publishAll(old, m, ops[:40])
	drainAll(in)
	m.check(t, seg.Index(), old.Slot())
	// Unconsumed records of the old generation must not survive the bump.
	for _, o := range ops[40:] {
		publishOp(old, o)
	}
	restarted, err := seg.Register(workerCfg(7))
	if err != nil {
		t.Fatal(err)
	}
	if restarted.Slot() != old.Slot() || restarted.Generation() != old.Generation()+1 {
		t.Fatalf("restart got slot %d gen %d", restarted.Slot(), restarted.Generation())
	}
	fresh := newModel()
	publishAll(restarted, fresh, genOps(6, 20))
	drainAll(in)
	for h := range m.all {
		if !fresh.present[h] && seg.Index().Lookup(h).Has(old.Slot()) {
			t.Fatalf("stale block %#x survived the generation bump", h)
		}
	}
	fresh.check(t, seg.Index(), restarted.Slot())
	if st := in.Stats(); st.GenerationBumps != 1 || st.Stale != 10 {
		t.Fatalf("bumps %d stale %d", st.GenerationBumps, st.Stale)
	}
}

// markDownSilent publishes ops for p and a beating worker, then lets p's
// heartbeat go stale until the ingester marks it down.
func markDownSilent(t *testing.T, seg *shm.Segment, in *Ingester, p, live *shm.Publisher, ops []op) {
	t.Helper()
	for _, o := range ops {
		publishOp(p, o)
		publishOp(live, o)
	}
	p.Heartbeat()
	live.Heartbeat()
	drainAll(in)
	if seg.Index().Stats().WorkerBlocks[p.Slot()] == 0 {
		t.Fatal("nothing ingested")
	}
	waitMarkedDown(t, seg, in, p, live, "silent worker never marked down")
}

// waitMarkedDown ingests, live beating, until p's slot is marked down;
// failing with why past a generous deadline.
func waitMarkedDown(t *testing.T, seg *shm.Segment, in *Ingester, p, live *shm.Publisher, why string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		live.Heartbeat()
		drainAll(in)
		if info, _ := seg.Worker(p.Slot()); info.State == shm.StateDown {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(why)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPausedWorkerRevivesWithItsBlocks: an engine paused past the grace
// (SIGSTOP, swapped out) is marked down, and resumes with its cache
// intact. It announces nothing it already holds, so the router keeps its
// blocks, applies what it publishes meanwhile, and takes the registration
// back as it was: what it cached before the pause, and what it caches
// after it on top of that, is claimed exactly.
func TestPausedWorkerRevivesWithItsBlocks(t *testing.T) {
	seg := openSeg(t, 1<<20)
	// The grace is also how long this goroutine may stall between a
	// heartbeat and the scan after it before a worker that is live is
	// marked down: a second, not a few hundred milliseconds a loaded
	// machine can take.
	in := acquire(t, seg, Config{HeartbeatGrace: time.Second, RegistryEvery: time.Millisecond, DownRetention: time.Hour})
	p, err := seg.Register(workerCfg(1))
	if err != nil {
		t.Fatal(err)
	}
	live, err := seg.Register(workerCfg(2))
	if err != nil {
		t.Fatal(err)
	}
	ops := genOps(1, 60)
	m := newModel()
	for _, o := range ops[:30] {
		m.apply(o)
	}
	markDownSilent(t, seg, in, p, live, ops[:30])
	m.check(t, seg.Index(), p.Slot())
	if in.Stats().WorkersDown != 1 {
		t.Fatalf("WorkersDown %d", in.Stats().WorkersDown)
	}
	// What it publishes while down (its heartbeat stuck, its events not)
	// keeps the kept blocks true.
	publishAll(p, m, ops[30:45])
	drainAll(in)
	m.check(t, seg.Index(), p.Slot())
	gen := p.Generation()
	if err := p.Heartbeat(); err != nil {
		t.Fatal(err)
	}
	if info, _ := seg.Worker(p.Slot()); info.State != shm.StateLive || info.Generation != gen {
		t.Fatalf("revived as %+v, want live under generation %d", info, gen)
	}
	publishAll(p, m, ops[45:])
	drainAll(in)
	m.check(t, seg.Index(), p.Slot())
	st := in.Stats()
	if st.WorkersRevived != 1 || st.Gaps != 0 || st.Resyncs != 0 || st.SkippedDown != 0 || st.UnresolvedParent != 0 || st.GenerationBumps != 0 {
		t.Fatalf("stats after a revival %+v", st)
	}
	// A clean Close removes the worker at once.
	p.Close()
	drainAll(in)
	if n := seg.Index().Stats().WorkerBlocks[p.Slot()]; n != 0 {
		t.Fatalf("closed worker still holds %d blocks", n)
	}
	if err := seg.Index().Verify(); err != nil {
		t.Fatal(err)
	}
}

// markDown marks p's slot down as the ingester does when its heartbeat
// goes stale, without waiting for a grace to pass.
func markDown(t *testing.T, seg *shm.Segment, in *Ingester, p *shm.Publisher) {
	t.Helper()
	_, gen, beat := seg.SlotState(p.Slot())
	if ok, err := seg.MarkDown(p.Slot(), gen, beat); !ok || err != nil {
		t.Fatalf("MarkDown: %v %v", ok, err)
	}
	drainAll(in)
}

// TestDeadWorkerLosesItsBlocks: a worker down past the retention is
// taken for dead and its blocks are removed; if it resumes after all,
// what it published meanwhile is consumed in order (no gap, no resync)
// and it starts over from what it publishes next.
func TestDeadWorkerLosesItsBlocks(t *testing.T) {
	seg := openSeg(t, 1<<20)
	in := acquire(t, seg, Config{DownRetention: 200 * time.Millisecond})
	p, err := seg.Register(workerCfg(1))
	if err != nil {
		t.Fatal(err)
	}
	live, err := seg.Register(workerCfg(2))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range genOps(1, 30) {
		publishOp(p, o)
		publishOp(live, o)
	}
	drainAll(in)
	markDown(t, seg, in, p)
	if seg.Index().Stats().WorkerBlocks[p.Slot()] == 0 {
		t.Fatal("the blocks went at the mark, not after the retention")
	}
	deadline := time.Now().Add(30 * time.Second)
	for seg.Index().Stats().WorkerBlocks[p.Slot()] != 0 {
		if time.Now().After(deadline) {
			t.Fatal("a worker down past the retention kept its blocks")
		}
		drainAll(in)
		time.Sleep(5 * time.Millisecond)
	}
	if seg.Index().Stats().WorkerBlocks[live.Slot()] == 0 {
		t.Fatal("the live worker lost its blocks")
	}
	publishAll(p, newModel(), genOps(2, 5))
	drainAll(in)
	if n := seg.Index().Stats().WorkerBlocks[p.Slot()]; n != 0 {
		t.Fatalf("a dead worker's records stored %d blocks", n)
	}
	if err := p.Heartbeat(); err != nil {
		t.Fatal(err)
	}
	m := newModel()
	publishAll(p, m, genOps(9, 10))
	drainAll(in)
	m.check(t, seg.Index(), p.Slot())
	st := in.Stats()
	if st.SkippedDown != 5 || st.Gaps != 0 || st.Resyncs != 0 || st.WorkersRevived != 1 {
		t.Fatalf("stats after a late revival %+v", st)
	}
}

// TestNoDownRetention: with no retention (kvfast serve --down-retention
// 0) a worker's blocks go as it is marked down.
func TestNoDownRetention(t *testing.T) {
	seg := openSeg(t, 1<<20)
	in := acquire(t, seg, Config{DownRetention: -1})
	p, err := seg.Register(workerCfg(1))
	if err != nil {
		t.Fatal(err)
	}
	publishAll(p, newModel(), genOps(4, 20))
	drainAll(in)
	if seg.Index().Stats().WorkerBlocks[p.Slot()] == 0 {
		t.Fatal("nothing ingested")
	}
	markDown(t, seg, in, p)
	if n := seg.Index().Stats().WorkerBlocks[p.Slot()]; n != 0 {
		t.Fatalf("%d blocks kept with no retention", n)
	}
}

// TestDownWorkerAcrossATakeover: a router that takes the ingester role
// while a worker is down (a restart, a standby) keeps its blocks, and
// applies what it publishes meanwhile as its predecessor would: its
// model and block size are read from the down registration.
func TestDownWorkerAcrossATakeover(t *testing.T) {
	seg := openSeg(t, 1<<20)
	first := New(seg, Config{HeartbeatGrace: time.Hour})
	if ok, err := first.Acquire(context.Background()); !ok || err != nil {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	p, err := seg.Register(workerCfg(1))
	if err != nil {
		t.Fatal(err)
	}
	ops := genOps(3, 40)
	m := newModel()
	publishAll(p, m, ops[:20])
	drainAll(first)
	markDown(t, seg, first, p)
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	next := acquire(t, seg, Config{})
	publishAll(p, m, ops[20:])
	drainAll(next)
	m.check(t, seg.Index(), p.Slot())
	if st := next.Stats(); st.BlockSizeMismatch != 0 || st.SkippedDown != 0 {
		t.Fatalf("stats after the takeover %+v", st)
	}
}

func TestGapResyncs(t *testing.T) {
	seg := openSeg(t, shm.MinRingBytes)
	in := acquire(t, seg, Config{})
	p, err := seg.Register(workerCfg(1))
	if err != nil {
		t.Fatal(err)
	}
	ops := genOps(3, 400)
	var dropped bool
	i := 0
	for ; i < len(ops) && !dropped; i++ {
		dropped = errors.Is(publishOp(p, ops[i]), shm.ErrRingFull)
	}
	if !dropped {
		t.Fatal("ring never filled")
	}
	drainAll(in)
	// After the gap the worker was cleared; blocks published from here on
	// as fresh roots must be held exactly.
	m := newModel()
	p.Cleared()
	for _, o := range genOps(4, 30) {
		publishOp(p, o)
		m.apply(o)
		drainAll(in)
	}
	m.check(t, seg.Index(), p.Slot())
	if st := in.Stats(); st.Gaps != 0 {
		// The drops happened before anything was consumed, so the gap is
		// seen when the first post-drop record arrives.
		if st.Resyncs < st.Gaps {
			t.Fatalf("gaps %d resyncs %d", st.Gaps, st.Resyncs)
		}
	} else {
		t.Fatalf("gap not detected: %+v", st)
	}
}

// TestGapsSpendTheBudget: a resync costs far more than a record, so a
// ring whose every record leaves a gap is drained a few records a pass,
// not a whole budget of resyncs, and the other rings still get theirs.
func TestGapsSpendTheBudget(t *testing.T) {
	seg := openSeg(t, shm.MinRingBytes)
	const budget = 64
	in := acquire(t, seg, Config{Budget: budget})
	gappy, err := seg.Register(workerCfg(1))
	if err != nil {
		t.Fatal(err)
	}
	honest, err := seg.Register(workerCfg(2))
	if err != nil {
		t.Fatal(err)
	}
	const records = 100
	for range records {
		if err := gappy.Cleared(); err != nil {
			t.Fatal(err)
		}
	}
	if err := honest.Cleared(); err != nil {
		t.Fatal(err)
	}
	// Renumber the gappy ring's records 2, 4, 6, ...: each one a gap.
	// Cleared records are 24 bytes, back to back from the ring's start
	// (docs/shm-layout.md: rings at 49152, each a 256-byte control block
	// then the data; seq at 8 in a record).
	data := int64(49152 + int(gappy.Slot())*(256+shm.MinRingBytes) + 256)
	for i := range int64(records) {
		scribble(t, seg.Path(), data+24*i+8, binary.LittleEndian.AppendUint64(nil, uint64(2*(i+1))))
	}
	in.ScanRegistry()
	in.Poll()
	st := in.Stats()
	if st.Gaps == 0 || st.Gaps > 16 {
		t.Fatalf("%d gaps resynced in one pass of a %d-record budget, want 1 to 16", st.Gaps, budget)
	}
	if st.Cleared != st.Gaps+1 {
		t.Fatalf("%d records applied, %d gaps: the honest ring's record was not drained in the same pass", st.Cleared, st.Gaps)
	}
}

// TestFutureHeartbeatGoesStale: a heartbeat ahead of the router's clock
// (a publisher's bad clock, a scribble) never ages by its value; once it
// has stood still for the grace its worker is marked down all the same,
// so its slot can be reclaimed, while a worker that keeps beating stays.
func TestFutureHeartbeatGoesStale(t *testing.T) {
	seg := openSeg(t, 1<<20)
	in := acquire(t, seg, Config{HeartbeatGrace: time.Second, RegistryEvery: time.Millisecond})
	p, err := seg.Register(workerCfg(1))
	if err != nil {
		t.Fatal(err)
	}
	live, err := seg.Register(workerCfg(2))
	if err != nil {
		t.Fatal(err)
	}
	drainAll(in)
	// The registry slot's heartbeat word (shm/layout.go: registryOff is
	// two pages in, slots are 512 bytes; shm/registry.go: sHeartbeat 40).
	future := shm.MonotonicNow() + int64(time.Hour)
	scribble(t, seg.Path(), 8192+int64(p.Slot())*512+40, binary.LittleEndian.AppendUint64(nil, uint64(future)))
	if info, _ := seg.Worker(p.Slot()); info.Heartbeat != future {
		t.Fatalf("the scribble missed the heartbeat: %+v", info)
	}
	waitMarkedDown(t, seg, in, p, live, "a worker whose heartbeat is an hour ahead was never marked down")
	if info, _ := seg.Worker(live.Slot()); info.State != shm.StateLive {
		t.Fatalf("the beating worker is %v", info.State)
	}
}

func TestIngestSurvivesGarbage(t *testing.T) {
	seg := openSeg(t, 1<<20)
	in := acquire(t, seg, Config{})
	p, err := seg.Register(workerCfg(1))
	if err != nil {
		t.Fatal(err)
	}
	good := genOps(1, 20)
	for _, o := range good {
		publishOp(p, o)
	}
	drainAll(in)
	// Scribble over the ring: a record header claiming to be enormous,
	// committed by a buggy producer.
	st := seg.RingState(p.Slot())
	scribble(t, seg.Path(), ringAt(seg, p.Slot())+256+int64(st.Head%uint64(seg.Header().RingBytes)), []byte{0xf8, 0xff, 0xff, 0x0f, 1, 0, 4, 0})
	scribbleHead(t, seg, p.Slot(), st.Head+32) // "commit" it
	drainAll(in)
	if s := in.Stats(); s.Garbage == 0 || s.Resyncs == 0 {
		t.Fatalf("garbage not detected: %+v", s)
	}
	// The next record of the (buggy) publisher lands where it thinks head
	// is, which disagrees with the forged head: refused again, no crash.
	p.Cleared()
	drainAll(in)
	// A restarted publisher continues from the real head and recovers.
	p, err = seg.Register(workerCfg(1))
	if err != nil {
		t.Fatal(err)
	}
	m := newModel()
	publishAll(p, m, genOps(2, 20))
	drainAll(in)
	m.check(t, seg.Index(), p.Slot())
	if err := seg.Index().Verify(); err != nil {
		t.Fatal(err)
	}
}

func TestPollRequiresLock(t *testing.T) {
	seg := openSeg(t, 1<<20)
	holder := acquire(t, seg, Config{})
	_ = holder
	other, err := shm.Open(seg.Path(), shm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	in := New(other, Config{})
	if ok, _ := in.Acquire(context.Background()); ok {
		t.Fatal("two ingesters hold the lock")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Poll without the lock did not panic")
		}
	}()
	in.Poll()
}

// TestEngineBackBeforeTheScanKeepsItsFirstRecords: an engine that
// re-registers into its old slot and publishes before the ingester's next
// registry scan has what it published applied, not skipped as the closed
// worker's records (the first blocks of a restarted engine, and every
// chain built on them, were never credited).
func TestEngineBackBeforeTheScanKeepsItsFirstRecords(t *testing.T) {
	seg := openSeg(t, 1<<20)
	in := acquire(t, seg, Config{RegistryEvery: time.Hour}) // scans only when told
	p, err := seg.Register(workerCfg(3))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range genOps(11, 20) {
		publishOp(p, o)
	}
	drainAll(in)
	p.Close()
	in.ScanRegistry() // the ingester sees the worker closed
	again, err := seg.Register(workerCfg(3))
	if err != nil {
		t.Fatal(err)
	}
	if again.Slot() != p.Slot() {
		t.Fatalf("re-registered into slot %d, not %d", again.Slot(), p.Slot())
	}
	m := newModel()
	publishAll(again, m, genOps(12, 20))
	for in.Poll() > 0 {
	}
	m.check(t, seg.Index(), again.Slot())
	if st := in.Stats(); st.SkippedDown != 0 {
		t.Errorf("%d records skipped as a down worker's", st.SkippedDown)
	}
}

// TestCursorAheadOfRecordsResyncs: a ring cursor whose last applied
// sequence number is ahead of every record (corrupt bytes, another
// writer) would have every record skipped as already applied until the
// engine restarts; the ingester instead drops the worker's entries, as
// after a gap, and applies the records from there.
func TestCursorAheadOfRecordsResyncs(t *testing.T) {
	seg := openSeg(t, 1<<20)
	first := acquire(t, seg, Config{})
	p, err := seg.Register(workerCfg(1))
	if err != nil {
		t.Fatal(err)
	}
	ops := genOps(11, 40)
	for _, o := range ops[:20] {
		if err := publishOp(p, o); err != nil {
			t.Fatal(err)
		}
	}
	drainAll(first)
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	// docs/shm-layout.md: a ring's last applied sequence number is the
	// u64 at byte 136 of its control block.
	scribble(t, seg.Path(), ringAt(seg, p.Slot())+136, binary.LittleEndian.AppendUint64(nil, 1<<62))
	m := newModel()
	for _, o := range ops[20:] {
		if err := publishOp(p, o); err != nil {
			t.Fatal(err)
		}
		m.apply(o)
	}
	next := acquire(t, seg, Config{})
	drainAll(next)
	st := next.Stats()
	if st.Duplicate != 0 || st.Records != 20 || st.Gaps != 1 {
		t.Fatalf("after a cursor ahead of its records: %+v", st)
	}
	if st := seg.Index().Stats(); st.WorkerBlocks[p.Slot()] == 0 {
		t.Fatal("the worker's records after the bad cursor were not applied")
	}
}

// TestReservedSlot: a slot a router reserves for a static worker (whose
// ZMQ feed writes its blocks) starts empty under a new reservation, found
// before the feeds start (Acquire), and then keeps what the feed writes,
// through registry scans and an ingester restart.
func TestReservedSlot(t *testing.T) {
	seg := openSeg(t, 1<<20)
	ix := seg.Index()
	// An earlier engine's blocks, left under the slot the reservation
	// takes (its close was never ingested).
	top := workers.Slot(workers.Max - 1)
	ix.StoredAgain(top, []uint64{1, 2, 3}, nil)
	slots, gens, err := seg.Reserve([]shm.Reservation{{WorkerID: 7, Model: testModel}})
	if err != nil || slots[0] != top {
		t.Fatalf("reserved %v: %v", slots, err)
	}
	in := acquire(t, seg, Config{})
	if got := ix.Stats().WorkerBlocks[top]; got != 0 {
		t.Fatalf("a new reservation kept %d blocks of the slot's earlier engine", got)
	}
	ix.StoredAgain(top, []uint64{4, 5}, nil) // the static worker's feed
	drainAll(in)
	drainAll(in)
	if got := ix.Stats().WorkerBlocks[top]; got != 2 {
		t.Fatalf("registry scans left %d of the feed's 2 blocks", got)
	}
	// A restarted router: the same reservation, the same blocks.
	in.Release()
	if again, againGens, err := seg.Reserve([]shm.Reservation{{WorkerID: 7, Model: testModel}}); err != nil || again[0] != top || againGens[0] != gens[0] {
		t.Fatalf("reserved again %v %v: %v", again, againGens, err)
	}
	in = acquire(t, seg, Config{})
	drainAll(in)
	if got := ix.Stats().WorkerBlocks[top]; got != 2 {
		t.Fatalf("a restart under the same reservation left %d of 2 blocks", got)
	}
}

// TestStuckGarbageCountedOnce: a ring whose head stays wrong (unaligned,
// left so by a publisher that then closed) is garbage once, not again at
// every registry scan (it had counted some 195 a second, for ever, which
// made the garbage and resync counts useless); a head that moves is read
// again.
func TestStuckGarbageCountedOnce(t *testing.T) {
	seg := openSeg(t, 1<<20)
	in := acquire(t, seg, Config{})
	p, err := seg.Register(workerCfg(1))
	if err != nil {
		t.Fatal(err)
	}
	publishAll(p, newModel(), genOps(1, 5))
	drainAll(in)
	st := seg.RingState(p.Slot())
	scribbleHead(t, seg, p.Slot(), st.Head+4)
	for range 20 {
		drainAll(in)
	}
	if s := in.Stats(); s.Garbage != 1 {
		t.Fatalf("an unaligned head that never moves counted %d times as garbage, want once", s.Garbage)
	}
	scribbleHead(t, seg, p.Slot(), st.Head+12)
	drainAll(in)
	if s := in.Stats(); s.Garbage != 2 {
		t.Fatalf("a head that moved (still wrong) was not read again: garbage %d, want 2", s.Garbage)
	}
}

// TestStandbySeesAHungHolder: a router that holds the ingester lock but
// consumes nothing (stopped, stuck) keeps the lock, which only its death
// frees; a standby says so once events have waited StallAfter, and stops
// saying so once the holder consumes them.
func TestStandbySeesAHungHolder(t *testing.T) {
	seg := openSeg(t, 1<<20)
	holder := acquire(t, seg, Config{}) // never polled until the end: hung
	other, err := shm.Open(seg.Path(), shm.Options{Index: testIndex, RingBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() }) // after the standby stops
	var log syncbuf.Buffer
	standby := New(other, Config{StandbyPoll: 5 * time.Millisecond, StallAfter: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	runUntilCleanup(t, standby)

	p, err := seg.Register(workerCfg(1))
	if err != nil {
		t.Fatal(err)
	}
	publishAll(p, newModel(), genOps(5, 20))
	stats := func() any { return standby.Stats() }
	waitFor(t, func() bool { return standby.Stats().IngesterStalled }, stats)
	if out := log.String(); !strings.Contains(out, "has applied none of those waiting") || !strings.Contains(out, "ingester_pid=") {
		t.Fatalf("the standby's log:\n%s", out)
	}
	if standby.Stats().Ingesting {
		t.Fatal("the standby took the role from a live holder")
	}
	drainAll(holder)
	waitFor(t, func() bool { return !standby.Stats().IngesterStalled }, stats)
}

// TestStandbyIgnoresAnUnalignedHead: a producer's unaligned head leaves a
// few bytes of lag the holder resyncs past and then never consumes (the
// ring waits for its head to move); a standby must not take that for a
// hung holder, and still must once real events wait. The clock is the
// test's: watchHolder takes the time.
func TestStandbyIgnoresAnUnalignedHead(t *testing.T) {
	seg := openSeg(t, 1<<20)
	holder := acquire(t, seg, Config{})
	p, err := seg.Register(workerCfg(1))
	if err != nil {
		t.Fatal(err)
	}
	publishAll(p, newModel(), genOps(1, 5))
	drainAll(holder)
	scribbleHead(t, seg, p.Slot(), seg.RingState(p.Slot()).Head+4)
	drainAll(holder)
	if lag := seg.RingState(p.Slot()).Lag(); lag != 4 {
		t.Fatalf("lag %d after the holder resynced past the unaligned head, want 4", lag)
	}
	other, err := shm.Open(seg.Path(), shm.Options{Index: testIndex, RingBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	standby := New(other, Config{StallAfter: time.Second})
	now := time.Now()
	for m := range 3 { // a first look, then two a minute apart
		standby.watchHolder(now.Add(time.Duration(m) * time.Minute))
	}
	if standby.Stats().IngesterStalled {
		t.Fatal("a standby called the holder stalled for the bytes of an unaligned head")
	}
	publishAll(p, newModel(), genOps(2, 5)) // the holder, hung, consumes none of these
	standby.watchHolder(now.Add(3 * time.Minute))
	standby.watchHolder(now.Add(4 * time.Minute))
	if !standby.Stats().IngesterStalled {
		t.Fatal("events waited a minute unconsumed and the standby said nothing")
	}
}
