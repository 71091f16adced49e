package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvfast/kvfast/dispatch"
	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/feed"
	"github.com/kvfast/kvfast/internal/logthrottle"
	"github.com/kvfast/kvfast/internal/sdnotify"
	"github.com/kvfast/kvfast/internal/tracing"
	"github.com/kvfast/kvfast/prompt"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
)

// Node is one running router: its segment, index, event feeds, scheduler,
// engine pool and HTTP front end. New starts its background work; Shutdown
// or Close stops it, once.
type Node struct {
	cfg      Config
	log      *slog.Logger
	seg      *shm.Segment // nil without a segment; the node opened it and closes it
	index    *radix.Index
	approx   *radix.Approx
	ingester *feed.Ingester
	sched    *sched.Scheduler
	engines  *dispatch.Pool
	prompts  *prompt.Registry
	front    *fastpath.Server
	traces   *tracing.Provider // nil: tracing off

	static workers.Set // slots configured statically
	// reserved holds the generation of each static slot's registry
	// reservation (shm/reserve.go), which syncRegistry keeps fresh; zero
	// without a segment.
	reserved [workers.Max]uint32
	zmq      [workers.Max]*feed.ZMQSubscriber // static workers' event feeds, by slot

	renderTurn atomic.Uint64 // PickEngine's round robin
	// adapters is what the adapter poller last told the front end, for
	// PickEngine: an adapter's prompt is rendered by an engine that has it.
	adapters atomic.Pointer[map[string]fastpath.Adapter]
	// unlisted are the workers whose engines, when last asked, did not
	// list their model (adapters.go): a workers.Set.
	unlisted atomic.Uint64
	// keyRefused are the workers whose engines, when last asked, refused
	// the router's credentials (adapters.go): a workers.Set.
	keyRefused atomic.Uint64
	// sglang are the workers whose engines, when last asked, may read
	// SGLang's spellings of an adapter (adapters.go, engineModels.sglang):
	// a workers.Set, for /admin/workers.
	sglang atomic.Uint64
	// membersChanged wakes the adapter poller when the registry loop sees
	// an engine join or leave, so that a slot's new engine is not routed
	// its predecessor's adapters until the next poll.
	membersChanged chan struct{}
	// polled is closed when the next model poll has run: a request naming
	// a model no worker is known to serve waits for it (RefreshModels).
	// pollMu guards the swap that each poll makes.
	pollMu sync.Mutex
	polled chan struct{}

	// unknownModel is the static workers configured without a model whose
	// engines have not yet said which they serve (the model poll learns it).
	unknownModel atomic.Uint64
	// discovered is closed when unknownModel empties; settled, when the
	// node's start-up has settled (see awaitSettled), which the front end
	// waits for before it calls itself ready.
	discovered     chan struct{}
	discoveredOnce sync.Once
	settled        chan struct{}

	// throttle keeps conditions that every poll sees again (a refused
	// registration, a corrupt registry slot) to one log line a minute.
	throttle *logthrottle.Throttle

	// regState is what the registry said about each slot last time; only
	// the registry loop touches it (and New, before the loop starts).
	regState [workers.Max]regEntry
	// refusedRegs is the registrations the registry loop refused
	// (publishRefusals), for Snapshot.
	refusedRegs atomic.Pointer[[]fastpath.RefusedView]
	// downRegs is the registrations the registry loop found presumed
	// dead, for the snapshot; replaced when the set changes.
	downRegs atomic.Pointer[[]fastpath.RegistrationView]
	// refusedSeen is each slot's index refusals at the last look
	// (watchRefusals); only that loop touches it.
	refusedSeen [workers.Max]uint64

	stop      context.CancelFunc
	bg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
	// released orders Snapshot with the unmapping of the segment: Snapshot
	// reads the index under the read lock, Close unmaps under the write
	// lock and sets released, after which Snapshot leaves the index out.
	releaseMu sync.RWMutex
	released  bool
}

