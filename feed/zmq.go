package feed

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvfast/kvfast/radix"
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
	// worker's entries instead of replaying them.
	Replay string
	// Topic is the subscription prefix; "" receives every topic.
	Topic string

	Slot  workers.Slot // the worker's slot in the index
	Model string       // block-hash namespace: radix.NamespaceSeed(Model, "", "")
	// BlockSize is the router's block size; blocks the engine stores in
	// another size are counted and skipped. Default radix.DefaultBlockSize.
	BlockSize int

	DialTimeout   time.Duration // TCP connect timeout, default 2s
	RedialMin     time.Duration // first wait before redialling a lost engine, default 50ms
	RedialMax     time.Duration // the wait doubles up to this, default 2s
	ReplayTimeout time.Duration // longest silence of the replay socket mid-replay, default 1s

	MaxBatchBlocks int // decoder limit, default DefaultMaxBatchBlocks
	MaxBatchTokens int // decoder limit, default DefaultMaxBatchTokens

	Logger *slog.Logger // default: discard
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
		return fmt.Errorf("cannot use ZMQ endpoint %q: want tcp://host:port or ipc://path", ep)
	case scheme == "ipc" && addr != "":
		return nil
	case scheme != "tcp":
		return fmt.Errorf("cannot use ZMQ endpoint %q: only tcp:// and ipc:// are supported", ep)
	}
	host, port, err := net.SplitHostPort(addr)
	if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 1 || n > 65535 {
		return fmt.Errorf("cannot use ZMQ endpoint %q: want tcp://host:port", ep)
	}
	if host == "" || host == "*" {
		return fmt.Errorf("cannot use ZMQ endpoint %q: a wildcard is where the engine binds; dial its address (tcp://127.0.0.1:%s)", ep, port)
	}
	return nil
}

// ZMQSubscriber applies one engine's ZMQ KV-event stream to the index, in
// the engine's worker slot. Run it on its own goroutine.
type ZMQSubscriber struct {
	ix    *radix.Index
	cfg   ZMQConfig
	seed  uint64
	dec   VLLMDecoder
	apply applier

	// Sequence state, owned by the Run goroutine.
	synced   bool   // the index holds this worker's state as of lastSeq
	lastSeq  uint64 // last batch applied (live or replayed)
	haveLive bool
	lastLive uint64 // last batch received on the live stream

	running   atomic.Bool
	connected atomic.Bool
	c         zmqCounters
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
		apply: newApplier(ix, 0)}
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
// entries are cleared. An engine that restarted (its sequence went back)
// has its blocks and engine-hash mappings dropped.
func (s *ZMQSubscriber) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errZMQRunning
	}
	defer s.running.Store(false)
	s.ix.RemoveWorker(s.cfg.Slot)
	s.synced, s.haveLive = false, false
	wait := s.cfg.RedialMin
	for {
		received, err := s.session(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if received {
			wait = s.cfg.RedialMin
		}
		s.c.disconnects.Add(1)
		s.cfg.Logger.Debug("KV-event feed lost, redialling", "endpoint", s.cfg.Endpoint, "slot", s.cfg.Slot,
			"err", err, "in", wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, s.cfg.RedialMax)
	}
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
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
		return false, fmt.Errorf("cannot subscribe to %q: %w", s.cfg.Topic, err)
	}
	if err := sub.Dial(s.cfg.Endpoint); err != nil {
		return false, err
	}
	s.connected.Store(true)
	defer s.connected.Store(false)
	s.cfg.Logger.Info("KV-event feed connected", "endpoint", s.cfg.Endpoint, "slot", s.cfg.Slot)
	for {
		msg, err := sub.Recv()
		if err != nil {
			return received, err
		}
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		received = true
		// [topic, 8-byte big-endian sequence number, msgpack batch]
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			// Its sequence number is unknown; if it was a batch, the next
			// one shows the gap.
			s.c.garbage.Add(1)
			continue
		}
		s.onLive(ctx, binary.BigEndian.Uint64(msg.Frames[1]), msg.Frames[2])
	}
}

// onLive handles a batch from the live stream.
func (s *ZMQSubscriber) onLive(ctx context.Context, seq uint64, payload []byte) {
	if s.haveLive && seq <= s.lastLive {
		// A publisher never repeats a number on the live stream: it
		// restarted, and its cache with it.
		s.c.restarts.Add(1)
		s.ix.RemoveWorker(s.cfg.Slot)
		s.synced = false
	}
	s.haveLive, s.lastLive = true, seq
	switch {
	case !s.synced:
		// Joining: the index holds nothing for this worker, so any suffix
		// of the engine's history is safe to apply, and the replay buffer
		// may hold all of it.
		if seq > 0 && s.cfg.Replay != "" {
			s.replay(ctx, 0)
		}
	case seq > s.lastSeq+1:
		s.c.gaps.Add(1)
		if s.cfg.Replay != "" {
			s.replay(ctx, s.lastSeq+1)
		}
	}
	s.offer(seq, payload)
}

