package shm

import (
	"errors"
	"fmt"
	"io/fs"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/kvfast/kvfast/workers"
)

// WorkerConfig describes the engine rank a publisher speaks for.
type WorkerConfig struct {
	WorkerID         uint64
	DPRank           uint32
	Model            string // served model name; seeds the block hashes
	BlockSize        int    // tokens per KV block, as the engine uses
	KVCapacityBlocks uint64
	Endpoint         string       // HTTP base URL the router forwards requests to
	Role             workers.Role // disaggregated serving's part; workers.RoleBoth when aggregated
}

func (c WorkerConfig) validate() error {
	switch {
	case c.BlockSize <= 0 || c.BlockSize > workers.MaxBlockSize:
		return fmt.Errorf("cannot register block size %d: must be in [1, %d]", c.BlockSize, workers.MaxBlockSize)
	case len(c.Model) > MaxModelLen:
		return fmt.Errorf("cannot register model name of %d bytes: at most %d", len(c.Model), MaxModelLen)
	case c.Role > workers.RoleEncode:
		return fmt.Errorf("cannot register role %d: want 0 (both), 1 (prefill), 2 (decode) or 3 (encode)", c.Role)
	case len(c.Endpoint) > MaxEndpointLen:
		return fmt.Errorf("cannot register endpoint of %d bytes: at most %d", len(c.Endpoint), MaxEndpointLen)
	}
	return nil
}

// Publisher is an engine's side of the feed: it owns one registry slot,
// that slot's ring (as its single producer) and its load page.
//
// Its event methods never block and never allocate: when the ring is full
// the record is dropped, ErrRingFull returned, and the router sees the gap.
// A Publisher is not safe for concurrent use; an engine with several
// event sources serialises them (as vLLM's publisher thread does).
type Publisher struct {
	seg       *Segment
	ownSeg    bool
	slot      int
	cfg       WorkerConfig
	w         ringWriter
	maxBlocks int // blocks per Stored record that fit maxRecord
	maxHashes int // hashes per Removed record
	closed    bool
}

// Register attaches to the segment at path (which the router created) and
// claims a slot for cfg. Close releases both.
func Register(path string, cfg WorkerConfig) (*Publisher, error) {
	// Engines may run as another user than the router that made the
	// segment; the router's own refusal of foreign segments protects it.
	seg, err := attach(path, false, true)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("cannot register with shm segment %s: %w (start the router first)", path, ErrNoSegment)
		}
		return nil, err
	}
	p, err := seg.Register(cfg)
	if err != nil {
		seg.Close()
		return nil, err
	}
	p.ownSeg = true
	return p, nil
}

// claimWatching is claim, waiting out a holder of the worker id that is
// presumed alive: if its heartbeat moves while it is watched, another
// engine runs under this worker id and rank, and the registration is
// refused (ErrWorkerLive); if it stands still until liveHeartbeat has
// passed since the last beat, or for liveHeartbeat of watching (a
// heartbeat ahead of this clock never ages), the holder died (an engine
// restarted after a crash), and its slot is taken over. The wait is
// bounded by liveHeartbeat and a poll.
func (s *Segment) claimWatching(cfg WorkerConfig) (int, uint32, error) {
	var first, stood *holderPresumedError
	var since time.Time
	for {
		slot, gen, err := s.claim(cfg, stood)
		var held *holderPresumedError
		if !errors.As(err, &held) {
			return slot, gen, err
		}
		if first == nil {
			first, since = held, time.Now()
		} else if held.slot != first.slot || held.beat != first.beat {
			return 0, 0, fmt.Errorf("cannot register worker %d rank %d in %s: process %d (endpoint %q) holds it and heartbeats; "+
				"give each engine its own worker id, or stop that one first: %w",
				cfg.WorkerID, cfg.DPRank, s.path, held.holder, held.endpoint, ErrWorkerLive)
		}
		if time.Since(since) > liveHeartbeat {
			stood = first
			continue
		}
		time.Sleep(holderWatchPoll)
	}
}

// holderWatchPoll is how often claimWatching looks at a holder's
// heartbeat: well under any publisher's period.
const holderWatchPoll = 50 * time.Millisecond

