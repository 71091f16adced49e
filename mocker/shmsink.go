package mocker

import (
	"errors"
	"fmt"

	"github.com/kvfast/kvfast/shm"
)

// ShmPublisher adapts a shm.Publisher to the mock engine's Publisher seam.
// Like the shm publisher it is not safe for concurrent use; the engine
// calls it from its loop goroutine only.
type ShmPublisher struct {
	p      *shm.Publisher
	path   string       // set when the publisher was registered by path
	seg    *shm.Segment // set when it was registered in an open segment
	worker shm.WorkerConfig
	hashes []uint64
	tokens []uint32
	// Reregistered counts registrations renewed after the router
	// recreated the segment, or after another registration took the slot.
	Reregistered uint64
}

var _ Publisher = (*ShmPublisher)(nil)

// Stored implements Publisher. The blocks' tokens are laid end to end, as
// the shm record carries them, in buffers reused across calls.
//
// Blocks of an adapter or a salted request are not published: a shm
// record names no namespace, and the router would file them under the
// base model's, where requests without that adapter and salt would match
// them. The router then under-claims them, which is safe. (Their
// evictions still are published; the router ignores hashes it never
// stored.) Nor can a record name a tier or a KV-cache group: only blocks
// stored on the GPU in group 0 are published, and copies in the host pool
// or in a hybrid engine's other group are left out.
func (s *ShmPublisher) Stored(at Placement, parent uint64, hasParent bool, blocks []BlockEvent) error {
	if !at.OnGPU() || len(blocks) > 0 && (blocks[0].LoRA != "" || blocks[0].Salt != "") {
		return nil
	}
	s.hashes, s.tokens = s.hashes[:0], s.tokens[:0]
	for _, b := range blocks {
		s.hashes = append(s.hashes, b.Hash)
		s.tokens = append(s.tokens, b.Tokens...)
	}
	return s.p.Stored(parent, hasParent, s.hashes, s.tokens)
}

// Removed implements Publisher. Only evictions from the GPU in group 0 are
// published: a record would name the GPU's copy of every other.
func (s *ShmPublisher) Removed(at Placement, hashes []uint64) error {
	if !at.OnGPU() {
		return nil
	}
	return s.p.Removed(hashes)
}

// Cleared implements Publisher.
func (s *ShmPublisher) Cleared() error { return s.p.Cleared() }

// Load implements Publisher.
func (s *ShmPublisher) Load(running, waiting, kvUsed, kvTotal uint64) error {
	s.p.Load(shm.Load{Running: running, Waiting: waiting, KVUsedBlocks: kvUsed, KVTotalBlocks: kvTotal})
	return nil
}

// Heartbeat implements Publisher. When the router has recreated the
// segment and the publisher was registered by path, it registers again
// in the new segment; when another registration took its slot (the
// router marked it down while it was paused and a new engine got the
// slot), it registers again in the same one, as the Python publisher does
// (a slot whose holder still heartbeats is not taken: shm.ErrWorkerLive).
// The router then knows none of the blocks cached before: it
// underestimates this engine's cache until they are evicted and stored
// again, which costs routing quality but never correctness.
func (s *ShmPublisher) Heartbeat() error {
	err := s.p.Heartbeat()
	var p *shm.Publisher
	var rerr error
	switch {
	case errors.Is(err, shm.ErrRetired) && s.path != "":
		p, rerr = shm.Register(s.path, s.worker)
	case errors.Is(err, shm.ErrSlotLost) && s.path != "":
		p, rerr = shm.Register(s.path, s.worker)
	case errors.Is(err, shm.ErrSlotLost) && s.seg != nil:
		p, rerr = s.seg.Register(s.worker)
	default:
		return err
	}
	if rerr != nil {
		return fmt.Errorf("cannot register again with shm segment after %v: %w", err, rerr)
	}
	_ = s.p.Close()
	s.p = p
	s.Reregistered++
	return s.p.Cleared()
}

// Close releases the registration.
func (s *ShmPublisher) Close() error { return s.p.Close() }

// openSegmentPublisher registers the engine in the segment named by
// cfg.Segment (or in cfg.SegmentHandle, already open in this process) and
// returns the publisher and the function that unregisters it.
func openSegmentPublisher(cfg Config, endpoint string) (*ShmPublisher, error) {
	wc := shm.WorkerConfig{
		WorkerID:         cfg.WorkerID,
		DPRank:           cfg.DPRank,
		Model:            cfg.Model,
		BlockSize:        cfg.BlockSize,
		KVCapacityBlocks: uint64(cfg.KVBlocks),
		Endpoint:         endpoint,
		Role:             cfg.Role,
	}
	if cfg.SegmentHandle != nil {
		p, err := cfg.SegmentHandle.Register(wc)
		if err != nil {
			return nil, fmt.Errorf("cannot register mock engine %s in shm segment %s: %w", endpoint, cfg.SegmentHandle.Path(), err)
		}
		return &ShmPublisher{p: p, seg: cfg.SegmentHandle, worker: wc}, nil
	}
	p, err := shm.Register(cfg.Segment, wc)
	if err != nil {
		return nil, fmt.Errorf("cannot register mock engine %s in shm segment %s: %w", endpoint, cfg.Segment, err)
	}
	return &ShmPublisher{p: p, path: cfg.Segment, worker: wc}, nil
}
