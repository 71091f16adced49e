package feed

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvfast/kvfast/internal/syncbuf"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
)

// wireFormat is how a publisher lays out its batches, as msgspec writes
// them for each engine's struct definitions.
type wireFormat int

const (
	vllmMap     wireFormat = iota // vLLM after PR #42892: structs as maps, tag under "type"
	vllmArray                     // vLLM with array_like structs: [tag, fields...], batch [ts, events, dp_rank]
	sglangArray                   // SGLang: array_like, BlockStored ends at lora_id, BlockRemoved at block_hashes
	vllmMixed                     // vLLM v0.26: batch [ts, events, dp_rank], events maps
	sglangMeta                    // SGLang >= 0.5.18: array_like, medium always sent, a salt as an eighth metadata map
)

func (f wireFormat) String() string {
	return [...]string{"vllm-map", "vllm-array", "sglang-array", "vllm-mixed", "sglang-meta"}[f]
}

// wireEvent is one event as a publisher builds it; fields hold what
// msgspec would encode (nil for None).
type wireEvent struct {
	kind     string
	hashes   []any // uint64, int64 or []byte
	parent   any
	tokens   []uint32
	bs       int
	loraID   any
	medium   any
	loraName any
	extra    []any // extra_keys; omitted when nil
	group    any   // group_idx; omitted when nil
	salt     any   // SGLang's cache salt: metadata map (sglangMeta) or cache_salt key (map events)
	bigram   bool  // token_ids as SGLang's EAGLE bigram pairs
}

// testTS is the ts of every batch encodeBatch writes.
const testTS = 1722222222.5

// encodeBatch writes one KVEventBatch the way the engine's msgspec
// encoder does, with an independent msgpack implementation.
func encodeBatch(t testing.TB, f wireFormat, events []wireEvent) []byte {
	t.Helper()
	return encodeBatchAt(t, f, testTS, events)
}

// encodeBatchAt is encodeBatch for a batch made at ts.
func encodeBatchAt(t testing.TB, f wireFormat, ts float64, events []wireEvent) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.UseCompactInts(true)
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	tokens := func(ts []uint32, bigram bool) {
		must(e.EncodeArrayLen(len(ts)))
		for i, x := range ts {
			if bigram {
				// [t_i, t_i+1]; the last pair's second token lies beyond
				// the block.
				next := x + 1
				if i+1 < len(ts) {
					next = ts[i+1]
				}
				must(e.EncodeArrayLen(2))
				must(e.EncodeUint(uint64(x)))
				must(e.EncodeUint(uint64(next)))
				continue
			}
			must(e.EncodeUint(uint64(x)))
		}
	}
	anys := func(vs []any) {
		must(e.EncodeArrayLen(len(vs)))
		for _, v := range vs {
			must(e.Encode(v))
		}
	}
	if f == vllmMap {
		must(e.EncodeMapLen(3))
		must(e.EncodeString("ts"))
		must(e.EncodeFloat64(ts))
		must(e.EncodeString("events"))
	} else {
		n := 3
		if f == sglangArray {
			n = 2
		}
		must(e.EncodeArrayLen(n))
		must(e.EncodeFloat64(ts))
	}
	must(e.EncodeArrayLen(len(events)))
	for _, ev := range events {
		type kv struct {
			k string
			v func()
		}
		var fields []kv
		val := func(k string, v any) kv { return kv{k, func() { must(e.Encode(v)) }} }
		switch ev.kind {
		case "BlockStored":
			fields = []kv{{"block_hashes", func() { anys(ev.hashes) }}, val("parent_block_hash", ev.parent),
				{"token_ids", func() { tokens(ev.tokens, ev.bigram) }}, val("block_size", ev.bs), val("lora_id", ev.loraID)}
			switch {
			case f == sglangMeta && ev.salt != nil:
				fields = append(fields, val("medium", ev.medium), val("metadata", map[string]any{"cache_salt": ev.salt}))
			case f == sglangMeta:
				fields = append(fields, val("medium", ev.medium))
			case f != sglangArray:
				fields = append(fields, val("medium", ev.medium), val("lora_name", ev.loraName))
				if ev.salt != nil {
					fields = append(fields, val("cache_salt", ev.salt))
				}
			}
		case "BlockRemoved":
			fields = []kv{{"block_hashes", func() { anys(ev.hashes) }}}
			if f != sglangArray {
				fields = append(fields, val("medium", ev.medium))
			}
		}
		// omit_defaults: trailing fields at their default are left out.
		// SGLang has neither extra_keys nor group_idx.
		sglang := f == sglangArray || f == sglangMeta
		if ev.extra != nil && !sglang {
			fields = append(fields, kv{"extra_keys", func() { anys(ev.extra) }})
		}
		if ev.group != nil && !sglang {
			if ev.extra == nil && ev.kind == "BlockStored" {
				fields = append(fields, val("extra_keys", nil))
			}
			fields = append(fields, val("group_idx", ev.group))
		}
		if f == vllmMap || f == vllmMixed {
			must(e.EncodeMapLen(len(fields) + 1))
			must(e.EncodeString("type"))
			must(e.EncodeString(ev.kind))
			for _, fl := range fields {
				must(e.EncodeString(fl.k))
				fl.v()
			}
		} else {
			must(e.EncodeArrayLen(len(fields) + 1))
			must(e.EncodeString(ev.kind))
			for _, fl := range fields {
				fl.v()
			}
		}
	}
	if f == vllmMap {
		must(e.EncodeString("data_parallel_rank"))
		must(e.EncodeInt(0))
	} else if f != sglangArray {
		must(e.EncodeInt(0))
	}
	return buf.Bytes()
}

// hashKind is how the engine writes block hashes.
type hashKind int

const (
	intHashes    hashKind = iota // VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES: uint64, those >= 2^63 as msgpack uint64
	bytesHashes                  // vLLM's default: the sha256 digest
	signedHashes                 // SGLang (hash_str_to_int64) and vLLM 0.9 (hash()): int64, often negative
)

func (k hashKind) wire(h uint64) any {
	switch k {
	case intHashes:
		return h
	case signedHashes:
		return int64(h)
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], h)
	d := sha256.Sum256(b[:])
	return d[:]
}

// wireOps turns model ops into the events a publisher sends for them.
func wireOps(k hashKind, ops []op) []wireEvent {
	var evs []wireEvent
	for _, o := range ops {
		ev := wireEvent{bs: testBlockSize}
		for _, h := range o.Hashes {
			ev.hashes = append(ev.hashes, k.wire(h))
		}
		switch o.Op {
		case "stored":
			ev.kind, ev.tokens = "BlockStored", o.Tokens
			if o.Parent != nil {
				ev.parent = k.wire(*o.Parent)
			}
		case "removed":
			ev.kind = "BlockRemoved"
		case "cleared":
			ev.kind = "AllBlocksCleared"
		}
		evs = append(evs, ev)
	}
	return evs
}

// testEngine is the engine side of vLLM's protocol: a PUB socket and,
// optionally, the ROUTER replay socket serving a buffer of past batches.
type testEngine struct {
	t        testing.TB
	topic    []byte
	pub      zmq4.Socket
	ep       string
	router   zmq4.Socket
	replayEp string

	closing sync.Once
	mu      sync.Mutex
	// replayTopic: replies carry the topic frame, as since vLLM PR #45177
	// (v0.26): [topic, seq, payload], the end marker's topic empty.
	replayTopic bool
	seq         uint64
	buffer      []sentBatch // what the replay socket serves
	served      int         // replay requests answered
	// serve, when set, answers replay requests instead of the buffer
	// (a misbehaving replay socket).
	serve   func(id []byte, start uint64)
	stopped sync.WaitGroup
	// streamID follows the sequence number in live batches' sequence
	// frame, as vLLM's snapshot stream id does (nil: none).
	streamID []byte
}

type sentBatch struct {
	seq     uint64
	payload []byte
}

func newTestEngine(t testing.TB, replay bool) *testEngine {
	t.Helper()
	return listenTestEngine(t, replay, "tcp://127.0.0.1:0")
}

func listenTestEngine(t testing.TB, replay bool, ep string) *testEngine {
	t.Helper()
	replayEp := ""
	if replay {
		replayEp = "tcp://127.0.0.1:0"
	}
	return listenTestEngineAt(t, ep, replayEp)
}

