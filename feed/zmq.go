package feed

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/go-zeromq/zmq4"

	"github.com/kvfast/kvfast/internal/logthrottle"
	"github.com/kvfast/kvfast/internal/redact"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
)

// ZMQConfig describes one engine's ZMQ KV-event feed. Endpoint, Slot and
// Model are required; zero values of the rest take the defaults.
type ZMQConfig struct {
	// Endpoint is the engine's PUB socket, dialled by the router:
	// tcp://host:port (vLLM binds tcp://*:5557 by default; rank r of a
	// data-parallel deployment binds port+r) or ipc://path.
	Endpoint string
	// Replay is the engine's ROUTER replay socket (vLLM's replay_endpoint),
	// or "" if it has none: lost batches are then recovered by clearing the
	// worker's entries instead of replaying them, and as nothing can prove
	// that the engine behind a redialled connection is the one followed
	// before, every reconnect rebuilds the worker's view from live traffic.
	Replay string
	// Topic is the subscription prefix; "" receives every topic.
	Topic string

	Slot  workers.Slot // the worker's slot in the index
	Model string       // block-hash namespace: radix.NamespaceSeed(Model, "", "")
	// DPRank, with CheckDPRank, is the data-parallel rank the worker is:
	// a batch stamped with another data_parallel_rank describes another
	// rank's cache (vLLM's rank r publishes on the base port + r, so the
	// endpoint is likely the wrong rank's) and is skipped, not credited
	// here. Worth checking where ranks share one HTTP endpoint (vLLM's
	// internal load balancing), each worker being one rank; an engine
	// alone at its endpoint may have been started as any rank.
	DPRank      uint32
	CheckDPRank bool
	// BlockSize is the router's block size; blocks the engine stores in
	// another size are counted and skipped. Default radix.DefaultBlockSize.
	BlockSize int

	DialTimeout   time.Duration // TCP connect timeout, default 2s
	RedialMin     time.Duration // first wait before redialling a lost engine, default 50ms
	RedialMax     time.Duration // the wait doubles up to this, default 2s
	ReplayTimeout time.Duration // longest silence of the replay socket mid-replay, default 1s
	// QuietAfter is how long a connection may carry nothing before the
	// log says so, once per connection, default 1m: a topic= the engine
	// does not publish under is filtered out by the engine's own socket
	// and otherwise looks like an idle engine.
	QuietAfter time.Duration

	MaxBatchBlocks int // decoder limit, default DefaultMaxBatchBlocks
	MaxBatchTokens int // decoder limit, default DefaultMaxBatchTokens

	Logger *slog.Logger // default: discard

	// Segment is the shared-memory segment whose mapping holds the
	// index, or nil for a heap index: a fault in it (a truncated file) is
	// caught, and the worker's view rebuilt from live traffic.
	Segment *shm.Segment
}

func (c ZMQConfig) withDefaults() ZMQConfig {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.DialTimeout, 2*time.Second)
	def(&c.RedialMin, 50*time.Millisecond)
	def(&c.RedialMax, 2*time.Second)
	def(&c.ReplayTimeout, time.Second)
	def(&c.QuietAfter, time.Minute)
	if c.BlockSize <= 0 {
		c.BlockSize = radix.DefaultBlockSize
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// CheckZMQEndpoint reports whether ep is an address the router can dial:
// tcp://host:port with a concrete host, or ipc://path.
func CheckZMQEndpoint(ep string) error {
	scheme, addr, ok := strings.Cut(ep, "://")
	switch {
	case !ok:
		return fmt.Errorf("cannot use ZMQ endpoint %q: want tcp://host:port or ipc://path", redact.Endpoint(ep))
	case scheme == "ipc" && addr != "":
		return nil
	case scheme != "tcp":
		return fmt.Errorf("cannot use ZMQ endpoint %q: only tcp:// and ipc:// are supported", redact.Endpoint(ep))
	}
	host, port, err := net.SplitHostPort(addr)
	if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 1 || n > 65535 {
		return fmt.Errorf("cannot use ZMQ endpoint %q: want tcp://host:port", redact.Endpoint(ep))
	}
	if host == "" || host == "*" {
		return fmt.Errorf("cannot use ZMQ endpoint %q: a wildcard is where the engine binds; dial its address (tcp://127.0.0.1:%s)", redact.Endpoint(ep), port)
	}
	return nil
}

// ZMQSubscriber applies one engine's ZMQ KV-event stream to the index, in
// the engine's worker slot. Run it on its own goroutine.
type ZMQSubscriber struct {
	ix   *radix.Index
	cfg  ZMQConfig
	seed uint64 // the base model's namespace
	// namespaces caches the seeds of the LoRA adapters and cache salts
	// seen, so that a stream of salted batches allocates nothing.
	namespaces namespaceSeeds
	// groups are the KV-cache groups learned from the engine's events
	// (learnGroup); N is 0 until one is.
	groups radix.Hybrid
	dec    VLLMDecoder
	apply  applier

	// Sequence state, owned by the Run goroutine.
	synced     bool    // the index holds this worker's state as of lastSeq
	lastSeq    uint64  // last batch applied (live or replayed)
	lastDigest uint64  // XXH64 of batch lastSeq's payload: what a replay must return for it
	lastTS     float64 // ts of batch lastSeq, if it decoded
	haveLive   bool
	lastLive   uint64 // last batch received on the live stream
	// recent holds the digests of the batches applied last, by sequence
	// number, so that a live batch numbered at or below the last one
	// applied is taken for a repeat only if it is one (offer).
	recent [recentBatches]appliedBatch
	// replayUnconfirmed: the replay made at connection applied batches
	// that no live batch has yet proven this engine's (provenReplay).
	// Written by the Run goroutine; atomic for tests that wait on it.
	replayUnconfirmed atomic.Bool

	running   atomic.Bool
	connected atomic.Bool
	c         zmqCounters
	// warnedRank: the last batch was another rank's and that was logged;
	// a batch of the worker's own rank clears it. Owned by Run.
	warnedRank bool
	// throttle keeps lines an engine can make repeat at will (a failing
	// replay on every batch, a group that changes kind on every event) to
	// one a minute each: 5,000 bad batches had logged 5,000 lines.
	throttle *logthrottle.Throttle
}

// NewZMQSubscriber checks cfg and returns a subscriber that will write
// slot cfg.Slot of ix.
func NewZMQSubscriber(ix *radix.Index, cfg ZMQConfig) (*ZMQSubscriber, error) {
	if ix == nil {
		panic("BUG: feed: ZMQ subscriber without an index")
	}
	cfg = cfg.withDefaults()
	if err := CheckZMQEndpoint(cfg.Endpoint); err != nil {
		return nil, err
	}
	if cfg.Replay != "" {
		if err := CheckZMQEndpoint(cfg.Replay); err != nil {
			return nil, err
		}
	}
	if !cfg.Slot.Valid() {
		return nil, fmt.Errorf("cannot subscribe for worker slot %d: at most %d slots", cfg.Slot, workers.Max)
	}
	s := &ZMQSubscriber{ix: ix, cfg: cfg, seed: radix.NamespaceSeed(cfg.Model, "", ""),
		apply: newApplier(ix, 0), throttle: logthrottle.New(time.Minute)}
	s.dec.MaxBlocks, s.dec.MaxTokens = cfg.MaxBatchBlocks, cfg.MaxBatchTokens
	return s, nil
}

// Config returns the subscriber's configuration, defaults filled in.
func (s *ZMQSubscriber) Config() ZMQConfig { return s.cfg }

var errZMQRunning = errors.New("kvfast: ZMQ subscriber already running")

// Run subscribes to the engine and applies its batches until ctx is done;
// it returns ctx.Err(). It first drops whatever the index holds for the
// slot (nothing says it is still true), redials a lost engine with
// backoff, and detects lost batches by sequence number: they are replayed
// from the engine's replay socket if there is one, else the worker's
// entries are cleared. An engine that restarted has its blocks and
// engine-hash mappings dropped, and after a reconnect the view is kept
// only if the replay socket proves the stream continues it (doc.go,
// "Sequence numbers and restarts").
func (s *ZMQSubscriber) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errZMQRunning
	}
	defer s.running.Store(false)
	s.forget()
	wait := s.cfg.RedialMin
	for {
		var received bool
		var err error
		if !s.cfg.Segment.Guard(func() { received, err = s.session(ctx) }) {
			// The segment was detached (shm/fault.go) and reads as empty:
			// this worker's view is gone with it.
			err = errors.New("the index's segment file was truncated")
			s.forget()
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if received {
			wait = s.cfg.RedialMin
		}
		s.c.disconnects.Add(1)
		// Said at warning level, once a minute: an endpoint that cannot
		// be reached (a wrong zmq= port, an engine started without
		// --kv-events-config) otherwise showed only as
		// kvfast_zmq_connected 0.
		args := []any{"events", s.cfg.Endpoint, "slot", s.cfg.Slot, "err", err, "in", wait}
		if errors.Is(err, syscall.ECONNREFUSED) {
			// vLLM binds its publisher only for a wildcard endpoint
			// (tcp://*:5557) and connects out for any other, so an engine
			// given the router's view of its address listens nowhere.
			args = append(args, "hint", "nothing listens there: the engine is not up yet, or it does not bind this port: start it with KV events on and a wildcard endpoint it binds (vLLM: \"endpoint\":\"tcp://*:PORT\")")
		}
		s.throttle.Log(s.cfg.Logger, slog.LevelWarn, "lost", "KV-event feed down, redialling", args...)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, s.cfg.RedialMax)
	}
}