// New builds the router described by cfg and starts its background work:
// the registry sync, approximate-index expiry, event ingestion (as the
// segment's ingester or its standby) and one ZMQ subscriber per static
// worker that publishes events. It does not listen; call Serve or use Run.
func New(cfg Config) (_ *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.AdminListen == "" {
		cfg.HTTP.AdminOnAPI = true
	}
	n := &Node{cfg: cfg, log: cfg.Logger, discovered: make(chan struct{}), settled: make(chan struct{}),
		membersChanged: make(chan struct{}, 1), polled: make(chan struct{}), throttle: logthrottle.NewFlushing(logRepeatEvery)}
	defer func() {
		if err != nil {
			n.release()
		}
	}()
	policy, useApprox, err := sched.ParsePolicy(cfg.Policy)
	if err != nil {
		return nil, err
	}
	// The tokenizers are built before the segment is opened: a tokenizer
	// that cannot be loaded (a wrong path) must not leave a new segment
	// file behind.
	pcfg := cfg.Tokenizers
	pcfg.EngineToken = cfg.Dispatch.EngineToken // one key for every call to the engines
	if n.prompts, err = prompt.NewRegistry(pcfg, prompt.Options{Engines: n,
		MaxTokenID: cfg.HTTP.MaxTokenID, Logger: n.log}); err != nil {
		return nil, fmt.Errorf("--tokenizer: %w", err)
	}
	if cfg.Segment.Path != "" {
		n.seg, err = shm.Open(cfg.Segment.Path, shm.Options{Index: radix.Config{Capacity: cfg.Segment.IndexCapacity},
			RingBytes: cfg.Segment.RingBytes, Recreate: cfg.Segment.Recreate, AllowForeign: cfg.Segment.AllowForeign,
			Bindings: cfg.Segment.Sessions, ResetDamagedIndex: true})
		if err != nil {
			return nil, err
		}
		if why := n.seg.IndexReset(); why != "" {
			n.log.Warn("dropped the index: its header was damaged (a stray write to the segment); it refills from the engines' next KV events",
				"segment", cfg.Segment.Path, "damage", why)
		}
		if fsType, ok := n.seg.MemoryBacked(); !ok {
			n.log.Warn("the segment is on a disk-backed file system, not tmpfs (as /dev/shm is): the kernel writes its pages back to disk; give --segment a path under /dev/shm unless that is meant",
				"segment", cfg.Segment.Path, "fs_type", fmt.Sprintf("%#x", fsType))
		}
		if cfg.Segment.Recreate {
			// Said every time: a flag left in a unit file drops the warm
			// index at every restart.
			n.log.Info(recreatedMessage, "segment", cfg.Segment.Path)
		}
		if pid, ok := n.seg.Displaced(); ok {
			n.log.Warn(displacedMessage, "segment", cfg.Segment.Path, "displaced_pid", pid)
		}
		if cfg.Segment.AllowForeign {
			if st, serr := os.Stat(cfg.Segment.Path); serr == nil && st.Mode().Perm()&0o077 != 0 {
				n.log.Warn("attached to a segment others may access (--allow-foreign-segment): whoever can write it can register engines and rewrite the index",
					"segment", cfg.Segment.Path, "mode", fmt.Sprintf("%#o", st.Mode().Perm()))
			}
		}
		n.index = n.seg.Index()
		retention := cfg.DownRetention
		if retention == 0 {
			retention = -1 // none: feed reads 0 as its default
		}
		n.ingester = feed.New(n.seg, feed.Config{HeartbeatGrace: cfg.HeartbeatGrace, DownRetention: retention, Logger: n.log})
	} else if n.index, err = radix.NewHeap(radix.Config{Capacity: cfg.Segment.IndexCapacity}); err != nil {
		return nil, fmt.Errorf("cannot create the index: %w", err)
	}
	if err := n.index.SetWorkerShare(cfg.Segment.IndexWorkerShare); err != nil {
		return nil, err
	}
	if n.approx, err = radix.NewApprox(radix.Config{Capacity: cfg.Approx.Capacity}, cfg.Approx.TTL); err != nil {
		return nil, fmt.Errorf("cannot create the approximate index: %w", err)
	}
	scfg, dcfg := cfg.libraryConfigs()
	scfg.Policy = policy
	if n.sched, err = sched.New(scfg); err != nil {
		return nil, err
	}
	dcfg.Health.OnChange = n.healthChanged
	n.engines = dispatch.NewPool(dcfg)
	if err := n.addStatic(cfg.Static); err != nil {
		return nil, err
	}
	n.pinSharedRanks()
	// Sticky sessions live in the segment, where every router on the node
	// sees them; without one, in this router's own table.
	var bindings *shm.Bindings
	switch {
	case n.seg != nil:
		bindings = n.seg.Bindings()
	case cfg.HTTP.Sessions.TTL > 0:
		if bindings, err = shm.NewBindings(cfg.Segment.Sessions); err != nil {
			return nil, err
		}
	}
	tcfg := cfg.Tracing
	if tcfg.Logger == nil {
		tcfg.Logger = n.log
	}
	if n.traces, err = tracing.New(tcfg); err != nil {
		return nil, err
	}
	n.front, err = fastpath.New(cfg.HTTP, fastpath.Deps{
		Index: n.index, Segment: n.seg, Approx: n.approx, Sched: n.sched, Engines: n.engines, Bindings: bindings,
		UseApprox: useApprox, Silent: n.silentStatic(), Renderers: n.prompts, State: n, Logger: n.log, Settled: n.settled,
		Tracer: n.traces.Tracer(), ModelsPending: func() bool { return n.unknownModel.Load() != 0 },
		RefreshModels: n.RefreshModels,
	})
	if err != nil {
		return nil, err
	}
	n.syncRegistry()
	n.rememberRegisteredModels()
	if n.unknownModel.Load() == 0 {
		n.discoveredOnce.Do(func() { close(n.discovered) })
		if n.ingester == nil {
			// Nothing left to discover or repair: ready (on the workers'
			// health) from the first request on.
			close(n.settled)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.stop = cancel
	n.bg.Go(func() { n.every(ctx, cfg.RegistryPoll, n.syncRegistry) })
	n.bg.Go(func() { n.every(ctx, time.Second, func() { n.approx.Expire(time.Now()) }) })
	n.bg.Go(func() {
		n.every(ctx, time.Second, func() {
			n.watchRefusals()
			n.throttle.Flush() // what it held back, once its minute is over
		})
	})
	n.bg.Go(func() { n.runZMQ(ctx) })
	n.bg.Go(func() { n.pollModels(ctx) })
	n.bg.Go(func() { n.awaitSettled(ctx) })
	if n.ingester != nil {
		n.bg.Go(func() {
			if err := n.ingester.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				n.log.Error("event ingestion stopped", "err", err)
			}
		})
	}
	return n, nil
}

// watchRefusals warns, once a minute per worker, while the index refuses
// a worker's blocks: from then on the router under-claims its cache, and
// /metrics alone would not tell an operator why its hit rate fell.
// Process-local counts only (radix.Index.Refused), so it may run after
// the segment is unmapped. Only the background loop calls it.
func (n *Node) watchRefusals() {
	for i := range workers.Max {
		slot := workers.Slot(i)
		refused := n.index.Refused(slot)
		if refused == n.refusedSeen[i] {
			continue
		}
		if refused > n.refusedSeen[i] {
			// The worker's id too: /admin/workers and the metrics name it.
			args := []any{"slot", slot}
			if info, ok := n.sched.Worker(slot); ok {
				args = append(args, "worker", info.ID)
			}
			n.throttle.Log(n.log, slog.LevelWarn, "index-refused/"+strconv.Itoa(i), indexFullMessage,
				append(args, "refused_blocks", refused, "index_worker_share", n.cfg.Segment.IndexWorkerShare)...)
		}
		n.refusedSeen[i] = refused
	}
}

const indexFullMessage = "the index refused a worker's blocks for want of room (the worker holds its share, " +
	"--index-worker-share, or the index is full): the router under-claims its cache from now on; an engine that " +
	"never reports evictions, or one with a large lower tier, does this; kvfast_worker_index_blocks shows who " +
	"holds the index, and --index-capacity (a new segment) makes it larger"

// logRepeatEvery is how often a condition every poll sees again is logged.
const logRepeatEvery = time.Minute

// pollModels asks every engine which models and adapters it serves: every
// RegistryPoll while a static worker's model is still unknown, so that it
// becomes routable as soon as its engine answers, then every adapterPoll,
// and at once when an engine joins or leaves.
func (n *Node) pollModels(ctx context.Context) {
	p := newAdapterPoller(n.cfg.Dispatch.EngineToken)
	// Its kept-alive connections (two goroutines each) go with the node,
	// not at the transport's idle timeout.
	defer p.client.CloseIdleConnections()
	start := time.Now()
	t := time.NewTimer(0)
	defer t.Stop()
	defer func() {
		// No poll comes any more: those waiting for one hear so now.
		n.pollMu.Lock()
		close(n.polled)
		n.pollMu.Unlock()
	}()
	var polled, next time.Time // the last poll, and when the timer fires
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.membersChanged:
			// Soon, but not more often than adapterKickGap: an engine in a
			// restart loop joins and leaves at every registry scan, and
			// each poll asks every engine.
			if at := polled.Add(adapterKickGap); at.Before(next) {
				if now := time.Now(); at.Before(now) {
					at = now
				}
				t.Reset(time.Until(at))
				next = at
			}
			continue
		case <-t.C:
		}
		period := adapterPoll
		n.pollMu.Lock()
		done := n.polled // those waiting since before this poll began
		n.polled = make(chan struct{})
		n.pollMu.Unlock()
		if p.poll(ctx, n) {
			n.discoveredOnce.Do(func() { close(n.discovered) })
		} else if time.Since(start) < n.cfg.DiscoveryTimeout {
			period = n.cfg.RegistryPoll
		}
		close(done)
		polled = time.Now()
		next = polled.Add(period)
		t.Reset(period)
	}
}

