package feed

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
)

const (
	testModel     = "test-model"
	testBlockSize = 4
)

var testIndex = radix.Config{Capacity: 1 << 16}

// countingBlock is one block's token ids, first, first+1, ...: distinct
// firsts far enough apart make distinct blocks.
func countingBlock(first uint32) []uint32 {
	b := make([]uint32, testBlockSize)
	for i := range b {
		b[i] = first + uint32(i)
	}
	return b
}

// op is one publisher call; ops files carry them to child processes (Go
// and Python) as JSON lines.
type op struct {
	Op     string   `json:"op"` // stored | removed | cleared
	Parent *uint64  `json:"parent,omitempty"`
	Hashes []uint64 `json:"hashes,omitempty"`
	Tokens []uint32 `json:"tokens,omitempty"`
}

// genOps makes a deterministic workload: chains of stored blocks that
// extend earlier ones, removals of stored blocks, and a rare clear.
func genOps(seed uint64, n int) []op {
	rng := rand.New(rand.NewPCG(seed, 99))
	var ops []op
	var known []uint64 // engine hashes stored and not removed
	next := seed << 32
	for len(ops) < n {
		switch r := rng.IntN(20); {
		case r < 13:
			o := op{Op: "stored"}
			if len(known) > 0 && rng.IntN(3) > 0 {
				p := known[rng.IntN(len(known))]
				o.Parent = &p
			}
			k := rng.IntN(6) + 1
			for i := 0; i < k; i++ {
				next++
				o.Hashes = append(o.Hashes, next*0x9e3779b97f4a7c15) // arbitrary 64-bit keys
				for j := 0; j < testBlockSize; j++ {
					o.Tokens = append(o.Tokens, rng.Uint32N(50000))
				}
			}
			known = append(known, o.Hashes...)
			ops = append(ops, o)
		case r < 19 && len(known) > 0:
			k := min(len(known), rng.IntN(3)+1)
			o := op{Op: "removed"}
			for i := 0; i < k; i++ {
				j := rng.IntN(len(known))
				o.Hashes = append(o.Hashes, known[j])
				known[j] = known[len(known)-1]
				known = known[:len(known)-1]
			}
			ops = append(ops, o)
		case r == 19:
			// An engine empties its cache only when no request holds a
			// block (vLLM's reset_prefix_cache, SGLang's flush_cache), so
			// nothing it stores later chains from a block it held before.
			ops = append(ops, op{Op: "cleared"})
			known = known[:0]
		}
	}
	return ops
}

func writeOps(t testing.TB, ops []op) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ops.jsonl")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, o := range ops {
		enc.Encode(o)
	}
	w.Flush()
	f.Close()
	return path
}

func readOps(path string) ([]op, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ops []op
	dec := json.NewDecoder(f)
	for dec.More() {
		var o op
		if err := dec.Decode(&o); err != nil {
			return nil, err
		}
		ops = append(ops, o)
	}
	return ops, nil
}

// publishAll publishes ops through p, in order, and applies them to m:
// what the index must then hold for p's slot.
func publishAll(p *shm.Publisher, m *model, ops []op) {
	for _, o := range ops {
		_ = publishOp(p, o)
		m.apply(o)
	}
}

func publishOp(p *shm.Publisher, o op) error {
	switch o.Op {
	case "stored":
		var parent uint64
		if o.Parent != nil {
			parent = *o.Parent
		}
		return p.Stored(parent, o.Parent != nil, o.Hashes, o.Tokens)
	case "removed":
		return p.Removed(o.Hashes)
	case "cleared":
		return p.Cleared()
	}
	return fmt.Errorf("unknown op %q", o.Op)
}

// model is the reference: what one worker's blocks must be after a
// prefix of ops, computed without the ring or the index.
type model struct {
	seed    uint64
	engine  map[uint64]uint64 // engine hash -> kvfast hash
	present map[uint64]bool   // kvfast hashes held
	all     map[uint64]bool   // every kvfast hash ever produced
}

func newModel() *model {
	return &model{seed: radix.NamespaceSeed(testModel, "", ""), engine: map[uint64]uint64{},
		present: map[uint64]bool{}, all: map[uint64]bool{}}
}

func (m *model) apply(o op) {
	switch o.Op {
	case "stored":
		parent := m.seed
		if o.Parent != nil {
			kv, ok := m.engine[*o.Parent]
			if !ok {
				return
			}
			parent = kv
		}
		for i, eh := range o.Hashes {
			parent = radix.ChainBlockHash(parent, o.Tokens[i*testBlockSize:(i+1)*testBlockSize])
			m.engine[eh] = parent
			m.present[parent] = true
			m.all[parent] = true
		}
	case "removed":
		for _, eh := range o.Hashes {
			if kv, ok := m.engine[eh]; ok {
				delete(m.engine, eh)
				delete(m.present, kv)
			}
		}
	case "cleared":
		clear(m.present)
		clear(m.engine) // the engine's hashes of the blocks it dropped name nothing now
	}
}

// check compares the index's view of slot with the model, exactly.
func (m *model) check(t testing.TB, ix *radix.Index, slot workers.Slot) {
	t.Helper()
	for h := range m.all {
		if got := ix.Lookup(h).Has(slot); got != m.present[h] {
			t.Fatalf("slot %d block %#x: index has it=%v, publisher state says %v", slot, h, got, m.present[h])
		}
	}
	if got := ix.Stats().WorkerBlocks[slot]; got != uint64(len(m.present)) {
		t.Fatalf("slot %d holds %d blocks, want %d", slot, got, len(m.present))
	}
}

func openSeg(t testing.TB, ringBytes int) *shm.Segment {
	t.Helper()
	seg, err := shm.Open(filepath.Join(t.TempDir(), "seg"), shm.Options{Index: testIndex, RingBytes: ringBytes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seg.Close() })
	return seg
}

func workerCfg(id uint64) shm.WorkerConfig {
	return shm.WorkerConfig{WorkerID: id, Model: testModel, BlockSize: testBlockSize, KVCapacityBlocks: 1000, Endpoint: "http://127.0.0.1:9"}
}

func acquire(t testing.TB, seg *shm.Segment, cfg Config) *Ingester {
	t.Helper()
	if cfg.HeartbeatGrace == 0 {
		// The tests' publishers do not heartbeat: under the default
		// grace a test slowed past 5 s (the race detector on a loaded
		// machine) saw its workers go stale and their blocks dropped.
		// A test of staleness sets its own grace.
		cfg.HeartbeatGrace = time.Hour
	}
	in := New(seg, cfg)
	ok, err := in.Acquire(context.Background())
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	t.Cleanup(func() { in.Release() })
	return in
}

// runUntilCleanup runs in.Run in the background until the test ends:
// before the segments opened earlier in the test close (cleanups run last
// in, first out).
func runUntilCleanup(t testing.TB, in *Ingester) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// drainAll polls until no ring has pending records.
func drainAll(in *Ingester) {
	in.ScanRegistry()
	for in.Poll() > 0 {
	}
}
