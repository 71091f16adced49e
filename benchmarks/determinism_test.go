package benchmarks

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvfast/kvfast/benchmarks/replay"
	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/feed"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/shm"
)

// TestRoutingDeterminism checks that the kv policy at temperature 0 is a
// function of the seed and the trace: two replays of the same records with
// the same scheduler seed route every request to the same worker.
//
// Wall-clock effects are taken out with a stand-in timing: engines run
// with infinite speed-up (steps cost CPU only), the replay keeps one
// request in flight, and before each request the client waits until the
// system has settled, that is until every engine is idle, the router's
// index has applied every block the engines published, and every booking
// is released. Each decision then sees exactly the state the previous
// requests left, whatever the machine's speed. The engines' caches are
// small enough that they evict, so the decisions also depend on the
// engines' eviction events, and deterministic tie-breaking matters
// because idle engines with no overlap cost the same.
func TestRoutingDeterminism(t *testing.T) {
	tr, err := replay.EmbeddedTrace(replay.TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	requests := 150
	if testing.Short() {
		requests = 60
	}
	route := func(t *testing.T, seed uint64) determinismRun {
		return runDeterminism(t, tr, requests, seed)
	}

	first := route(t, 7)
	second := route(t, 7)
	if len(first.workers) != requests || len(second.workers) != requests {
		t.Fatalf("replays routed %d and %d of %d requests", len(first.workers), len(second.workers), requests)
	}
	for i := range first.workers {
		if first.workers[i] != second.workers[i] {
			t.Fatalf("request %d (trace line %d) went to worker %s, then to worker %s with the same seed and trace\nfirst:  %v\nsecond: %v",
				i, tr.Records[i].Line, first.workers[i], second.workers[i], first.workers, second.workers)
		}
	}
	// The comparison means something only if decisions were both cache
	// driven and spread: one worker for everything, or no hits, would be
	// deterministic for uninteresting reasons.
	used := map[string]bool{}
	for _, w := range first.workers {
		used[w] = true
	}
	if len(used) < 3 {
		t.Fatalf("only %d distinct workers used: %v", len(used), first.workers)
	}
	if first.cached == 0 || first.cached != second.cached {
		t.Fatalf("cached tokens %d and %d: want equal and positive", first.cached, second.cached)
	}
	if first.evicted == 0 {
		t.Fatal("no engine evicted: the check does not cover eviction events")
	}
	t.Logf("%d decisions identical over %d workers; %d cached prompt tokens, %d blocks evicted",
		requests, len(used), first.cached, first.evicted)
}

// determinismRun is what one replay decided and what the engines did.
type determinismRun struct {
	workers []string // x-kvfast-worker of each request, in trace order
	cached  int      // prompt tokens the engines reported cached
	evicted uint64   // blocks the engines evicted
}

const (
	determinismEngines     = 4
	determinismKVBlocks    = 1024 // 16k tokens each: the longest prompt fits, the trace's reuse does not
	determinismBlockTokens = 32
)

func runDeterminism(t *testing.T, tr *replay.Trace, requests int, seed uint64) determinismRun {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	seg, err := shm.Open(filepath.Join(t.TempDir(), "kvfast.shm"), shm.Options{Index: radix.Config{Capacity: 1 << 16}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = seg.Close() }) // runs last: engines and router stop first
	ing := feed.New(seg, feed.Config{})
	cost := sched.DefaultCostParams()
	cost.Temperature = 0
	srv, err := fastpath.New(fastpath.Config{
		Segment:  seg,
		Ingester: ing,
		Policy:   "kv",
		Sched:    sched.Config{Seed: seed, Cost: &cost},
		Logger:   log,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	var engines []*mocker.Engine
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		if err := <-served; err != nil {
			t.Error(err)
		}
		for _, e := range engines {
			if err := e.Close(); err != nil {
				t.Error(err)
			}
		}
	})
	// One at a time, so that each engine gets the same registry slot in
	// both runs.
	for i := range determinismEngines {
		e, err := mocker.Start(mocker.Config{KVBlocks: determinismKVBlocks, Speedup: math.Inf(1), WorkerID: uint64(i), SegmentHandle: seg})
		if err != nil {
			t.Fatal(err)
		}
		engines = append(engines, e)
		waitDeterminism(t, fmt.Sprintf("engine %d to register", i), func() bool { return len(srv.Admin().Workers) == i+1 })
	}
	waitDeterminism(t, "engines to turn healthy", func() bool {
		for _, w := range srv.Admin().Workers {
			if !w.Healthy {
				return false
			}
		}
		return true
	})

	client := &http.Client{Transport: &settledTransport{base: &http.Transport{Proxy: nil}, srv: srv, ing: ing, engines: engines}}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := replay.Run(ctx, replay.Config{
		RouterURL:       "http://" + ln.Addr().String(),
		Trace:           tr,
		MaxRequests:     requests,
		Concurrency:     1,
		Tokens:          replay.TokenSynth{BlockTokens: determinismBlockTokens},
		MaxOutputTokens: 4,
		Client:          client,
		Timeout:         30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	var run determinismRun
	for i := range res.Requests {
		r := &res.Requests[i]
		if !r.OK() || r.Worker == "" {
			t.Fatalf("request %d: status %d, worker %q, error %q", i, r.Status, r.Worker, r.Err)
		}
		run.workers = append(run.workers, r.Worker)
		run.cached += r.UsageCachedTokens
	}
	for _, e := range engines {
		run.evicted += e.Stats().BlocksEvicted
	}
	return run
}

// settledTransport holds every request until the system has settled, so
// that a routing decision depends on the requests before it and not on
// how far event ingestion or load release happened to get.
type settledTransport struct {
	base    http.RoundTripper
	srv     *fastpath.Server
	ing     *feed.Ingester
	engines []*mocker.Engine
}

func (s *settledTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	deadline := time.Now().Add(10 * time.Second)
	for !s.settled() {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("system did not settle within 10s: %+v", s.srv.Admin())
		}
		select {
		case <-r.Context().Done():
			return nil, r.Context().Err()
		case <-time.After(200 * time.Microsecond):
		}
	}
	return s.base.RoundTrip(r)
}

// settled: every engine is idle (its stats snapshot is taken after its
// last step, so its counters are final), the ingester has dealt with
// every block they published, and no booking is outstanding.
func (s *settledTransport) settled() bool {
	var stored, evicted uint64
	for _, e := range s.engines {
		st := e.Stats()
		if st.Running != 0 || st.Waiting != 0 {
			return false
		}
		stored += st.BlocksStored
		evicted += st.BlocksEvicted
	}
	fs := s.ing.Stats()
	if fs.StoredBlocks+fs.UnresolvedParent+fs.BlockSizeMismatch != stored || fs.RemovedBlocks+fs.UnknownRemoved != evicted {
		return false
	}
	q := s.srv.Admin().Queue
	return q.Waiting == 0 && q.Booked == q.Released
}

func waitDeterminism(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