// adapterKickGap is the least time between two adapter polls that engines
// joining or leaving, or requests naming unknown models, bring forward.
const adapterKickGap = 250 * time.Millisecond

// refreshWait bounds how long a request naming a model no worker is known
// to serve waits for the engines to be asked again (RefreshModels): a
// poll brought forward runs within adapterKickGap, and asks every engine
// at once, each within its 2 s client timeout.
const refreshWait = 3 * time.Second

// RefreshModels brings the next model poll forward and waits for it to
// have run (fastpath.Deps.RefreshModels): an adapter loaded at run time
// (vLLM's /v1/load_lora_adapter) is routed from its first request instead
// of answered 404 until the next regular poll. Polls stay at least
// adapterKickGap apart however many requests ask, and all that wait on
// one are answered by it. It reports whether a poll ran, false when ctx
// ended or refreshWait passed first.
func (n *Node) RefreshModels(ctx context.Context) bool {
	n.pollMu.Lock()
	done := n.polled
	n.pollMu.Unlock()
	select {
	case n.membersChanged <- struct{}{}:
	default: // a poll is due already
	}
	t := time.NewTimer(refreshWait)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-ctx.Done():
	case <-t.C:
	}
	return false
}

// awaitSettled closes n.settled, which /ready and requests naming a model
// no worker serves yet wait for, once start-up has settled: every static
// worker's model is known (or DiscoveryTimeout passed, said in the log),
// and the index is safe to route on (this router repaired it as the
// ingester, or another router holds that role). Registered workers are
// routable already: New synced the registry before it returned.
func (n *Node) awaitSettled(ctx context.Context) {
	start := time.Now()
	select {
	case <-n.settled:
		// Settled in New (no static worker waits on its model, no index to
		// repair): said all the same, so that the log has its ready line,
		// or its warning that nothing can be routed.
		n.logSettled(start)
		return
	default:
	}
	timeout := time.NewTimer(n.cfg.DiscoveryTimeout)
	defer timeout.Stop()
	select {
	case <-n.discovered:
	case <-timeout.C:
		n.log.Warn("static workers' engines have not said which model they serve; requests naming a model route to them once they do",
			"slots", slotList(workers.Set(n.unknownModel.Load())), "waited", n.cfg.DiscoveryTimeout)
	case <-ctx.Done():
		return
	}
	if n.ingester != nil {
		select {
		case <-n.ingester.Settled():
		case <-ctx.Done():
			return
		}
	}
	close(n.settled)
	n.logSettled(start)
}

