package feed

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
)

// errCut is what cutIndex panics with: the writer is killed there.
var errCut = errors.New("killed")

// cutIndex performs the apply path's index writes one block (or one
// Cleared) at a time and panics right after the cut-th, leaving the index
// as an ingester killed between those two writes would. cut 0 never
// panics and just counts the writes.
type cutIndex struct {
	ix     *radix.Index
	cut    int
	writes int
}

func (c *cutIndex) wrote() {
	c.writes++
	if c.writes == c.cut {
		panic(errCut)
	}
}

func (c *cutIndex) Lookup(h uint64) workers.Set { return c.ix.Lookup(h) }

func (c *cutIndex) MapEngineHash(w workers.Slot, engine, kv uint64) bool {
	ok := c.ix.MapEngineHash(w, engine, kv)
	c.wrote()
	return ok
}

func (c *cutIndex) LookupEngineHash(w workers.Slot, engine uint64) (uint64, bool) {
	return c.ix.LookupEngineHash(w, engine)
}

func (c *cutIndex) MapEngineHashes(w workers.Slot, engines, kvs []uint64, had []int) (int, []int) {
	mapped := 0
	for i := range engines {
		n, h := c.ix.MapEngineHashes(w, engines[i:i+1], kvs[i:i+1], nil)
		mapped += n
		if len(h) > 0 {
			had = append(had, i)
		}
		c.wrote()
	}
	return mapped, had
}

func (c *cutIndex) UnmapEngineHashes(w workers.Slot, engines []uint64, dst []uint64) []uint64 {
	for _, e := range engines {
		if kv, ok := c.ix.UnmapEngineHash(w, e); ok {
			dst = append(dst, kv)
		}
		c.wrote()
	}
	return dst
}

func (c *cutIndex) StoredAgain(w workers.Slot, hashes []uint64, again []int) ([]int, int) {
	refused := 0
	for i := range hashes {
		held, r := c.ix.StoredAgain(w, hashes[i:i+1], nil)
		if len(held) > 0 {
			again = append(again, i)
		}
		refused += r
		c.wrote()
	}
	return again, refused
}

func (c *cutIndex) Removed(w workers.Slot, hashes []uint64) {
	for i := range hashes {
		c.ix.Removed(w, hashes[i:i+1])
		c.wrote()
	}
}

func (c *cutIndex) Cleared(w workers.Slot) {
	c.ix.Cleared(w)
	c.wrote()
}

func (c *cutIndex) ClearedAll(w workers.Slot) {
	c.ix.ClearedAll(w)
	c.wrote()
}

// unnamedBlocks returns the blocks ix holds for slot that none of the
// slot's engine-hash mappings names, which no removal could take out
// again. m is the model of a run over ops, so m.all holds every kvfast
// hash ops can produce; a block outside it fails the test.
func unnamedBlocks(t *testing.T, ix *radix.Index, slot workers.Slot, ops []op, m *model) []uint64 {
	t.Helper()
	named := map[uint64]bool{}
	for _, o := range ops {
		for _, e := range o.Hashes {
			if kv, ok := ix.LookupEngineHash(slot, e); ok {
				named[kv] = true
			}
		}
	}
	var unnamed []uint64
	held := uint64(0)
	for kv := range m.all {
		if ix.Lookup(kv).Has(slot) {
			held++
			if !named[kv] {
				unnamed = append(unnamed, kv)
			}
		}
	}
	if got := ix.Stats().WorkerBlocks[slot]; got != held {
		t.Fatalf("slot %d holds %d blocks, %d of them produced by the ops", slot, got, held)
	}
	return unnamed
}

// cutTestOps is a workload with every event kind, removals of blocks that
// a Cleared already dropped, and stores whose parent a Cleared dropped.
func cutTestOps(t *testing.T) []op {
	ops := genOps(17, 60)
	kinds := map[string]int{}
	for _, o := range ops {
		kinds[o.Op]++
	}
	if kinds["stored"] == 0 || kinds["removed"] == 0 || kinds["cleared"] == 0 {
		t.Fatalf("workload lacks an event kind: %v", kinds)
	}
	return ops
}

