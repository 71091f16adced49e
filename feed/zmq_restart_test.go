package feed

import (
	"context"
	"math"
	"strconv"
	"testing"
)

// Continuity across reconnects (feed/doc.go, "Restarts"): a lost
// connection is how an engine restart looks from the router, and the
// restarted engine numbers its batches from 0 again, so nothing that
// follows a reconnect is trusted until shown to continue what the index
// holds.

// TestZMQRestartedEngineAheadOfTheRouter: the engine restarts while the
// router is disconnected and publishes more batches than the router had
// seen before it reconnects, so its first live batch looks like a gap.
// Replaying that "gap" from the new engine would keep every block of the
// old one claimed. With a replay socket the router compares the batch it
// applied last with the new engine's batch of that number, finds them
// different, and rebuilds the view from the new engine's whole history;
// without one it cannot prove continuity and rebuilds from live traffic.
func TestZMQRestartedEngineAheadOfTheRouter(t *testing.T) {
	for _, replay := range []bool{true, false} {
		t.Run(map[bool]string{true: "replay", false: "no-replay"}[replay], func(t *testing.T) {
			ix := newZMQIndex(t)
			e := newTestEngine(t, replay)
			if replay {
				e.replyWithTopic()
			}
			s := startSub(t, ix, e, nil)
			e.warmUp(t, s, vllmMap)
			old := newModel()
			seqs, bs := publishOps(t, vllmMap, genOps(31, 120), e.publish)
			applyAll(old, bs)
			waitSeq(t, s, seqs[len(seqs)-1])
			old.check(t, ix, zmqTestSlot)
			base := s.Stats()

			ep, replayEp := e.ep, e.replayEp
			e.close()
			e = listenTestEngineAt(t, ep, replayEp)
			if replay {
				e.replyWithTopic()
			}
			// Everything the new engine publishes before the router is back
			// goes nowhere live (lose), but stays in its replay buffer.
			fresh := newModel()
			for h := range old.all {
				fresh.all[h] = true // must all be gone
			}
			var newSeqs []uint64
			for len(newSeqs) == 0 || newSeqs[len(newSeqs)-1] <= seqs[len(seqs)-1]+5 {
				more, bs := publishOps(t, vllmMap, genOps(uint64(32+len(newSeqs)), 60), e.lose)
				newSeqs = append(newSeqs, more...)
				if replay {
					applyAll(fresh, bs) // the router replays the new engine's history
				}
			}
			e.warmUp(t, s, vllmMap)
			fresh.check(t, ix, zmqTestSlot)

			st := s.Stats()
			if st.Disconnects == base.Disconnects || st.Gaps != base.Gaps || st.ReplayFailures != 0 {
				t.Fatalf("stats %+v", st)
			}
			if replay {
				// The comparison replay, the whole history, and the first
				// live batch's check that the history was this engine's.
				if st.Restarts-base.Restarts != 1 || st.Rejoins != 0 || st.Replays-base.Replays != 3 {
					t.Fatalf("stats %+v", st)
				}
			} else if st.Rejoins != 1 || st.Restarts != base.Restarts {
				t.Fatalf("stats %+v", st)
			}
			if got := ix.Stats().EngineMapEntries; got != uint64(len(fresh.engine)) {
				t.Fatalf("%d engine-map entries, the new engine mapped %d", got, len(fresh.engine))
			}
		})
	}
}

// The cases below drive the subscriber's sequence logic directly, as its
// Run goroutine would, so that a reconnect lands exactly between two
// chosen batches: over sockets the first batch a redialled SUB receives is
// a matter of timing.