// logSettled says that start-up has settled, and whether /ready agrees.
func (n *Node) logSettled(start time.Time) {
	healthy := 0
	for w := range n.sched.Workers().All() {
		if n.sched.Load(w).Healthy {
			healthy++
		}
	}
	workers := n.sched.Workers().Len()
	if healthy == 0 && workers == 0 && n.seg != nil {
		// The usual start: engines register in the segment as they start,
		// after the router (kvfast-engine@.service orders after it). Not a
		// warning, which every start would then carry.
		n.log.Info(awaitingEnginesMessage, "after", time.Since(start).Round(time.Millisecond))
		return
	}
	if healthy == 0 {
		// /ready says not_ready: the log must not say ready.
		n.log.Warn("router started, but no worker is healthy yet: /ready answers 503, and requests get 503 until one is (at once with no worker known, after the queue wait with workers down)",
			"workers", workers, "after", time.Since(start).Round(time.Millisecond))
		return
	}
	n.log.Info("router ready", "workers", workers, "healthy", healthy, "after", time.Since(start).Round(time.Millisecond))
}

const awaitingEnginesMessage = "router started; no engine has registered in the segment yet: /ready answers 503, and requests get 503, until one does"

func slotList(set workers.Set) []int {
	var out []int
	for w := range set.All() {
		out = append(out, int(w))
	}
	return out
}