// forget drops the worker's view, so that the next session rebuilds it.
func (s *ZMQSubscriber) forget() {
	s.cfg.Segment.Guard(s.dropView)
}

// dropView drops what the index holds for the worker (its blocks, engine
// mappings and KV-cache groups: RemoveWorker forgets the hybrid rule too)
// and what the subscriber learned with it, so that the engine's next
// events rebuild all of it. The groups must be learned again, or a hybrid
// engine's blocks would be credited as full attention from then on.
func (s *ZMQSubscriber) dropView() {
	s.ix.RemoveWorker(s.cfg.Slot)
	s.apply.forgetCopies(s.cfg.Slot)
	s.groups = radix.Hybrid{}
	// The live numbering seen says nothing of the stream that rebuilds
	// the view: a restarted engine's first batch, numbered below the
	// old one's, is no second restart.
	s.synced, s.haveLive = false, false
}

// zmqLog routes zmq4's own complaints to the debug log.
func (s *ZMQSubscriber) zmqLog() *log.Logger {
	return slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelDebug)
}

// session dials the engine once and consumes its stream until the
// connection fails or ctx ends.
func (s *ZMQSubscriber) session(ctx context.Context) (received bool, _ error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Redialling is ours (with backoff and ctx), not zmq4's.
	sub := zmq4.NewSub(sctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(s.cfg.DialTimeout),
		zmq4.WithLogger(s.zmqLog()))
	defer closeSocket(sub)
	if err := sub.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
		return false, fmt.Errorf("cannot subscribe to %q: %w", s.cfg.Topic, err)
	}
	if err := sub.Dial(guarded(s.cfg.Endpoint)); err != nil {
		return false, err
	}
	s.connected.Store(true)
	defer s.connected.Store(false)
	// Once a minute: an engine whose socket keeps dropping (or a peer
	// reconnecting in a loop) would log a line per connection.
	s.throttle.Log(s.cfg.Logger, slog.LevelInfo, "connected", "KV-event feed connected", "events", s.cfg.Endpoint, "slot", s.cfg.Slot)
	s.joined(ctx)
	var heard atomic.Bool
	quiet := time.AfterFunc(s.cfg.QuietAfter, func() {
		if !heard.Load() {
			s.cfg.Logger.Warn("no KV events since the feed connected: an idle engine sends none, but one that has served "+
				"requests and sent nothing publishes under another topic (the engine's socket drops what the topic= "+
				"prefix does not match; vLLM's default topic is empty) or has KV events off",
				"events", s.cfg.Endpoint, "slot", s.cfg.Slot, "topic", s.cfg.Topic, "connected_for", s.cfg.QuietAfter)
		}
	})
	defer quiet.Stop()
	for {
		msg, err := sub.Recv()
		if err != nil {
			return received, err
		}
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		received = true
		// [topic, 8-byte big-endian sequence number, msgpack batch]. The
		// topic is checked here too: libzmq's SUB filters what it
		// receives, zmq4's leaves it to the publisher, and a peer that
		// ignores the subscription could pass another engine's batches.
		// With its snapshot endpoint on, vLLM appends its 16-byte stream
		// id to the sequence frame (ZmqEventPublisher._publisher_thread:
		// seq.to_bytes(8, "big") + _snapshot_stream_id); the number is
		// the same first 8 bytes.
		if len(msg.Frames) != 3 || !isSeqFrame(msg.Frames[1]) {
			// Its sequence number is unknown; if it was a batch, the next
			// one shows the gap.
			s.unreadable(&s.c.garbage, "message not [topic, seq, batch]", "frames", len(msg.Frames))
			continue
		}
		if !strings.HasPrefix(string(msg.Frames[0]), s.cfg.Topic) {
			// Not heard: a publisher that ignores the subscription and
			// publishes under another topic is the quiet line's case.
			s.unreadable(&s.c.garbage, "batch under another topic", "topic", s.cfg.Topic, "batch_topic", strconv.Quote(string(msg.Frames[0])))
			continue
		}
		heard.Store(true)
		s.onLive(ctx, binary.BigEndian.Uint64(msg.Frames[1]), msg.Frames[2])
	}
}

// isSeqFrame reports whether f is a live batch's sequence frame: the 8-byte
// number, alone or followed by vLLM's 16-byte snapshot stream id.
func isSeqFrame(f []byte) bool { return len(f) == 8 || len(f) == 8+16 }

