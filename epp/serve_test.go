package epp_test

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/kvfast/kvfast/epp"
)

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// TestServe: what kvfast epp runs. ext_proc over TLS with a self-signed
// certificate (the gateway does not verify it, as with GIE's own picker),
// gRPC health in plain text on its own port for the kubelet, metrics over
// HTTP; the picker routes once its source has given the endpoints, and
// the context's end stops it all.
func TestServe(t *testing.T) {
	cert, err := epp.SelfSignedTLS("kvfast-epp")
	if err != nil {
		t.Fatal(err)
	}
	cfg := epp.DefaultConfig()
	cfg.Model, cfg.Logger = testModel, slog.New(slog.DiscardHandler)
	ln, hln, mln := listen(t), listen(t), listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- epp.Serve(ctx, cfg, epp.Static(endpoints(2)),
			epp.Listeners{TLS: cert, Poll: time.Hour, Drain: wait}, ln, hln, mln)
	}()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	waitFor(t, "readiness on the health port", func() bool { return grpcHealth(t, hln.Addr().String(), epp.HealthReadiness) == "SERVING" })

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := &eppRig{client: extprocv3.NewExternalProcessorClient(conn)}
	st := r.open(t, duplexMode())
	st.requestHeaders("/v1/completions", false, nil)
	st.requestBody(completionBody(t, tokens(1, 64), false), true)
	hr := st.recv()
	if dest := destinationOf(t, hr, hr.GetRequestHeaders().GetResponse()); !strings.HasPrefix(dest, "10.0.0.") {
		t.Fatalf("destination %q", dest)
	}
	st.recv()
	st.closeAndWaitEOF()

	resp, err := http.Get("http://" + mln.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"kvfast_epp_decisions_total 1", "kvfast_epp_endpoints 2", "kvfast_epp_requests_in_flight 0",
		"kvfast_epp_admission_waiting 0", "kvfast_epp_endpoint_active_requests{endpoint=", "kvfast_epp_endpoint_healthy{endpoint=", "go_goroutines ", "process_resident_memory_bytes ",
		// No refusal yet, and its series are there to rate and alert on.
		`kvfast_epp_refusals_total{status="503"} 0`, `kvfast_epp_refusals_total{status="429"} 0`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}

	// Shutting down, the picker drains the streams still open, and is not
	// ready meanwhile.
	held := r.open(t, duplexMode())
	held.requestHeaders("/v1/completions", false, nil)
	waitFor(t, "the held stream to open", func() bool {
		resp, err := http.Get("http://" + mln.Addr().String() + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), "kvfast_epp_streams 1")
	})
	cancel()
	waitFor(t, "readiness to end with the drain", func() bool { return grpcHealth(t, hln.Addr().String(), epp.HealthReadiness) == "NOT_SERVING" })
	held.cancel()
}
