//go:build !race

package mocker

import (
	"path/filepath"
	"testing"

	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/shm"
)

func TestZeroAllocations(t *testing.T) {
	t.Run("cache allocate, commit, release", func(t *testing.T) {
		ev := &eventSink{}
		c := newKVCache(&Config{KVBlocks: 64, BlockSize: 16}, ev)
		toks := seq(0, 16)
		h := uint64(0)
		ids := make([]int32, 0, 8)
		n := testing.AllocsPerRun(1000, func() {
			ids = ids[:0]
			for range 8 {
				id, _ := c.allocate()
				h++
				c.commit(id, h, h-1, true, toks, "", "", blockMM{})
				ids = append(ids, id)
			}
			for i := len(ids) - 1; i >= 0; i-- {
				c.release(ids[i], false)
			}
			ev.flush()
		})
		if n != 0 {
			t.Fatalf("%v allocations per cycle", n)
		}
	})
	t.Run("eviction into the host pool, hybrid window", func(t *testing.T) {
		for _, cfg := range []Config{
			{KVBlocks: 16, BlockSize: 16, HostBlocks: 8},
			{KVBlocks: 16, BlockSize: 16, SlidingWindow: 32},
		} {
			ev := &eventSink{}
			c := newKVCache(&cfg, ev)
			hybrid := cfg.SlidingWindow > 0
			toks := seq(0, 16)
			h := uint64(0)
			ids := make([]int32, 0, 12)
			cycle := func() {
				ids = ids[:0]
				for range 12 {
					id, _ := c.allocate()
					h++
					c.commit(id, h, h-1, true, toks, "", "", blockMM{})
					if hybrid {
						c.enterWindow(id, toks)
					}
					ids = append(ids, id)
				}
				if hybrid {
					for i := range ids[:6] {
						c.leaveWindow(ids[i])
					}
				}
				for i := len(ids) - 1; i >= 0; i-- {
					c.release(ids[i], hybrid && i < 6)
				}
				ev.flush()
			}
			cycle() // fills the pool
			if n := testing.AllocsPerRun(1000, cycle); n != 0 {
				t.Fatalf("%+v: %v allocations per cycle", cfg, n)
			}
			if c.host != nil && c.hostEvicts == 0 || cfg.SlidingWindow > 0 && c.windowFreed == 0 {
				t.Fatalf("%+v: the cycle neither offloaded nor freed", cfg)
			}
		}
	})
	t.Run("core decode step", func(t *testing.T) {
		c := newTestCore(t, Config{BlockSize: 16, KVBlocks: 8192, MaxBatchedTokens: 8192}, nil)
		for i := range 32 {
			addReq(t, c, seq(i*1000, 100+i), 4000)
		}
		for range 20 {
			c.Step()
		}
		if n := testing.AllocsPerRun(500, func() { c.Step() }); n != 0 {
			t.Fatalf("%v allocations per step", n)
		}
		if c.Stats().BlocksStored < 32*30 {
			t.Fatal("decode did not fill and store blocks during the measurement")
		}
	})
	t.Run("text tokenizer with room", func(t *testing.T) {
		buf := make([]uint32, 0, 16)
		if n := testing.AllocsPerRun(100, func() { buf = AppendTextTokens(buf[:0], "a b c d") }); n != 0 {
			t.Fatalf("%v allocations", n)
		}
	})
	t.Run("token array with room", func(t *testing.T) {
		raw := []byte(idsJSON(seq(1, 500)))
		buf := make([]uint32, 0, 600)
		var r apiRequest
		if n := testing.AllocsPerRun(100, func() { buf, _ = promptTokens(&r.prompt, buf[:0], raw) }); n != 0 {
			t.Fatalf("%v allocations", n)
		}
	})
	t.Run("response chunk", func(t *testing.T) {
		h := &respHead{id: "cmpl-x", created: 1, model: []byte(`"m"`)}
		buf := make([]byte, 0, 1024)
		if n := testing.AllocsPerRun(100, func() { buf = h.appendChunk(buf[:0], 5, 3, "", true, 10, 0) }); n != 0 {
			t.Fatalf("%v allocations", n)
		}
	})
	t.Run("shm publisher adapter", func(t *testing.T) {
		seg, err := shm.Open(filepath.Join(t.TempDir(), "seg"), shm.Options{Index: radix.Config{Capacity: 1024}})
		if err != nil {
			t.Fatal(err)
		}
		defer seg.Close()
		p, err := seg.Register(shm.WorkerConfig{Model: "m", BlockSize: 16, KVCapacityBlocks: 64, Endpoint: "http://x"})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		sp := NewShmPublisher(p)
		blocks := []BlockEvent{{Hash: 1, Tokens: seq(0, 16)}, {Hash: 2, Tokens: seq(16, 16)}}
		hashes := []uint64{1, 2}
		// The ring fills and drops (nobody consumes); dropping must not
		// allocate either.
		if n := testing.AllocsPerRun(500, func() {
			_ = sp.Stored(Placement{}, 0, false, blocks)
			_ = sp.Removed(Placement{}, hashes)
			_ = sp.Load(1, 2, 3, 64)
		}); n != 0 {
			t.Fatalf("%v allocations", n)
		}
	})
}