// joined runs once a session's connection is up, before its first live
// batch, which an idle engine may not send for hours. A lost connection
// is how an engine restart looks from here, and a restarted engine
// numbers its batches from 0 again, so a sequence number alone cannot
// tell a restarted engine that has already published more batches than
// the router had seen from a gap: after a reconnect the view the index
// holds is kept only if the replay socket proves the engine the same (it
// returns the batch applied last, byte for byte), and what it published
// meanwhile is replayed; else the view is dropped now, not at the next
// batch, or a restarted engine left idle would keep its predecessor's
// prefixes claimed. Joining (the router started, or the view was
// dropped), it catches up from the engine's replay buffer, so that a warm
// engine that serves nothing is credited with its cache.
func (s *ZMQSubscriber) joined(ctx context.Context) {
	replayBroke := false
	if s.synced {
		res := replayUnproven
		if s.cfg.Replay != "" {
			res = s.replay(ctx, s.lastSeq, endOfReplay, true, 0)
		}
		switch res {
		case replayMismatch:
			s.restarted()
		case replayUnproven, replayFailed:
			s.c.rejoins.Add(1)
			s.throttle.Log(s.cfg.Logger, slog.LevelInfo, "rejoin", "KV-event feed reconnected and nothing proves the engine is the "+
				"one before: its cached blocks dropped from the index, rebuilt from its events", "events", s.cfg.Endpoint, "slot", s.cfg.Slot)
			s.dropView()
			// A replay socket that just failed would only fail again now;
			// a gap later in the session asks it again.
			replayBroke = res == replayFailed
		}
	}
	if !s.synced && s.cfg.Replay != "" && !replayBroke {
		// Nothing to prove what it applies against yet: the first live
		// batch will. Set before, so that nothing reads the batches it
		// applies as confirmed.
		s.replayUnconfirmed.Store(true)
		before := s.c.replayed.Load()
		s.replay(ctx, 0, endOfReplay, false, 0)
		s.replayUnconfirmed.Store(s.c.replayed.Load() != before)
	}
}

// onLive handles a batch from the live stream.
func (s *ZMQSubscriber) onLive(ctx context.Context, seq uint64, payload []byte) {
	if s.haveLive && seq <= s.lastLive {
		// A publisher never repeats a number on the live stream: it
		// restarted, and its cache with it.
		s.restarted()
	}
	s.haveLive, s.lastLive = true, seq
	canReplay := s.cfg.Replay != ""
	if s.replayUnconfirmed.Load() {
		// What the replay at connection applied is this engine's only if
		// its replay socket has this live batch, as published.
		if s.synced {
			if res := s.replay(ctx, seq, seq, false, xxhash.Sum64(payload)); res != replayEnded {
				s.rejectReplay(seq, res)
				canReplay = false // it would only answer with the same history
			}
		}
		s.replayUnconfirmed.Store(false)
	}
	switch {
	case !s.synced:
		// Joining: the index holds nothing for this worker, so any suffix
		// of the engine's history is safe to apply, and the replay buffer
		// may hold all of it.
		if seq > 0 && canReplay {
			s.provenReplay(ctx, 0, seq, payload)
		}
	case seq > s.lastSeq+1:
		s.c.gaps.Add(1)
		if canReplay {
			s.provenReplay(ctx, s.lastSeq+1, seq, payload)
		} else {
			// offer drops the worker's blocks: what the lost batches
			// removed may still be claimed.
			s.throttle.Log(s.cfg.Logger, slog.LevelWarn, "gap", "KV-event batches lost, the worker's cached blocks dropped from the index "+
				"(a replay= socket would let the router fetch them instead)", "events", s.cfg.Endpoint, "slot", s.cfg.Slot,
				"after_seq", s.lastSeq, "next_seq", seq)
		}
	}
	s.offer(seq, payload)
}

// provenReplay replays from from up to the live batch until (whose
// payload is live), and keeps what it applied only if the replay proved
// itself this engine's: its reply numbered until must be the live batch,
// byte for byte. An engine's replay socket answers after the batch it
// last published is in its buffer (vLLM appends each batch as it sends
// it, on the thread that serves replays), so the engine's own replay
// always carries it; a replay= socket of another engine, or of a process
// that is not an engine, does not. Applied all the same, its batches had
// credited this worker with another engine's blocks.
func (s *ZMQSubscriber) provenReplay(ctx context.Context, from, until uint64, live []byte) {
	before := s.c.replayed.Load()
	res := s.replay(ctx, from, until, false, xxhash.Sum64(live))
	if res == replayEnded || s.c.replayed.Load() == before {
		return // proven, or nothing applied: the live batch decides as ever
	}
	s.rejectReplay(until, res)
}

// rejectReplay drops what a replay that did not prove itself this
// engine's applied (provenReplay).
func (s *ZMQSubscriber) rejectReplay(live uint64, res replayResult) {
	s.c.replayRejected.Add(1)
	s.throttle.Log(s.cfg.Logger, slog.LevelWarn, "unproven", "KV-event replay not proven this engine's (its replies did not "+
		"include the live batch as published): what it applied is dropped and the worker's view rebuilt from its live events; "+
		"check that replay= names this engine's replay socket", "events", s.cfg.Endpoint, "replay", s.cfg.Replay, "slot", s.cfg.Slot,
		"live_seq", live, "result", res.String())
	s.dropView()
}

// restarted drops the worker's blocks and engine mappings: the engine that
// made them is gone, and what it cached with it.
func (s *ZMQSubscriber) restarted() {
	s.c.restarts.Add(1)
	s.throttle.Log(s.cfg.Logger, slog.LevelInfo, "restart", "engine restarted, its cached blocks dropped from the index",
		"events", s.cfg.Endpoint, "slot", s.cfg.Slot)
	s.dropView()
}

// clockStepTolerance is how far a batch's ts may run behind its
// predecessor's before the two are taken for different engines. An engine
// stamps batches with its wall clock as it makes them and publishes them
// in order, so only a clock step moves ts back, and steps of this size
// are rare.
const clockStepTolerance = 1.0 // seconds