// healthChanged is the engine pool's health hook: the scheduler routes
// only to engines that pass their checks and are not ejected for failing
// requests.
func (n *Node) healthChanged(slot workers.Slot, addr string, healthy bool, cause error) {
	n.sched.SetHealthy(slot, healthy)
	var o dispatch.OutlierStatus
	if e := n.engines.Engine(slot); e != nil {
		o = e.Outlier()
	}
	args := []any{"slot", slot, "addr", addr, "healthy", healthy,
		"ejected", o.Ejected, "ejected_for", o.Remaining, "ejections", o.Ejections}
	if cause != nil {
		// The operator's first question about an engine gone unhealthy. It
		// holds no credential: addr is host:port (a worker URL's user info
		// is dropped when it is parsed), and checks and dials quote no
		// header.
		args = append(args, "err", cause)
	}
	// Once a minute per slot: an engine flapping (or a publisher
	// re-registering in a loop) would otherwise log at its rate. One key
	// for both directions, so that the line the throttle writes last
	// (Flush) is the engine's health now.
	n.throttle.Log(n.log, slog.LevelWarn, "health/"+strconv.Itoa(int(slot)), "engine health changed", args...)
}

// every runs f each period until ctx ends.
func (n *Node) every(ctx context.Context, period time.Duration, f func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

// Scheduler exposes the scheduler, for callers that inspect workers or
// mark one unhealthy (end-to-end tests inject faults through it).
func (n *Node) Scheduler() *sched.Scheduler { return n.sched }

// Index is the exact (event-fed) index.
func (n *Node) Index() *radix.Index { return n.index }

// Serve answers HTTP on ln until Shutdown or Close.
func (n *Node) Serve(ln net.Listener) error {
	n.log.Info("router listening", "addr", ln.Addr().String(), "policy", n.cfg.Policy, "direct", n.cfg.HTTP.Direct)
	err := n.front.Serve(ln)
	if errors.Is(err, fastpath.ErrServerClosed) {
		return nil // shut down before serving started: what the caller asked for
	}
	return err
}

// ServeAdmin answers the admin endpoints (/admin/..., /metrics, /health,
// /ready) on ln until Shutdown or Close; it runs beside Serve.
func (n *Node) ServeAdmin(ln net.Listener) error {
	n.log.Info("admin endpoints listening", "addr", ln.Addr().String())
	err := n.front.ServeAdmin(ln)
	if errors.Is(err, fastpath.ErrServerClosed) {
		return nil
	}
	return err
}

// warnExposure says at start what an operator may not have meant: an API
// that other hosts reach without an API key, admin endpoints (engines'
// addresses, models, load) that they reach without a token, on the API
// listener or on admin, the admin listener (nil: none).
func (n *Node) warnExposure(api, admin net.Addr) {
	if !isLoopback(api) && len(n.cfg.HTTP.APIKeys) == 0 {
		n.log.Warn("the API listener is reachable from other hosts and no API key is set: anyone who reaches it can use the engines (--api-key-file)",
			"addr", api.String())
	}
	if n.cfg.HTTP.AdminToken != "" {
		return
	}
	switch {
	case n.cfg.HTTP.AdminOnAPI && !isLoopback(api):
		n.log.Warn("the admin endpoints are served on a listener reachable from other hosts without an admin token (--admin-listen, --admin-token-file)",
			"addr", api.String())
	case admin != nil && !isLoopback(admin):
		n.log.Warn("the admin listener is reachable from other hosts and no admin token is set: anyone who reaches it reads /metrics and /admin/workers (--admin-token-file)",
			"addr", admin.String())
	}
}

func isLoopback(a net.Addr) bool {
	tcp, ok := a.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// Shutdown stops accepting requests, lets in-flight ones finish until ctx
// ends (then cuts them), and stops everything New started. The guards
// release every booking on every path, cut or not.
func (n *Node) Shutdown(ctx context.Context) error {
	err := n.front.Shutdown(ctx)
	return errors.Join(err, n.Close())
}

// traceFlushTimeout bounds the export of the spans still buffered at
// shutdown: a collector that is down must not hold the router's exit.
const traceFlushTimeout = 5 * time.Second

// Close cuts in-flight requests at once and stops everything New started.
// It is safe to call more than once and after Shutdown; only the first
// call does anything. If a request is still running after its connection
// was cut (waiting on a silent engine), the segment stays mapped: it is
// freed when the process exits, where unmapping it now would fault that
// request's next read of the index.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // no drain: Shutdown is the graceful path
		drained := !errors.Is(n.front.Shutdown(ctx), fastpath.ErrNotDrained)
		n.stop()
		n.bg.Wait()
		if !drained {
			n.log.Warn("leaving the segment mapped: requests are still running after their connections were cut")
			n.seg = nil
		}
		n.releaseMu.Lock()
		n.closeErr = n.release()
		n.released = true
		n.releaseMu.Unlock()
	})
	return n.closeErr
}

