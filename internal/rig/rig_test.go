package rig_test

import (
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/internal/rig"
	"github.com/kvfast/kvfast/internal/rig/rigtest"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
	"github.com/kvfast/kvfast/workers"
)

// TestRigRoutesToItsEngines: Start returns with every engine routable, in
// registry slot order; a request through the router reaches an engine;
// Close stops the router and the engines and removes the segment.
func TestRigRoutesToItsEngines(t *testing.T) {
	dir := t.TempDir()
	r, err := rig.Start(context.Background(), rig.Config{Node: rigtest.Config(), SegmentDir: dir, Engines: 3,
		Engine: mocker.Config{WorkerID: 10, Speedup: math.Inf(1)}})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = r.Close()
		}
	}()
	if !strings.HasPrefix(r.SegmentPath, dir) || len(r.Engines) != 3 {
		t.Fatalf("segment %q, %d engines", r.SegmentPath, len(r.Engines))
	}
	workers := r.Node.Snapshot().Workers
	if len(workers) != 3 {
		t.Fatalf("workers %+v", workers)
	}
	for i, w := range workers {
		if w.Slot != i || w.WorkerID != uint64(10+i) || !w.Healthy || w.Source != "registry" || w.Endpoint != r.Engines[i].Addr() {
			t.Errorf("worker %d: %+v", i, w)
		}
	}
	resp, err := http.Post(r.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":[1,2,3],"max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Kvfast-Worker") == "" {
		t.Fatalf("through the router: %d %v %s", resp.StatusCode, resp.Header, body)
	}

	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	closed = true
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for _, addr := range []string{r.Addr, r.Engines[0].Addr(), r.Engines[2].Addr()} {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts after Close", addr)
		}
	}
	if _, err := os.Stat(filepath.Dir(r.SegmentPath)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the segment's directory survived Close: %v", err)
	}
}

// TestRigRoles: Roles gives each engine its own role, which the router's
// disaggregated routing sees: a request is prefilled on the prefill engine
// and decoded on the decode engine.
func TestRigRoles(t *testing.T) {
	cfg := rigtest.Config()
	cfg.HTTP.Disagg = fastpath.DisaggConfig{Protocol: fastpath.DisaggVLLM}
	r := rigtest.Start(t, rig.Config{Node: cfg, SegmentDir: t.TempDir(), Engines: 2,
		Engine: mocker.Config{WorkerID: 20, Speedup: math.Inf(1)}, Roles: []workers.Role{workers.RolePrefill, workers.RoleDecode}})
	resp, err := http.Post(r.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17],"max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get(fastpath.HeaderPrefillWorker) != "20" || resp.Header.Get("X-Kvfast-Worker") != "21" {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
	}
	if st := r.Engines[1].Stats(); st.BlocksTransferred != 1 {
		t.Errorf("the decode engine pulled %d blocks, want the prompt's one full block", st.BlocksTransferred)
	}
}

// TestRigWithoutSegment: static workers only, and WaitWorkers sees them.
func TestRigWithoutSegment(t *testing.T) {
	eng, err := mocker.Start(mocker.Config{Speedup: math.Inf(1)})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	cfg := rigtest.Config()
	cfg.Static = []node.StaticWorker{{ID: 1, Endpoint: eng.Addr(), Model: mocker.DefaultModel}}
	r := rigtest.Start(t, rig.Config{Node: cfg, NoSegment: true})
	if r.SegmentPath != "" {
		t.Errorf("segment %q without one", r.SegmentPath)
	}
	if err := r.WaitWorkers(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
}

func TestRigRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  rig.Config
		want string
	}{
		{"engines without a segment", rig.Config{Node: rigtest.Config(), NoSegment: true, Engines: 1}, "without a segment"},
		{"engines with their own segment", rig.Config{Node: rigtest.Config(), Engines: 1,
			Engine: mocker.Config{Segment: "/dev/shm/elsewhere"}}, "own segment"},
		{"negative engines", rig.Config{Node: rigtest.Config(), Engines: -1}, "engines"},
		{"a role short", rig.Config{Node: rigtest.Config(), Engines: 2, Roles: []workers.Role{workers.RolePrefill}}, "one role per engine"},
		{"a router that cannot start", rig.Config{Node: node.Config{}}, "router"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.cfg.SegmentDir = dir
			r, err := rig.Start(context.Background(), tc.cfg)
			if err == nil {
				_ = r.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Start = %v, want an error about %q", err, tc.want)
			}
			// Whatever was created is gone again.
			if left, _ := os.ReadDir(dir); len(left) != 0 {
				t.Errorf("Start left %v behind", left)
			}
		})
	}
}

func TestWaitFor(t *testing.T) {
	calls := 0
	if err := rig.WaitFor(context.Background(), time.Second, "the third call", func() bool { calls++; return calls == 3 }); err != nil {
		t.Fatal(err)
	}
	err := rig.WaitFor(context.Background(), 20*time.Millisecond, "never", func() bool { return false })
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "never") {
		t.Fatalf("a condition that never holds: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := rig.WaitFor(ctx, time.Minute, "never", func() bool { return false }); !errors.Is(err, context.Canceled) {
		t.Fatalf("with a cancelled context: %v", err)
	}
}