// TestRingApplyCutAtEveryWrite kills the ring ingester after each single
// index write of a workload in turn. At every cut, each block the index
// holds must still be named by an engine-hash mapping (the apply path's
// ordering rule, apply.go); and a successor that resumes from the ring's
// persisted cursor, re-applying the record that was cut short, must end
// with exactly the blocks of an uninterrupted run.
func TestRingApplyCutAtEveryWrite(t *testing.T) {
	ops := cutTestOps(t)
	want := newModel()
	for _, o := range ops {
		want.apply(o)
	}
	dir := t.TempDir()
	run := func(cut int) int {
		// Each cut's segment is removed once done: segments are reserved
		// on disk in full, and the cuts run to hundreds.
		path := filepath.Join(dir, "seg"+strconv.Itoa(cut))
		seg, err := shm.Open(path, shm.Options{Index: radix.Config{Capacity: 1 << 12}, RingBytes: 1 << 16})
		if err != nil {
			t.Fatal(err)
		}
		defer os.Remove(path)
		defer seg.Close()
		p, err := seg.Register(workerCfg(1))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range ops {
			if err := publishOp(p, o); err != nil {
				t.Fatal(err)
			}
		}
		cfg := Config{HeartbeatGrace: time.Hour, RegistryEvery: time.Hour}
		in := New(seg, cfg)
		if ok, err := in.Acquire(context.Background()); !ok {
			t.Fatalf("cannot take the ingester role: %v", err)
		}
		defer func() { in.Release() }() // whichever ingester holds the role by then
		c := &cutIndex{ix: seg.Index(), cut: cut}
		in.apply.ix = c
		killed := func() (killed bool) {
			defer func() {
				if r := recover(); r != nil {
					if r != errCut {
						panic(r)
					}
					killed = true
				}
			}()
			drainAll(in)
			return false
		}()
		if killed != (cut > 0) {
			t.Fatalf("cut %d of %d writes: killed=%v", cut, c.writes, killed)
		}
		if bad := unnamedBlocks(t, seg.Index(), p.Slot(), ops, want); len(bad) > 0 {
			t.Fatalf("killed after write %d: %d blocks held with no engine hash naming them, e.g. %#x", cut, len(bad), bad[0])
		}
		if killed {
			if err := in.Release(); err != nil {
				t.Fatal(err)
			}
			in = New(seg, cfg)
			if ok, err := in.Acquire(context.Background()); !ok {
				t.Fatalf("successor cannot take the ingester role: %v", err)
			}
			drainAll(in)
		}
		want.check(t, seg.Index(), p.Slot())
		return c.writes
	}
	total := run(0)
	if total < 100 {
		t.Fatalf("only %d index writes: the workload is too small to mean much", total)
	}
	for cut := 1; cut <= total; cut++ {
		run(cut)
	}
}

// TestRingAndZMQApplyAlike feeds one event sequence through both sources
// and requires identical index state, block table and engine map, after
// every event.
func TestRingAndZMQApplyAlike(t *testing.T) {
	ops := genOps(23, 300)
	seg := openSeg(t, 1<<20)
	in := acquire(t, seg, Config{HeartbeatGrace: time.Hour, RegistryEvery: time.Hour})
	p, err := seg.Register(workerCfg(1))
	if err != nil {
		t.Fatal(err)
	}
	slot := p.Slot()
	zix := newZMQIndex(t)
	sub, err := NewZMQSubscriber(zix, ZMQConfig{Endpoint: "tcp://127.0.0.1:1", Slot: slot, Model: testModel,
		BlockSize: testBlockSize})
	if err != nil {
		t.Fatal(err)
	}
	m := newModel()
	for i, o := range ops {
		if err := publishOp(p, o); err != nil {
			t.Fatal(err)
		}
		drainAll(in)
		sub.offer(uint64(i+1), encodeBatch(t, vllmMap, wireOps(intHashes, []op{o})))
		m.apply(o)
		for kv := range m.all {
			if r, z := seg.Index().Lookup(kv).Has(slot), zix.Lookup(kv).Has(slot); r != z {
				t.Fatalf("after event %d (%s): block %#x held by ring index %v, by ZMQ index %v", i, o.Op, kv, r, z)
			}
		}
		for _, past := range ops[:i+1] {
			for _, e := range past.Hashes {
				rkv, rok := seg.Index().LookupEngineHash(slot, e)
				zkv, zok := zix.LookupEngineHash(slot, e)
				if rkv != zkv || rok != zok {
					t.Fatalf("after event %d (%s): engine hash %#x maps to %#x,%v in the ring index, %#x,%v in the ZMQ index",
						i, o.Op, e, rkv, rok, zkv, zok)
				}
			}
		}
	}
	m.check(t, seg.Index(), slot)
	m.check(t, zix, slot)
}