// newDrivenSub returns a subscriber that is not running, for tests that
// call its sequence logic themselves.
func newDrivenSub(t *testing.T, e *testEngine) *ZMQSubscriber {
	t.Helper()
	cfg := ZMQConfig{Endpoint: "tcp://127.0.0.1:1", Slot: zmqTestSlot, Model: testModel, BlockSize: testBlockSize}
	if e != nil {
		cfg.Endpoint, cfg.Replay = e.ep, e.replayEp
	}
	s, err := NewZMQSubscriber(newZMQIndex(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// live publishes ops as batches through e (or numbers them from *next,
// without an engine) and hands each to s as its live stream does.
func live(t *testing.T, s *ZMQSubscriber, e *testEngine, next *uint64, ops []op) [][]op {
	t.Helper()
	var out [][]op
	for _, b := range batches(ops) {
		payload := encodeBatch(t, vllmMap, wireOps(intHashes, b))
		seq := *next
		if e != nil {
			seq = e.publish(payload)
		}
		*next = seq + 1
		s.onLive(context.Background(), seq, payload)
		out = append(out, b)
	}
	return out
}

// TestZMQReconnectNextNumberIsNotProof: the restarted engine has published
// exactly as many batches as the router had seen, so its first live batch
// carries the very number the router expects next. Without a replay socket
// nothing can tell it from the old engine's next batch: the view is
// rebuilt.
func TestZMQReconnectNextNumberIsNotProof(t *testing.T) {
	s := newDrivenSub(t, nil)
	var next uint64
	old := newModel()
	applyAll(old, live(t, s, nil, &next, genOps(41, 80)))
	old.check(t, s.ix, zmqTestSlot)

	// The view is dropped as the connection comes back, before any batch.
	s.joined(context.Background())
	if n := s.ix.Stats().WorkerBlocks[zmqTestSlot]; n != 0 {
		t.Fatalf("%d blocks still claimed after a reconnect nothing proves", n)
	}
	fresh := newModel()
	for h := range old.all {
		fresh.all[h] = true
	}
	applyAll(fresh, live(t, s, nil, &next, genOps(42, 40)))
	fresh.check(t, s.ix, zmqTestSlot)
	if st := s.Stats(); st.Rejoins != 1 || st.Restarts != 0 || st.Gaps != 0 || st.Resyncs != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestZMQReconnectProvenByReplay: the same engine, still up after the
// connection came back, returns the batch the router applied last byte
// for byte; what it missed meanwhile is replayed and the view kept.
func TestZMQReconnectProvenByReplay(t *testing.T) {
	e := newTestEngine(t, true)
	e.replyWithTopic()
	s := newDrivenSub(t, e)
	var next uint64
	m := newModel()
	applyAll(m, live(t, s, e, &next, genOps(43, 80)))

	// What it published while the router was away is replayed as the
	// connection comes back, once the batch applied last is proven.
	seqs, missed := publishOps(t, vllmMap, genOps(44, 40), e.lose)
	next = seqs[len(seqs)-1] + 1
	applyAll(m, missed)
	s.joined(context.Background())
	m.check(t, s.ix, zmqTestSlot)
	applyAll(m, live(t, s, e, &next, genOps(45, 40)))
	m.check(t, s.ix, zmqTestSlot)
	if st := s.Stats(); st.Rejoins != 0 || st.Restarts != 0 || st.Gaps != 0 || st.Resyncs != 0 ||
		st.Replays != 1 || st.Replayed != uint64(len(missed)) {
		t.Fatalf("stats %+v", st)
	}
}

// TestZMQReconnectPastTheReplayBuffer: the engine's buffer no longer holds
// the batch the router applied last, so continuity cannot be shown. The
// view is rebuilt from what the buffer still holds.
func TestZMQReconnectPastTheReplayBuffer(t *testing.T) {
	e := newTestEngine(t, true)
	s := newDrivenSub(t, e)
	var next uint64
	old := newModel()
	applyAll(old, live(t, s, e, &next, genOps(46, 80)))

	seqs, missed := publishOps(t, vllmMap, genOps(47, 40), e.lose)
	next = seqs[len(seqs)-1] + 1
	e.forget(seqs[2])
	s.joined(context.Background())
	fresh := newModel()
	// What the new view holds: the buffer's suffix applied to nothing.
	for h := range old.all {
		fresh.all[h] = true
	}
	applyAll(fresh, missed[2:])
	fresh.check(t, s.ix, zmqTestSlot)
	applyAll(fresh, live(t, s, e, &next, genOps(48, 20)))
	fresh.check(t, s.ix, zmqTestSlot)
	// The proof, the catch-up from the buffer, and the first live batch's
	// check that the catch-up was this engine's.
	if st := s.Stats(); st.Rejoins != 1 || st.Restarts != 0 || st.Replays != 3 || st.ReplayFailures != 0 || st.ReplayRejected != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestZMQTimestampBackwardsIsARestart: batches are stamped with the
// engine's clock as they are made and published in order, so a batch made
// well before its predecessor comes from another engine: the old view is
// dropped before it applies.
func TestZMQTimestampBackwardsIsARestart(t *testing.T) {
	s := newDrivenSub(t, nil)
	old := newModel()
	seq := uint64(0)
	for _, b := range batches(genOps(49, 60)) {
		s.offer(seq, encodeBatchAt(t, vllmMap, 2000, wireOps(intHashes, b)))
		applyAll(old, [][]op{b})
		seq++
	}
	// A clock step within the tolerance is not a restart, nor is a
	// timestamp that is not a number, which must not hide the next step.
	s.offer(seq, encodeBatchAt(t, vllmMap, 2000-clockStepTolerance/2, nil))
	seq++
	s.offer(seq, encodeBatchAt(t, vllmMap, math.NaN(), nil))
	seq++
	old.check(t, s.ix, zmqTestSlot)
	if st := s.Stats(); st.Restarts != 0 {
		t.Fatalf("stats %+v", st)
	}

	fresh := newModel()
	for h := range old.all {
		fresh.all[h] = true
	}
	for i, b := range batches(genOps(50, 30)) {
		s.offer(seq, encodeBatchAt(t, vllmMap, 1000+float64(i), wireOps(intHashes, b)))
		applyAll(fresh, [][]op{b})
		seq++
	}
	fresh.check(t, s.ix, zmqTestSlot)
	if st := s.Stats(); st.Restarts != 1 || st.Gaps != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestZMQReplayNumberedPastTheEngine: the replay socket answers the
// catch-up at connection with a batch numbered past anything the engine
// published, then truthfully. The live batches, numbered from 0, were
// dropped as repeats of what the view had applied, freezing it with a
// block no engine held; now a live batch that is not the batch applied
// under its number drops what the replay made up (replay_rejected), and
// one too far below the last number applied to tell (more than the 4,096
// digests kept) drops the view as well (a rejoin).
func TestZMQReplayNumberedPastTheEngine(t *testing.T) {
	for _, tc := range []struct {
		lie               uint64
		rejected, rejoins uint64
	}{{100, 1, 0}, {1_000_000, 0, 1}} {
		t.Run(strconv.FormatUint(tc.lie, 10), func(t *testing.T) {
			e := newTestEngine(t, true)
			e.replyWithTopic()
			s := newDrivenSub(t, e)
			madeUp := newModel()
			b := batches(genOps(51, 10))
			e.mu.Lock()
			e.buffer = append(e.buffer, sentBatch{seq: tc.lie, payload: encodeBatch(t, vllmMap, wireOps(intHashes, b[0]))})
			e.mu.Unlock()
			applyAll(madeUp, b[:1])
			s.joined(context.Background())
			madeUp.check(t, s.ix, zmqTestSlot)

			e.mu.Lock()
			e.buffer = nil // truthful from now on
			e.mu.Unlock()
			var next uint64
			m := newModel()
			for h := range madeUp.all {
				m.all[h] = true // must be gone
			}
			applyAll(m, live(t, s, e, &next, genOps(52, 40)))
			m.check(t, s.ix, zmqTestSlot)
			if st := s.Stats(); st.ReplayRejected != tc.rejected || st.Rejoins != tc.rejoins || st.Duplicates != 0 || st.LastSeq != next-1 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// TestZMQRestartSeenAtReconnect: an engine that restarts and then stays
// idle publishes nothing that would show the restart; its predecessor's
// blocks are dropped as the connection comes back, with a replay socket
// (which no longer holds the batch applied last) or without.
func TestZMQRestartSeenAtReconnect(t *testing.T) {
	for _, replay := range []bool{true, false} {
		t.Run(map[bool]string{true: "replay", false: "no-replay"}[replay], func(t *testing.T) {
			ix := newZMQIndex(t)
			e := newTestEngine(t, replay)
			s := startSub(t, ix, e, nil)
			e.warmUp(t, s, vllmMap)
			old := newModel()
			seqs, bs := publishOps(t, vllmMap, genOps(53, 60), e.publish)
			applyAll(old, bs)
			waitSeq(t, s, seqs[len(seqs)-1])
			old.check(t, ix, zmqTestSlot)

			ep, replayEp := e.ep, e.replayEp
			e.close()
			listenTestEngineAt(t, ep, replayEp) // restarted, and idle: it publishes nothing
			waitFor(t, func() bool { return ix.Stats().WorkerBlocks[zmqTestSlot] == 0 }, func() any { return s.Stats() })
			if st := s.Stats(); st.Rejoins != 1 || st.Restarts != 0 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// TestZMQReplayFailingAtReconnectIsAskedAgain: a replay socket that fails
// the check as the connection comes back (an engine that binds it a moment
// after its publisher, a stall) costs the view then, but a gap later in
// the same session is still replayed, not cleared over.
func TestZMQReplayFailingAtReconnectIsAskedAgain(t *testing.T) {
	e := newTestEngine(t, true)
	e.replyWithTopic()
	s := newDrivenSub(t, e)
	var next uint64
	live(t, s, e, &next, genOps(54, 40))

	e.mu.Lock()
	e.serve = func([]byte, uint64) {} // answers nothing: the replay stalls out
	e.mu.Unlock()
	s.joined(context.Background())
	if st := s.Stats(); st.ReplayFailures != 1 || st.Rejoins != 1 {
		t.Fatalf("stats %+v", st)
	}
	e.mu.Lock()
	e.serve = nil
	e.mu.Unlock()
	m := newModel()
	applyAll(m, live(t, s, e, &next, genOps(55, 20)))
	_, missed := publishOps(t, vllmMap, genOps(56, 20), e.lose)
	applyAll(m, missed)
	next += uint64(len(missed))
	applyAll(m, live(t, s, e, &next, genOps(57, 20)))
	m.check(t, s.ix, zmqTestSlot)
	if st := s.Stats(); st.Gaps != 1 || st.Resyncs != 0 || st.Replayed < uint64(len(missed)) {
		t.Fatalf("stats %+v", st)
	}
}