// offer applies batch seq unless it was applied already; batches missing
// before it first cost the worker its entries, since whatever they removed
// may still be claimed.
func (s *ZMQSubscriber) offer(seq uint64, payload []byte) {
	if s.synced && seq <= s.lastSeq {
		s.c.duplicates.Add(1)
		return
	}
	if s.synced && seq != s.lastSeq+1 {
		s.resync()
	}
	s.synced, s.lastSeq = true, seq
	if b, err := s.dec.Decode(payload); err == nil {
		s.applyBatch(b)
	} else {
		// The batch is lost, and what it changed with it.
		s.c.garbage.Add(1)
		s.cfg.Logger.Debug("undecodable KV-event batch", "endpoint", s.cfg.Endpoint, "seq", seq, "err", err)
		s.resync()
	}
	// Published last: a reader that sees seq sees its effects.
	s.c.lastSeq.Store(seq)
}

func (s *ZMQSubscriber) resync() {
	s.apply.cleared(s.cfg.Slot)
	s.c.resyncs.Add(1)
}

// endOfReplay is the sequence number of vLLM's end-of-replay marker (-1).
const endOfReplay = ^uint64(0)

// replay asks the engine's replay socket for every batch from seq from on
// and offers each. vLLM's protocol: the request is [empty delimiter,
// 8-byte big-endian start]; each reply is [empty, seq, payload], and
// [empty, -1, empty] ends the stream. A replay that fails or stalls is
// abandoned; offer then resyncs over whatever is still missing.
func (s *ZMQSubscriber) replay(ctx context.Context, from uint64) {
	s.c.replays.Add(1)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stall := time.AfterFunc(s.cfg.ReplayTimeout, cancel)
	defer stall.Stop()
	d := zmq4.NewDealer(rctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(s.cfg.DialTimeout),
		zmq4.WithTimeout(s.cfg.ReplayTimeout), zmq4.WithLogger(s.zmqLog()))
	defer d.Close()
	fail := func(err error) {
		s.c.replayFailures.Add(1)
		s.cfg.Logger.Warn("KV-event replay failed", "endpoint", s.cfg.Replay, "from", from, "err", err)
	}
	if err := d.Dial(s.cfg.Replay); err != nil {
		fail(err)
		return
	}
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], from)
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, req[:])); err != nil {
		fail(err)
		return
	}
	for {
		msg, err := d.Recv()
		if err != nil {
			fail(err)
			return
		}
		stall.Reset(s.cfg.ReplayTimeout)
		f := msg.Frames
		if len(f) == 3 && len(f[0]) == 0 {
			f = f[1:] // the ROUTER's envelope delimiter
		}
		if msg.Type == zmq4.CmdMsg || len(f) != 2 || len(f[0]) != 8 {
			s.c.garbage.Add(1)
			continue
		}
		seq := binary.BigEndian.Uint64(f[0])
		if seq == endOfReplay && len(f[1]) == 0 {
			return
		}
		s.c.replayed.Add(1)
		s.offer(seq, f[1])
	}
}

// applyBatch writes one decoded batch through the shared apply path
// (apply.go), event by event, after skipping and counting what the router
// cannot route on.
func (s *ZMQSubscriber) applyBatch(b *VLLMBatch) {
	slot := s.cfg.Slot
	s.c.batches.Add(1)
	for i := range b.Events {
		ev := &b.Events[i]
		n := uint64(len(ev.Hashes))
		switch ev.Kind {
		case VLLMBlockStored:
			switch bs := s.cfg.BlockSize; {
			case ev.LoRA:
				s.c.skippedLoRA.Add(n)
			case ev.OffGPU:
				s.c.skippedMedium.Add(n)
			case ev.Group != 0:
				s.c.skippedGroup.Add(n)
			case ev.BlockSize != int64(bs):
				s.c.blockSizeMismatch.Add(n)
			case ev.BadTokens || len(ev.Tokens) != len(ev.Hashes)*bs:
				s.c.badEvents.Add(1)
			default:
				s.stored(ev, bs)
			}
		case VLLMBlockRemoved:
			switch {
			case ev.OffGPU:
				s.c.skippedMedium.Add(n)
			case ev.Group != 0:
				s.c.skippedGroup.Add(n)
			default:
				removed := uint64(s.apply.removed(slot, ev.Hashes))
				s.c.unknownRemoved.Add(n - removed)
				s.c.removedBlocks.Add(removed)
			}
		case VLLMAllBlocksCleared:
			s.apply.cleared(slot)
			s.c.cleared.Add(1)
		default:
			s.c.unknownEvents.Add(1)
		}
	}
}