// offer applies batch seq unless it was applied already; batches missing
// before it first cost the worker its entries, since whatever they removed
// may still be claimed.
func (s *ZMQSubscriber) offer(seq uint64, payload []byte) {
	digest := xxhash.Sum64(payload)
	if s.synced && seq <= s.lastSeq {
		if r := s.recent[seq%recentBatches]; r.seq == seq && r.digest == digest {
			s.c.duplicates.Add(1) // a live batch the replay had applied already
			return
		}
		if s.lastSeq-seq >= recentBatches {
			// Too far behind for the digests kept to tell: nothing shows
			// the view to be this stream's (a replay that ran far ahead of
			// a fast engine's live stream, or numbers made up).
			s.c.rejoins.Add(1)
			s.throttle.Log(s.cfg.Logger, slog.LevelWarn, "behind", "a live KV-event batch is numbered more than 4,096 below "+
				"the last one applied, too far to tell a repeat: the worker's cached blocks dropped from the index, rebuilt from its events",
				"events", s.cfg.Endpoint, "slot", s.cfg.Slot, "live_seq", seq, "last_applied_seq", s.lastSeq)
			s.dropView()
		} else {
			// Not the batch applied under that number: the numbering the
			// view followed is not this stream's. A replay socket that
			// numbered its batches past the engine's would otherwise have
			// every live batch dropped as a repeat, and the view frozen
			// with what it made up.
			s.rejectReplay(seq, replayMismatch)
		}
	}
	if s.synced && seq != s.lastSeq+1 {
		s.resync()
	}
	b, err := s.dec.Decode(payload)
	if err == nil && s.synced && b.TS < s.lastTS-clockStepTolerance {
		// Made before its predecessor: by another engine, whose history
		// this batch continues and not the one the index holds.
		s.restarted()
	}
	s.synced, s.lastSeq, s.lastDigest = true, seq, digest
	s.recent[seq%recentBatches] = appliedBatch{seq: seq, digest: digest}
	if err == nil {
		if !math.IsNaN(b.TS) && !math.IsInf(b.TS, 0) {
			// A timestamp that is not a number says nothing of the clock,
			// and would hide every later step back.
			s.lastTS = b.TS
		}
		s.applyBatch(b)
	} else {
		// The batch is lost, and what it changed with it.
		s.unreadable(&s.c.garbage, "undecodable batch", "seq", seq, "err", err)
		s.resync()
	}
	s.dec.Release() // the payload is not held until the next batch
	// Published last: a reader that sees seq sees its effects.
	s.c.lastSeq.Store(seq)
}

// recentBatches is how many applied batches' digests offer keeps: the
// live batches an engine publishes while the replay that catches up with
// it runs come again on the live stream, already applied (a replay of a
// full 10,000-batch buffer takes a few seconds; an engine publishes tens
// to hundreds of batches a second).
const recentBatches = 4096

// appliedBatch is a batch offer applied: its number and payload digest.
type appliedBatch struct{ seq, digest uint64 }

func (s *ZMQSubscriber) resync() {
	s.apply.cleared(s.cfg.Slot)
	s.c.resyncs.Add(1)
}

// unreadable counts, in counter, a message, batch or event the router
// cannot use, and says so once a minute per engine with reason.
func (s *ZMQSubscriber) unreadable(counter *atomic.Uint64, reason string, args ...any) {
	counter.Add(1)
	s.throttle.Log(s.cfg.Logger, slog.LevelWarn, "bad", unreadableMessage,
		append([]any{"events", s.cfg.Endpoint, "slot", s.cfg.Slot, "reason", reason}, args...)...)
}

// unreadableMessage is logged, once a minute per engine, for batches and
// events the decoder refused (zmq_decode.go says what it accepts).
const unreadableMessage = "KV events the router cannot read were skipped, and the worker's cached blocks dropped where they may " +
	"have removed some: a publisher kvfast does not know (the engine's version, or not an engine), or a damaged stream; " +
	"kvfast_zmq_events_total counts them (status garbage, bad_events)"

// endOfReplay is the sequence number of vLLM's end-of-replay marker (-1).
const endOfReplay = ^uint64(0)

// replayResult is how a replay ended.
type replayResult int

const (
	replayEnded    replayResult = iota // the engine sent its end marker, or (proving) the live batch as published
	replayFailed                       // the socket failed or stalled
	replayUnproven                     // the batch to compare was not there
	replayMismatch                     // the batch differs from the one compared with
)

func (r replayResult) String() string {
	switch r {
	case replayEnded:
		return "ended"
	case replayFailed:
		return "failed"
	case replayUnproven:
		return "live batch missing"
	case replayMismatch:
		return "live batch differs"
	}
	return "unknown"
}

// replay asks the engine's replay socket for every batch from seq from on
// and offers each, up to the live batch until that called for it (which
// the caller offers next). vLLM's protocol: the request is [empty
// delimiter, 8-byte big-endian start]; replies and the end marker (seq
// -1, empty payload) come in the shapes replayReply accepts. A replay that
// fails or stalls is abandoned; offer then resyncs over whatever is still
// missing.
//
// The live stream waits while a replay runs, so the replay socket is not
// trusted to end it: a reply at or past until ends it (the rest comes
// live, and a number from nowhere cannot shadow the live stream), a reply
// that does not move the sequence on is skipped without counting as
// progress against the stall timeout, and the whole replay has
// maxReplayTimeouts stall timeouts at most.
//
// An engine answers with its whole buffer in one burst (vLLM's is 10,000
// batches), through a ROUTER socket that silently drops what exceeds its
// send high-water mark (1,000 messages) while the reader is behind. So
// replies are read ahead of applying them (replayRound), and a hole in
// the middle of the replies, where a batch is missing after others came,
// is asked for again from the missing number, up to maxReplayReasks
// times, rather than resynced over; a reply that starts past the number
// asked for means the buffer no longer holds it, and is resynced over.
//
// With verify, from is the batch applied last, and the first reply must be
// that batch, byte for byte, for the rest to be taken as its continuation:
// an engine's replay buffer holds the payloads it published, so only the
// engine that published it returns the same bytes under that number.
// With untilDigest (not 0), the reply numbered until must be there with
// that digest: the replay ends replayEnded only then, replayUnproven when
// it ends without it (provenReplay).
func (s *ZMQSubscriber) replay(ctx context.Context, from, until uint64, verify bool, untilDigest uint64) replayResult {
	rctx, cancel := context.WithTimeout(ctx, maxReplayTimeouts*s.cfg.ReplayTimeout)
	defer cancel()
	r := replayState{from: from, until: until, next: from, verify: verify, untilDigest: untilDigest}
	for asked := 0; ; asked++ {
		res, hole := s.replayRound(rctx, &r, asked < maxReplayReasks)
		if !hole {
			return res
		}
		s.c.replayHoles.Add(1)
	}
}

// replayState is one replay's progress across its requests.
type replayState struct {
	from, until uint64
	next        uint64 // the lowest number that moves the replay on
	verify      bool   // the first reply must be batch from, as applied
	untilDigest uint64 // not 0: the reply numbered until must have this digest
}

// ended is how a replay that saw no reply numbered until ended.
func (r *replayState) ended() replayResult {
	if r.untilDigest != 0 {
		return replayUnproven
	}
	return replayEnded
}

