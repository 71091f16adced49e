package rig

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
	"github.com/kvfast/kvfast/workers"
)

// DefaultWaitTimeout bounds every wait of a Rig whose Config sets none:
// generous, because a shared 2-core machine running the race detector is
// slow, and a wait that holds returns as soon as it holds.
const DefaultWaitTimeout = 10 * time.Second

// Config describes a rig: one router and the engines behind it.
type Config struct {
	// Node configures the router; start from node.DefaultConfig(). The rig
	// listens on 127.0.0.1 with an ephemeral port and places the segment
	// itself, so Node.Listen and Node.Segment.Path are overwritten.
	Node node.Config
	// NoSegment runs the router without a segment (a heap index, static
	// workers only); Engines must then be 0.
	NoSegment bool
	// SegmentDir is where the segment's temporary directory is created
	// ("": /dev/shm when there is one, else the system's temp directory).
	SegmentDir string

	// Engines is how many mock engines to start. Engine is their template:
	// engine i gets worker id Engine.WorkerID+i and registers in the
	// segment, so Engine.Segment, SegmentHandle and Publisher must be
	// unset.
	Engines int
	Engine  mocker.Config
	// Roles, when set, gives engine i the role Roles[i] instead of
	// Engine.Role (len(Roles) == Engines): a disaggregated deployment
	// (prefill and decode pools, encoders) behind one router. Every engine
	// shares the rig's encoder-cache store (Rig.ECStore) unless
	// Engine.ECStore names another.
	Roles []workers.Role

	// WaitTimeout bounds Start's wait for the engines and the rig's waits
	// (0: DefaultWaitTimeout).
	WaitTimeout time.Duration
}

// Rig is a running router with its engines.
type Rig struct {
	Node *node.Node
	// Addr is where the router listens (127.0.0.1:port); URL is
	// http://Addr.
	Addr string
	URL  string
	// Engines are the mock engines, engine i in registry slot i.
	Engines []*mocker.Engine
	// SegmentPath is the segment's file ("" with NoSegment): more engines
	// may register there (mocker.Config.Segment).
	SegmentPath string
	// ECStore is the encoder-cache store the engines share: encode
	// engines save what they encode there, the others find it there.
	// More engines may share it (mocker.Config.ECStore).
	ECStore *mocker.ECStore

	wait      time.Duration
	shutdown  time.Duration
	dir       string
	served    chan error // Serve's result; nil until Serve runs
	closeOnce sync.Once
	closeErr  error
}

// Start starts the router, then the engines one at a time, and returns
// once the router routes to every engine. On error, whatever was started
// is stopped again.
func Start(ctx context.Context, cfg Config) (_ *Rig, err error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	r := &Rig{wait: cfg.WaitTimeout, shutdown: cfg.Node.ShutdownTimeout, ECStore: cfg.Engine.ECStore}
	if r.ECStore == nil {
		r.ECStore = mocker.NewECStore()
	}
	if r.wait <= 0 {
		r.wait = DefaultWaitTimeout
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.Close())
		}
	}()
	cfg.Node.Segment.Path = ""
	if !cfg.NoSegment {
		if r.dir, err = os.MkdirTemp(segmentBase(cfg.SegmentDir), "kvfast-rig-"); err != nil {
			return nil, fmt.Errorf("cannot create a directory for the segment: %w", err)
		}
		r.SegmentPath = filepath.Join(r.dir, "kvfast.shm")
		cfg.Node.Segment.Path = r.SegmentPath
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("cannot listen: %w", err)
	}
	r.Addr = ln.Addr().String()
	r.URL = "http://" + r.Addr
	cfg.Node.Listen = r.Addr
	if r.Node, err = node.New(cfg.Node); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("cannot start the router: %w", err)
	}
	// The listener is bound, so clients may connect at once: the kernel
	// queues them until Serve accepts.
	r.served = make(chan error, 1)
	go func() { r.served <- r.Node.Serve(ln) }()

	// One at a time: registration claims the lowest free slot, so engine i
	// holds slot i, run after run.
	for i := range cfg.Engines {
		ec := cfg.Engine
		ec.WorkerID += uint64(i)
		ec.Segment = r.SegmentPath
		ec.ECStore = r.ECStore
		if cfg.Roles != nil {
			ec.Role = cfg.Roles[i]
		}
		e, err := mocker.Start(ec)
		if err != nil {
			return nil, fmt.Errorf("cannot start engine %d: %w", i, err)
		}
		r.Engines = append(r.Engines, e)
	}
	if cfg.Engines > 0 {
		if err := r.waitHealthy(ctx, cfg.Engines, "registry"); err != nil {
			return nil, err
		}
	}
	return r, nil
}

