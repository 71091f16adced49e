package benchmarks

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/kvfast/kvfast/benchmarks/replay"
	"github.com/kvfast/kvfast/internal/rig"
	"github.com/kvfast/kvfast/internal/rig/rigtest"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
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
	cfg := rigtest.Config()
	cfg.Policy = "kv"
	cfg.Sched.Seed = seed
	cfg.Sched.Cost.Temperature = 0
	cfg.Segment.IndexCapacity = 1 << 16
	// The rig starts the engines one at a time, so that each gets the same
	// registry slot in both runs.
	r := rigtest.Start(t, rig.Config{Node: cfg, Engines: determinismEngines,
		Engine: mocker.Config{KVBlocks: determinismKVBlocks, Speedup: math.Inf(1)}})
	engines := r.Engines

	client := &http.Client{Transport: &settledTransport{base: &http.Transport{Proxy: nil}, node: r.Node, engines: engines}}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := replay.Run(ctx, replay.Config{
		RouterURL:       r.URL,
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
	node    *node.Node
	engines []*mocker.Engine
}

func (s *settledTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if err := rig.WaitFor(r.Context(), 10*time.Second, "the system to settle", s.settled); err != nil {
		return nil, fmt.Errorf("%w: %+v", err, s.node.Snapshot())
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
	snap := s.node.Snapshot()
	fs := snap.Feed
	if fs == nil {
		return false
	}
	if fs.StoredBlocks+fs.UnresolvedParent+fs.BlockSizeMismatch != stored || fs.RemovedBlocks+fs.UnknownRemoved != evicted {
		return false
	}
	q := snap.Queue
	return q.Waiting == 0 && q.Booked == q.Released
}