// replayRound makes one replay request, from r.next, and offers its
// replies. With reask, a hole among the replies, or replies that stop
// short of the end marker after some came (the engine's socket dropped
// the tail, marker and all), ends the round with hole set, for the caller
// to ask again from r.next. Within rctx, which bounds the whole replay,
// the round is given up after ReplayTimeout without progress.
func (s *ZMQSubscriber) replayRound(rctx context.Context, r *replayState, reask bool) (_ replayResult, hole bool) {
	s.c.replays.Add(1)
	round, stop := context.WithCancel(rctx)
	defer stop()
	stall := time.AfterFunc(s.cfg.ReplayTimeout, stop)
	defer stall.Stop()
	start := r.next
	fail := func(err error) (replayResult, bool) {
		s.c.replayFailures.Add(1)
		s.throttle.Log(s.cfg.Logger, slog.LevelWarn, "replay", "KV-event replay failed", "replay", s.cfg.Replay, "from", start, "err", err)
		return replayFailed, false
	}
	d := zmq4.NewDealer(round, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(s.cfg.DialTimeout),
		zmq4.WithTimeout(s.cfg.ReplayTimeout), zmq4.WithLogger(s.zmqLog()))
	if err := d.Dial(guarded(s.cfg.Replay)); err != nil {
		closeSocket(d)
		return fail(err)
	}
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], start)
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, req[:])); err != nil {
		closeSocket(d)
		return fail(err)
	}
	ahead := readAhead(d)
	defer ahead.stop()
	moved := false // this round offered a batch
	for {
		msg, err := ahead.next()
		if err != nil {
			if moved && reask && rctx.Err() == nil {
				return replayEnded, true // the tail was dropped: ask again from r.next
			}
			return fail(err)
		}
		seq, payload, ok := replayReply(msg.Frames)
		if msg.Type == zmq4.CmdMsg || !ok {
			s.unreadable(&s.c.garbage, "replay reply not [seq, payload]", "replay", s.cfg.Replay)
			continue
		}
		end := seq == endOfReplay && len(payload) == 0
		if r.verify {
			r.verify = false
			switch {
			case end || seq != r.from:
				return replayUnproven, false
			case xxhash.Sum64(payload) != s.lastDigest:
				return replayMismatch, false
			}
			stall.Reset(s.cfg.ReplayTimeout)
			r.next, moved = r.from+1, true
			continue // applied already: what follows continues it
		}
		switch {
		case end:
			return r.ended(), false
		case seq == r.until && r.untilDigest != 0:
			if xxhash.Sum64(payload) != r.untilDigest {
				return replayMismatch, false
			}
			return replayEnded, false
		case seq < r.next:
			s.c.duplicates.Add(1) // a repeat moves nothing on
			continue
		case seq > r.next && moved && reask:
			return replayEnded, true // dropped on the way: ask again from r.next
		case seq >= r.until:
			return r.ended(), false
		}
		stall.Reset(s.cfg.ReplayTimeout)
		r.next = seq + 1
		moved = true
		s.c.replayed.Add(1)
		s.offer(seq, payload)
	}
}

// maxReplayReasks bounds the requests one replay makes again after holes.
// Each one that ends in a hole has moved the replay on by at least the
// engine's send high-water mark, so a whole 10,000-batch buffer needs
// about ten at worst.
const maxReplayReasks = 32

// replayAheadBytes bounds the replies read ahead of applying them: enough
// for an engine's whole replay buffer of ordinary batches, and a bound on
// what one replay holds when batches are large.
const replayAheadBytes = 64 << 20

// aheadReader reads a replay socket's messages on a goroutine of its own,
// up to replayAheadBytes ahead of the reader, so that the engine's ROUTER,
// which drops replies past its high-water mark, is drained as fast as the
// network delivers while the batches are applied one by one.
type aheadReader struct {
	d       zmq4.Socket
	msgs    chan zmq4.Msg
	err     error // why msgs closed; read once it is
	queued  atomic.Int64
	drained chan struct{} // a token: bytes were taken off the queue
	done    chan struct{} // closed by stop
	exited  chan struct{} // closed when the goroutine returns
}

func readAhead(d zmq4.Socket) *aheadReader {
	a := &aheadReader{d: d, msgs: make(chan zmq4.Msg, 4096), drained: make(chan struct{}, 1),
		done: make(chan struct{}), exited: make(chan struct{})}
	go a.run()
	return a
}

func msgBytes(m zmq4.Msg) int64 {
	n := int64(0)
	for _, f := range m.Frames {
		n += int64(len(f))
	}
	return n
}

func (a *aheadReader) run() {
	defer close(a.exited)
	defer close(a.msgs)
	for {
		msg, err := a.d.Recv()
		if err != nil {
			a.err = err
			return
		}
		n := msgBytes(msg)
		for a.queued.Load() > 0 && a.queued.Load()+n > replayAheadBytes {
			select {
			case <-a.drained:
			case <-a.done:
				return
			}
		}
		a.queued.Add(n)
		select {
		case a.msgs <- msg:
		case <-a.done:
			return
		}
	}
}

// next returns the next message read, or why reading stopped.
func (a *aheadReader) next() (zmq4.Msg, error) {
	msg, ok := <-a.msgs
	if !ok {
		return zmq4.Msg{}, a.err
	}
	a.queued.Add(-msgBytes(msg))
	select {
	case a.drained <- struct{}{}:
	default:
	}
	return msg, nil
}

// stop closes the socket, waits for the reading goroutine to return
// (Recv on a closed socket returns), then drains the socket as
// closeSocket does.
func (a *aheadReader) stop() {
	close(a.done)
	_ = a.d.Close()
	<-a.exited
	drainClosed(a.d)
}

// closeSocket closes a socket whose peer may still be sending: an engine
// answers a replay with its whole buffer from the number asked for, and
// a replay stops reading at the batch that revealed its gap, or at a
// failure; a live stream is left when the subscriber stops. zmq4
// (v0.17.0) hands each received message to a queue of ten from a
// goroutine of the connection's, with a plain channel send that neither
// Close nor the context interrupts (qreader.listen): with the queue full,
// that goroutine, and the messages it holds, would stay blocked for the
// life of the process, one per socket. Once the socket is closed the
// queue is emptied, which lets that goroutine see the context done and
// return. Recv on a closed socket chooses at random between its done
// context and a queued message, so it is asked 128 times: each call takes
// a queued message at even odds, and the queue holds ten (and the
// goroutine one more).
func closeSocket(d zmq4.Socket) {
	_ = d.Close()
	drainClosed(d)
}

// drainClosed empties a closed socket's queue (closeSocket).
func drainClosed(d zmq4.Socket) {
	for range 128 {
		_, _ = d.Recv()
	}
}

// maxReplayTimeouts bounds one replay, in stall timeouts (ReplayTimeout):
// an engine's replay buffer of thousands of batches arrives in well under
// one.
const maxReplayTimeouts = 30

// replayReply reads one message of the replay socket as it reaches a
// DEALER: the ROUTER's empty delimiter, then
//
//	[seq, payload]         vLLM before PR #45177 (v0.26), SGLang
//	[topic, seq, payload]  vLLM since PR #45177; its end marker's topic is empty
//
// (vllm/distributed/kv_events.py, ZmqEventPublisher._service_replay: the
// old shape at vllm-project/vllm@b4e69e0af33f, the new one at
// vMaroon/vllm@08ee3e54203f, a fork carrying #45177). The last two frames
// are the sequence number and the payload; at most a delimiter and a topic
// precede them. The topic is not checked: the replay socket is the
// engine's own, and its live topic was already matched by the SUB.
func replayReply(f [][]byte) (seq uint64, payload []byte, ok bool) {
	switch {
	case len(f) < 2 || len(f) > 4:
		return 0, nil, false
	case len(f) == 4 && len(f[0]) != 0:
		return 0, nil, false // two frames before seq, the first not a delimiter
	}
	s, p := f[len(f)-2], f[len(f)-1]
	if len(s) != 8 {
		return 0, nil, false
	}
	return binary.BigEndian.Uint64(s), p, true
}