// listenTestEngineAt starts an engine on the given endpoints, as a
// restarted engine binds its configured ports again; replayEp "" means no
// replay socket.
func listenTestEngineAt(t testing.TB, ep, replayEp string) *testEngine {
	t.Helper()
	e := &testEngine{t: t, topic: []byte("kv-events")}
	e.pub = zmq4.NewPub(context.Background())
	if err := e.pub.Listen(ep); err != nil {
		t.Fatal(err)
	}
	e.ep = "tcp://" + e.pub.Addr().String()
	if replayEp != "" {
		e.router = zmq4.NewRouter(context.Background())
		if err := e.router.Listen(replayEp); err != nil {
			t.Fatal(err)
		}
		e.replayEp = "tcp://" + e.router.Addr().String()
		e.stopped.Add(1)
		go e.serveReplay()
	}
	t.Cleanup(e.close)
	return e
}

func (e *testEngine) close() {
	e.closing.Do(func() {
		e.pub.Close()
		if e.router != nil {
			e.router.Close()
		}
		e.stopped.Wait()
	})
}

func (e *testEngine) serveReplay() {
	defer e.stopped.Done()
	for {
		msg, err := e.router.Recv()
		if err != nil {
			return
		}
		// [identity, empty delimiter, 8-byte start], as vLLM's ROUTER reads it.
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 0 || len(msg.Frames[2]) != 8 {
			e.t.Errorf("bad replay request %q", msg.Frames)
			continue
		}
		id, start := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
		e.mu.Lock()
		var todo []sentBatch
		for _, b := range e.buffer {
			if b.seq >= start {
				todo = append(todo, b)
			}
		}
		e.served++
		withTopic, serve := e.replayTopic, e.serve
		e.mu.Unlock()
		if serve != nil {
			serve(id, start)
			continue
		}
		// A client that hangs up mid-replay only ends its own replay: like
		// pyzmq's ROUTER, the socket drops what it cannot route.
		for _, b := range append(todo, sentBatch{endOfReplay, []byte{}}) {
			if e.reply(id, withTopic, b.seq, b.payload) != nil {
				break
			}
		}
	}
}

// reply sends one replay reply in the engine's shape:
// [identity, empty, seq, payload], or since vLLM PR #45177
// [identity, empty, topic, seq, payload] with an empty topic on the end
// marker (vllm/distributed/kv_events.py, ZmqEventPublisher._service_replay).
func (e *testEngine) reply(id []byte, withTopic bool, seq uint64, payload []byte) error {
	frames := [][]byte{id, {}}
	if withTopic {
		topic := e.topic
		if seq == endOfReplay {
			topic = []byte{}
		}
		frames = append(frames, topic)
	}
	return e.router.Send(zmq4.NewMsgFrom(append(frames, be64(seq), payload)...))
}

func be64(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

// publish sends the next batch and keeps it for replay.
func (e *testEngine) publish(payload []byte) uint64 {
	return e.emit(payload, true)
}

// lose numbers and buffers the next batch without sending it, as a PUB
// socket over its high-water mark drops it.
func (e *testEngine) lose(payload []byte) uint64 {
	return e.emit(payload, false)
}

func (e *testEngine) emit(payload []byte, send bool) uint64 {
	e.mu.Lock()
	seq := e.seq
	e.seq++
	if e.router != nil {
		e.buffer = append(e.buffer, sentBatch{seq, payload})
	}
	seqFrame := append(be64(seq), e.streamID...)
	e.mu.Unlock()
	if send {
		e.sendRaw(e.topic, seqFrame, payload)
	}
	return seq
}

func (e *testEngine) sendRaw(frames ...[]byte) {
	if err := e.pub.Send(zmq4.NewMsgFrom(frames...)); err != nil {
		e.t.Fatal(err)
	}
}

// forget drops the replay buffer up to (not including) seq, as vLLM's
// bounded buffer does.
func (e *testEngine) forget(seq uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for len(e.buffer) > 0 && e.buffer[0].seq < seq {
		e.buffer = e.buffer[1:]
	}
}

// replyWithTopic switches the replay socket to vLLM's current reply shape.
func (e *testEngine) replyWithTopic() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.replayTopic = true
}

func (e *testEngine) replaysServed() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.served
}

// warmUp publishes empty batches until the subscriber applies one: a SUB
// socket misses what is published before its subscription reaches the
// PUB. It returns the last sequence number published.
func (e *testEngine) warmUp(t testing.TB, s *ZMQSubscriber, f wireFormat) uint64 {
	t.Helper()
	empty := encodeBatch(t, f, nil)
	deadline := time.Now().Add(30 * time.Second)
	for {
		before := s.Stats().Batches
		seq := e.publish(empty)
		for range 20 {
			// Received, and what the replay at connection applied proven by
			// a live batch (the proof is a replay of its own, which tests
			// counting replays must not see).
			if s.Stats().Batches > before && s.ReplayConfirmed() {
				waitSeq(t, s, seq)
				return seq
			}
			time.Sleep(time.Millisecond)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the subscriber never received a batch: %+v", s.Stats())
		}
	}
}

// waitSeq waits until batch seq (and everything before it) is applied.
func waitSeq(t testing.TB, s *ZMQSubscriber, seq uint64) {
	t.Helper()
	waitFor(t, func() bool { st := s.Stats(); return st.Batches > 0 && st.LastSeq >= seq },
		func() any { return s.Stats() })
}

func waitFor(t testing.TB, cond func() bool, state func() any) {
	t.Helper()
	// Generous: it bounds a failure, and a loaded CI machine is slow.
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out; state: %+v", state())
		}
		time.Sleep(time.Millisecond)
	}
}

const zmqTestSlot = workers.Slot(61)

