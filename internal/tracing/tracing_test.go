package tracing

import (
	"context"
	"strings"
	"testing"
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