// applyBatch writes one decoded batch through the shared apply path
// (apply.go), event by event, after skipping and counting what the router
// cannot route on.
func (s *ZMQSubscriber) applyBatch(b *VLLMBatch) {
	slot := s.cfg.Slot
	if s.cfg.CheckDPRank && b.HasDPRank && b.DPRank != int64(s.cfg.DPRank) {
		s.c.otherRankBatches.Add(1)
		if !s.warnedRank {
			s.warnedRank = true
			s.cfg.Logger.Warn("KV-event batches of another data-parallel rank skipped: is the worker's zmq= endpoint its own rank's (vLLM's rank r publishes on the base port + r)?",
				"events", s.cfg.Endpoint, "worker_rank", s.cfg.DPRank, "batch_rank", b.DPRank)
		}
		return
	}
	s.warnedRank = false
	s.c.batches.Add(1)
	defer func() { s.c.reusedEngineHash.Add(s.apply.takeReused()) }()
	// An event that cannot be decoded is counted and skipped. A Stored
	// lost so only under-claims: its blocks are not stored, and blocks
	// later events chain from them are counted unresolved. Any other (a
	// Removed, a Cleared, or one whose tag was unreadable) may have
	// dropped blocks the index still holds, so the worker is resynced at
	// the last such event of the batch: the events after it still apply
	// and, as a resync keeps the engine mappings, still resolve their
	// parents. Only the last: a resync drops every block, so one at each
	// (up to one per event of a hostile batch) would only redo it.
	lastLoss := -1
	for i := range b.Events {
		if ev := &b.Events[i]; ev.Undecodable && ev.Kind != VLLMBlockStored {
			lastLoss = i
		}
	}
	for i := range b.Events {
		ev := &b.Events[i]
		n := uint64(len(ev.Hashes))
		if ev.Undecodable {
			s.unreadable(&s.c.badEvents, ev.Reason, "kind", ev.Kind)
			if i == lastLoss {
				s.resync()
			}
			continue
		}
		switch ev.Kind {
		case VLLMBlockStored:
			k, ok := s.keyspace(ev)
			switch bs := s.cfg.BlockSize; {
			case !ok:
			case ev.LoRA && len(ev.LoRAName) == 0:
				// An adapter named only by lora_id (vLLM before lora_name):
				// requests name adapters, so its blocks cannot be matched.
				s.c.skippedLoRA.Add(n)
			case k.tier != workers.TierGPU && len(ev.Tokens) == 0 && ev.BlockSize%int64(bs) == 0:
				// vLLM's offloading connector names the blocks it copied
				// by engine hash alone, block_size 0 (its offloaded block
				// size before). An offloaded block of several GPU blocks
				// is named by its last one, which alone is credited: the
				// blocks before it can only be under-claimed.
				s.learnGroupOf(ev)
				stored, unresolved := s.apply.storedByReference(slot, k, ev.Hashes)
				s.c.storedBlocks.Add(uint64(stored))
				s.c.unresolvedParent.Add(uint64(unresolved))
			case ev.BlockSize <= 0 || ev.BlockSize > workers.MaxBlockSize:
				// No engine's size: a broken publisher, not a setting to
				// correct.
				s.unreadable(&s.c.badEvents, "block_size out of range", "kind", ev.Kind, "block_size", ev.BlockSize)
			case ev.BlockSize != int64(bs):
				s.c.blockSizeMismatch.Add(n)
				// Every block will miss: said once a minute, not per batch.
				s.throttle.Log(s.cfg.Logger, slog.LevelWarn, "blocksize", "KV events in another block size skipped: no prompt can match them; start the router with the engine's block size (--block-size) or the engine with the router's",
					"events", s.cfg.Endpoint, "slot", s.cfg.Slot, "engine_block_size", ev.BlockSize, "router_block_size", bs)
			case ev.BadTokens:
				s.unreadable(&s.c.badEvents, "token ids out of range", "kind", ev.Kind)
			case len(ev.Tokens) != len(ev.Hashes)*bs:
				if skip, ok := nullBlocks(ev, bs); ok {
					s.learnGroupOf(ev)
					s.stored(ev, k, bs, skip)
				} else {
					s.unreadable(&s.c.badEvents, "token ids do not cover the blocks named", "kind", ev.Kind,
						"blocks", len(ev.Hashes), "tokens", len(ev.Tokens))
				}
			default:
				s.learnGroupOf(ev)
				s.stored(ev, k, bs, 0)
			}
		case VLLMBlockRemoved:
			if k, ok := s.keyspace(ev); ok {
				removed := uint64(s.apply.removed(slot, k, ev.Hashes))
				s.c.unknownRemoved.Add(n - removed)
				s.c.removedBlocks.Add(removed)
			}
		case VLLMAllBlocksCleared:
			s.apply.engineCleared(slot)
			s.c.cleared.Add(1)
		default:
			s.c.unknownEvents.Add(1)
		}
	}
}

// keyspace returns where ev's blocks are held. Blocks it cannot place are
// counted as skipped and it reports false: a medium it does not know, a
// group beyond radix.MaxGroups, or a lower tier of a group other than 0
// (offloading hybrid models is not modelled: its blocks would be credited
// without the other groups' rule).
func (s *ZMQSubscriber) keyspace(ev *VLLMEvent) (keyspace, bool) {
	n := uint64(len(ev.Hashes))
	switch {
	case ev.UnknownMedium:
		s.c.skippedMedium.Add(n)
		return keyspace{}, false
	case ev.Group < 0 || ev.Group >= radix.MaxGroups:
		s.c.skippedGroup.Add(n)
		return keyspace{}, false
	case ev.Group != 0 && ev.Tier != workers.TierGPU:
		s.c.skippedMedium.Add(n)
		return keyspace{}, false
	}
	return keyspace{group: int(ev.Group), tier: ev.Tier}, true
}

// learnGroupOf learns the kind of the KV-cache group a Stored event stores
// into, once the event is known to be one whose blocks are stored. A
// group learned from events the router cannot index (another block size,
// token ids that do not cover the blocks) would hold every match of the
// worker to a group that never holds a block, zeroing its credit: such
// a group is left unknown, and counted where the event is skipped.
func (s *ZMQSubscriber) learnGroupOf(ev *VLLMEvent) {
	if ev.Group != 0 || ev.SpecKind != nil {
		s.learnGroup(int(ev.Group), ev.SpecKind, ev.SlidingWindow)
	}
}