// release frees what New acquired, in reverse order.
func (n *Node) release() error {
	if n.traces != nil {
		// The front end has drained: the last requests' spans are ended
		// and go out now, unless the collector is slow to take them.
		ctx, cancel := context.WithTimeout(context.Background(), traceFlushTimeout)
		if err := n.traces.Shutdown(ctx); err != nil {
			n.log.Warn("dropped spans at shutdown", "err", err)
		}
		cancel()
	}
	if n.prompts != nil {
		n.prompts.Close()
	}
	if n.engines != nil {
		n.engines.Close()
	}
	if n.seg != nil {
		if err := n.seg.Close(); err != nil {
			return fmt.Errorf("cannot close the segment: %w", err)
		}
	}
	return nil
}

// Run serves cfg on cfg.Listen until ctx ends or SIGINT or SIGTERM
// arrives, then shuts down gracefully within cfg.ShutdownTimeout.
func Run(ctx context.Context, cfg Config) error {
	// From the start: a SIGHUP while the segment opens must not kill the
	// router either (ignoreHangUps logs the ones that come while it serves).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	// SIGINT and SIGTERM from the start too: one that comes while New
	// opens the segment (seconds, for a large index) stops the router
	// once New returns, cleanly, where the default action killed it and
	// left its half-made segment file in /dev/shm.
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// Listeners first: an address that cannot be bound fails the start
	// before the segment is created and engines see a router that is not.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("cannot listen on --listen %s: %w", cfg.Listen, err)
	}
	var adminLn net.Listener
	if cfg.AdminListen != "" {
		if adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
			_ = ln.Close()
			return fmt.Errorf("cannot listen on --admin-listen %s: %w", cfg.AdminListen, err)
		}
	}
	n, err := New(cfg)
	if err != nil {
		_ = ln.Close()
		if adminLn != nil {
			_ = adminLn.Close()
		}
		return fmt.Errorf("cannot start the router: %w", err)
	}
	if ctx.Err() != nil {
		_ = ln.Close()
		if adminLn != nil {
			_ = adminLn.Close()
		}
		n.log.Info("stopped during start-up: nothing was served")
		return n.Close()
	}
	var adminAddr net.Addr
	if adminLn != nil {
		adminAddr = adminLn.Addr()
	}
	n.warnExposure(ln.Addr(), adminAddr)
	go n.ignoreHangUps(ctx, hup)
	served := make(chan error, 2)
	go func() { served <- n.Serve(ln) }()
	if adminLn != nil {
		go func() { served <- n.ServeAdmin(adminLn) }()
	}
	n.notifyReady(ctx)
	select {
	case err := <-served:
		return errors.Join(err, n.Close())
	case <-ctx.Done():
	}
	n.notify("STOPPING=1")
	again := make(chan os.Signal, 1)
	signal.Notify(again, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(again)
	cut, done := make(chan struct{}), make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-again:
			n.log.Warn("second signal: cutting in-flight requests now")
			close(cut)
		case <-done:
		}
	}()
	if cfg.ShutdownDelay > 0 {
		n.front.Drain()
		n.log.Info("shutting down: serving on while balancers see /ready answer 503 (a second SIGINT or SIGTERM cuts everything now)", "delay", cfg.ShutdownDelay)
		wait := time.NewTimer(cfg.ShutdownDelay)
		select {
		case <-wait.C:
		case <-cut:
		}
		wait.Stop()
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	select {
	case <-cut: // the second signal's warning said it: nothing drains
		cancel()
	default:
		inFlight, queued := n.requestsInFlight()
		n.log.Info("shutting down: draining in-flight requests (a second SIGINT or SIGTERM cuts them now)",
			"deadline", cfg.ShutdownTimeout, "in_flight", inFlight, "queued", queued)
		go func() {
			select {
			case <-cut:
				cancel()
			case <-sctx.Done():
			}
		}()
	}
	if err := n.Shutdown(sctx); err != nil {
		n.log.Warn("shutdown cut requests still running", "err", err)
	}
	if err := <-served; err != nil {
		return err
	}
	if adminLn != nil {
		if err := <-served; err != nil {
			return err
		}
	}
	n.log.Info("router stopped")
	return nil
}

