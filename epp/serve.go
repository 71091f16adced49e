package epp

import (
	"context"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The gRPC health services the protocol names: liveness answers SERVING
// while the process runs; readiness and the ext_proc service itself once
// the picker knows its endpoints.
const (
	HealthLiveness  = "liveness"
	HealthReadiness = "readiness"
)

// NewGRPC returns a gRPC server that answers ext_proc with s and the gRPC
// health protocol. Readiness turns SERVING when s's picker has synced its
// endpoints (or never, if ctx ends first).
func NewGRPC(ctx context.Context, s *Server, opts ...grpc.ServerOption) *grpc.Server {
	// A buffered request body comes in one message.
	opts = append([]grpc.ServerOption{grpc.MaxRecvMsgSize(s.p.cfg.MaxBodyBytes + 1<<16)}, opts...)
	g := grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(g, s)
	hs := health.NewServer()
	hs.SetServingStatus(HealthLiveness, healthpb.HealthCheckResponse_SERVING)
	for _, svc := range []string{"", HealthReadiness, extprocv3.ExternalProcessor_ServiceDesc.ServiceName} {
		hs.SetServingStatus(svc, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	healthpb.RegisterHealthServer(g, hs)
	go func() {
		select {
		case <-s.p.Ready():
			for _, svc := range []string{"", HealthReadiness, extprocv3.ExternalProcessor_ServiceDesc.ServiceName} {
				hs.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
			}
		case <-ctx.Done():
		}
	}()
	return g
}