// learnGroup records the kind of KV-cache group g, and tells the index
// when the worker's model turns out to be hybrid or its groups change.
// Groups are learned from the events that store into them, so until a
// group's first store the index does not hold the worker to it: a group
// that has stored nothing yet is one whose hits are not yet offered.
func (s *ZMQSubscriber) learnGroup(g int, kind []byte, window int64) {
	spec := groupSpec(kind, window, s.cfg.BlockSize)
	if g < s.groups.N && s.groups.Groups[g] == spec || g == 0 && s.groups.N == 0 && spec.Kind == radix.FullAttention {
		return
	}
	s.groups.Groups[g] = spec
	s.groups.N = max(s.groups.N, g+1, 1)
	if s.groups.N < 2 {
		return
	}
	h := s.groups // a copy: readers hold the old one
	s.ix.SetHybrid(s.cfg.Slot, &h)
	s.throttle.Log(s.cfg.Logger, slog.LevelInfo, "groups/"+strconv.Itoa(g), "KV-cache groups of a hybrid model", "events", s.cfg.Endpoint, "groups", h.N,
		"group", g, "kind", string(kind), "sliding_window", window)
}

// groupSpec is the reuse rule of a group of kind kind (vLLM's
// kv_cache_spec_kind). A sliding window of W tokens needs the
// ⌈(W−1)/blockSize⌉ blocks before the prefix's end (vLLM's
// SlidingWindowManager); a mamba group needs the last block's state.
// Full attention, and any kind not known here, need every block: the
// strictest rule can only under-claim.
func groupSpec(kind []byte, window int64, blockSize int) radix.GroupSpec {
	switch string(kind) {
	case "sliding_window":
		if window > 1 {
			// Clamped first: a window near 2^63 wrapped negative below,
			// and a negative window credits the last block alone.
			window = min(window, math.MaxInt32)
			return radix.GroupSpec{Kind: radix.Windowed, WindowBlocks: int((window - 1 + int64(blockSize) - 1) / int64(blockSize))}
		}
	case "mamba":
		return radix.GroupSpec{Kind: radix.Windowed, WindowBlocks: 1}
	}
	return radix.GroupSpec{Kind: radix.FullAttention}
}

// nullBlocks reports how many of a Stored event's blocks the engine left
// unnamed, when its token ids cover more whole blocks than it names:
// vLLM's cache_full_blocks (vllm/v1/core/block_pool.py) skips the null
// blocks of a sliding-window or mamba group (those past the window, or
// before the blocks align mode keeps), and, in releases since it caches a
// request's prefix hits in the same call, the blocks that were cached
// already; either way they lead the range, which token_ids still covers
// whole, and the blocks named are its last ones. The kvfast chain runs
// through the tokens of the blocks left out, so the blocks named are
// hashed as the engine's prompt is, whatever became of those. Token ids
// that are not whole blocks are not understood, and the event is skipped.
func nullBlocks(ev *VLLMEvent, bs int) (int, bool) {
	blocks := len(ev.Tokens) / bs
	if len(ev.Tokens)%bs != 0 || blocks <= len(ev.Hashes) {
		return 0, false
	}
	return blocks - len(ev.Hashes), true
}

// sglangContentHashedRoot is Python's hash(()), the parent SGLang's
// releases from its PR #6824 (June 2025) to its PR #13488 (November 2025)
// give the first page under the radix tree's root (the root's empty key,
// hashed). Those releases name each page by a hash of its own tokens,
// and the pages of one tree node by the parent node's last page: no
// consumer can follow the chain, and the fix was to send sequence hashes.
// The feed does not guess at the chain (a guess over-claims); it says
// what the engine is.
const sglangContentHashedRoot = 5740354900026072187

const contentHashedMessage = "the engine names a first block's parent by Python's hash of the empty tuple: an SGLang " +
	"release from June to November 2025 (its PRs #6824 to #13488), which hashes each page's tokens alone. Its KV " +
	"events cannot be followed, and the router credits none of its cache (counted unresolved_parent_blocks): " +
	"upgrade SGLang"

// unresolvedMessage explains blocks chained to a parent the feed never saw
// stored, from an engine with no replay socket: stored before the router
// followed the engine (it started, or reconnected, since), the parent
// stays unknown for as long as the engine keeps it, and a shared system
// prompt's block is kept for good, so every conversation chained to it
// goes uncredited.
const unresolvedMessage = "the engine's events chain to blocks stored before this router followed it (it started or reconnected since): " +
	"those and every block chained to them, a shared system prompt's included, credit no cache until the engine stores them again; " +
	"give the worker a replay socket (replay=, vLLM's replay_endpoint) or keep the index in a segment across router restarts"

// stored stores a Stored event's blocks; the event's token ids begin with
// skip null blocks it does not name (nullBlocks), which the chain of
// kvfast hashes runs through.
func (s *ZMQSubscriber) stored(ev *VLLMEvent, k keyspace, bs, skip int) {
	seed := s.seed
	if !ev.HasParent && (len(ev.LoRAName) > 0 || len(ev.Salt) > 0) {
		// A block with a parent inherits its namespace from the parent's
		// kvfast hash; only a sequence's first block is seeded with it.
		seed = s.namespaces.seed(s.cfg.Model, ev.LoRAName, ev.Salt)
	}
	parent, ok := s.apply.parent(s.cfg.Slot, k, seed, ev.Parent, ev.HasParent)
	if !ok {
		s.c.unresolvedParent.Add(uint64(len(ev.Hashes)))
		switch {
		case ev.Parent == sglangContentHashedRoot:
			s.throttle.Log(s.cfg.Logger, slog.LevelWarn, "content-hashed", contentHashedMessage, "events", s.cfg.Endpoint, "slot", s.cfg.Slot)
		case s.cfg.Replay == "":
			s.throttle.Log(s.cfg.Logger, slog.LevelWarn, "unresolved", unresolvedMessage, "events", s.cfg.Endpoint, "slot", s.cfg.Slot)
		}
		return
	}
	tokens := ev.Tokens[skip*bs:]
	for i := range skip {
		parent = radix.ChainBlockHash(parent, ev.Tokens[i*bs:(i+1)*bs])
	}
	// Blocks whose engine hash covers keys kvfast cannot reproduce
	// (prompt embeddings) would collide with plain-text blocks; so would
	// every later block of the chain. Multimodal keys are folded in.
	m := ev.ExtraKeysFrom
	s.c.skippedExtraKeys.Add(uint64(len(ev.Hashes) - m))
	var mm []uint64
	if ev.MMExtra != nil {
		mm = ev.MMExtra[:m]
		for _, e := range mm {
			if e != 0 {
				s.c.multimodalBlocks.Add(1)
			}
		}
	}
	s.c.storedBlocks.Add(uint64(s.apply.stored(s.cfg.Slot, k, parent, ev.Hashes[:m], tokens[:m*bs], mm, bs)))
}