func (s *ZMQSubscriber) stored(ev *VLLMEvent, bs int) {
	parent, ok := s.apply.parent(s.cfg.Slot, s.seed, ev.Parent, ev.HasParent)
	if !ok {
		s.c.unresolvedParent.Add(uint64(len(ev.Hashes)))
		return
	}
	// Blocks whose engine hash covers more than tokens (images, a cache
	// salt) would collide with plain-text blocks; so would every later
	// block of the chain.
	m := ev.ExtraKeysFrom
	s.c.skippedExtraKeys.Add(uint64(len(ev.Hashes) - m))
	s.c.storedBlocks.Add(uint64(s.apply.stored(s.cfg.Slot, parent, ev.Hashes[:m], ev.Tokens[:m*bs], bs)))
}

// zmqCounters are written by the Run goroutine and read by Stats. Batches
// arrive once per engine step (milliseconds), so plain atomics cost
// nothing that matters.
type zmqCounters struct {
	batches, replayed, storedBlocks, removedBlocks, cleared atomic.Uint64
	gaps, replays, replayFailures, resyncs, restarts        atomic.Uint64
	duplicates, garbage, disconnects                        atomic.Uint64
	badEvents, unknownEvents                                atomic.Uint64
	skippedLoRA, skippedMedium, skippedGroup                atomic.Uint64
	skippedExtraKeys, blockSizeMismatch                     atomic.Uint64
	unresolvedParent, unknownRemoved                        atomic.Uint64
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
	Resyncs        uint64 `json:"resyncs"`         // times the worker's entries were cleared to recover
	Restarts       uint64 `json:"restarts"`        // publisher restarts (sequence went back)
	Duplicates     uint64 `json:"duplicates"`      // batches already applied, skipped
	Garbage        uint64 `json:"garbage"`         // messages or payloads that could not be decoded
	Disconnects    uint64 `json:"disconnects"`     // lost or failed connections

	BadEvents     uint64 `json:"bad_events"`     // BlockStored events with unusable token ids
	UnknownEvents uint64 `json:"unknown_events"` // events of a type this version does not know

	SkippedLoRA       uint64 `json:"skipped_lora_blocks"`        // blocks of LoRA adapters
	SkippedMedium     uint64 `json:"skipped_medium_blocks"`      // blocks in a CPU or disk tier
	SkippedGroup      uint64 `json:"skipped_group_blocks"`       // blocks of KV-cache groups other than 0
	SkippedExtraKeys  uint64 `json:"skipped_extra_key_blocks"`   // blocks hashed with extra keys (images, salt)
	BlockSizeMismatch uint64 `json:"block_size_mismatch_blocks"` // blocks of another block size
	UnresolvedParent  uint64 `json:"unresolved_parent_blocks"`   // blocks whose parent engine hash is unknown
	UnknownRemoved    uint64 `json:"unknown_removed_blocks"`     // removed hashes with no mapping
}

// Stats returns the subscriber's counters. Safe from any goroutine.
func (s *ZMQSubscriber) Stats() ZMQStats {
	c := &s.c
	return ZMQStats{Connected: s.connected.Load(), LastSeq: c.lastSeq.Load(),
		Batches: c.batches.Load(), Replayed: c.replayed.Load(), StoredBlocks: c.storedBlocks.Load(),
		RemovedBlocks: c.removedBlocks.Load(), Cleared: c.cleared.Load(),
		Gaps: c.gaps.Load(), Replays: c.replays.Load(), ReplayFailures: c.replayFailures.Load(),
		Resyncs: c.resyncs.Load(), Restarts: c.restarts.Load(), Duplicates: c.duplicates.Load(),
		Garbage: c.garbage.Load(), Disconnects: c.disconnects.Load(),
		BadEvents: c.badEvents.Load(), UnknownEvents: c.unknownEvents.Load(),
		SkippedLoRA: c.skippedLoRA.Load(), SkippedMedium: c.skippedMedium.Load(), SkippedGroup: c.skippedGroup.Load(),
		SkippedExtraKeys: c.skippedExtraKeys.Load(), BlockSizeMismatch: c.blockSizeMismatch.Load(),
		UnresolvedParent: c.unresolvedParent.Load(), UnknownRemoved: c.unknownRemoved.Load()}
}