func newZMQIndex(t testing.TB) *radix.Index {
	t.Helper()
	ix, err := radix.NewHeap(testIndex)
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

// startSub runs a subscriber for e until the test ends.
func startSub(t testing.TB, ix *radix.Index, e *testEngine, tweak func(*ZMQConfig)) *ZMQSubscriber {
	t.Helper()
	return startSubAt(t, ix, e.ep, e.replayEp, tweak)
}

// startSubAt runs a subscriber for the engine publishing at ep, with the
// replay socket replayEp ("" for none), until the test ends.
func startSubAt(t testing.TB, ix *radix.Index, ep, replayEp string, tweak func(*ZMQConfig)) *ZMQSubscriber {
	t.Helper()
	cfg := ZMQConfig{Endpoint: ep, Replay: replayEp, Topic: "kv-events", Slot: zmqTestSlot, Model: testModel,
		BlockSize: testBlockSize, RedialMin: 5 * time.Millisecond, RedialMax: 20 * time.Millisecond,
		ReplayTimeout: 500 * time.Millisecond}
	if tweak != nil {
		tweak(&cfg)
	}
	s, err := NewZMQSubscriber(ix, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run returned %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	return s
}

// batches cuts ops into batches of 1 to 4 events.
func batches(ops []op) [][]op {
	var out [][]op
	for i := 0; i < len(ops); {
		n := min(1+i%4, len(ops)-i)
		out = append(out, ops[i:i+n])
		i += n
	}
	return out
}

func TestZMQMatchesModel(t *testing.T) {
	for _, tc := range []struct {
		f     wireFormat
		k     hashKind
		eagle bool // SGLang with EAGLE: token_ids as bigram pairs
	}{
		{vllmMap, intHashes, false}, {vllmMap, bytesHashes, false}, {vllmArray, intHashes, false},
		{vllmArray, bytesHashes, false}, {vllmMixed, intHashes, false}, {vllmMixed, bytesHashes, false},
		{sglangArray, signedHashes, false}, {sglangMeta, signedHashes, false}, {sglangMeta, signedHashes, true},
	} {
		f, k := tc.f, tc.k
		name := f.String() + map[hashKind]string{intHashes: "/int", bytesHashes: "/bytes", signedHashes: "/int64"}[k]
		if tc.eagle {
			name += "/eagle"
		}
		t.Run(name, func(t *testing.T) {
			ix := newZMQIndex(t)
			e := newTestEngine(t, false)
			s := startSub(t, ix, e, nil)
			e.warmUp(t, s, f)
			base := s.Stats()
			m := newModel()
			bs := batches(genOps(uint64(10+f)*3+uint64(k), 400))
			var last uint64
			for i, b := range bs {
				evs := wireOps(k, b)
				for i := range evs {
					evs[i].bigram = tc.eagle
				}
				last = e.publish(encodeBatch(t, f, evs))
				for _, o := range b {
					m.apply(o)
				}
				if i%40 == 0 || i == len(bs)-1 {
					waitSeq(t, s, last)
					m.check(t, ix, zmqTestSlot)
				}
			}
			st := s.Stats()
			if st.Batches-base.Batches != uint64(len(bs)) || st.Gaps != 0 || st.Resyncs != 0 || st.Garbage != 0 ||
				st.UnresolvedParent != 0 || st.BadEvents != 0 || !st.Connected {
				t.Fatalf("stats %+v", st)
			}
			if err := ix.Verify(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// publishOps publishes ops in batches (through send, which may lose them)
// and returns the batches with their sequence numbers.
func publishOps(t testing.TB, f wireFormat, ops []op, send func([]byte) uint64) (seqs []uint64, bs [][]op) {
	for _, b := range batches(ops) {
		seqs = append(seqs, send(encodeBatch(t, f, wireOps(intHashes, b))))
		bs = append(bs, b)
	}
	return seqs, bs
}

func applyAll(m *model, bs [][]op) {
	for _, b := range bs {
		for _, o := range b {
			m.apply(o)
		}
	}
}

func TestZMQGapIsReplayed(t *testing.T) {
	// Both reply shapes: [seq, payload] (vLLM before v0.26, SGLang) and
	// [topic, seq, payload] (vLLM since PR #45177), whose end marker has an
	// empty topic; a misread marker would stall the replay until its
	// timeout and count as a failure.
	for _, withTopic := range []bool{false, true} {
		t.Run(map[bool]string{false: "seq-payload", true: "topic-seq-payload"}[withTopic], func(t *testing.T) {
			ix := newZMQIndex(t)
			e := newTestEngine(t, true)
			if withTopic {
				e.replyWithTopic()
			}
			s := startSub(t, ix, e, func(c *ZMQConfig) { c.ReplayTimeout = time.Minute })
			e.warmUp(t, s, vllmMap)
			base, served := s.Stats(), e.replaysServed()
			ops := genOps(21, 300)
			m := newModel()
			_, before := publishOps(t, vllmMap, ops[:100], e.publish)
			_, lost := publishOps(t, vllmMap, ops[100:200], e.lose)
			seqs, after := publishOps(t, vllmMap, ops[200:], e.publish)
			applyAll(m, before)
			applyAll(m, lost)
			applyAll(m, after)
			waitSeq(t, s, seqs[len(seqs)-1])
			m.check(t, ix, zmqTestSlot)
			st := s.Stats()
			if st.Gaps != 1 || st.Replays-base.Replays != 1 || st.ReplayFailures != 0 || st.Resyncs != 0 ||
				st.Garbage != 0 || st.Replayed-base.Replayed < uint64(len(lost)) {
				t.Fatalf("stats %+v", st)
			}
			if e.replaysServed()-served != 1 {
				t.Fatalf("%d replays served", e.replaysServed())
			}
		})
	}
}

// TestZMQReplayOfAnotherEngineIsRejected: a replay= socket that is not
// the live engine's (a misconfiguration) answers with another history.
// Its batches are applied as they come, and dropped once the replay has
// not proven itself by the live batch as published: at connection, when
// the first live batch comes, and after a gap. Kept, they had credited the
// worker with the other engine's blocks.
func TestZMQReplayOfAnotherEngineIsRejected(t *testing.T) {
	ix := newZMQIndex(t)
	live := newTestEngine(t, false)
	other := newTestEngine(t, true)
	// The other engine's history, longer than anything the live one
	// publishes here, so that every replay finds batches under the numbers
	// asked for.
	publishOps(t, vllmMap, genOps(31, 1200), other.lose)
	s := startSubAt(t, ix, live.ep, other.replayEp, nil)
	live.warmUp(t, s, vllmMap)
	if st := s.Stats(); st.ReplayRejected != 1 || st.Replayed == 0 {
		t.Fatalf("the replay at connection: stats %+v", st)
	}
	ops := genOps(32, 300)
	m := newModel()
	_, before := publishOps(t, vllmMap, ops[:100], live.publish)
	publishOps(t, vllmMap, ops[100:200], live.lose)
	seqs, after := publishOps(t, vllmMap, ops[200:], live.publish)
	applyAll(m, before)
	m.apply(op{Op: "cleared"}) // the view dropped, and rebuilt from the live batches
	applyAll(m, after)
	waitSeq(t, s, seqs[len(seqs)-1])
	m.check(t, ix, zmqTestSlot)
	if st := s.Stats(); st.ReplayRejected != 2 || st.Gaps != 1 {
		t.Fatalf("after a gap: stats %+v", st)
	}
}

// TestZMQMisbehavingReplayEnds: the live stream waits while a replay
// runs, so a replay socket must not be able to hold it: one that repeats
// a batch without end stalls out, and one that answers with a number from
// far ahead ends the replay there without shadowing the live stream. In
// both the worker's later live batches are applied.
func TestZMQMisbehavingReplayEnds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		serve func(e *testEngine, id []byte, start uint64, payload []byte, stop <-chan struct{})
	}{
		{"repeats a batch", func(e *testEngine, id []byte, start uint64, payload []byte, stop <-chan struct{}) {
			for { // every 100 ms until the test ends, against a 300 ms stall timeout
				if e.reply(id, false, start, payload) != nil {
					return
				}
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		}},
		{"lies about the number", func(e *testEngine, id []byte, _ uint64, payload []byte, _ <-chan struct{}) {
			_ = e.reply(id, false, 1e12, payload)
			_ = e.reply(id, false, endOfReplay, []byte{})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := newZMQIndex(t)
			e := newTestEngine(t, true)
			s := startSub(t, ix, e, func(c *ZMQConfig) { c.ReplayTimeout = 300 * time.Millisecond })
			e.warmUp(t, s, vllmMap)
			ops := genOps(26, 200)
			_, lost := publishOps(t, vllmMap, ops[:50], e.lose)
			lostPayload := encodeBatch(t, vllmMap, wireOps(intHashes, lost[0]))
			e.mu.Lock()
			stop := make(chan struct{})
			t.Cleanup(func() { close(stop) }) // before the engine's own cleanup waits for its server
			e.serve = func(id []byte, start uint64) { tc.serve(e, id, start, lostPayload, stop) }
			e.mu.Unlock()
			m := newModel()
			m.apply(op{Op: "cleared"}) // the lost batches stay lost
			seqs, after := publishOps(t, vllmMap, ops[50:], e.publish)
			applyAll(m, after)
			waitSeq(t, s, seqs[len(seqs)-1])
			m.check(t, ix, zmqTestSlot)
		})
	}
}

func TestZMQGapWithoutReplayResyncs(t *testing.T) {
	ix := newZMQIndex(t)
	e := newTestEngine(t, false)
	var log syncbuf.Buffer
	s := startSub(t, ix, e, func(c *ZMQConfig) { c.Logger = slog.New(slog.NewTextHandler(&log, nil)) })
	e.warmUp(t, s, vllmArray)
	ops := genOps(22, 300)
	m := newModel()
	_, before := publishOps(t, vllmArray, ops[:100], e.publish)
	publishOps(t, vllmArray, ops[100:150], e.lose)
	seqs, after := publishOps(t, vllmArray, ops[150:], e.publish)
	applyAll(m, before)
	m.apply(op{Op: "cleared"}) // the resync
	applyAll(m, after)
	waitSeq(t, s, seqs[len(seqs)-1])
	m.check(t, ix, zmqTestSlot)
	if st := s.Stats(); st.Gaps != 1 || st.Resyncs != 1 || st.Replays != 0 {
		t.Fatalf("stats %+v", st)
	}
	// The operator learns that routing lost the worker's cache, and why.
	if !strings.Contains(log.String(), "level=WARN msg=\"KV-event batches lost") {
		t.Errorf("the gap was not logged:\n%s", log.String())
	}
}

func TestZMQReplayBeyondBufferResyncs(t *testing.T) {
	ix := newZMQIndex(t)
	e := newTestEngine(t, true)
	s := startSub(t, ix, e, nil)
	e.warmUp(t, s, vllmMap)
	base := s.Stats()
	ops := genOps(23, 300)
	m := newModel()
	_, before := publishOps(t, vllmMap, ops[:100], e.publish)
	lostSeqs, lost := publishOps(t, vllmMap, ops[100:200], e.lose)
	// The engine's buffer has already dropped the first half of the lost
	// batches: the replay starts after a hole.
	half := len(lostSeqs) / 2
	e.forget(lostSeqs[half])
	seqs, after := publishOps(t, vllmMap, ops[200:], e.publish)
	applyAll(m, before)
	m.apply(op{Op: "cleared"})
	applyAll(m, lost[half:])
	applyAll(m, after)
	waitSeq(t, s, seqs[len(seqs)-1])
	m.check(t, ix, zmqTestSlot)
	if st := s.Stats(); st.Gaps != 1 || st.Replays-base.Replays != 1 || st.Resyncs != 1 ||
		st.Replayed-base.Replayed < uint64(len(lost)-half) {
		t.Fatalf("stats %+v", st)
	}
}

func TestZMQDeadReplaySocketResyncs(t *testing.T) {
	ix := newZMQIndex(t)
	e := newTestEngine(t, false)
	ln := freeTCPEndpoint(t) // nothing listens there
	s := startSub(t, ix, e, func(c *ZMQConfig) { c.Replay = ln })
	e.warmUp(t, s, vllmMap)
	base := s.Stats()
	m := newModel()
	ops := genOps(24, 200)
	_, before := publishOps(t, vllmMap, ops[:80], e.publish)
	publishOps(t, vllmMap, ops[80:120], e.lose)
	seqs, after := publishOps(t, vllmMap, ops[120:], e.publish)
	applyAll(m, before)
	m.apply(op{Op: "cleared"})
	applyAll(m, after)
	waitSeq(t, s, seqs[len(seqs)-1])
	m.check(t, ix, zmqTestSlot)
	if st := s.Stats(); st.Gaps != 1 || st.ReplayFailures-base.ReplayFailures != 1 || st.Resyncs != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// freeTCPEndpoint returns a loopback endpoint nothing listens on.
func freeTCPEndpoint(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return "tcp://" + ln.Addr().String()
}

// TestZMQJoinCatchesUpFromReplay: the engine ran before the router
// subscribed (or the router restarted): everything it published went
// nowhere, but its replay buffer still holds it. The subscriber catches up
// from it as soon as it connects, without waiting for the engine's next
// batch, which an idle engine may not send for hours; live batches then
// continue the view.
func TestZMQJoinCatchesUpFromReplay(t *testing.T) {
	ix := newZMQIndex(t)
	e := newTestEngine(t, true)
	ops := genOps(25, 300)
	m := newModel()
	seqs, early := publishOps(t, vllmMap, ops[:200], e.publish)
	applyAll(m, early)
	s := startSub(t, ix, e, nil)
	waitSeq(t, s, seqs[len(seqs)-1])
	m.check(t, ix, zmqTestSlot)
	if st := s.Stats(); st.Replays != 1 || st.Resyncs != 0 || st.Replayed != uint64(len(seqs)) {
		t.Fatalf("idle engine: stats %+v", st)
	}
	e.warmUp(t, s, vllmMap)
	seqs, late := publishOps(t, vllmMap, ops[200:], e.publish)
	applyAll(m, late)
	waitSeq(t, s, seqs[len(seqs)-1])
	m.check(t, ix, zmqTestSlot)
	if st := s.Stats(); st.Resyncs != 0 {
		t.Fatalf("live batches after the catch-up: stats %+v", st)
	}
}

// TestZMQReplayHoleIsAskedAgain: replies the engine's ROUTER dropped in
// the middle of a replay (past its send high-water mark, silently) are
// asked for again from the first one missing, instead of costing the
// worker its entries; so is a tail dropped with the end marker, which
// shows as the replies stopping.
func TestZMQReplayHoleIsAskedAgain(t *testing.T) {
	for _, tc := range []struct {
		name    string
		dropped func(i, n int) bool // reply i of n is dropped in the first round
	}{
		{"a hole in the middle", func(i, _ int) bool { return i >= 20 && i < 30 }},
		{"the tail and the end marker", func(i, _ int) bool { return i >= 20 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := newZMQIndex(t)
			e := newTestEngine(t, true)
			// The dropped tail shows after a stall timeout; a loaded machine
			// may stall a later round too, which only asks once more.
			s := startSub(t, ix, e, func(c *ZMQConfig) { c.ReplayTimeout = time.Second })
			e.warmUp(t, s, vllmMap)
			ops := genOps(28, 300)
			m := newModel()
			_, lost := publishOps(t, vllmMap, ops[:200], e.lose)
			applyAll(m, lost)
			var asked atomic.Int32
			e.mu.Lock()
			e.serve = func(id []byte, start uint64) {
				e.mu.Lock()
				var todo []sentBatch
				for _, b := range e.buffer {
					if b.seq >= start {
						todo = append(todo, b)
					}
				}
				e.mu.Unlock()
				todo = append(todo, sentBatch{endOfReplay, []byte{}})
				first := asked.Add(1) == 1
				for i, b := range todo {
					if first && tc.dropped(i, len(todo)) {
						continue // dropped past the high-water mark
					}
					if e.reply(id, false, b.seq, b.payload) != nil {
						return
					}
				}
			}
			e.mu.Unlock()
			seqs, after := publishOps(t, vllmMap, ops[200:], e.publish)
			applyAll(m, after)
			waitSeq(t, s, seqs[len(seqs)-1])
			m.check(t, ix, zmqTestSlot)
			if st := s.Stats(); st.ReplayHoles < 1 || st.Resyncs != 0 || st.ReplayFailures != 0 || asked.Load() < 2 {
				t.Fatalf("%d replay requests, stats %+v", asked.Load(), st)
			}
		})
	}
}

func TestZMQEngineRestartDropsItsBlocks(t *testing.T) {
	ix := newZMQIndex(t)
	e := newTestEngine(t, false)
	var log syncbuf.Buffer
	s := startSub(t, ix, e, func(c *ZMQConfig) { c.Logger = slog.New(slog.NewTextHandler(&log, nil)) })
	e.warmUp(t, s, vllmMap)
	old := newModel()
	seqs, bs := publishOps(t, vllmMap, genOps(26, 100), e.publish)
	applyAll(old, bs)
	waitSeq(t, s, seqs[len(seqs)-1])
	old.check(t, ix, zmqTestSlot)

	// The engine restarts on the same port: a new PUB socket whose
	// numbering starts again at 0. The subscriber must notice the lost
	// connection, redial, and drop the old engine's blocks.
	ep := e.ep
	e.close()
	e = listenTestEngine(t, false, ep)
	e.warmUp(t, s, vllmMap)
	fresh := newModel()
	for h := range old.all {
		fresh.all[h] = true // must all be gone
	}
	seqs, bs = publishOps(t, vllmMap, genOps(27, 100), e.publish)
	applyAll(fresh, bs)
	waitSeq(t, s, seqs[len(seqs)-1])
	fresh.check(t, ix, zmqTestSlot)
	// Without a replay socket nothing proves the engine the one before:
	// the view goes as the connection comes back (a rejoin), and the new
	// engine's numbering from 0 is no second restart.
	if st := s.Stats(); st.Rejoins != 1 || st.Restarts != 0 || st.Disconnects < 1 {
		t.Fatalf("stats %+v", st)
	}
	if !strings.Contains(log.String(), "nothing proves the engine is the one before: its cached blocks dropped") {
		t.Errorf("the rejoin was not logged:\n%s", log.String())
	}
	// The old engine's hash mappings went with it.
	if st := ix.Stats(); st.EngineMapEntries != uint64(len(fresh.engine)) {
		t.Fatalf("%d engine-map entries, the new engine mapped %d", st.EngineMapEntries, len(fresh.engine))
	}
}

func TestZMQSkipsWhatItCannotRoute(t *testing.T) {
	ix := newZMQIndex(t)
	e := newTestEngine(t, false)
	var log syncbuf.Buffer
	s := startSub(t, ix, e, func(c *ZMQConfig) { c.Logger = slog.New(slog.NewTextHandler(&log, nil)) })
	e.warmUp(t, s, vllmMap)
	tokens := func(n int) []uint32 {
		ts := make([]uint32, n*testBlockSize)
		for i := range ts {
			ts[i] = uint32(i + 7)
		}
		return ts
	}
	good := wireEvent{kind: "BlockStored", hashes: []any{uint64(1), uint64(2)}, tokens: tokens(2), bs: testBlockSize}
	with := func(f func(*wireEvent)) wireEvent {
		ev := good
		ev.hashes = []any{uint64(100 + len(ev.kind)), uint64(200)}
		f(&ev)
		return ev
	}
	events := []wireEvent{
		good,
		with(func(ev *wireEvent) { ev.loraID = 3 }), // unnamed adapter: skipped
		with(func(ev *wireEvent) { // stored in the adapter's namespace, under hashes of its own as vLLM's carry the adapter
			ev.loraName = "adapter"
			ev.hashes = []any{uint64(500), uint64(501)}
		}),
		with(func(ev *wireEvent) { ev.medium = "CPU" }),  // stored on the host tier
		with(func(ev *wireEvent) { ev.medium = "GPU" }),  // stored: 2 blocks
		with(func(ev *wireEvent) { ev.medium = "TAPE" }), // no tier kvfast knows: skipped
		with(func(ev *wireEvent) { ev.group = 1 }),       // stored in group 1
		with(func(ev *wireEvent) { ev.group = radix.MaxGroups }),
		with(func(ev *wireEvent) { ev.bs = -1 }), // no engine's size: a bad event, which must not take the warning below
		with(func(ev *wireEvent) { ev.bs = 2 * testBlockSize }),
		with(func(ev *wireEvent) { ev.tokens = ev.tokens[:len(ev.tokens)-1] }),
		with(func(ev *wireEvent) { ev.parent = uint64(999) }), // unknown parent
		with(func(ev *wireEvent) {
			ev.hashes = []any{uint64(300), uint64(301)}
			ev.extra = []any{nil, []any{"mm-hash", 0}}
		}),
		{kind: "BlockRemoved", hashes: []any{uint64(2), uint64(12345)}, medium: "CPU"},
		{kind: "BlockRemoved", hashes: []any{uint64(12345)}},
		{kind: "KVCacheEvictedToMars", hashes: []any{uint64(1)}},
	}
	seq := e.publish(encodeBatch(t, vllmMap, events))
	// Unusable token ids: well-formed msgpack, so only the event is skipped.
	bad := encodeBatch(t, vllmMap, []wireEvent{{kind: "BlockStored", hashes: []any{uint64(50)}, tokens: []uint32{1, 2, 3, 4}, bs: testBlockSize}})
	bad = bytes.Replace(bad, []byte{0x94, 1, 2, 3, 4}, []byte{0x94, 1, 2, 3, 0xff}, 1) // -1
	seq2 := e.publish(bad)
	waitSeq(t, s, seq2)
	if seq2 != seq+1 {
		t.Fatal("sequence")
	}
	st := s.Stats()
	want := ZMQStats{Connected: true, LastSeq: seq2, Batches: st.Batches, StoredBlocks: 2 + 2 + 2 + 2 + 2 + 1,
		SkippedLoRA: 2, SkippedMedium: 2, SkippedGroup: 2, BlockSizeMismatch: 2, BadEvents: 3,
		UnresolvedParent: 2, SkippedExtraKeys: 1, UnknownRemoved: 2 + 1, UnknownEvents: 1}
	if st != want {
		t.Fatalf("stats\n got %+v\nwant %+v", st, want)
	}
	if !strings.Contains(log.String(), "KV events in another block size skipped") || !strings.Contains(log.String(), "engine_block_size=8 ") {
		t.Errorf("the engine's block size is not what the log warns of:\n%s", log.String())
	}
	if n := strings.Count(log.String(), "KV events the router cannot read"); n != 1 {
		t.Errorf("the bad events were logged %d times, want once (a minute):\n%s", n, log.String())
	}
	seed := radix.NamespaceSeed(testModel, "", "")
	b1 := radix.ChainBlockHash(seed, tokens(2)[:testBlockSize])
	b2 := radix.ChainBlockHash(b1, tokens(2)[testBlockSize:])
	if !ix.Lookup(b1).Has(zmqTestSlot) || !ix.Lookup(b2).Has(zmqTestSlot) {
		t.Fatal("the good event's blocks are missing")
	}
	a1 := radix.ChainBlockHash(radix.NamespaceSeed(testModel, "adapter", ""), tokens(2)[:testBlockSize])
	if !ix.Lookup(a1).Has(zmqTestSlot) {
		t.Fatal("the adapter's blocks are missing")
	}
	for _, k := range []keyspace{{tier: workers.TierHost}, {group: 1}} {
		if !ix.Lookup(radix.KeyspaceHash(b2, k.group, k.tier)).Has(zmqTestSlot) {
			t.Fatalf("the blocks of %+v are missing", k)
		}
	}
	if n := ix.Stats().WorkerBlocks[zmqTestSlot]; n != 8 {
		// The medium=GPU and extra-keys events store the same two
		// token blocks (and the first extra-key block) again; the
		// adapter's, the host tier's and group 1's are two others each.
		t.Fatalf("slot holds %d blocks", n)
	}
}

// TestZMQCachedLeadingBlocksChainThrough: vLLM's cache_full_blocks names
// only the blocks it newly caches, while its token ids also cover the
// leading blocks of the range that were cached already (a prefix hit):
// the blocks named chain through those tokens, as the engine hashed them.
func TestZMQCachedLeadingBlocksChainThrough(t *testing.T) {
	ix := newZMQIndex(t)
	e := newTestEngine(t, false)
	s := startSub(t, ix, e, nil)
	e.warmUp(t, s, vllmMap)
	a, b, c, d := countingBlock(100), countingBlock(200), countingBlock(300), countingBlock(400)
	seq := e.publish(encodeBatch(t, vllmMap, []wireEvent{
		{kind: "BlockStored", hashes: []any{uint64(1), uint64(2)}, tokens: append(slices.Clone(a), b...), bs: testBlockSize},
		// Blocks c and d were cached already (named by an earlier
		// request, or not: the chain needs only their tokens); e is new.
		{kind: "BlockStored", hashes: []any{uint64(5)}, parent: uint64(2), tokens: slices.Concat(c, d, countingBlock(500)), bs: testBlockSize},
	}))
	waitSeq(t, s, seq)
	h := radix.NamespaceSeed(testModel, "", "")
	for _, blk := range [][]uint32{a, b, c, d, countingBlock(500)} {
		h = radix.ChainBlockHash(h, blk)
	}
	if !ix.Lookup(h).Has(zmqTestSlot) {
		t.Fatalf("the newly cached block was not stored under its chained hash: %+v", s.Stats())
	}
	if st := s.Stats(); st.BadEvents != 0 || st.StoredBlocks != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// TestZMQOtherRankSkipped: with CheckDPRank, a batch stamped with
// another data_parallel_rank is another rank's cache and is skipped
// (counted), while the worker's own rank's batches apply; without it, the
// rank is not looked at.
func TestZMQOtherRankSkipped(t *testing.T) {
	tokens := make([]uint32, testBlockSize)
	for i := range tokens {
		tokens[i] = uint32(i + 3)
	}
	block := radix.ChainBlockHash(radix.NamespaceSeed(testModel, "", ""), tokens)
	stored := func(rank byte) []byte {
		b := encodeBatch(t, vllmMap, []wireEvent{{kind: "BlockStored", hashes: []any{uint64(77)}, tokens: tokens, bs: testBlockSize}})
		if b[len(b)-1] != 0 {
			t.Fatalf("the batch does not end with its rank 0: % x", b[len(b)-8:])
		}
		b[len(b)-1] = rank // data_parallel_rank, a positive fixint
		return b
	}
	for _, check := range []bool{true, false} {
		ix := newZMQIndex(t)
		e := newTestEngine(t, false)
		s := startSub(t, ix, e, func(c *ZMQConfig) { c.CheckDPRank = check })
		e.warmUp(t, s, vllmMap)
		waitSeq(t, s, e.publish(stored(1)))
		if got := ix.Lookup(block).Has(zmqTestSlot); got == check {
			t.Fatalf("check %v: rank 1's block stored on rank 0's worker: %v", check, got)
		}
		if n := s.Stats().OtherRankBatches; n != map[bool]uint64{true: 1, false: 0}[check] {
			t.Fatalf("check %v: %d batches of another rank counted", check, n)
		}
		waitSeq(t, s, e.publish(stored(0)))
		if !ix.Lookup(block).Has(zmqTestSlot) {
			t.Fatalf("check %v: the worker's own rank's block is missing", check)
		}
	}
}

func TestZMQGarbageIsCountedAndSurvived(t *testing.T) {
	ix := newZMQIndex(t)
	e := newTestEngine(t, false)
	s := startSub(t, ix, e, nil)
	e.warmUp(t, s, vllmMap)
	m := newModel()
	seqs, bs := publishOps(t, vllmMap, genOps(28, 60), e.publish)
	applyAll(m, bs)
	waitSeq(t, s, seqs[len(seqs)-1])
	// Messages that are not [topic, seq, payload] are dropped unnumbered.
	e.sendRaw(e.topic, be64(seqs[len(seqs)-1]+1))
	e.sendRaw(e.topic, []byte{1, 2, 3}, []byte{0x90})
	e.sendRaw(e.topic, be64(0), []byte{0x90}, []byte{})
	// A numbered batch that does not decode is lost, with what it changed.
	garbage := e.publish([]byte{0x92, 0xcb, 1, 2})
	m.apply(op{Op: "cleared"})
	seqs, bs = publishOps(t, vllmMap, genOps(29, 60), e.publish)
	applyAll(m, bs)
	waitSeq(t, s, seqs[len(seqs)-1])
	m.check(t, ix, zmqTestSlot)
	if st := s.Stats(); st.Garbage != 4 || st.Resyncs != 1 || st.Gaps != 0 || garbage+1 != seqs[0] {
		t.Fatalf("stats %+v", st)
	}
}

// TestZMQSnapshotStreamID: with its snapshot endpoint on, vLLM follows
// each live batch's sequence number with its 16-byte stream id in the same
// frame; those batches are applied (they were all garbage, and each
// dropped the worker's view), and the replay still fills a gap.
func TestZMQSnapshotStreamID(t *testing.T) {
	ix := newZMQIndex(t)
	e := newTestEngine(t, true)
	e.streamID = []byte("0123456789abcdef")
	s := startSub(t, ix, e, nil)
	e.warmUp(t, s, vllmMap)
	m := newModel()
	bs := batches(genOps(31, 60))
	for i, b := range bs {
		send := e.publish
		if i == len(bs)/2 {
			send = e.lose // a gap, filled from the replay socket
		}
		send(encodeBatch(t, vllmMap, wireOps(intHashes, b)))
		applyAll(m, [][]op{b})
	}
	last := e.publish(encodeBatch(t, vllmMap, nil))
	waitSeq(t, s, last)
	m.check(t, ix, zmqTestSlot)
	if st := s.Stats(); st.Garbage != 0 || st.Resyncs != 0 || st.Gaps != 1 || st.Replayed == 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestZMQRedialsUntilTheEngineComesUp(t *testing.T) {
	ep := freeTCPEndpoint(t)
	ix := newZMQIndex(t)
	s := startSub(t, ix, &testEngine{ep: ep}, nil)
	waitFor(t, func() bool { return s.Stats().Disconnects >= 2 }, func() any { return s.Stats() })
	if s.Stats().Connected {
		t.Fatal("connected to nothing")
	}
	e := listenTestEngine(t, false, ep)
	e.warmUp(t, s, vllmMap)
	if !s.Stats().Connected {
		t.Fatal("not connected")
	}
}

// TestZMQUnreachableFeedIsLogged: an endpoint nothing listens on is
// said at warning level, once a minute however often it is redialled.
func TestZMQUnreachableFeedIsLogged(t *testing.T) {
	var log syncbuf.Buffer
	s := startSub(t, newZMQIndex(t), &testEngine{ep: freeTCPEndpoint(t)}, func(c *ZMQConfig) {
		c.Logger = slog.New(slog.NewTextHandler(&log, nil))
	})
	waitFor(t, func() bool { return s.Stats().Disconnects >= 3 }, func() any { return s.Stats() })
	if n := strings.Count(log.String(), "level=WARN msg=\"KV-event feed down, redialling\" events=tcp://"); n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, log.String())
	}
	// Refused: the line says what an engine must do to be listening.
	if !strings.Contains(log.String(), "hint=\"nothing listens there") {
		t.Errorf("a refused connection without its hint:\n%s", log.String())
	}
	// Named events, not endpoint: the endpoint picker's logger names the
	// pod's address endpoint, and JSON logs kept one of the two.
	if strings.Contains(log.String(), " endpoint=") {
		t.Errorf("the feed's socket logged as endpoint:\n%s", log.String())
	}
}

// TestZMQQuietFeedIsLogged: a connection that carries nothing is said
// once: a topic= the engine does not publish under looks just so, since
// the engine's own socket drops what the subscription does not match.
func TestZMQQuietFeedIsLogged(t *testing.T) {
	var log syncbuf.Buffer
	e := newTestEngine(t, false)
	startSub(t, newZMQIndex(t), e, func(c *ZMQConfig) {
		c.Logger = slog.New(slog.NewTextHandler(&log, nil))
		c.QuietAfter = 20 * time.Millisecond
	})
	waitFor(t, func() bool { return strings.Contains(log.String(), "no KV events since the feed connected") },
		func() any { return log.String() })
	if !strings.Contains(log.String(), "topic=kv-events") {
		t.Errorf("the line does not name the topic:\n%s", log.String())
	}
}

// TestZMQContentHashedSGLangIsNamed: SGLang's releases of mid-2025 give
// a first page the parent hash(()) (the radix root's empty key) and hash
// pages alone; their events are not followed, and the log says which
// engine that is and what to do, once.
func TestZMQContentHashedSGLangIsNamed(t *testing.T) {
	var log syncbuf.Buffer
	e := newTestEngine(t, false)
	s := startSub(t, newZMQIndex(t), e, func(c *ZMQConfig) { c.Logger = slog.New(slog.NewTextHandler(&log, nil)) })
	e.warmUp(t, s, vllmArray)
	root := int64(5740354900026072187) // Python 3: hash(())
	seq := e.publish(encodeBatch(t, vllmArray, []wireEvent{
		{kind: "BlockStored", hashes: []any{int64(-11)}, parent: root, tokens: countingBlock(21), bs: testBlockSize},
		{kind: "BlockStored", hashes: []any{int64(-12)}, parent: root, tokens: countingBlock(41), bs: testBlockSize},
		{kind: "BlockStored", hashes: []any{int64(-13)}, parent: int64(999), tokens: countingBlock(61), bs: testBlockSize},
	}))
	waitSeq(t, s, seq)
	if st := s.Stats(); st.UnresolvedParent != 3 || st.StoredBlocks != 0 {
		t.Fatalf("stats %+v", st)
	}
	if n := strings.Count(log.String(), "an SGLang release from June to November 2025"); n != 1 {
		t.Errorf("named %d times, want once:\n%s", n, log.String())
	}
}

// TestZMQUnresolvedParentIsExplained: without a replay socket, blocks
// chained to a parent stored before the router followed the engine are
// not credited, and the log says why and what to do, once a minute; with
// one, the replay fills such gaps and the line is not written.
func TestZMQUnresolvedParentIsExplained(t *testing.T) {
	for _, replay := range []bool{false, true} {
		var log syncbuf.Buffer
		e := newTestEngine(t, replay)
		s := startSub(t, newZMQIndex(t), e, func(c *ZMQConfig) { c.Logger = slog.New(slog.NewTextHandler(&log, nil)) })
		e.warmUp(t, s, vllmArray)
		ts := countingBlock(81)
		var seq uint64
		for h := range 3 {
			seq = e.publish(encodeBatch(t, vllmArray, []wireEvent{
				{kind: "BlockStored", hashes: []any{int64(-21 - h)}, parent: int64(4242), tokens: ts, bs: testBlockSize},
			}))
		}
		waitSeq(t, s, seq)
		if st := s.Stats(); st.UnresolvedParent != 3 {
			t.Fatalf("replay %v: stats %+v", replay, st)
		}
		want := 1
		if replay {
			want = 0
		}
		if n := strings.Count(log.String(), "chain to blocks stored before this router followed it"); n != want {
			t.Errorf("replay %v: explained %d times, want %d:\n%s", replay, n, want, log.String())
		}
	}
}

func TestZMQRunTwice(t *testing.T) {
	s, err := NewZMQSubscriber(newZMQIndex(t), ZMQConfig{Endpoint: freeTCPEndpoint(t), Slot: 1, Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	waitFor(t, func() bool { return s.running.Load() }, func() any { return "not running" })
	if err := s.Run(ctx); !errors.Is(err, errZMQRunning) {
		t.Fatalf("second Run: %v", err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

func TestCheckZMQEndpoint(t *testing.T) {
	for _, tc := range []struct {
		ep string
		ok bool
	}{
		{"tcp://127.0.0.1:5557", true},
		{"tcp://engine-0.local:5557", true},
		{"tcp://[::1]:5557", true},
		{"ipc:///tmp/kv-events", true},
		{"tcp://*:5557", false},
		{"tcp://:5557", false},
		{"tcp://127.0.0.1", false},
		{"tcp://127.0.0.1:0", false},
		{"tcp://127.0.0.1:http", false},
		{"tcp://127.0.0.1:65536", false},
		{"127.0.0.1:5557", false},
		{"http://127.0.0.1:5557", false},
		{"ipc://", false},
		{"", false},
	} {
		if err := CheckZMQEndpoint(tc.ep); (err == nil) != tc.ok {
			t.Errorf("%q: %v", tc.ep, err)
		}
	}
	ix := newZMQIndex(t)
	for _, cfg := range []ZMQConfig{
		{Endpoint: "tcp://*:1", Slot: 1},
		{Endpoint: "tcp://127.0.0.1:1", Replay: "tcp://*:2", Slot: 1},
		{Endpoint: "tcp://127.0.0.1:1", Slot: workers.Max},
	} {
		if _, err := NewZMQSubscriber(ix, cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
}

// TestDecodeVLLMBatch pins the decoder against hand-built payloads.
func TestDecodeVLLMBatch(t *testing.T) {
	sha := bytesHashes.wire(7).([]byte)
	stored := wireEvent{kind: "BlockStored", hashes: []any{uint64(1), int64(-2), sha}, parent: uint64(math.MaxUint64),
		tokens: []uint32{1, 2, math.MaxUint32, 4, 5, 6}, bs: 2, loraID: nil, medium: "gpu",
		extra: []any{nil, []any{"salt", []any{1, 2, 3}}, nil}, group: 0}
	for _, f := range []wireFormat{vllmMap, vllmArray, sglangArray} {
		t.Run(f.String(), func(t *testing.T) {
			var d VLLMDecoder
			b, err := d.Decode(encodeBatch(t, f, []wireEvent{stored,
				{kind: "BlockRemoved", hashes: []any{uint64(9)}, medium: "CPU"}, {kind: "AllBlocksCleared"}}))
			if err != nil {
				t.Fatal(err)
			}
			if b.TS != 1722222222.5 || len(b.Events) != 3 || b.HasDPRank != (f != sglangArray) {
				t.Fatalf("batch %+v", b)
			}
			ev := b.Events[0]
			if ev.Kind != VLLMBlockStored || len(ev.Hashes) != 3 || ev.Hashes[0] != 1 || ev.Hashes[1] != uint64(1<<64-2) ||
				ev.Hashes[2] != binary.BigEndian.Uint64(sha[len(sha)-8:]) || !ev.HasParent || ev.Parent != math.MaxUint64 || ev.BlockSize != 2 ||
				len(ev.Tokens) != 6 || ev.Tokens[2] != math.MaxUint32 || ev.BadTokens || ev.LoRA || ev.Tier != workers.TierGPU ||
				ev.ExtraKeysFrom != map[bool]int{true: 3, false: 1}[f == sglangArray] || ev.Group != 0 {
				t.Fatalf("stored %+v", ev)
			}
			rm := b.Events[1]
			if rm.Kind != VLLMBlockRemoved || len(rm.Hashes) != 1 || rm.Hashes[0] != 9 || (rm.Tier == workers.TierHost) != (f != sglangArray) {
				t.Fatalf("removed %+v", rm)
			}
			if b.Events[2].Kind != VLLMAllBlocksCleared {
				t.Fatalf("cleared %+v", b.Events[2])
			}
		})
	}
	// Shapes msgspec may also produce, written out byte by byte.
	mp := func(parts ...any) []byte {
		var buf bytes.Buffer
		for _, p := range parts {
			switch p := p.(type) {
			case byte:
				buf.WriteByte(p)
			case int:
				buf.WriteByte(byte(p))
			case string:
				buf.WriteByte(0xa0 | byte(len(p)))
				buf.WriteString(p)
			case []byte:
				buf.Write(p)
			}
		}
		return buf.Bytes()
	}
	for _, tc := range []struct {
		name        string
		payload     []byte
		check       func(*VLLMBatch) bool
		err         string
		undecodable string // the batch decodes, its one event does not, for this reason
	}{
		{"tag after the fields", mp(0x82, "ts", 0, "events", 0x91, 0x83, "block_hashes", 0x91, 5, "medium", 0xc0, "type", "BlockRemoved"),
			func(b *VLLMBatch) bool { return b.Events[0].Kind == VLLMBlockRemoved && b.Events[0].Hashes[0] == 5 }, "", ""},
		{"unknown keys and trailing fields", mp(0x93, 0xca, 0x3f, 0x80, 0, 0, 0x92, 0x93, "AllBlocksCleared", 0x81, "x", 0xc3, 0xd4, 1, 2,
			0x95, "BlockRemoved", 0x90, 0xc0, 0xc0, 0xc0, 0xc0),
			func(b *VLLMBatch) bool { return b.TS == 1 && len(b.Events) == 2 && !b.HasDPRank }, "", ""},
		{"unknown event map", mp(0x82, "ts", 1, "events", 0x91, 0x82, "type", "Future", "block_hashes", "not a list"),
			func(b *VLLMBatch) bool { return b.Events[0].Kind == VLLMUnknown }, "", ""},
		{"negative token", mp(0x92, 0, 0x91, 0x95, "BlockStored", 0x91, 1, 0xc0, 0x91, 0xff, 1),
			func(b *VLLMBatch) bool { return b.Events[0].BadTokens }, "", ""},
		{"huge token", mp(0x92, 0, 0x91, 0x95, "BlockStored", 0x91, 1, 0xc0, 0x91, 0xcf, []byte{0, 0, 0, 1, 0, 0, 0, 0}, 1),
			func(b *VLLMBatch) bool { return b.Events[0].BadTokens }, "", ""},
		{"int64 hash", mp(0x92, 0, 0x91, 0x92, "BlockRemoved", 0x91, 0xd3, []byte{0x80, 0, 0, 0, 0, 0, 0, 0}),
			func(b *VLLMBatch) bool { return b.Events[0].Hashes[0] == 1<<63 }, "", ""},
		{"empty", nil, nil, "end of payload", ""},
		{"not a batch", mp(0xc3), nil, "want an array", ""},
		{"short batch", mp(0x91, 0), nil, "shorter", ""},
		{"no events", mp(0x81, "ts", 0), nil, "no events", ""},
		{"trailing bytes", mp(0x92, 0, 0x90, 0xc0), nil, "trailing", ""},
		{"truncated", mp(0x92, 0, 0x91, 0x92, "BlockRemoved", 0x92, 1), nil, "past the end", ""},
		{"truncated float", mp(0x92, 0xcb, 1, 2), nil, "past the end", ""},
		{"count past end", mp(0x92, 0, 0xdd, []byte{0xff, 0xff, 0xff, 0xff}), nil, "past the end", ""},
		{"string past end", mp(0x92, 0, 0x91, 0x91, 0xdb, []byte{0x7f, 0xff, 0xff, 0xff}), nil, "past the end", ""},
		{"short stored", mp(0x92, 0, 0x91, 0x94, "BlockStored", 0x90, 0xc0, 0x90), nil, "", "shorter"},
		{"stored map lacks tokens", mp(0x82, "ts", 0, "events", 0x91, 0x83, "type", "BlockStored", "block_hashes", 0x90, "block_size", 4), nil, "", "lacks"},
		{"untagged", mp(0x92, 0, 0x91, 0x81, "block_hashes", 0x90), nil, "", "no type"},
		{"tag not a string", mp(0x92, 0, 0x91, 0x91, 7), nil, "", "want a string"},
		{"hash of wrong type", mp(0x92, 0, 0x91, 0x92, "BlockRemoved", 0x91, 0xc3), nil, "", "want an integer, bytes"},
		{"medium not a string", mp(0x92, 0, 0x91, 0x93, "BlockRemoved", 0x90, 1), nil, "", "want a string"},
		{"block size too big", mp(0x92, 0, 0x91, 0x95, "BlockStored", 0x90, 0xc0, 0x90, 0xcf, []byte{0xff, 0, 0, 0, 0, 0, 0, 0}), nil, "", "out of range"},
		{"unused type byte", mp(0x92, 0, 0x91, 0x93, "AllBlocksCleared", 0xc1), nil, "unused", ""},
		{"deep nesting", append(mp(0x92, 0, 0x91, 0x92, "AllBlocksCleared"), bytes.Repeat([]byte{0x91}, 10000)...), nil, "nest", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d VLLMDecoder
			b, err := d.Decode(tc.payload)
			if tc.undecodable != "" {
				if err != nil || len(b.Events) != 1 || !b.Events[0].Undecodable ||
					!strings.Contains(b.Events[0].Reason, tc.undecodable) {
					t.Fatalf("got %+v, %v; want one event undecodable for %q", b, err, tc.undecodable)
				}
				return
			}
			if tc.err != "" {
				var de *DecodeError
				if !errors.As(err, &de) || !errors.Is(err, ErrMalformedBatch) || !bytes.Contains([]byte(err.Error()), []byte(tc.err)) {
					t.Fatalf("got %v, want an error about %q", err, tc.err)
				}
				return
			}
			if err != nil || !tc.check(b) {
				t.Fatalf("got %+v, %v", b, err)
			}
		})
	}
}

func TestDecodeVLLMBatchLimits(t *testing.T) {
	ev := wireEvent{kind: "BlockStored", hashes: []any{uint64(1), uint64(2)}, tokens: make([]uint32, 8), bs: 4}
	payload := encodeBatch(t, vllmMap, []wireEvent{ev, ev})
	for _, tc := range []struct {
		blocks, tokens, events int
		ok                     bool
	}{{4, 16, 2, true}, {3, 16, 2, false}, {4, 15, 2, false}, {4, 16, 1, false}} {
		d := VLLMDecoder{MaxBlocks: tc.blocks, MaxTokens: tc.tokens, MaxEvents: tc.events}
		if _, err := d.Decode(payload); (err == nil) != tc.ok {
			t.Errorf("limits %d/%d/%d: %v", tc.blocks, tc.tokens, tc.events, err)
		}
	}
	// Events cost the decoder far more than their bytes: a batch of one-byte
	// nils is refused by count, not decoded into 360 bytes each.
	nils := append([]byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd}, binary.BigEndian.AppendUint32(nil, DefaultMaxBatchEvents+1)...)
	nils = append(nils, make([]byte, DefaultMaxBatchEvents+1)...)
	for i := len(nils) - DefaultMaxBatchEvents - 1; i < len(nils); i++ {
		nils[i] = 0xc0
	}
	var d VLLMDecoder
	if _, err := d.Decode(nils); err == nil {
		t.Error("a batch of more events than the limit decoded")
	}
}

// TestDecoderDropsOutsizedBuffers: the decoder keeps its buffers between
// batches, but not those one outsized batch grew.
func TestDecoderDropsOutsizedBuffers(t *testing.T) {
	var d VLLMDecoder
	big := make([]wireEvent, retainEvents+1)
	for i := range big {
		big[i] = wireEvent{kind: "BlockStored", hashes: []any{uint64(i)}, tokens: make([]uint32, 4), bs: 4}
	}
	if _, err := d.Decode(encodeBatch(t, vllmMap, big)); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Decode(encodeBatch(t, vllmMap, big[:1])); err != nil {
		t.Fatal(err)
	}
	if cap(d.batch.Events) > retainEvents {
		t.Errorf("the decoder kept %d events' room after a batch of one", cap(d.batch.Events))
	}
}

// TestNamespaceSeedsAreBounded: the cache of namespace seeds holds what a
// publisher names within its entry and byte bounds, and keeps no key
// longer than a real adapter name and salt; every seed is the one
// radix.NamespaceSeed gives.
func TestNamespaceSeedsAreBounded(t *testing.T) {
	var c namespaceSeeds
	long := bytes.Repeat([]byte{'x'}, maxNamespaceKeyBytes)
	for i := range 100 {
		name := append(bytes.Clone(long), byte(i))
		if got, want := c.seed("m", name, nil), radix.NamespaceSeed("m", string(name), ""); got != want {
			t.Fatalf("seed of a long name %x, want %x", got, want)
		}
	}
	if len(c.m) != 0 {
		t.Errorf("%d long names cached", len(c.m))
	}
	name := bytes.Repeat([]byte{'y'}, maxNamespaceKeyBytes-10)
	for i := range 5000 {
		salt := []byte(strconv.Itoa(i))
		if got, want := c.seed("m", name, salt), radix.NamespaceSeed("m", string(name), string(salt)); got != want {
			t.Fatalf("seed %x, want %x", got, want)
		}
		if c.bytes > maxNamespaceSeedBytes || len(c.m) > maxNamespaceSeeds {
			t.Fatalf("after %d names: %d entries of %d bytes", i+1, len(c.m), c.bytes)
		}
	}
}

// TestZMQReplayLeavesNoReader: an engine answers a replay with its whole
// buffer, and a replay stops reading at the batch that revealed its gap.
// zmq4's connection goroutine, blocked on a full queue of unread replies,
// must not outlive the replay's socket (closeSocket).
func TestZMQReplayLeavesNoReader(t *testing.T) {
	router := zmq4.NewRouter(context.Background())
	defer router.Close()
	if err := router.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			msg, err := router.Recv()
			if err != nil {
				return
			}
			for i := range 100 { // far more than zmq4's queue of ten
				_ = router.Send(zmq4.NewMsgFrom(msg.Frames[0], []byte{}, be64(uint64(i)), []byte("payload")))
			}
		}
	}()
	// readers counts zmq4's connection goroutines, and of them those
	// blocked handing a message to a full queue.
	readers := func() (all, blocked int) {
		buf := make([]byte, 1<<20)
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "zmq4.(*qreader).listen") {
				all++
				if strings.Contains(g, "[chan send") {
					blocked++
				}
			}
		}
		return all, blocked
	}
	before, _ := readers()
	for range 3 {
		d := zmq4.NewDealer(context.Background())
		if err := d.Dial("tcp://" + router.Addr().String()); err != nil {
			t.Fatal(err)
		}
		if err := d.Send(zmq4.NewMsgFrom([]byte{}, be64(0))); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Recv(); err != nil { // the one reply read; the rest arrive unread
			t.Fatal(err)
		}
		waitFor(t, func() bool { _, b := readers(); return b > 0 }, func() any { return "no zmq4 reader blocked on its queue" })
		closeSocket(d)
	}
	waitFor(t, func() bool { all, _ := readers(); return all <= before }, func() any {
		all, blocked := readers()
		return fmt.Sprintf("%d zmq4 readers (%d blocked), %d before the replays", all, blocked, before)
	})
}

// TestUndecodableLossesResyncOnce: a batch whose events may have dropped
// blocks but cannot be read resyncs the worker once, at the last of them:
// what was stored before it is dropped, what comes after applies.
func TestUndecodableLossesResyncOnce(t *testing.T) {
	ix := newZMQIndex(t)
	s, err := NewZMQSubscriber(ix, ZMQConfig{Endpoint: "tcp://127.0.0.1:1", Slot: zmqTestSlot, Model: testModel, BlockSize: testBlockSize})
	if err != nil {
		t.Fatal(err)
	}
	s.offer(0, mpNotation(t, `[1.5, [["BlockStored", [1], null, [1, 2, 3, 4], 4, null], ["BlockRemoved", [true]],
		["BlockRemoved", [true]], ["BlockStored", [2], null, [5, 6, 7, 8], 4, null], ["BlockRemoved", [true]],
		["BlockStored", [3], null, [9, 10, 11, 12], 4, null]]]`))
	st := s.Stats()
	if st.Resyncs != 1 || st.BadEvents != 3 || st.StoredBlocks != 3 || ix.Stats().WorkerBlocks[zmqTestSlot] != 1 {
		t.Fatalf("stats %+v, worker blocks %d; want one resync and the last block held", st, ix.Stats().WorkerBlocks[zmqTestSlot])
	}
}

// TestGroupSpecClampsTheWindow: a sliding window near 2^63 tokens needs
// many blocks, not (wrapped negative) one.
func TestGroupSpecClampsTheWindow(t *testing.T) {
	for _, w := range []int64{math.MaxInt64, math.MaxInt64 - 2, 1 << 62, 64} {
		if g := groupSpec([]byte("sliding_window"), w, 16); g.Kind != radix.Windowed || g.WindowBlocks < 4 {
			t.Errorf("window %d: %+v", w, g)
		}
	}
}

// TestZMQRepeatedComplaintsAreThrottled: what an engine can make happen
// on every batch (a replay that fails, a group that changes kind) is
// logged once a minute, not once each time.
func TestZMQRepeatedComplaintsAreThrottled(t *testing.T) {
	var log syncbuf.Buffer
	s, err := NewZMQSubscriber(newZMQIndex(t), ZMQConfig{Endpoint: "tcp://127.0.0.1:1", Replay: freeTCPEndpoint(t),
		Slot: zmqTestSlot, Model: testModel, BlockSize: testBlockSize, DialTimeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if res := s.replay(context.Background(), 0, 5, false, 0); res != replayFailed {
			t.Fatalf("a replay from a closed port: %v", res)
		}
		kind := "sliding_window"
		if i%2 == 1 {
			kind = "full_attention"
		}
		s.learnGroup(1, []byte(kind), 128)
	}
	for _, line := range []string{"KV-event replay failed", "KV-cache groups of a hybrid model"} {
		if n := strings.Count(log.String(), line); n != 1 {
			t.Errorf("%q logged %d times, want once", line, n)
		}
	}
}

// TestZMQDecoderReleasesThePayload: once a batch is applied the decoder
// holds nothing of its payload (its reader, and the events' byte fields
// that alias it), so that a 20 MiB payload is not kept alive until the
// next batch arrives (a review saw one payload's worth stay per feed).
func TestZMQDecoderReleasesThePayload(t *testing.T) {
	payload := mpNotation(t, `[1.5, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": null,
	  "token_ids": [1, 2, 3, 4], "block_size": 4, "lora_id": 2, "medium": "GPU", "lora_name": "a"}], 0]`)
	var d VLLMDecoder
	b, err := d.Decode(payload)
	if err != nil || len(b.Events) != 1 || string(b.Events[0].LoRAName) != "a" {
		t.Fatalf("Decode = %+v, %v", b, err)
	}
	d.Release()
	if d.r.b != nil || len(d.batch.Events) != 0 || d.batch.Events[:1][0].LoRAName != nil {
		t.Fatal("the decoder still holds the payload after Release")
	}
	// It decodes on as before.
	if b, err := d.Decode(payload); err != nil || len(b.Events) != 1 {
		t.Fatalf("Decode after Release = %+v, %v", b, err)
	}
}
