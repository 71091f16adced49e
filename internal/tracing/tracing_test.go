package tracing

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvfast/kvfast/internal/syncbuf"
)

func TestValidateEndpoints(t *testing.T) {
	for _, tc := range []struct {
		endpoint string
		ok       bool
	}{
		{"", true},
		{"http://collector:4318", true},
		{"https://collector:4318/", true},
		{"http://collector:4318/custom/traces", true},
		{"collector:4318", false}, // no scheme: the scheme says whether TLS is used
		{"grpc://collector:4317", false},
		{"http://", false},
		{"http://user:secret@collector:4318", false},
		{"http://collector:4318?x=1", false},
	} {
		cfg := DefaultConfig()
		cfg.Endpoint = tc.endpoint
		if err := cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("Validate(%q) = %v, want ok %v", tc.endpoint, err, tc.ok)
		}
	}
	// Without a scheme, the error names no endpoint the operator never
	// wrote ("://garbage", "collector://").
	for _, endpoint := range []string{"garbage", "collector:4318"} {
		cfg := DefaultConfig()
		cfg.Endpoint = endpoint
		if err := cfg.Validate(); err == nil || strings.Contains(err.Error(), "://\"") || strings.Contains(err.Error(), `"://`) || !strings.Contains(err.Error(), "no http:// or https:// scheme") {
			t.Errorf("Validate(%q) = %v; want the missing scheme named, nothing quoted", endpoint, err)
		}
	}
	cfg := DefaultConfig()
	cfg.Endpoint, cfg.SampleRatio = "http://collector:4318", 1.5
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "sample ratio") {
		t.Errorf("Validate with sample ratio 1.5 = %v", err)
	}
}

func TestOffWithoutEndpoint(t *testing.T) {
	p, err := New(DefaultConfig())
	if err != nil || p != nil {
		t.Fatalf("New without an endpoint = %v, %v; want nil, nil", p, err)
	}
	if p.Tracer() != nil {
		t.Error("a nil provider gives a tracer")
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown of a nil provider: %v", err)
	}
}

// TestShutdownWithoutCollector: a provider whose collector is not there
// starts (nothing is dialled at New), shuts down within its context, and
// a second Shutdown returns the first one's result.
func TestShutdownWithoutCollector(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Endpoint = "http://127.0.0.1:1" // nothing listens on port 1
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, span := p.Tracer().Start(context.Background(), "lost")
	span.End()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	first := p.Shutdown(ctx) // the export fails or is cut: either way it returns
	if second := p.Shutdown(context.Background()); second != first {
		t.Errorf("a second Shutdown returned %v, the first %v: want the first's result", second, first)
	}
}

// TestRefusalsDoNotPrintCredentials: an endpoint with credentials in it,
// and OTLP header settings the exporter cannot parse, are refused with
// errors that do not quote the secrets.
func TestRefusalsDoNotPrintCredentials(t *testing.T) {
	for _, endpoint := range []string{"http://user:SECRET@collector:4318", "http://collector:4318/?api_key=SECRET", "http://coll ector/SECRET%zz"} {
		cfg := DefaultConfig()
		cfg.Endpoint = endpoint
		if err := cfg.Validate(); err == nil || strings.Contains(err.Error(), "SECRET") {
			t.Errorf("Validate(%q) = %v: want a refusal that does not quote the secret", endpoint, err)
		}
	}
	for _, headers := range []string{"Authorization=Bearer SECRET%ZZ", "X-Key SECRET", "a=b,SECRET"} {
		t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", headers)
		cfg := DefaultConfig()
		cfg.Endpoint = "http://collector:4318"
		if err := cfg.Validate(); err == nil || strings.Contains(err.Error(), "SECRET") {
			t.Errorf("headers %q: %v: want a refusal that does not quote them", headers, err)
		}
	}
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20abc,x-tenant=t1")
	cfg := DefaultConfig()
	cfg.Endpoint = "http://collector:4318"
	if err := cfg.Validate(); err != nil {
		t.Errorf("well-formed headers refused: %v", err)
	}
}

// TestExportErrorsGoToTheLogger: a collector refusing spans is reported
// through the router's logger (a JSON log stays JSON), not printed by
// OpenTelemetry's default handler.
func TestExportErrorsGoToTheLogger(t *testing.T) {
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "no", http.StatusBadRequest) // not retried by the exporter
	}))
	defer collector.Close()
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "10") // ms: export soon, from the processor's own goroutine
	var logs syncbuf.Buffer
	cfg := DefaultConfig()
	cfg.Endpoint = collector.URL
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Shutdown(context.Background()) }()
	_, span := p.Tracer().Start(context.Background(), "refused")
	span.End()
	for deadline := time.Now().Add(time.Minute); logs.String() == "" && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	var line struct{ Msg, Err string }
	if err := json.Unmarshal([]byte(strings.TrimSpace(logs.String())), &line); err != nil || line.Msg != "cannot export traces: spans are dropped" || line.Err == "" {
		t.Errorf("the log holds %q (%v); want one JSON line reporting the export error", logs.String(), err)
	}
}
