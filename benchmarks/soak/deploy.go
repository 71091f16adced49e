package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/internal/rig"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
)

// router is one life of the router: a node serving on its own listener.
type router struct {
	node   *node.Node
	served chan error
}

// startRouter starts a router on the soak's segment (reattaching to what
// an earlier life left there) with the sick engines as static workers.
func (s *soak) startRouter() error {
	cfg := node.DefaultConfig()
	cfg.Segment.Path = s.segment
	cfg.Segment.IndexCapacity = 1 << 18
	cfg.ShutdownTimeout = 5 * time.Second
	cfg.Logger = s.cfg.Logger
	if w := s.cfg.EvictionWeight; w != nil {
		cost := *cfg.Sched.Cost
		cost.EvictionWeight = *w
		cfg.Sched.Cost = &cost
	}
	for i, e := range s.sick {
		cfg.Static = append(cfg.Static, node.StaticWorker{ID: 9000 + uint64(i), Endpoint: e.url, Model: mocker.DefaultModel, KVBlocks: 1024})
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("cannot listen: %w", err)
	}
	cfg.Listen = ln.Addr().String()
	n, err := node.New(cfg)
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("cannot start the router: %w", err)
	}
	r := &router{node: n, served: make(chan error, 1)}
	go func() { r.served <- n.Serve(ln) }()
	url := "http://" + cfg.Listen
	s.mu.Lock()
	s.router = r
	s.mu.Unlock()
	s.url.Store(&url)
	s.rep.Routers++
	return nil
}

// stopRouter shuts the router down and adds its bookings to the report;
// a router that stops with a booking unreleased is an error.
func (s *soak) stopRouter() error {
	r := s.router
	if r == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	// The drain deadline passes whenever a request waits on the engine
	// that never answers; Shutdown then cuts what is left, which must
	// drain. Only a router that could not drain after the cut is a
	// finding, and whatever it left booked.
	if err := r.node.Shutdown(ctx); err != nil && (errors.Is(err, fastpath.ErrNotDrained) || !errors.Is(err, context.DeadlineExceeded)) {
		errs = append(errs, err)
	}
	select {
	case err := <-r.served:
		errs = append(errs, err)
	case <-time.After(30 * time.Second):
		errs = append(errs, errors.New("cannot stop the router: still serving 30s after Shutdown"))
	}
	// The scheduler's counters, not Node.Snapshot: a node that drained
	// has unmapped its segment, which Snapshot reads the index from.
	q := r.node.Scheduler().Stats()
	s.rep.Booked += q.Booked
	s.rep.Released += q.Released
	if q.Booked != q.Released {
		errs = append(errs, fmt.Errorf("router stopped with %d bookings unreleased", q.Booked-q.Released))
	}
	s.router = nil
	return errors.Join(errs...)
}

// restartRouter stops the router and starts another on the same segment,
// as an operator's restart does; the engines stay up and the new router
// must find them, and their blocks, in the segment.
func (s *soak) restartRouter(ctx context.Context) error {
	if err := s.stopRouter(); err != nil {
		// A finding, not a reason to stop: the next router takes over.
		s.findings = append(s.findings, fmt.Errorf("router restart %d: %w", s.rep.Routers, err))
	}
	if err := s.startRouter(); err != nil {
		return err
	}
	return s.waitHealthy(ctx, len(s.engines))
}

// startEngine starts a mock engine that registers in the segment.
func (s *soak) startEngine() error {
	s.nextID++
	e, err := mocker.Start(mocker.Config{WorkerID: s.nextID, Segment: s.segment, KVBlocks: 2048, Speedup: 20})
	if err != nil {
		return fmt.Errorf("cannot start engine %d: %w", s.nextID, err)
	}
	s.engines = append(s.engines, e)
	return nil
}

// restartEngine stops one engine (requests in flight there fail) and
// starts a new one in its place.
func (s *soak) restartEngine(ctx context.Context) error {
	i := s.rng.IntN(len(s.engines))
	if err := s.engines[i].Close(); err != nil {
		return fmt.Errorf("cannot stop engine %d: %w", s.engines[i].Config().WorkerID, err)
	}
	s.engines = append(s.engines[:i], s.engines[i+1:]...)
	if err := s.startEngine(); err != nil {
		return err
	}
	return s.waitHealthy(ctx, len(s.engines))
}

// waitHealthy waits until the router routes to n registered engines.
func (s *soak) waitHealthy(ctx context.Context, n int) error {
	return rig.WaitFor(ctx, 30*time.Second, fmt.Sprintf("%d registered engines routable", n), func() bool {
		healthy := 0
		for _, w := range s.router.node.Snapshot().Workers {
			if w.Healthy && w.Source == "registry" {
				healthy++
			}
		}
		return healthy >= n
	})
}

// stopAll stops the router, the engines and the sick engines, and
// removes the segment's directory.
func (s *soak) stopAll() error {
	errs := []error{s.stopRouter()}
	for _, e := range s.engines {
		errs = append(errs, e.Close())
	}
	for _, e := range s.sick {
		errs = append(errs, e.close())
	}
	if s.dir != "" {
		errs = append(errs, os.RemoveAll(s.dir))
	}
	return errors.Join(errs...)
}

// sickMode is how a sick engine fails. Each passes /health and lists the
// model, so only the requests themselves show it is sick.
type sickMode int

const (
	hangs   sickMode = iota // accepts a request and never answers
	fails                   // answers every request 500
	garbles                 // answers 200 with a body that is not what it claims
)

// sickEngine is a deliberately broken engine on 127.0.0.1.
type sickEngine struct {
	mode sickMode
	url  string
	srv  *http.Server
	done chan struct{}
	ln   net.Listener
}

func startSick(mode sickMode) (*sickEngine, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("cannot listen for a sick engine: %w", err)
	}
	e := &sickEngine{mode: mode, url: "http://" + ln.Addr().String(), done: make(chan struct{}), ln: ln}
	e.srv = &http.Server{Handler: http.HandlerFunc(e.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = e.srv.Serve(ln) }()
	return e, nil
}

func (e *sickEngine) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		w.WriteHeader(http.StatusOK)
		return
	case "/v1/models":
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"` + mocker.DefaultModel + `","object":"model"}]}`))
		return
	}
	switch e.mode {
	case hangs:
		// Until the router gives up on the request (its connection
		// closes) or the soak ends. net/http notices a closed connection
		// (and cancels the request's context) only once the body has
		// been read, so read it first.
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-e.done:
		}
	case fails:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`{"error":{"message":"engine broken","type":"InternalServerError","code":500}}`))
	case garbles:
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: {\"choices\":[{\"text\":\"\x00\xff\n\nnot an event\n\ndata: {{{\n\n"))
	}
}

func (e *sickEngine) close() error {
	close(e.done)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return e.srv.Shutdown(ctx)
}
