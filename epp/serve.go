package epp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
)

// The gRPC health services the protocol names: liveness answers SERVING
// while the process runs; readiness, the ext_proc service itself and
// HealthGIE once the picker knows its endpoints.
const (
	HealthLiveness  = "liveness"
	HealthReadiness = "readiness"
	// HealthGIE is the service GIE's own Helm chart probes (both probes,
	// for a single replica), so that kvfast can stand in for its picker.
	HealthGIE = "inference-extension"
)

// NewGRPC returns a gRPC server that answers ext_proc with s and the gRPC
// health protocol. Readiness (and the ext_proc service's health) turns
// SERVING when s's picker has synced its endpoints and, with an Elector,
// while s leads (SetLeading).
func NewGRPC(ctx context.Context, s *Server, opts ...grpc.ServerOption) *grpc.Server {
	// A buffered request body comes in one message. A gateway's HTTP/2
	// keepalive pings are allowed every 10 s, with or without streams:
	// grpc-go's default refuses more than one per 5 minutes and answers
	// with GOAWAY, cutting every stream on the connection (an Envoy with
	// a 10 s keepalive lost its streams after 30 s). The picker pings a
	// quiet gateway connection itself, to notice one that died.
	opts = append([]grpc.ServerOption{
		grpc.MaxRecvMsgSize(s.p.cfg.MaxBodyBytes + 1<<16),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: time.Minute, Timeout: 20 * time.Second}),
	}, opts...)
	g := grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(g, s)
	hs := health.NewServer()
	hs.SetServingStatus(HealthLiveness, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, hs)
	s.ready.attach(hs)
	go func() {
		select {
		case <-s.p.Ready():
			s.ready.set(func(r *readiness) { r.synced = true })
		case <-ctx.Done():
		}
	}()
	return g
}

// readiness is what the readiness health services answer: SERVING once
// the endpoints are known, while this replica leads.
type readiness struct {
	mu       sync.Mutex
	hs       *health.Server
	synced   bool
	leading  bool
	draining bool // shutting down: no new streams, so not ready
}

func (r *readiness) attach(hs *health.Server) { r.set(func(r *readiness) { r.hs = hs }) }

func (r *readiness) set(change func(*readiness)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	change(r)
	if r.hs == nil {
		return
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if r.synced && r.leading && !r.draining {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, svc := range []string{"", HealthReadiness, HealthGIE, extprocv3.ExternalProcessor_ServiceDesc.ServiceName} {
		r.hs.SetServingStatus(svc, st)
	}
}

// SetLeading says whether this replica holds the Lease (Elector.Run's
// callback); a replica without an Elector leads.
func (s *Server) SetLeading(leading bool) { s.ready.set(func(r *readiness) { r.leading = leading }) }

// Listeners are where Run serves: ext_proc and gRPC health on GRPC (GIE's
// default port is 9002), over TLS if TLS is set; gRPC health alone, in
// plain text for the kubelet's probes, on Health ("" for none);
// Prometheus metrics on Metrics ("" for none).
type Listeners struct {
	GRPC, Health, Metrics string
	TLS                   *tls.Config
	// Poll is how often the Source is asked for the endpoints.
	Poll time.Duration
	// Drain bounds the wait for open streams at shutdown; past it they
	// are cut (their bookings are released either way).
	Drain time.Duration
	// Elector, if set, makes this replica one of an active-standby set:
	// ready only while it holds the Lease.
	Elector *Elector
}

// Run serves the picker cfg describes, with endpoints from src, until ctx
// ends, then drains the open streams within l.Drain.
func Run(ctx context.Context, cfg Config, src Source, l Listeners) error {
	ln, err := net.Listen("tcp", l.GRPC)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %w", l.GRPC, err)
	}
	var mln, hln net.Listener
	if l.Metrics != "" {
		if mln, err = net.Listen("tcp", l.Metrics); err != nil {
			_ = ln.Close()
			return fmt.Errorf("cannot listen on %s (metrics): %w", l.Metrics, err)
		}
	}
	if l.Health != "" {
		if hln, err = net.Listen("tcp", l.Health); err != nil {
			_ = ln.Close()
			if mln != nil {
				_ = mln.Close()
			}
			return fmt.Errorf("cannot listen on %s (health): %w", l.Health, err)
		}
	}
	return serve(ctx, cfg, src, l, ln, hln, mln)
}

// serve is Run on listeners already open (hln and mln may be nil); it
// closes them.
func serve(ctx context.Context, cfg Config, src Source, l Listeners, ln, hln, mln net.Listener) error {
	p, err := NewPicker(cfg)
	if err != nil {
		for _, c := range []net.Listener{ln, hln, mln} {
			if c != nil {
				_ = c.Close()
			}
		}
		return fmt.Errorf("cannot start the picker: %w", err)
	}
	defer p.Close()
	s := NewServer(p)
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	if l.Elector != nil {
		s.SetLeading(false)
	}
	var opts []grpc.ServerOption
	if l.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(l.TLS)))
	}
	g := NewGRPC(ctx, s, opts...)
	var wg sync.WaitGroup
	wg.Go(func() { p.Run(ctx, src, l.Poll) })
	wg.Go(func() { p.RunAdapters(ctx, adapterPoll) })
	if l.Elector != nil {
		wg.Go(func() { l.Elector.Run(ctx, s.SetLeading) })
	}
	errs := make(chan error, 3)
	wg.Go(func() { errs <- g.Serve(ln) })
	var hg *grpc.Server
	if hln != nil {
		hg = grpc.NewServer()
		healthpb.RegisterHealthServer(hg, s.ready.hs)
		wg.Go(func() { errs <- hg.Serve(hln) })
	}
	var hs *http.Server
	if mln != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", s.MetricsHandler())
		hs = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		wg.Go(func() {
			if err := hs.Serve(mln); !errors.Is(err, http.ErrServerClosed) {
				errs <- err
			}
		})
	}
	metricsAddr := ""
	if mln != nil {
		metricsAddr = mln.Addr().String()
	}
	healthAddr := ""
	if hln != nil {
		healthAddr = hln.Addr().String()
	}
	p.log.Info("endpoint picker listening", "grpc", ln.Addr().String(), "tls", l.TLS != nil, "health", healthAddr,
		"metrics", metricsAddr, "model", cfg.Model, "policy", cfg.Policy)
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errs:
	}
	stop()
	// Not ready from here: a probe that still saw SERVING through the
	// drain kept the gateway sending to a picker that refuses streams.
	s.ready.set(func(r *readiness) { r.draining = true })
	if runErr == nil {
		p.log.Info("shutting down: readiness NOT_SERVING, open streams drain", "deadline", l.Drain)
	}
	drained := make(chan struct{})
	go func() {
		g.GracefulStop()
		close(drained)
	}()
	t := time.NewTimer(l.Drain)
	select {
	case <-drained:
	case <-t.C:
		p.log.Warn("cutting streams still open after the drain timeout", "timeout", l.Drain)
		g.Stop()
		<-drained
	}
	t.Stop()
	if hg != nil {
		hg.Stop()
	}
	if hs != nil {
		_ = hs.Close()
	}
	wg.Wait()
	if runErr != nil {
		return fmt.Errorf("cannot serve: %w", runErr)
	}
	p.log.Info("endpoint picker stopped")
	return nil
}