// remember records the registration as this process's (registrations).
func (p *Publisher) remember() {
	if key, ok := p.seg.regKey(p.slot); ok {
		registrations.Store(key, p.w.gen)
	}
}

// forget drops the registration from this process's, if it is still the
// one recorded.
func (p *Publisher) forget() {
	if key, ok := p.seg.regKey(p.slot); ok {
		registrations.CompareAndDelete(key, p.w.gen)
	}
}

// Register claims a slot in an already-open segment, for an engine that
// runs in the router's process (the mock engine in tests and demos).
func (s *Segment) Register(cfg WorkerConfig) (*Publisher, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if s.Retired() {
		// A router retires a segment after another file took its path; a
		// retired file still at its path is a stray write or a router
		// that died mid-recreate. Registering in it would be retired at
		// the next heartbeat, registered again, for ever, each time
		// dropping the worker's blocks.
		return nil, fmt.Errorf("cannot register in shm segment %s: it is marked retired and no new segment took its path "+
			"(restart the router with --recreate-segment): %w", s.path, ErrRetired)
	}
	// Before the slot is claimed: a worker that can publish no block must
	// not go live.
	if BlocksPerRecord(s.lay.ringBytes, cfg.BlockSize) < 1 {
		return nil, fmt.Errorf("cannot register block size %d: one block does not fit a %d-byte ring", cfg.BlockSize, s.lay.ringBytes)
	}
	slot, gen, err := s.claimWatching(cfg)
	if err != nil {
		return nil, err
	}
	p := &Publisher{seg: s, slot: slot, cfg: cfg, w: s.newRingWriter(slot, gen)}
	p.remember()
	p.maxBlocks = BlocksPerRecord(s.lay.ringBytes, cfg.BlockSize)
	p.maxHashes = (p.w.maxRecord - recordHead) / 8
	return p, nil
}

// BlocksPerRecord is how many blocks of blockSize tokens one Stored record
// carries in a ring of ringBytes (a record takes at most a quarter of the
// ring). Below 1, no publisher of that block size can publish anything.
func BlocksPerRecord(ringBytes, blockSize int) int {
	return (ringBytes/4 - storedHead - 8) / (8 + 4*blockSize)
}

// Slot returns the registry slot this publisher holds.
func (p *Publisher) Slot() workers.Slot { return workers.Slot(p.slot) }

// Generation returns the slot generation the publisher writes under.
func (p *Publisher) Generation() uint32 { return p.w.gen }

// Seq returns the sequence number of the last record committed or dropped.
func (p *Publisher) Seq() uint64 { return p.w.seq }

// Stored publishes that the engine cached len(engineHashes) full blocks
// whose tokens are tokens (BlockSize per block, in order). parent is the
// engine hash of the first block's parent; hasParent is false for a block
// at the start of a sequence. Batches too large for one record are split
// into chained records.
func (p *Publisher) Stored(parent uint64, hasParent bool, engineHashes []uint64, tokens []uint32) (err error) {
	defer p.catch(debug.SetPanicOnFault(true), &err)
	if p.closed {
		return ErrClosed
	}
	bs := p.cfg.BlockSize
	if len(tokens) != len(engineHashes)*bs {
		return fmt.Errorf("cannot publish %d blocks with %d tokens: want %d tokens per block", len(engineHashes), len(tokens), bs)
	}
	for len(engineHashes) > 0 {
		n := min(len(engineHashes), p.maxBlocks)
		if e := p.w.writeStored(parent, hasParent, engineHashes[:n], tokens[:n*bs], bs); e != nil {
			err = e
		}
		parent, hasParent = engineHashes[n-1], true
		engineHashes, tokens = engineHashes[n:], tokens[n*bs:]
	}
	return err
}

// Removed publishes that the engine evicted the blocks with these hashes.
func (p *Publisher) Removed(engineHashes []uint64) (err error) {
	defer p.catch(debug.SetPanicOnFault(true), &err)
	if p.closed {
		return ErrClosed
	}
	for len(engineHashes) > 0 {
		n := min(len(engineHashes), p.maxHashes)
		if e := p.w.writeRemoved(engineHashes[:n]); e != nil {
			err = e
		}
		engineHashes = engineHashes[n:]
	}
	return err
}