// distinctBlocks returns n engine hashes and n blocks of tokens, each
// block distinct.
func distinctBlocks(n int) (engines []uint64, tokens []uint32) {
	engines = make([]uint64, n)
	tokens = make([]uint32, n*testBlockSize)
	for i := range engines {
		engines[i] = uint64(i+1) * 0x9e3779b97f4a7c15
		tokens[i*testBlockSize] = uint32(i)
	}
	return engines, tokens
}

// TestStoredSkipsBlocksTheMapCannotName: with the engine map full, a
// store must not leave blocks that no removal could name.
func TestStoredSkipsBlocksTheMapCannotName(t *testing.T) {
	ix, err := radix.NewHeap(radix.Config{Capacity: 1 << 12, EngineMapCapacity: 64})
	if err != nil {
		t.Fatal(err)
	}
	const slot = workers.Slot(3)
	a := newApplier(ix, 0)
	engines, tokens := distinctBlocks(1000)
	stored := a.stored(slot, gpu, radix.NamespaceSeed(testModel, "", ""), engines, tokens, nil, testBlockSize)
	st := ix.Stats()
	if st.EngineMapOverflow == 0 || stored == len(engines) {
		t.Fatalf("the map did not fill: stored %d of %d, %+v", stored, len(engines), st)
	}
	if st.WorkerBlocks[slot] != uint64(stored) {
		t.Fatalf("stored reports %d blocks, the index holds %d", stored, st.WorkerBlocks[slot])
	}
	if removed := a.removed(slot, gpu, engines); removed != stored {
		t.Fatalf("removed %d of %d stored blocks", removed, stored)
	}
	if left := ix.Stats().WorkerBlocks[slot]; left != 0 {
		t.Fatalf("%d blocks left that no engine hash names", left)
	}
}

