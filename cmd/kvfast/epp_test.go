package main

import (
	"bytes"
	"io"
	"slices"
	"strings"
	"testing"

	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/kvfast/kvfast/epp"
)

// TestEPPConfig: epp's flags land in the picker's configuration and its
// endpoint source; what cannot run is refused with status 2, and --help
// teaches with status 0.
func TestEPPConfig(t *testing.T) {
	cfg, o, src, _, ok := eppConfig([]string{"--model", "qwen", "--policy", "round-robin", "--fallbacks", "2",
		"--request-body-mode", "buffered", "--listen", "127.0.0.1:9100",
		"--endpoint", "10.0.0.1:8000,zmq=tcp://10.0.0.1:5557,replay=tcp://10.0.0.1:5558", "--endpoint", "10.0.0.2:8000"}, io.Discard)
	if !ok {
		t.Fatal("epp refused its flags")
	}
	if cfg.Model != "qwen" || cfg.Policy != "round-robin" || cfg.Fallbacks != 2 || o.listeners.GRPC != "127.0.0.1:9100" ||
		cfg.RequestBodyMode != extprocfilter.ProcessingMode_BUFFERED {
		t.Errorf("flags not applied: %+v %+v", cfg, o)
	}
	want := epp.Static{{Address: "10.0.0.1:8000", Events: "tcp://10.0.0.1:5557", Replay: "tcp://10.0.0.1:5558"}, {Address: "10.0.0.2:8000"}}
	if got, _ := src.(epp.Static); !slices.Equal(got, want) {
		t.Errorf("endpoints %+v, want %+v", src, want)
	}

	for _, bad := range [][]string{
		{"--endpoint", "10.0.0.1:8000"}, // no model
		{"--model", "m"},                // no endpoints
		{"--model", "m", "--endpoint", "10.0.0.1"},
		{"--model", "m", "--endpoint", "10.0.0.1:8000,zmq=udp://x"},
		{"--model", "m", "--endpoint", "10.0.0.1:8000", "--pool", "p"},
		{"--model", "m", "--endpoint", "10.0.0.1:8000", "--request-body-mode", "streamed"},
		{"--model", "m", "--endpoint", "10.0.0.1:8000", "--fallbacks", "9"},
		{"--model", "m", "--pool", "p"}, // not in a pod
	} {
		t.Setenv("KUBERNETES_SERVICE_HOST", "")
		if _, _, _, code, ok := eppConfig(bad, io.Discard); ok || code != 2 {
			t.Errorf("%q: ok %v, status %d; want refused with 2", bad, ok, code)
		}
	}

	var help bytes.Buffer
	if _, _, _, code, ok := eppConfig([]string{"--help"}, &help); ok || code != 0 {
		t.Fatalf("--help: ok %v, status %d", ok, code)
	}
	for _, s := range []string{"x-gateway-destination-endpoint", "--pool", "--endpoint", "FULL_DUPLEX_STREAMED", "docs/epp.md"} {
		if !strings.Contains(help.String(), s) {
			t.Errorf("--help does not mention %s", s)
		}
	}
}
