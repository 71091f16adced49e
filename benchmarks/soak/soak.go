package soak

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfast/kvfast/internal/rig"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
)

// Config sizes a soak. Zero fields take the defaults in parentheses.
type Config struct {
	Duration time.Duration // how long load and faults run (2 min)
	Engines  int           // healthy mock engines (4)
	Clients  int           // concurrent clients (12)
	Seed     uint64        // the clients' and the fault loop's choices
	// FaultEvery is the pause between two injected faults (5 s).
	FaultEvery time.Duration
	// RSSBound is the resident memory the process must be back under at
	// the end (500 MiB: the router's 300 MB target with the mock engines
	// and the clients, which share the process, on top).
	RSSBound uint64
	// EvictionWeight, when set, replaces the router's default eviction
	// weight (kvfast serve --eviction-weight), to compare the soak with
	// the term on and off (docs/routing.md, "Stalled and unproven
	// engines").
	EvictionWeight *float64
	// Logger receives progress lines; nil discards them.
	Logger *slog.Logger
}

func (c *Config) defaults() {
	if c.Duration <= 0 {
		c.Duration = 2 * time.Minute
	}
	if c.Engines <= 0 {
		c.Engines = 4
	}
	if c.Clients <= 0 {
		c.Clients = 12
	}
	if c.FaultEvery <= 0 {
		c.FaultEvery = 5 * time.Second
	}
	if c.RSSBound == 0 {
		c.RSSBound = 500 << 20
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Report is what a soak ran and saw.
type Report struct {
	Duration time.Duration
	Requests uint64            // requests the clients sent
	Outcomes map[string]uint64 // by kind: ok, cancelled, status-NNN, transport
	Faults   map[string]uint64 // injected, by kind
	Routers  int               // router processes the soak ran (1 + restarts)
	Booked   uint64            // bookings over every router's life
	Released uint64            // releases over every router's life

	BaselineGoroutines, EndGoroutines int
	GoroutineSlack                    int // the end may exceed the baseline by this much
	BaselineRSS, PeakRSS, EndRSS      uint64
	// RSSEveryMinute samples resident memory once a minute under load:
	// a plateau, or the growth a leak shows.
	RSSEveryMinute []uint64
}

// String renders the report as the lines BENCHMARKS.md records.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "duration %v, %d router lives, %d requests\n", r.Duration.Round(time.Second), r.Routers, r.Requests)
	fmt.Fprintf(&b, "outcomes: %s\n", sortedCounts(r.Outcomes))
	fmt.Fprintf(&b, "faults: %s\n", sortedCounts(r.Faults))
	fmt.Fprintf(&b, "bookings: %d booked, %d released\n", r.Booked, r.Released)
	fmt.Fprintf(&b, "goroutines: %d at baseline, %d at the end (slack %d)\n", r.BaselineGoroutines, r.EndGoroutines, r.GoroutineSlack)
	fmt.Fprintf(&b, "RSS: %d MiB at baseline, %d MiB peak, %d MiB at the end\n", r.BaselineRSS>>20, r.PeakRSS>>20, r.EndRSS>>20)
	if len(r.RSSEveryMinute) > 0 {
		b.WriteString("RSS each minute under load (MiB):")
		for _, v := range r.RSSEveryMinute {
			fmt.Fprintf(&b, " %d", v>>20)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func sortedCounts(m map[string]uint64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// Run soaks a node for cfg.Duration and checks it. The error joins every
// check that failed; the report is filled either way.
func Run(ctx context.Context, cfg Config) (Report, error) {
	cfg.defaults()
	s := &soak{cfg: cfg, rep: Report{Outcomes: map[string]uint64{}, Faults: map[string]uint64{}},
		rng: rand.New(rand.NewPCG(cfg.Seed, 0x50a4))}
	err := s.run(ctx)
	return s.rep, err
}

type soak struct {
	cfg Config
	rep Report
	rng *rand.Rand // the fault loop's; clients have their own

	dir     string
	segment string
	sick    []*sickEngine
	engines []*mocker.Engine
	nextID  uint64

	// findings are checks that failed while the soak ran (a router that
	// did not stop clean); Run reports them with the final checks.
	findings []error

	mu      sync.Mutex // guards router, rep.Outcomes and rep.Faults
	router  *router
	url     atomic.Pointer[string]
	peakRSS atomic.Uint64
}

func (s *soak) run(ctx context.Context) (err error) {
	s.rep.BaselineGoroutines = runtime.NumGoroutine()
	s.rep.BaselineRSS = rss()
	if s.dir, err = os.MkdirTemp("", "kvfast-soak-"); err != nil {
		return fmt.Errorf("cannot create a directory for the segment: %w", err)
	}
	s.segment = filepath.Join(s.dir, "kvfast.shm")
	defer func() { err = errors.Join(err, s.stopAll()) }()

	for _, mode := range []sickMode{hangs, fails, garbles} {
		e, err := startSick(mode)
		if err != nil {
			return err
		}
		s.sick = append(s.sick, e)
	}
	if err := s.startRouter(); err != nil {
		return err
	}
	for range s.cfg.Engines {
		if err := s.startEngine(); err != nil {
			return err
		}
	}
	if err := s.waitHealthy(ctx, s.cfg.Engines); err != nil {
		return err
	}
	// The baseline is the idle deployment: router, engines, sick engines.
	s.rep.BaselineGoroutines = runtime.NumGoroutine()
	s.rep.BaselineRSS = rss()
	s.cfg.Logger.Info("soak running", "duration", s.cfg.Duration, "engines", s.cfg.Engines, "clients", s.cfg.Clients)

	start := time.Now()
	loadCtx, stopLoad := context.WithTimeout(ctx, s.cfg.Duration)
	defer stopLoad()
	var wg sync.WaitGroup
	for i := range s.cfg.Clients {
		wg.Go(func() { s.client(loadCtx, uint64(i)) })
	}
	wg.Go(func() { s.watchRSS(loadCtx) })
	faultErr := s.faults(loadCtx)
	wg.Wait()
	s.rep.Duration = time.Since(start)
	if faultErr != nil && !errors.Is(faultErr, context.DeadlineExceeded) && !errors.Is(faultErr, context.Canceled) {
		return errors.Join(append(s.findings, fmt.Errorf("cannot inject faults: %w", faultErr))...)
	}
	return errors.Join(append(s.findings, s.check(ctx))...)
}

// check waits for what must hold once the load has stopped, and reports
// every check that does not.
func (s *soak) check(ctx context.Context) error {
	const settle = 90 * time.Second // generous: a loaded 2-core machine
	var errs []error
	n := s.router.node
	if err := rig.WaitFor(ctx, settle, "no load booked on any worker", func() bool {
		for _, w := range n.Snapshot().Workers {
			if w.Requests != 0 || w.PrefillTokens != 0 || w.ActiveBlocks != 0 {
				return false
			}
		}
		return true
	}); err != nil {
		errs = append(errs, fmt.Errorf("%w: %+v", err, loads(n)))
	}
	if err := rig.WaitFor(ctx, settle, "every booking released", func() bool {
		q := n.Snapshot().Queue
		return q.Booked == q.Released
	}); err != nil {
		q := n.Snapshot().Queue
		errs = append(errs, fmt.Errorf("%w: booked %d, released %d", err, q.Booked, q.Released))
	}
	if err := s.checkIndex(ctx, settle); err != nil {
		errs = append(errs, err)
	}
	// Idle keep-alive connections of the clients and the router's engine
	// pools close within their idle timeouts, and fasthttp's idle workers
	// within ten seconds; a leak stays.
	slack := 16 + s.cfg.Clients
	s.rep.GoroutineSlack = slack
	if err := rig.WaitFor(ctx, settle, "goroutines back at the baseline", func() bool {
		http.DefaultClient.CloseIdleConnections()
		return runtime.NumGoroutine() <= s.rep.BaselineGoroutines+slack
	}); err != nil {
		errs = append(errs, fmt.Errorf("%w: %d now, %d at baseline (+%d allowed)", err, runtime.NumGoroutine(), s.rep.BaselineGoroutines, slack))
	}
	runtime.GC()
	if err := rig.WaitFor(ctx, settle, "resident memory under its bound", func() bool {
		return rss() <= s.cfg.RSSBound
	}); err != nil {
		errs = append(errs, fmt.Errorf("%w: %d MiB, bound %d MiB", err, rss()>>20, s.cfg.RSSBound>>20))
	}
	s.rep.EndGoroutines = runtime.NumGoroutine()
	s.rep.EndRSS = rss()
	s.rep.PeakRSS = max(s.peakRSS.Load(), s.rep.EndRSS)
	return errors.Join(errs...)
}

// checkIndex waits until, for every live engine, the index holds exactly
// the blocks the engine caches.
func (s *soak) checkIndex(ctx context.Context, timeout time.Duration) error {
	var diff string
	err := rig.WaitFor(ctx, timeout, "the index equal to the engines' caches", func() bool {
		byID := map[uint64]uint64{}
		for _, w := range s.router.node.Snapshot().Workers {
			if w.Source == "registry" {
				byID[w.WorkerID] = w.IndexBlocks
			}
		}
		diff = ""
		for _, e := range s.engines {
			id := e.Config().WorkerID
			if got, want := byID[id], uint64(e.Stats().KVCached); got != want {
				diff += fmt.Sprintf(" engine %d: index %d, engine %d;", id, got, want)
			}
		}
		return diff == ""
	})
	if err != nil {
		return fmt.Errorf("%w:%s", err, diff)
	}
	return nil
}

func loads(n *node.Node) string {
	var b strings.Builder
	for _, w := range n.Snapshot().Workers {
		fmt.Fprintf(&b, "[slot %d %s: %d requests, %d prefill tokens, %d blocks] ", w.Slot, w.Endpoint, w.Requests, w.PrefillTokens, w.ActiveBlocks)
	}
	return b.String()
}

func (s *soak) count(m map[string]uint64, kind string) {
	s.mu.Lock()
	m[kind]++
	s.mu.Unlock()
}

// watchRSS samples resident memory for the report's peak and its
// once-a-minute series.
func (s *soak) watchRSS(ctx context.Context) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	next := time.Now().Add(time.Minute)
	for {
		r := rss()
		if r > s.peakRSS.Load() {
			s.peakRSS.Store(r)
		}
		if now := time.Now(); now.After(next) {
			s.mu.Lock()
			s.rep.RSSEveryMinute = append(s.rep.RSSEveryMinute, r)
			s.mu.Unlock()
			next = now.Add(time.Minute)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// rss is the process's resident set size, from /proc (0 where there is
// none).
func rss() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// client sends requests until ctx ends: token prompts over a few shared
// prefixes, streaming or not, a tenth of them cancelled at a random time.
func (s *soak) client(ctx context.Context, id uint64) {
	r := rand.New(rand.NewPCG(s.cfg.Seed, id))
	hc := &http.Client{Timeout: 20 * time.Second}
	defer hc.CloseIdleConnections()
	for ctx.Err() == nil {
		body := promptBody(r)
		rctx, cancel := context.WithCancel(ctx)
		cancelled := r.IntN(10) == 0
		if cancelled {
			d := time.Duration(r.IntN(200)) * time.Millisecond
			time.AfterFunc(d, cancel)
		}
		kind := s.send(rctx, hc, body)
		cancel()
		if cancelled && kind != "ok" {
			kind = "cancelled"
		}
		if ctx.Err() != nil && kind != "ok" {
			kind = "cancelled" // cut by the end of the soak
		}
		s.mu.Lock()
		s.rep.Requests++
		s.rep.Outcomes[kind]++
		s.mu.Unlock()
		if kind == "transport" {
			// The router is restarting (its old port refuses): a client
			// that retried at once would count thousands of refusals
			// and load nothing. Pacing, not synchronisation.
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(10+r.IntN(40)) * time.Millisecond):
			}
		}
	}
}

func (s *soak) send(ctx context.Context, hc *http.Client, body []byte) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, *s.url.Load()+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return "transport"
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return "transport"
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return "transport"
	}
	if resp.StatusCode != http.StatusOK {
		return "status-" + strconv.Itoa(resp.StatusCode)
	}
	return "ok"
}

// promptBody is a completions request over one of eight shared prefixes
// and a random suffix, so that the engines' caches and the index churn.
func promptBody(r *rand.Rand) []byte {
	var b bytes.Buffer
	prefix := r.IntN(8)
	b.WriteString(`{"model":"mock","max_tokens":`)
	b.WriteString(strconv.Itoa(4 + r.IntN(24)))
	if r.IntN(2) == 0 {
		b.WriteString(`,"stream":true`)
	}
	b.WriteString(`,"prompt":[`)
	n := 64 + r.IntN(256)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		t := 1000 + prefix*1000 + i
		if i >= n/2 {
			t = 100000 + r.IntN(50000)
		}
		b.WriteString(strconv.Itoa(t))
	}
	b.WriteString("]}")
	return b.Bytes()
}

// faults injects one fault every FaultEvery until ctx ends.
func (s *soak) faults(ctx context.Context) error {
	t := time.NewTicker(s.cfg.FaultEvery)
	defer t.Stop()
	kinds := []string{"engine-restart", "router-restart", "body-flood", "idle-flood"}
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		// Every kind once first, then at random.
		kind := kinds[i%len(kinds)]
		if i >= len(kinds) {
			kind = kinds[s.rng.IntN(len(kinds))]
		}
		var err error
		switch kind {
		case "engine-restart":
			err = s.restartEngine(ctx)
		case "router-restart":
			err = s.restartRouter(ctx)
		case "body-flood":
			s.bodyFlood(ctx)
		case "idle-flood":
			s.idleFlood(ctx)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", kind, err)
		}
		s.count(s.rep.Faults, kind)
		s.cfg.Logger.Info("fault injected", "kind", kind)
	}
}

// bodyFlood sends concurrent large bodies, which the router must refuse
// or read within its memory budget.
func (s *soak) bodyFlood(ctx context.Context) {
	const senders, size = 8, 8 << 20
	big := bytes.Repeat([]byte("x"), size)
	copy(big, `{"model":"mock","prompt":"`)
	var wg sync.WaitGroup
	for range senders {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, *s.url.Load()+"/v1/completions", bytes.NewReader(big))
			if err != nil {
				return
			}
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
}

// idleFlood opens many connections that send nothing, holds them a
// while, and closes them. The clients must get through meanwhile.
func (s *soak) idleFlood(ctx context.Context) {
	const conns = 400
	addr := strings.TrimPrefix(*s.url.Load(), "http://")
	var open []net.Conn
	d := net.Dialer{Timeout: time.Second}
	for range conns {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			break
		}
		open = append(open, c)
	}
	select {
	case <-ctx.Done():
	case <-time.After(2 * time.Second):
	}
	for _, c := range open {
		c.Close()
	}
}
