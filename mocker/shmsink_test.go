package mocker

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
)

// TestShmPublishing runs an engine registered in a real segment file and
// reads back, as the router's ingester would, what it published.
func TestShmPublishing(t *testing.T) {
	for _, byPath := range []bool{true, false} {
		name := map[bool]string{true: "by path", false: "in process"}[byPath]
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kvfast.shm")
			seg, err := shm.Open(path, shm.Options{Index: radix.Config{Capacity: 4096}})
			if err != nil {
				t.Fatal(err)
			}
			defer seg.Close()
			cfg := Config{Model: "m", KVBlocks: 256, WorkerID: 7, DPRank: 2, Timing: testTiming}
			if byPath {
				cfg.Segment = path
			} else {
				cfg.SegmentHandle = seg
			}
			e, err := Start(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()

			workers := seg.Workers(nil)
			if len(workers) != 1 {
				t.Fatalf("%d workers registered", len(workers))
			}
			w := workers[0]
			if w.WorkerID != 7 || w.DPRank != 2 || w.Model != "m" || w.BlockSize != 16 || w.KVCapacityBlocks != 256 ||
				w.Endpoint != e.URL() || w.State != shm.StateLive {
				t.Fatalf("registry slot: %+v", w)
			}

			prompt := seq(1, 50)
			// A salted request's blocks are not published (a shm record
			// names no namespace): the ring holds the plain request's only.
			if status, b := do(t, "POST", e.URL()+"/v1/completions", `{"prompt":`+idsJSON(prompt)+`,"max_tokens":1,"cache_salt":"t"}`); status != 200 {
				t.Fatalf("status %d: %s", status, b)
			}
			if status, b := do(t, "POST", e.URL()+"/v1/completions", `{"prompt":`+idsJSON(prompt)+`,"max_tokens":1}`); status != 200 {
				t.Fatalf("status %d: %s", status, b)
			}
			want := radix.AppendBlockHashes(nil, EngineSeed("m"), prompt, 16)

			r := seg.Reader(w.Slot)
			var got []uint64
			var kinds []shm.Kind
			var rec shm.Record
			eventually(t, "the stored blocks in the ring", func() bool {
				for {
					ok, err := r.Next(&rec)
					if err != nil {
						t.Fatal(err)
					}
					if !ok {
						break
					}
					kinds = append(kinds, rec.Kind)
					if rec.Kind == shm.KindStored {
						got = append(got, rec.Hashes...)
						if !slices.Equal(rec.Tokens, prompt[:len(rec.Hashes)*16]) {
							t.Fatalf("stored tokens %v", rec.Tokens)
						}
					}
					r.Commit(&rec)
				}
				return len(got) >= len(want)
			})
			if !slices.Equal(got, want) || kinds[0] != shm.KindCleared {
				t.Fatalf("ring: kinds %v hashes %x, want cleared then %x", kinds, got, want)
			}
			l, err := seg.LoadOf(w.Slot)
			if err != nil || l.KVTotalBlocks != 256 {
				t.Fatalf("load page %+v: %v", l, err)
			}

			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			if st, _, _ := seg.SlotState(w.Slot); st != shm.StateClosed {
				t.Fatalf("slot state after close: %v", st)
			}
		})
	}

	t.Run("no segment", func(t *testing.T) {
		if e, err := Start(Config{Segment: filepath.Join(t.TempDir(), "missing")}); err == nil {
			e.Close()
			t.Fatal("started without a segment")
		}
	})
}

// TestShmPublisherFollowsADeletedSegment: an engine whose segment file is
// deleted (as the router's refusals advise) goes on heartbeating, and once
// a router has created a new segment at the path it registers there, so
// that the new router sees it without the engine being restarted.
func TestShmPublisherFollowsADeletedSegment(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvfast.shm")
	opts := shm.Options{Index: radix.Config{Capacity: 4096}, RingBytes: 64 << 10}
	old, err := shm.Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	e, err := Start(Config{Model: "m", WorkerID: 7, Segment: path, Timing: testTiming, HeartbeatInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	fresh, err := shm.Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	eventually(t, "the engine to register in the new segment", func() bool {
		ws := fresh.Workers(nil)
		return len(ws) == 1 && ws[0].WorkerID == 7 && ws[0].State == shm.StateLive
	})
}

// TestShmPublisherRegistersAgainAfterLosingItsSlot: an engine paused past
// the router's grace is marked down, and a new engine may take its slot
// when no other is free; once it runs again it registers anew (it stayed
// out of the worker set for good, counting publish errors).
func TestShmPublisherRegistersAgainAfterLosingItsSlot(t *testing.T) {
	for _, byPath := range []bool{true, false} {
		path := filepath.Join(t.TempDir(), "kvfast.shm")
		seg, err := shm.Open(path, shm.Options{Index: radix.Config{Capacity: 4096}, RingBytes: 64 << 10})
		if err != nil {
			t.Fatal(err)
		}
		defer seg.Close()
		c := Config{SegmentHandle: seg}
		if byPath {
			c = Config{Segment: path}
		}
		c.Model, c.WorkerID, c.BlockSize, c.KVBlocks = "m", 100, 16, 64
		sp, err := openSegmentPublisher(c, "127.0.0.1:9")
		if err != nil {
			t.Fatal(err)
		}
		// Every other slot taken, then the engine marked down and its
		// slot given to a newcomer.
		var others []*shm.Publisher
		for id := uint64(1); len(seg.Workers(nil)) < workers.Max; id++ {
			p, err := seg.Register(shm.WorkerConfig{WorkerID: id, Model: "m", BlockSize: 16})
			if err != nil {
				t.Fatal(err)
			}
			others = append(others, p)
		}
		slot := sp.p.Slot()
		_, gen, beat := seg.SlotState(slot)
		if ok, err := seg.MarkDown(slot, gen, beat); !ok || err != nil {
			t.Fatalf("mark down: %v %v", ok, err)
		}
		newcomer, err := seg.Register(shm.WorkerConfig{WorkerID: 200, Model: "m", BlockSize: 16})
		if err != nil || newcomer.Slot() != slot {
			t.Fatalf("the newcomer did not take the down slot %d: %v (slot %d of %d)", slot, err, newcomer.Slot(), len(seg.Workers(nil)))
		}
		for _, p := range append(others, newcomer) {
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
		}
		if err := sp.Heartbeat(); err != nil || sp.Reregistered != 1 {
			t.Fatalf("heartbeat after losing the slot: %v, re-registered %d times", err, sp.Reregistered)
		}
		live := slices.ContainsFunc(seg.Workers(nil), func(w shm.WorkerInfo) bool { return w.WorkerID == 100 && w.State == shm.StateLive })
		if !live {
			t.Fatalf("worker 100 is not live again: %+v", seg.Workers(nil))
		}
		if err := sp.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