// zmqCounters are written by the Run goroutine and read by Stats. Batches
// arrive once per engine step (milliseconds), so plain atomics cost
// nothing that matters.
type zmqCounters struct {
	batches, replayed, storedBlocks, removedBlocks, cleared atomic.Uint64
	gaps, replays, replayFailures, resyncs, restarts        atomic.Uint64
	rejoins, replayHoles, replayRejected                    atomic.Uint64
	duplicates, garbage, disconnects                        atomic.Uint64
	badEvents, unknownEvents                                atomic.Uint64
	skippedLoRA, skippedMedium, skippedGroup                atomic.Uint64
	skippedExtraKeys, blockSizeMismatch                     atomic.Uint64
	multimodalBlocks                                        atomic.Uint64
	unresolvedParent, unknownRemoved, reusedEngineHash      atomic.Uint64
	otherRankBatches                                        atomic.Uint64
	lastSeq                                                 atomic.Uint64
}

// ZMQStats is a snapshot of a subscriber's counters. Batches and events
// are counted as such; the Skipped and Unresolved fields count blocks.
type ZMQStats struct {
	Connected bool   `json:"connected"`
	LastSeq   uint64 `json:"last_seq"` // last batch applied; meaningful once Batches > 0

	Batches       uint64 `json:"batches"`        // batches applied (live or replayed)
	Replayed      uint64 `json:"replayed"`       // of which came from the replay socket
	StoredBlocks  uint64 `json:"stored_blocks"`  // blocks stored
	RemovedBlocks uint64 `json:"removed_blocks"` // blocks removed (engine hash resolved)
	Cleared       uint64 `json:"cleared"`        // AllBlocksCleared events applied

	Gaps           uint64 `json:"gaps"`            // sequence gaps on the live stream
	Replays        uint64 `json:"replays"`         // replay requests made
	ReplayFailures uint64 `json:"replay_failures"` // replays that failed or stalled
	ReplayHoles    uint64 `json:"replay_holes"`    // replies missing mid-replay (dropped by the engine's socket), asked for again
	ReplayRejected uint64 `json:"replay_rejected"` // replays not proven this engine's (the live batch missing or different): what they applied was dropped
	Resyncs        uint64 `json:"resyncs"`         // times the worker's entries were cleared to recover
	Restarts       uint64 `json:"restarts"`        // publisher restarts (sequence or ts went back, replay showed another history)
	Rejoins        uint64 `json:"rejoins"`         // reconnects whose continuity could not be proven: the worker's view was rebuilt
	Duplicates     uint64 `json:"duplicates"`      // batches already applied, skipped
	Garbage        uint64 `json:"garbage"`         // messages or payloads that could not be decoded
	Disconnects    uint64 `json:"disconnects"`     // lost or failed connections

	BadEvents     uint64 `json:"bad_events"`     // events that did not decode, or BlockStored events with unusable token ids
	UnknownEvents uint64 `json:"unknown_events"` // events of a type this version does not know

	SkippedLoRA       uint64 `json:"skipped_lora_blocks"`        // blocks of LoRA adapters
	SkippedMedium     uint64 `json:"skipped_medium_blocks"`      // blocks in a CPU or disk tier
	SkippedGroup      uint64 `json:"skipped_group_blocks"`       // blocks of KV-cache groups other than 0
	SkippedExtraKeys  uint64 `json:"skipped_extra_key_blocks"`   // blocks hashed with extra keys kvfast cannot reproduce (prompt embeddings)
	MultimodalBlocks  uint64 `json:"multimodal_blocks"`          // blocks received whose hash covers multimodal keys, hashed with them
	BlockSizeMismatch uint64 `json:"block_size_mismatch_blocks"` // blocks of another block size
	UnresolvedParent  uint64 `json:"unresolved_parent_blocks"`   // blocks whose parent engine hash is unknown
	UnknownRemoved    uint64 `json:"unknown_removed_blocks"`     // removed hashes with no mapping
	ReusedEngineHash  uint64 `json:"reused_engine_hash_blocks"`  // blocks not stored: their engine hash already names another block (per-page hashing)
	OtherRankBatches  uint64 `json:"other_rank_batches"`         // batches of another data-parallel rank, skipped (ZMQConfig.CheckDPRank)
}

// Stats returns the subscriber's counters. Safe from any goroutine.
func (s *ZMQSubscriber) Stats() ZMQStats {
	c := &s.c
	return ZMQStats{Connected: s.connected.Load(), LastSeq: c.lastSeq.Load(),
		Batches: c.batches.Load(), Replayed: c.replayed.Load(), StoredBlocks: c.storedBlocks.Load(),
		RemovedBlocks: c.removedBlocks.Load(), Cleared: c.cleared.Load(),
		Gaps: c.gaps.Load(), Replays: c.replays.Load(), ReplayFailures: c.replayFailures.Load(), ReplayHoles: c.replayHoles.Load(),
		ReplayRejected: c.replayRejected.Load(),
		Resyncs:        c.resyncs.Load(), Restarts: c.restarts.Load(), Rejoins: c.rejoins.Load(), Duplicates: c.duplicates.Load(),
		Garbage: c.garbage.Load(), Disconnects: c.disconnects.Load(),
		BadEvents: c.badEvents.Load(), UnknownEvents: c.unknownEvents.Load(),
		SkippedLoRA: c.skippedLoRA.Load(), SkippedMedium: c.skippedMedium.Load(), SkippedGroup: c.skippedGroup.Load(),
		SkippedExtraKeys: c.skippedExtraKeys.Load(), MultimodalBlocks: c.multimodalBlocks.Load(),
		BlockSizeMismatch: c.blockSizeMismatch.Load(),
		UnresolvedParent:  c.unresolvedParent.Load(), UnknownRemoved: c.unknownRemoved.Load(),
		ReusedEngineHash: c.reusedEngineHash.Load(), OtherRankBatches: c.otherRankBatches.Load()}
}

// namespaceSeeds caches radix.NamespaceSeed(model, lora, salt) by lora
// and salt. A tenant's salt recurs on every one of its requests, so the
// cache saves hashing and, above all, the strings NamespaceSeed takes; it
// is bounded in entries and in bytes (a publisher decides how long names
// are), and simply emptied when full, as recomputing costs little. A key
// longer than any real adapter name and salt is not cached at all.
type namespaceSeeds struct {
	m     map[string]uint64
	bytes int // of the keys in m
	key   []byte
}

const (
	maxNamespaceSeeds     = 4096
	maxNamespaceSeedBytes = 1 << 20
	maxNamespaceKeyBytes  = 1 << 10
)

func (c *namespaceSeeds) seed(model string, lora, salt []byte) uint64 {
	if len(lora)+len(salt) >= maxNamespaceKeyBytes {
		return radix.NamespaceSeed(model, string(lora), string(salt))
	}
	c.key = append(append(append(c.key[:0], lora...), 0), salt...)
	if v, ok := c.m[string(c.key)]; ok {
		return v
	}
	if c.m == nil || len(c.m) >= maxNamespaceSeeds || c.bytes+len(c.key) > maxNamespaceSeedBytes {
		c.m, c.bytes = make(map[string]uint64), 0
	}
	v := radix.NamespaceSeed(model, string(lora), string(salt))
	c.m[string(c.key)] = v
	c.bytes += len(c.key)
	return v
}