// TestStoredCountsOnlyWhatTheIndexTook: blocks past the worker's share of
// the block table are not counted as stored (the feed's stored_blocks).
func TestStoredCountsOnlyWhatTheIndexTook(t *testing.T) {
	ix, err := radix.NewHeap(radix.Config{Capacity: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if err := ix.SetWorkerShare(0.25); err != nil {
		t.Fatal(err)
	}
	const slot = workers.Slot(2)
	a := newApplier(ix, 0)
	engines, tokens := distinctBlocks(1000)
	stored := a.stored(slot, gpu, radix.NamespaceSeed(testModel, "", ""), engines, tokens, nil, testBlockSize)
	st := ix.Stats()
	if st.WorkerRefused[slot] == 0 || st.WorkerBlocks[slot] != uint64(stored) {
		t.Fatalf("stored reports %d blocks, the index holds %d and refused %d", stored, st.WorkerBlocks[slot], st.WorkerRefused[slot])
	}
}

// TestStoredUnderATakenName: a block whose engine hash names another block
// the worker holds is not stored (reused), in another event or the same
// one, so that every held block keeps a name; a name whose block the
// worker no longer holds (dropped by a resync, which keeps names) is
// stale, and a new block takes it.
func TestStoredUnderATakenName(t *testing.T) {
	ix, err := radix.NewHeap(radix.Config{Capacity: 1 << 12})
	if err != nil {
		t.Fatal(err)
	}
	const slot = workers.Slot(2)
	seed := radix.NamespaceSeed(testModel, "", "")
	a := newApplier(ix, 0)
	block := func(tok uint32) []uint32 {
		b := make([]uint32, testBlockSize)
		b[0] = tok
		return b
	}
	if n := a.stored(slot, gpu, seed, []uint64{7}, block(1), nil, testBlockSize); n != 1 {
		t.Fatalf("first block: stored %d", n)
	}
	if n := a.stored(slot, gpu, seed, []uint64{7}, block(2), nil, testBlockSize); n != 0 || a.takeReused() != 1 {
		t.Fatal("a second block under a held block's name was stored")
	}
	if n := a.stored(slot, gpu, seed, []uint64{8, 8}, append(block(3), block(4)...), nil, testBlockSize); n != 1 || a.takeReused() != 1 {
		t.Fatalf("one event naming two blocks alike: stored %d", n)
	}
	a.cleared(slot) // a resync: blocks go, names stay
	if n := a.stored(slot, gpu, seed, []uint64{7}, block(5), nil, testBlockSize); n != 1 || a.takeReused() != 0 {
		t.Fatalf("a block under a stale name: stored %d", n)
	}
	if removed := a.removed(slot, gpu, []uint64{7}); removed != 1 || ix.Stats().WorkerBlocks[slot] != 0 {
		t.Fatalf("removed %d; %d blocks left", removed, ix.Stats().WorkerBlocks[slot])
	}
	if err := ix.Verify(); err != nil {
		t.Fatal(err)
	}
}

// TestCopiesOfABlock: vLLM does not de-duplicate its cache, so two
// requests computing one prefix at once each cache, announce and later
// evict a copy. Evicting one copy leaves the block claimed and its name
// resolving (a later block chains from it); evicting the last takes it
// out. An engine's clear forgets the copies.
func TestCopiesOfABlock(t *testing.T) {
	ix, err := radix.NewHeap(radix.Config{Capacity: 1 << 12})
	if err != nil {
		t.Fatal(err)
	}
	const slot = workers.Slot(4)
	seed := radix.NamespaceSeed(testModel, "", "")
	a := newApplier(ix, 0)
	tokens := make([]uint32, 3*testBlockSize)
	for i := range tokens {
		tokens[i] = uint32(i + 1)
	}
	b1 := radix.ChainBlockHash(seed, tokens[:testBlockSize])
	b2 := radix.ChainBlockHash(b1, tokens[testBlockSize:2*testBlockSize])
	b3 := radix.ChainBlockHash(b2, tokens[2*testBlockSize:])
	held := func(want ...bool) {
		t.Helper()
		for i, h := range []uint64{b1, b2, b3} {
			if got := ix.Lookup(h).Has(slot); got != want[i] {
				t.Fatalf("block %d held %v, want %v", i+1, got, want[i])
			}
		}
	}
	for range 2 { // two copies of blocks 11 and 12
		if n := a.stored(slot, gpu, seed, []uint64{11, 12}, tokens[:2*testBlockSize], nil, testBlockSize); n != 2 {
			t.Fatalf("stored %d", n)
		}
	}
	if n := a.removed(slot, gpu, []uint64{12, 11}); n != 2 {
		t.Fatalf("the first copies' eviction resolved %d blocks, want 2", n)
	}
	held(true, true, false)
	parent, ok := a.parent(slot, gpu, seed, 12, true)
	if !ok || a.stored(slot, gpu, parent, []uint64{13}, tokens[2*testBlockSize:], nil, testBlockSize) != 1 {
		t.Fatal("a block chained from the remaining copy was not stored")
	}
	held(true, true, true)
	if n := a.removed(slot, gpu, []uint64{13, 12, 11}); n != 3 {
		t.Fatalf("the last copies' eviction resolved %d blocks, want 3", n)
	}
	held(false, false, false)

	// A clear forgets the copies: after it, one eviction takes a block out.
	a.stored(slot, gpu, seed, []uint64{11}, tokens[:testBlockSize], nil, testBlockSize)
	a.stored(slot, gpu, seed, []uint64{11}, tokens[:testBlockSize], nil, testBlockSize)
	a.engineCleared(slot)
	a.stored(slot, gpu, seed, []uint64{11}, tokens[:testBlockSize], nil, testBlockSize)
	a.removed(slot, gpu, []uint64{11})
	held(false, false, false)
	if len(a.copies) != 0 {
		t.Fatalf("copies left: %v", a.copies)
	}

	// One block under two names is not two copies: each name's eviction
	// unmaps it, so no name outlives its own eviction.
	a.stored(slot, gpu, seed, []uint64{21}, tokens[:testBlockSize], nil, testBlockSize)
	a.stored(slot, gpu, seed, []uint64{22}, tokens[:testBlockSize], nil, testBlockSize)
	if len(a.copies) != 0 {
		t.Fatalf("a second name counted as a copy: %v", a.copies)
	}
	a.removed(slot, gpu, []uint64{22})
	if _, ok := ix.LookupEngineHash(slot, 22); ok {
		t.Fatal("an evicted name still maps")
	}
	a.removed(slot, gpu, []uint64{21})
	held(false, false, false)
	if err := ix.Verify(); err != nil {
		t.Fatal(err)
	}
}
