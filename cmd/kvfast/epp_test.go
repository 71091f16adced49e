package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/kvfast/kvfast/epp"
	"github.com/kvfast/kvfast/node"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/workers"
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
	// Admission as kvfast serve's: busy thresholds on, a queue of 1024.
	if cfg.Sched.Busy != sched.DefaultBusy || cfg.Sched.QueueCapacity != sched.DefaultQueueCapacity {
		t.Errorf("admission defaults %+v, queue %d; want kvfast serve's", cfg.Sched.Busy, cfg.Sched.QueueCapacity)
	}
	if cfg, _, _, _, ok := eppConfig([]string{"--model", "m", "--endpoint", "10.0.0.1:8000", "--queue-capacity", "0"}, io.Discard); !ok || cfg.Sched.QueueCapacity >= 0 {
		t.Errorf("--queue-capacity 0: ok %v, capacity %d; want no queue (negative, sched's convention)", ok, cfg.Sched.QueueCapacity)
	}
	want := epp.Static{{Address: "10.0.0.1:8000", Events: "tcp://10.0.0.1:5557", Replay: "tcp://10.0.0.1:5558"}, {Address: "10.0.0.2:8000"}}
	if got, _ := src.(epp.Static); !slices.Equal(got, want) {
		t.Errorf("endpoints %+v, want %+v", src, want)
	}

	// The engines' key, from its file; a missing or empty file refused.
	keyFile := filepath.Join(t.TempDir(), "engine-key")
	if err := os.WriteFile(keyFile, []byte("sk-engine\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if cfg, _, _, _, ok := eppConfig([]string{"--model", "m", "--endpoint", "10.0.0.1:8000", "--engine-api-key-file", keyFile}, io.Discard); !ok || cfg.EngineToken != "sk-engine" {
		t.Errorf("--engine-api-key-file: ok %v, key read %q", ok, cfg.EngineToken)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	control := filepath.Join(t.TempDir(), "control")
	if err := os.WriteFile(control, []byte("sk-\x01engine\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{empty, control, filepath.Join(t.TempDir(), "missing")} {
		if _, _, _, code, ok := eppConfig([]string{"--model", "m", "--endpoint", "10.0.0.1:8000", "--engine-api-key-file", f}, io.Discard); ok || code != 2 {
			t.Errorf("--engine-api-key-file %s: ok %v, status %d; want refused with 2", f, ok, code)
		}
	}

	// STREAMED, as Envoy may announce it: routed on the headers, as none.
	if cfg, _, _, _, ok := eppConfig([]string{"--model", "m", "--endpoint", "10.0.0.1:8000", "--request-body-mode", "streamed"}, io.Discard); !ok ||
		cfg.RequestBodyMode != extprocfilter.ProcessingMode_STREAMED {
		t.Errorf("--request-body-mode streamed: ok %v, mode %v", ok, cfg.RequestBodyMode)
	}

	for _, bad := range [][]string{
		{"--endpoint", "10.0.0.1:8000"}, // no model
		{"--model", "m"},                // no endpoints
		{"--model", "m", "--endpoint", "10.0.0.1"},
		{"--model", "m", "--endpoint", "localhost:8000"}, // a host name: the gateway connects to an IP
		{"--model", "m", "--endpoint", "10.0.0.1:0"},
		{"--model", "m", "--endpoint", "10.0.0.1:8000,zmq=udp://x"},
		{"--model", "m", "--endpoint", "10.0.0.1:8000", "--pool", "p"},
		{"--model", "m", "--endpoint", "10.0.0.1:8000", "--request-body-mode", "duplex"},
		{"--model", "m", "--endpoint", "10.0.0.1:8000", "--fallbacks", "9"},
		{"--model", "m", "--pool", "p"}, // not in a pod
		{"--model", "m", "--endpoint", "10.0.0.1:8000", "--queue-capacity", "-1"},
		tooManyEndpoints(), // more than the slots: one would be dropped, not the last
	} {
		t.Setenv("KUBERNETES_SERVICE_HOST", "")
		if _, _, _, code, ok := eppConfig(bad, io.Discard); ok || code != 2 {
			t.Errorf("%q: ok %v, status %d; want refused with 2", bad, ok, code)
		}
	}

	// A refused setting names its flag, and reads once: no sentinel's
	// "invalid ... configuration" after the reason.
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--endpoint", "10.0.0.1:8000"}, "give --model"},
		{[]string{"--model", "m", "--endpoint", "10.0.0.1:8000", "--policy", "kv-aware"}, `--policy: cannot use routing policy "kv-aware": want one of`},
		{[]string{"--model", "m", "--endpoint", "10.0.0.1:8000", "--block-size", "-1"}, "cannot use --block-size -1"},
	} {
		var stderr bytes.Buffer
		eppConfig(tc.args, &stderr)
		if msg := stderr.String(); !strings.Contains(msg, tc.says) || strings.Contains(msg, "invalid") {
			t.Errorf("%q: %q; want it to say %q, and not that it is invalid", tc.args, msg, tc.says)
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

// TestEPPMemoryLimit: the picker's soft memory limit counts its body
// budget and both of its heap indexes, as serve's counts its own.
func TestEPPMemoryLimit(t *testing.T) {
	limit := func(args ...string) int64 {
		t.Helper()
		cfg, _, _, code, ok := eppConfig(append([]string{"--model", "m", "--endpoint", "127.0.0.1:8001"}, args...), io.Discard)
		if !ok {
			t.Fatalf("eppConfig(%q) refused: exit %d", args, code)
		}
		return eppMemoryLimit(cfg)
	}
	base := limit()
	if base <= baselineMemory+epp.DefaultConfig().BodyBudgetBytes {
		t.Fatalf("default limit %d counts no index beyond the baseline and the body budget", base)
	}
	if got := limit("--body-budget-bytes", strconv.FormatInt(2*epp.DefaultConfig().BodyBudgetBytes, 10)); got != base+epp.DefaultConfig().BodyBudgetBytes {
		t.Errorf("twice the body budget: limit %d, want %d", got, base+epp.DefaultConfig().BodyBudgetBytes)
	}
	small, err := radix.RegionSize(radix.Config{Capacity: epp.DefaultConfig().IndexCapacity})
	if err != nil {
		t.Fatal(err)
	}
	large, err := radix.RegionSize(radix.Config{Capacity: 4 * epp.DefaultConfig().IndexCapacity})
	if err != nil {
		t.Fatal(err)
	}
	if got := limit("--index-capacity", strconv.Itoa(4*epp.DefaultConfig().IndexCapacity)); got != base+int64(large-small) {
		t.Errorf("four times the index: limit %d, want %d", got, base+int64(large-small))
	}
}

// TestEPPEnvironment: the picker reads KVFAST_EPP_<FLAG>, and ignores
// kvfast serve's KVFAST_<FLAG> (the container image sets KVFAST_LISTEN
// for the router, which had moved a picker off :9002).
func TestEPPEnvironment(t *testing.T) {
	t.Setenv("KVFAST_LISTEN", "0.0.0.0:8000")
	t.Setenv("KVFAST_ADMIN_LISTEN", "0.0.0.0:8089")
	t.Setenv("KVFAST_EPP_METRICS_LISTEN", "127.0.0.1:9191")
	var stderr bytes.Buffer
	_, o, _, _, ok := eppConfig([]string{"--model", "m", "--endpoint", "10.0.0.1:8000"}, &stderr)
	if !ok {
		t.Fatalf("refused: %s", stderr.String())
	}
	if o.listeners.GRPC != ":9002" || o.listeners.Metrics != "127.0.0.1:9191" {
		t.Errorf("listen %q, metrics %q: want the default and KVFAST_EPP_METRICS_LISTEN's", o.listeners.GRPC, o.listeners.Metrics)
	}
	if stderr.Len() != 0 {
		t.Errorf("warned about the router's variables: %s", stderr.String())
	}
	// And the router ignores the picker's.
	t.Setenv("KVFAST_EPP_LISTEN", ":9002")
	stderr.Reset()
	if _, _, ok := serveConfig([]string{"--segment", "none", "--worker", "url=http://127.0.0.1:9001"}, &stderr); !ok || stderr.Len() != 0 {
		t.Errorf("kvfast serve beside KVFAST_EPP_ variables: ok %v, %s", ok, stderr.String())
	}
}

// TestManifestsUseRealFlags: every kvfast container in deploy/kubernetes
// runs a command with flags (and KVFAST_ environment variables) that
// command has, with values it accepts.
func TestManifestsUseRealFlags(t *testing.T) {
	files, err := filepath.Glob("../../deploy/kubernetes/*/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob("../../deploy/kubernetes/*/*/*.yaml")
	files = append(files, more...)
	containers := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range kvfastContainers(string(b)) {
			containers++
			fs := flag.NewFlagSet(c.args[0], flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			prefix := serveEnvPrefix
			switch c.args[0] {
			case "epp":
				cfg, o := epp.DefaultConfig(), eppOptions{}
				bindEPPFlags(fs, &cfg, &o)
				prefix = eppEnvPrefix
			case "serve":
				cfg := node.DefaultConfig()
				var lo logOptions
				var sec securityFiles
				bindServeFlags(fs, &cfg, &lo, &sec)
			default:
				t.Errorf("%s: kvfast %s: not a command the manifests should run", f, c.args[0])
				continue
			}
			if err := fs.Parse(c.args[1:]); err != nil {
				t.Errorf("%s: kvfast %v: %v", f, c.args, err)
			}
			for _, env := range c.env {
				rest, ok := strings.CutPrefix(env, prefix)
				if !ok || prefix == serveEnvPrefix && strings.HasPrefix(env, eppEnvPrefix) {
					t.Errorf("%s: %s is not read by kvfast %s, whose variables start %s", f, env, c.args[0], prefix)
					continue
				}
				name := strings.ReplaceAll(strings.ToLower(rest), "_", "-")
				if fs.Lookup(name) == nil {
					t.Errorf("%s: %s names no flag of kvfast %s", f, env, c.args[0])
				}
			}
		}
	}
	if containers < 4 {
		t.Fatalf("found %d kvfast containers in the manifests, want 4 or more", containers)
	}
}

type container struct{ args, env []string }

// kvfastContainers reads, from a manifest, the args and KVFAST_
// environment variables of each container whose image is kvfast's: the
// list items under "args:" and the "- name: KVFAST_..." under "env:" that
// follow its image line, at the container's indentation.
func kvfastContainers(manifest string) []container {
	var out []container
	lines := strings.Split(manifest, "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != "image: kvfast:latest" {
			continue
		}
		indent := len(l) - len(strings.TrimLeft(l, " "))
		var c container
		section := ""
		for _, m := range lines[i+1:] {
			trimmed := strings.TrimSpace(m)
			ind := len(m) - len(strings.TrimLeft(m, " "))
			if trimmed == "" {
				continue
			}
			if ind < indent || (ind == indent-2 && strings.HasPrefix(trimmed, "- ")) {
				break // the next container, or the end of this one
			}
			if ind == indent {
				section = strings.TrimSuffix(trimmed, ":")
				continue
			}
			switch {
			case section == "args" && strings.HasPrefix(trimmed, "- "):
				c.args = append(c.args, strings.TrimPrefix(trimmed, "- "))
			case section == "env" && strings.HasPrefix(trimmed, "- name: KVFAST_"):
				c.env = append(c.env, strings.TrimPrefix(trimmed, "- name: "))
			}
		}
		if len(c.args) > 0 {
			out = append(out, c)
		}
	}
	return out
}

// tooManyEndpoints is epp's flags with one --endpoint more than the
// picker has slots.
func tooManyEndpoints() []string {
	args := []string{"--model", "m"}
	for i := range workers.Max + 1 {
		args = append(args, "--endpoint", fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250+1))
	}
	return args
}