// requestsInFlight is how many requests are booked on workers and how
// many wait in the admission queue, for the shutdown's log.
func (n *Node) requestsInFlight() (inFlight uint64, queued int) {
	q := n.sched.Stats()
	return q.Booked - min(q.Released, q.Booked), q.Waiting
}

// ignoreHangUps keeps SIGHUP, which would otherwise kill the router on
// the spot and cut every stream, from stopping it: kvfast reads its
// configuration and key files only at start, so there is nothing to
// reload, and the log says what to do instead. It returns when ctx ends.
func (n *Node) ignoreHangUps(ctx context.Context, hup <-chan os.Signal) {
	for {
		select {
		case <-hup:
			n.log.Warn("SIGHUP ignored: kvfast reads its flags and key files only at start; " +
				"restart it to change them (SIGTERM drains in-flight requests first)")
		case <-ctx.Done():
			return
		}
	}
}

// notifyReady tells systemd (a unit of Type=notify) that the router is up
// once its listeners are bound: the segment is open, so engines ordered
// after it may register, and clients may connect. Start-up settling
// (/ready) comes later and is sent as a status line, so that a unit
// waiting for the router never waits for engines that wait for it.
func (n *Node) notifyReady(ctx context.Context) {
	n.notify("READY=1\nSTATUS=listening; settling (/ready answers 503 until then)")
	go func() {
		select {
		case <-n.settled:
			n.notify(fmt.Sprintf("STATUS=ready: routing to %d workers", n.sched.Workers().Len()))
		case <-ctx.Done():
		}
	}()
}

// notify sends state to systemd, if it started the router; a failure
// costs only the service manager's view, so it is logged, not returned.
func (n *Node) notify(state string) {
	if _, err := sdnotify.Notify(state); err != nil {
		n.log.Warn("cannot notify systemd", "err", err)
	}
}