// Cleared publishes that the engine dropped every cached block.
func (p *Publisher) Cleared() (err error) {
	defer p.catch(debug.SetPanicOnFault(true), &err)
	if p.closed {
		return ErrClosed
	}
	return p.w.writeCleared()
}

// Load publishes the engine's current load; Updated and Generation are
// filled in here.
func (p *Publisher) Load(l Load) {
	var err error // a fault is the next Heartbeat's to report
	defer p.catch(debug.SetPanicOnFault(true), &err)
	if p.closed || p.w.lost() {
		return // a slot another registration took is its publisher's to write
	}
	l.Updated = monoNow()
	l.Generation = p.w.gen
	p.seg.writeLoad(p.slot, l)
}

// Heartbeat tells the router the engine is alive. If the router already
// marked the worker down (the heartbeat came too late: the engine was
// paused) the registration is revived as it was, generation and sequence
// numbers kept: the router kept its blocks and applied its records for a
// while (feed.Config.DownRetention), and takes it back where it stopped.
func (p *Publisher) Heartbeat() (err error) {
	if p.closed {
		return ErrClosed
	}
	defer p.catch(debug.SetPanicOnFault(true), &err)
	if p.seg.Retired() || p.seg.Replaced() || p.seg.CheckSize() {
		return ErrRetired
	}
	off := slotOff(p.slot)
	if atomic.LoadUint32(p.seg.u32(off+sGeneration)) != p.w.gen {
		return ErrSlotLost
	}
	switch stateOf(atomic.LoadUint64(p.seg.u64(off + sState))) {
	case StateLive:
		atomic.StoreUint64(p.seg.u64(off+sHeartbeat), uint64(monoNow()))
		return nil
	case StateDown:
		return p.revive(off)
	}
	return ErrSlotLost
}

func (p *Publisher) revive(off int) error {
	unlock, _, err := p.seg.lockRegistry(true)
	if err != nil {
		return err
	}
	defer unlock()
	sw := p.seg.u64(off + sState)
	w := atomic.LoadUint64(sw)
	if stateOf(w) != StateDown || atomic.LoadUint32(p.seg.u32(off+sGeneration)) != p.w.gen {
		return ErrSlotLost
	}
	atomic.StoreUint64(p.seg.u64(off+sHeartbeat), uint64(monoNow()))
	atomic.StoreUint64(sw, nextState(w, StateLive))
	return nil
}

// markClosed sets the slot closed, under the registry lock, if it is
// still this registration's.
func (p *Publisher) markClosed() (err error) {
	defer p.catch(debug.SetPanicOnFault(true), &err)
	unlock, _, err := p.seg.lockRegistry(true)
	if err != nil {
		if errors.Is(err, ErrClosed) {
			return nil
		}
		return err
	}
	defer unlock()
	off := slotOff(p.slot)
	sw := p.seg.u64(off + sState)
	w := atomic.LoadUint64(sw)
	if st := stateOf(w); (st == StateLive || st == StateDown) && atomic.LoadUint32(p.seg.u32(off+sGeneration)) == p.w.gen {
		atomic.StoreUint64(sw, nextState(w, StateClosed))
	}
	return nil
}

// catch is deferred by the methods that write the mapping (fault.go): a
// fault in it, the file truncated under the engine, detaches the segment
// and makes the method report ErrRetired.
//
// prev is what debug.SetPanicOnFault was before the method set it, put
// back here: one deferred call rather than two, on the ring's path.
func (p *Publisher) catch(prev bool, err *error) {
	debug.SetPanicOnFault(prev)
	v := recover()
	if v == nil {
		return
	}
	if !p.seg.caught(v) {
		panic(v)
	}
	*err = ErrRetired
}

// Close marks the slot closed (the router drops the worker's blocks) and,
// for a publisher made by Register, unmaps the segment.
func (p *Publisher) Close() error {
	if p.closed {
		return nil
	}
	p.closed = true
	p.forget()
	err := p.markClosed()
	if errors.Is(err, ErrRetired) {
		err = nil // a truncated file (fault.go): there is no slot left to close
	}
	if p.ownSeg {
		if cerr := p.seg.Close(); err == nil {
			err = cerr
		}
	}
	return err
}