func (cfg *Config) check() error {
	switch {
	case cfg.Engines < 0 || cfg.Engines > workers.Max:
		return fmt.Errorf("cannot start %d engines: want 0..%d", cfg.Engines, workers.Max)
	case cfg.Roles != nil && len(cfg.Roles) != cfg.Engines:
		return fmt.Errorf("cannot start %d engines with %d roles: want one role per engine", cfg.Engines, len(cfg.Roles))
	case cfg.NoSegment && cfg.Engines > 0:
		return errors.New("cannot start engines without a segment to register in")
	case cfg.Engine.Segment != "" || cfg.Engine.SegmentHandle != nil || cfg.Engine.Publisher != nil:
		return errors.New("cannot start engines with their own segment or publisher: the rig registers them in its segment")
	}
	return nil
}

// Close stops the router (in-flight requests get the router's shutdown
// timeout), then the engines, then removes the segment's directory. Only
// the first call does anything; later calls return its result.
func (r *Rig) Close() error {
	r.closeOnce.Do(func() {
		var errs []error
		if r.Node != nil {
			ctx, cancel := context.WithTimeout(context.Background(), r.shutdown)
			if err := r.Node.Shutdown(ctx); err != nil {
				errs = append(errs, fmt.Errorf("cannot shut the router down cleanly: %w", err))
			}
			cancel()
		}
		if r.served != nil {
			select {
			case err := <-r.served:
				if err != nil {
					errs = append(errs, fmt.Errorf("router stopped serving: %w", err))
				}
			case <-time.After(r.wait):
				errs = append(errs, fmt.Errorf("cannot stop the router: Serve still running %v after Shutdown", r.wait))
			}
		}
		for i, e := range r.Engines {
			if err := e.Close(); err != nil {
				errs = append(errs, fmt.Errorf("cannot close engine %d: %w", i, err))
			}
		}
		if r.dir != "" {
			if err := os.RemoveAll(r.dir); err != nil {
				errs = append(errs, fmt.Errorf("cannot remove the segment's directory: %w", err))
			}
		}
		r.closeErr = errors.Join(errs...)
	})
	return r.closeErr
}

// WaitWorkers waits until the router routes to at least n healthy
// workers, static or registered.
func (r *Rig) WaitWorkers(ctx context.Context, n int) error {
	return r.waitHealthy(ctx, n, "")
}

// waitHealthy waits for n healthy workers from source ("registry",
// "static", or "" for either).
func (r *Rig) waitHealthy(ctx context.Context, n int, source string) error {
	healthy := 0
	err := WaitFor(ctx, r.wait, fmt.Sprintf("%d healthy workers", n), func() bool {
		healthy = 0
		for _, w := range r.Node.Snapshot().Workers {
			if w.Healthy && (source == "" || w.Source == source) {
				healthy++
			}
		}
		return healthy >= n
	})
	if err != nil {
		return fmt.Errorf("%w (%d routable)", err, healthy)
	}
	return nil
}

// WaitFor polls cond until it holds, and fails once timeout has passed
// (0: DefaultWaitTimeout) or ctx ends. It polls often at first and then
// backs off, so that a condition that holds soon costs little latency and
// one that takes long costs little CPU.
func WaitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	if timeout <= 0 {
		timeout = DefaultWaitTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pause := 200 * time.Microsecond
	t := time.NewTimer(pause)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			if cond() {
				return nil
			}
			return fmt.Errorf("cannot see %s within %v: %w", what, timeout, context.Cause(ctx))
		case <-t.C:
		}
		pause = min(2*pause, 10*time.Millisecond)
		t.Reset(pause)
	}
	return nil
}

// segmentBase picks where segments go: memory-backed /dev/shm when there
// is one, since a segment on a disk-backed file system makes the kernel
// write the index back to disk while the engines publish, which shows up
// as stalls in measurements.
func segmentBase(dir string) string {
	if dir != "" {
		return dir
	}
	if f, err := os.CreateTemp("/dev/shm", ".kvfast-probe-"); err == nil {
		name := f.Name()
		f.Close()
		os.Remove(name)
		return "/dev/shm"
	}
	return os.TempDir()
}
