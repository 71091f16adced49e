package main

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/node"
	"github.com/kvfast/kvfast/prompt"
	"github.com/kvfast/kvfast/radix"
)

// TestServeConfig: serve's flags bind to node.DefaultConfig, so that no
// flag means the library's default, and each flag lands in its field.
func TestServeConfig(t *testing.T) {
	t.Run("no flags: the defaults", func(t *testing.T) {
		cfg, _, ok := serveConfig(nil, io.Discard)
		if !ok {
			t.Fatal("serve refused no flags")
		}
		want := node.DefaultConfig()
		if cfg.Listen != want.Listen || cfg.Segment != want.Segment || cfg.Policy != want.Policy ||
			*cfg.Sched.Cost != *want.Sched.Cost || !reflect.DeepEqual(cfg.HTTP, want.HTTP) || cfg.AdminListen != want.AdminListen || cfg.ShutdownTimeout != want.ShutdownTimeout ||
			cfg.Dispatch.Timeouts != want.Dispatch.Timeouts || cfg.Dispatch.Health.Interval != want.Dispatch.Health.Interval ||
			cfg.Tokenizers.Timeout != want.Tokenizers.Timeout || cfg.Tokenizers.MaxResponseBytes != want.Tokenizers.MaxResponseBytes ||
			len(cfg.Tokenizers.Specs) != 0 || cfg.Sched.Busy != want.Sched.Busy || cfg.Sched.QueueCapacity != want.Sched.QueueCapacity ||
			cfg.DiscoveryTimeout != want.DiscoveryTimeout || cfg.Tracing != want.Tracing {
			t.Errorf("serve's defaults differ from node.DefaultConfig:\n%+v\n%+v", cfg, want)
		}
	})
	t.Run("flags", func(t *testing.T) {
		cfg, _, ok := serveConfig([]string{"--segment", "none", "--policy", "round-robin", "--prefill-load-scale", "3",
			"--max-retries", "0", "--queue-timeout", "2s", "--max-token-id", "151935",
			"--worker", "url=http://127.0.0.1:9001", "--worker", "url=http://127.0.0.1:9002,id=9",
			"--tokenizer", "Qwen/Qwen3-8B=remote", "--tokenizer", "auto", "--tokenize-timeout", "50ms"}, io.Discard)
		if !ok {
			t.Fatal("serve refused its flags")
		}
		if cfg.Segment.Path != "" || cfg.Policy != "round-robin" || cfg.Sched.Cost.PrefillLoadScale != 3 ||
			cfg.HTTP.MaxRetries != 0 || cfg.HTTP.QueueTimeout != 2*time.Second || cfg.HTTP.MaxTokenID != 151935 {
			t.Errorf("flags not applied: %+v", cfg)
		}
		want := []prompt.Spec{{Model: "Qwen/Qwen3-8B", Source: prompt.Source{Kind: prompt.SourceRemote}}, {Auto: true}}
		if !slices.Equal(cfg.Tokenizers.Specs, want) || cfg.Tokenizers.Timeout != 50*time.Millisecond {
			t.Errorf("tokenizers %+v", cfg.Tokenizers)
		}
		// Repeated --worker flags take consecutive default ids.
		if len(cfg.Static) != 2 || cfg.Static[0].ID != 0 || cfg.Static[1].ID != 9 {
			t.Errorf("static workers %+v", cfg.Static)
		}
	})
	t.Run("the SGLang bootstrap port: none, a number, or the workers' HTTP port", func(t *testing.T) {
		for value, want := range map[string]int{"0": 0, "8998": 8998, "http": fastpath.BootstrapHTTPPort} {
			cfg, _, ok := serveConfig([]string{"--segment", "none", "--disagg", "sglang", "--disagg-bootstrap-port", value}, io.Discard)
			if !ok || cfg.HTTP.Disagg.BootstrapPort != want {
				t.Errorf("--disagg-bootstrap-port %s: ok %v, port %d, want %d", value, ok, cfg.HTTP.Disagg.BootstrapPort, want)
			}
		}
		var stderr strings.Builder
		if _, code, ok := serveConfig([]string{"--disagg-bootstrap-port", "8998x"}, &stderr); ok || code != 2 || !strings.Contains(stderr.String(), "or http") {
			t.Errorf("a bad port: ok %v, status %d, %q", ok, code, stderr.String())
		}
	})
	t.Run("a directory as the segment is a usage error that says what to give", func(t *testing.T) {
		var stderr strings.Builder
		_, code, ok := serveConfig([]string{"--segment", t.TempDir()}, &stderr)
		if ok || code != 2 || !strings.Contains(stderr.String(), "is a directory: give the segment file itself") {
			t.Errorf("--segment DIR: ok %v, status %d, %q", ok, code, stderr.String())
		}
	})
	t.Run("a queue timeout shorter than the session busy unbind is warned about", func(t *testing.T) {
		var stderr strings.Builder
		if _, _, ok := serveConfig([]string{"--segment", "none", "--queue-timeout", "2s", "--session-busy-unbind", "6s"}, &stderr); !ok {
			t.Fatalf("refused: %s", stderr.String())
		}
		if !strings.Contains(stderr.String(), "set --session-busy-unbind at most --queue-timeout") {
			t.Errorf("no warning: %q", stderr.String())
		}
		stderr.Reset()
		serveConfig([]string{"--segment", "none"}, &stderr)
		if strings.Contains(stderr.String(), "session-busy-unbind") {
			t.Errorf("the defaults are warned about: %q", stderr.String())
		}
	})
	t.Run("a misspelled KVFAST_ variable is warned about", func(t *testing.T) {
		t.Setenv("KVFAST_POLICYY", "round-robin")
		t.Setenv("KVFAST_MODEL", "m") // a publisher's, not the router's
		var stderr strings.Builder
		if _, _, ok := serveConfig([]string{"--segment", "none"}, &stderr); !ok {
			t.Fatalf("refused: %s", stderr.String())
		}
		if msg := stderr.String(); !strings.Contains(msg, "variable=KVFAST_POLICYY") || !strings.Contains(msg, "flag=--policyy") || strings.Contains(msg, "KVFAST_MODEL") {
			t.Errorf("stderr:\n%s", msg)
		}
		// A start that fails before there is a log still names it: the
		// misspelling may be why it failed.
		stderr.Reset()
		if _, code, ok := serveConfig([]string{"--segment", "none", "--log-format", "yaml"}, &stderr); ok || code != 2 ||
			!strings.Contains(stderr.String(), "ignoring KVFAST_POLICYY") {
			t.Errorf("a failed start: ok %v, exit %d, stderr:\n%s", ok, code, stderr.String())
		}
		// Otherwise in the log's format: with JSON logs, a JSON line.
		stderr.Reset()
		if _, _, ok := serveConfig([]string{"--segment", "none", "--worker", "url=http://127.0.0.1:9001", "--log-format", "json"}, &stderr); !ok {
			t.Fatalf("refused: %s", stderr.String())
		}
		var line struct{ Level, Msg, Variable string }
		if err := json.Unmarshal([]byte(strings.TrimSpace(stderr.String())), &line); err != nil || line.Level != "WARN" || line.Variable != "KVFAST_POLICYY" {
			t.Errorf("with --log-format json: %v %+v\n%s", err, line, stderr.String())
		}
		// No segment and no --worker: nothing can ever join.
		stderr.Reset()
		if _, _, ok := serveConfig([]string{"--segment", "none"}, &stderr); !ok || !strings.Contains(stderr.String(), "no engine can join this router") {
			t.Errorf("no segment, no worker: ok %v, %s; want a warning that nothing can join", ok, stderr.String())
		}
	})
	t.Run("a bad flag: the error, not the flag list", func(t *testing.T) {
		var stderr strings.Builder
		if _, code, ok := serveConfig([]string{"--no-such-flag"}, &stderr); ok || code != 2 {
			t.Fatalf("a bad flag: ok %v, exit %d", ok, code)
		}
		if msg := stderr.String(); !strings.Contains(msg, "-no-such-flag") || !strings.Contains(msg, "kvfast serve --help") ||
			strings.Contains(msg, "--index-capacity") {
			t.Errorf("stderr:\n%s", msg)
		}
		stderr.Reset()
		if _, code, ok := serveConfig([]string{"--help"}, &stderr); ok || code != 0 || !strings.Contains(stderr.String(), "--index-capacity") {
			t.Errorf("--help: exit %d, stderr:\n%s", code, stderr.String())
		}
	})
	t.Run("a policy it has not", func(t *testing.T) {
		var stderr strings.Builder
		serveConfig([]string{"--segment", "none", "--policy", "kv-aware"}, &stderr)
		if msg := stderr.String(); !strings.Contains(msg, `kvfast serve: --policy: cannot use routing policy "kv-aware": want one of kv,`) ||
			strings.Contains(msg, "invalid") {
			t.Errorf("--policy kv-aware: %q; want the flag named, and the reason read once", msg)
		}
	})
	t.Run("a bad value: what the flag takes", func(t *testing.T) {
		for _, tc := range []struct{ args, says string }{
			{"--queue-timeout 5", "want a duration with its unit"},
			{"--max-body-bytes 32MiB", "want a whole number"},
			{"--busy-decode-fraction x", "want a number"},
			{"--credit-in-flight false", "takes its value after '=', as in --flag=false"},
			{"--credit-in-flight=no", "want true or false"},
			{"--busy-decode-fraction 2", "from 0 (off) to 1"},
			{"--trace-sample-ratio 2", "want 0..1"},
			{"--listen 127.0.0.1", `cannot listen on --listen "127.0.0.1": want host:port`},
			{"--admin-listen 127.0.0.1:99999", "want host:port, a port from 0 to 65535"},
			{"--worker url=http//127.0.0.1:9001", `"http//127.0.0.1" is neither an IP address nor a host name`},
			{"--worker url=http://127.0.0.1:99999", "the port must be a number from 1 to 65535"},
			{"--worker url=http://engine-0.local:0", "the port must be a number from 1 to 65535"},
			{"--session-capacity 0", "cannot use --session-capacity 0: must be 7 to"},
			{"--session-capacity 117440513", "must be 7 to 117440512"},
			{"--listen 127.0.0.1:41500 --admin-listen 127.0.0.1:41500", "they name one port"},
			{"--listen :8000 --admin-listen 127.0.0.1:8000", "they name one port"},
			{"--eject-consecutive -1", "a count of failures"},
			{"--max-token-id -1", "want a whole number from 0 to 4294967295"},
			{"--session-ttl -1s", "cannot use --session-ttl -1s: must not be negative"},
			{"--session-busy-unbind -1s", "cannot use --session-busy-unbind -1s: must not be negative"},
			{"--busy-prefill-tokens -1", "a count of tokens, 0 (off) or more"},
			{"--eject-max-percent 101", "a percentage, 0 (off) to 100"},
		} {
			var stderr strings.Builder
			args := append([]string{"--segment", "none"}, strings.Fields(tc.args)...)
			if _, code, ok := serveConfig(args, &stderr); ok || code != 2 || !strings.Contains(stderr.String(), tc.says) {
				t.Errorf("%s: ok %v, exit %d, %q; want exit 2 saying %q", tc.args, ok, code, stderr.String(), tc.says)
			}
		}
		// A value in range for its type but refused by the part of the
		// router that uses it: the message names the flag the operator
		// typed, not the setting's name inside the code.
		for _, args := range []string{"--stall-after -1s", "--busy-decode-fraction 2", "--busy-prefill-tokens -1", "--eviction-weight -1",
			"--overlap-credit -1", "--temperature -1", "--host-tier-weight 2", "--disk-tier-weight -1", "--block-size 65536",
			"--max-conns 0", "--max-conns-per-ip -1", "--max-retries -1", "--max-body-bytes 0", "--body-budget-bytes 1",
			"--queue-timeout -1s", "--header-timeout 0s", "--read-timeout -1s", "--idle-timeout 0s", "--write-timeout -1s",
			"--session-control-timeout 0s", "--encode-max-items 0", "--encode-max-item-bytes 0", "--encoder-affinity-items -1",
			"--encoder-affinity-ttl -1s", "--disagg fast", "--disagg-min-remote-tokens -1", "--disagg-local-cached-fraction 1.5", "--disagg-local-cached-fraction NaN",
			"--tokenize-timeout 0s", "--tokenize-max-response-bytes 0", "--tokenize-max-bytes 0",
			"--tokenize-inflight-bytes 0", "--tokenize-cache-bytes -1"} {
			var stderr strings.Builder
			fields := strings.Fields(args)
			if _, code, ok := serveConfig(append([]string{"--segment", "none"}, fields...), &stderr); ok || code != 2 || !strings.Contains(stderr.String(), "cannot use "+fields[0]+" ") {
				t.Errorf("%s: ok %v, exit %d, %q; want exit 2 naming %s", args, ok, code, stderr.String(), fields[0])
			}
		}
		t.Setenv("KVFAST_CREDIT_IN_FLIGHT", "no")
		var stderr strings.Builder
		if _, code, ok := serveConfig([]string{"--segment", "none"}, &stderr); ok || code != 2 || !strings.Contains(stderr.String(), "want true or false") {
			t.Errorf("KVFAST_CREDIT_IN_FLIGHT=no: ok %v, exit %d, %q", ok, code, stderr.String())
		}
		// A value that parses but the router refuses names its variable.
		t.Setenv("KVFAST_CREDIT_IN_FLIGHT", "")
		os.Unsetenv("KVFAST_CREDIT_IN_FLIGHT")
		t.Setenv("KVFAST_POLICY", "fastest")
		stderr.Reset()
		if _, code, ok := serveConfig([]string{"--segment", "none"}, &stderr); ok || code != 2 || !strings.Contains(stderr.String(), "set from the environment: KVFAST_POLICY") {
			t.Errorf("KVFAST_POLICY=fastest: ok %v, exit %d, %q; want exit 2 naming the variable", ok, code, stderr.String())
		}
	})
	t.Run("one engine given twice", func(t *testing.T) {
		// Two workers on one engine would split its load accounting: the
		// same URL, however written, is refused unless the ranks differ.
		for _, second := range []string{"url=http://127.0.0.1:9001", "url=HTTP://127.0.0.1:9001/", "url=127.0.0.1:09001,id=7",
			"url=http://127.0.0.1:9001/v1,rank=0"} {
			var stderr strings.Builder
			args := []string{"--segment", "none", "--worker", "url=http://127.0.0.1:9001", "--worker", second}
			if _, code, ok := serveConfig(args, &stderr); ok || code != 2 ||
				!strings.Contains(stderr.String(), "flag --worker: cannot add engine http://127.0.0.1:9001 rank 0 twice: it is --worker number 1 already") {
				t.Errorf("%q: ok %v, code %d, %s; want the repeated --worker refused", args, ok, code, stderr.String())
			}
		}
		for _, args := range [][]string{
			{"--worker", "url=http://127.0.0.1:9001,rank=0", "--worker", "url=http://127.0.0.1:9001,rank=1"},
			{"--worker", "url=http://127.0.0.1:9001", "--worker", "url=http://127.0.0.1:9002"},
			{"--worker", "url=http://127.0.0.1:9001,model=a", "--worker", "url=http://127.0.0.1:9001,model=b"},
		} {
			if _, _, ok := serveConfig(append([]string{"--segment", "none"}, args...), io.Discard); !ok {
				t.Errorf("%q refused", args)
			}
		}
	})
	t.Run("start-up and trust flags", func(t *testing.T) {
		cfg, _, ok := serveConfig([]string{"--allow-foreign-segment", "--discovery-timeout", "3s"}, io.Discard)
		if !ok || !cfg.Segment.AllowForeign || cfg.DiscoveryTimeout != 3*time.Second {
			t.Errorf("flags not applied: ok %v, allow foreign %v, discovery timeout %v", ok, cfg.Segment.AllowForeign, cfg.DiscoveryTimeout)
		}
	})
	t.Run("tracing flags and their environment", func(t *testing.T) {
		if cfg, _, _ := serveConfig(nil, io.Discard); cfg.Tracing.Endpoint != "" {
			t.Errorf("tracing on by default: %+v", cfg.Tracing)
		}
		t.Setenv("KVFAST_OTLP_ENDPOINT", "http://127.0.0.1:4318")
		cfg, _, ok := serveConfig([]string{"--trace-sample-ratio", "0.25", "--otlp-service-name", "router-a"}, io.Discard)
		if !ok || cfg.Tracing.Endpoint != "http://127.0.0.1:4318" || cfg.Tracing.SampleRatio != 0.25 || cfg.Tracing.ServiceName != "router-a" {
			t.Errorf("tracing flags not applied: ok %v, %+v", ok, cfg.Tracing)
		}
	})
	t.Run("help documents the admission defaults", func(t *testing.T) {
		var help strings.Builder
		serveConfig([]string{"--help"}, &help)
		want := node.DefaultConfig().Sched
		for _, s := range []string{"Admission control is on by default", "--allow-foreign-segment",
			"(default " + strconv.FormatInt(want.Busy.PrefillTokens, 10) + ")", "(default " + strconv.FormatFloat(want.Busy.DecodeBlocksFraction, 'g', -1, 64) + ")"} {
			if !strings.Contains(help.String(), s) {
				t.Errorf("--help lacks %q", s)
			}
		}
	})
	t.Run("security files", func(t *testing.T) {
		dir := t.TempDir()
		keys, token := filepath.Join(dir, "keys"), filepath.Join(dir, "token")
		if err := os.WriteFile(keys, []byte("# team a\nkey-a\n\n  key-b  \n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(token, []byte("tok\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, _, ok := serveConfig([]string{"--api-key-file", keys, "--admin-token-file", token, "--engine-api-key-file", token, "--admin-listen", "",
			"--header-timeout", "3s", "--max-conns-per-ip", "7", "--body-budget-bytes", "33554432"}, io.Discard)
		if !ok {
			t.Fatal("serve refused its flags")
		}
		if !slices.Equal(cfg.HTTP.APIKeys, []string{"key-a", "key-b"}) || cfg.HTTP.AdminToken != "tok" || cfg.Dispatch.EngineToken != "tok" || cfg.AdminListen != "" ||
			cfg.HTTP.HeaderTimeout != 3*time.Second || cfg.HTTP.MaxConnsPerIP != 7 || cfg.HTTP.BodyBudgetBytes != 32<<20 {
			t.Errorf("flags not applied: keys %q, token %q, admin %q, %+v", cfg.HTTP.APIKeys, cfg.HTTP.AdminToken, cfg.AdminListen, cfg.HTTP)
		}
		empty := filepath.Join(dir, "empty")
		if err := os.WriteFile(empty, []byte("# nothing\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		twoLines := filepath.Join(dir, "two-lines")
		if err := os.WriteFile(twoLines, []byte("tok-a\ntok-b\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		commented := filepath.Join(dir, "commented")
		if err := os.WriteFile(commented, []byte("# keys\nsk-live-AAA # prod\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"--api-key-file", empty}, {"--admin-token-file", empty + "x"},
			{"--admin-token-file", twoLines}, {"--engine-api-key-file", twoLines}, {"--engine-api-key-file", empty + "x"},
			{"--body-budget-bytes", "1024"}, {"--api-key-file", commented}} {
			var stderr strings.Builder
			if _, code, ok := serveConfig(args, &stderr); ok || code != 2 || strings.Contains(stderr.String(), "AAA") {
				t.Errorf("%q: ok %v, code %d, %q; want exit status 2, no key printed", args, ok, code, stderr.String())
			}
		}
		// The key itself given where its file's path belongs: refused,
		// and not repeated in the error that names the flag's file.
		for _, flag := range []string{"--api-key-file", "--admin-token-file", "--engine-api-key-file"} {
			var stderr strings.Builder
			if _, code, ok := serveConfig([]string{flag, "sk-live-BBB"}, &stderr); ok || code != 2 ||
				strings.Contains(stderr.String(), "BBB") || !strings.Contains(stderr.String(), "no such file") {
				t.Errorf("%s sk-live-BBB: ok %v, code %d, %q; want exit status 2, the file missing, the key not printed", flag, ok, code, stderr.String())
			}
		}
	})
	t.Run("refusals", func(t *testing.T) {
		for _, args := range [][]string{
			{"--bogus"}, {"extra"}, {"--policy", "fastest"}, {"--worker", "model=m"}, {"--max-token-id", "4294967296"},
			{"--block-size", "0"}, {"--block-size", "40000"}, {"--log-level", "loud"}, {"--tokenizer", "remote"}, {"--tokenizer", "m=hf:"},
			{"--tokenizer", "m=remote", "--tokenizer", "m=remote"}, {"--tokenize-timeout", "0s"},
			{"--otlp-endpoint", "collector:4318"}, {"--otlp-endpoint", "http://c:4318", "--trace-sample-ratio", "2"},
		} {
			if _, code, ok := serveConfig(args, io.Discard); ok || code != 2 {
				t.Errorf("%q: ok %v, code %d; want exit status 2", args, ok, code)
			}
		}
		if _, code, ok := serveConfig([]string{"--help"}, io.Discard); ok || code != 0 {
			t.Errorf("--help: ok %v, code %d; want exit status 0", ok, code)
		}
	})
}

// TestServeDemoTokenizer: --tokenizer MODEL=demo gives the router the
// files of the demo tokenizer kvfast mock --tokenizer demo uses, in a
// temporary directory that goes when the router does.
func TestServeDemoTokenizer(t *testing.T) {
	cfg, code, ok := serveConfig([]string{"--segment", "none", "--tokenizer", "mock=demo"}, io.Discard)
	if !ok {
		t.Fatalf("serveConfig: exit %d", code)
	}
	cleanup, err := writeDemoTokenizer(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := cfg.Tokenizers.Specs[0].Source.Path
	if dir == "demo" {
		t.Fatal("the spec still names demo")
	}
	if _, err := prompt.Open("mock", dir, prompt.DefaultConfig(), 0); err != nil {
		t.Fatalf("the written files do not load: %v", err)
	}
	cleanup()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the directory outlived cleanup: %v", err)
	}
}

// TestFlagErrorsSpellTwoDashes: the flag package's errors name a flag with
// one dash; the help and the docs spell it with two, and so do the errors.
func TestFlagErrorsSpellTwoDashes(t *testing.T) {
	for args, want := range map[string]string{
		"--bogus":                 "flag provided but not defined: --bogus",
		"--listen":                "flag needs an argument: --listen",
		"--index-capacity=x":      `invalid value "x" for flag --index-capacity`,
		"--credit-in-flight=many": `invalid boolean value "many" for --credit-in-flight`,
	} {
		var stderr strings.Builder
		if _, code, ok := serveConfig([]string{args}, &stderr); ok || code != 2 || !strings.Contains(stderr.String(), want) {
			t.Errorf("%s: ok %v, code %d, %q; want %q", args, ok, code, stderr.String(), want)
		}
	}
}

// TestWorkerSecretsAreRefusedUnprinted: credentials or a query in a
// --worker URL were accepted and silently dropped (the engine then
// refused the router), and a bad --worker value was printed whole,
// password included, to stderr and the journal. They are refused, and
// no error prints them, from a flag or from KVFAST_WORKER.
func TestWorkerSecretsAreRefusedUnprinted(t *testing.T) {
	for _, v := range []string{
		"url=http://ops:HUNTER2@127.0.0.1:8000,model=m",
		"url=http://127.0.0.1:8000/?api_key=HUNTER2,model=m",
		"url=https://ops:HUNTER2@127.0.0.1:8000,bogus=1",
		"url=http://127.0.0.1:8000,model=m,zmq=tcp://u:HUNTER2@127.0.0.1:5557,bogus=1",
		// A password holding @, /, a comma or a quote; a fragment.
		"url=http://admin:HUN@TER2@10.0.0.1:8000,model=m",
		"url=http://u:HUN/TER2@h:1,model=m",
		`url=http://u:HUN,TER2"x@h:1,model=m`,
		"url=http://h:1/#HUNTER2,model=m",
		// A key the router does not take, which names a secret.
		"url=http://127.0.0.1:8000,model=m,api_key=HUNTER2",
		"url=http://127.0.0.1:8000,model=m,Token=HUNTER2,x=1",
		// Keys no list of secret names holds, a secret cut at a comma,
		// a password without a scheme, a query holding a space.
		"url=http://127.0.0.1:8000,model=m,access_token=HUNTER2",
		"url=http://127.0.0.1:8000,model=m,api_key:HUNTER2",
		"url=http://127.0.0.1:8000,model=m,api_key=HUN,TER2",
		"url=u:HUNTER2@127.0.0.1:8000,model=m",
		"url=http://127.0.0.1:8000/?token=HUN TER2,model=m",
		// A value holding what reads as the rest of the flag's message.
		"url=http://h:1,model=m,x=HUNTER2 for flag -block-size: ",
		// A password holding an unescaped '?' or '#', which ended the
		// authority before its '@' (a review's finds).
		"url=http://user:HUNTER2?x@127.0.0.1:8000,model=m",
		"url=http://user:HUNTER2#x@127.0.0.1:8000,model=m",
		"url=http://127.0.0.1:8000,model=m,zmq=tcp://u:HUNTER2?x@127.0.0.1:5557",
		// A query holding an '@' before a secret (the diff review's find).
		"url=http://127.0.0.1:8000/?user=a@b.c&sig=HUNTER2,model=m",
	} {
		var stderr strings.Builder
		if _, _, ok := serveConfig([]string{"--segment", "none", "--worker", v}, &stderr); ok {
			t.Errorf("--worker %s accepted", v)
		}
		if strings.Contains(stderr.String(), "HUNTER2") || strings.Contains(stderr.String(), "TER2") || !strings.Contains(stderr.String(), "invalid value for flag --worker: ") {
			t.Errorf("--worker %s: %q", v, stderr.String())
		}
		t.Setenv("KVFAST_WORKER", v)
		stderr.Reset()
		if _, _, ok := serveConfig([]string{"--segment", "none"}, &stderr); ok {
			t.Errorf("KVFAST_WORKER=%s accepted", v)
		}
		if strings.Contains(stderr.String(), "HUNTER2") || strings.Contains(stderr.String(), "TER2") || !strings.Contains(stderr.String(), "KVFAST_WORKER") {
			t.Errorf("KVFAST_WORKER=%s: %q", v, stderr.String())
		}
		os.Unsetenv("KVFAST_WORKER")
	}
	// A URL given to a flag of another type, which the flag package
	// quotes whole: a '?' before its last '@' hides everything after the
	// scheme (a password holding it, or a query holding an '@').
	for _, v := range []string{"http://u:HUNTER2?x@h:1", "http://h:1/?user=a@b.c&sig=HUNTER2"} {
		var stderr strings.Builder
		if _, code, ok := serveConfig([]string{"--segment", "none", "--queue-timeout", v}, &stderr); ok || code != 2 || strings.Contains(stderr.String(), "HUNTER2") {
			t.Errorf("--queue-timeout %s: ok %v, code %d, %q", v, ok, code, stderr.String())
		}
	}
	// A URL left after the flags, meant for one.
	for _, arg := range []string{"http://u:HUNTER2@127.0.0.1:1", "u:HUNTER2?x@127.0.0.1:1"} {
		var stderr strings.Builder
		if _, code, ok := serveConfig([]string{"--segment", "none", arg}, &stderr); ok || code != 2 ||
			strings.Contains(stderr.String(), "HUNTER2") || !strings.Contains(stderr.String(), "unexpected argument") {
			t.Errorf("argument %s: ok %v, code %d, %q", arg, ok, code, stderr.String())
		}
	}
	var stderr strings.Builder
	serveConfig([]string{"--segment", "none", "--worker", "url=http://ops:HUNTER2@127.0.0.1:8000,model=m"}, &stderr)
	if !strings.Contains(stderr.String(), "--engine-api-key-file") {
		t.Errorf("the refusal does not say where the key goes: %q", stderr.String())
	}
}

// TestMemoryLimitCountsTheHeapIndex: the soft memory limit covers the
// index when it lives on the heap (--segment none) and the prefix-token
// caches of the models named with --tokenizer. Under the bare limit a
// 16M-block index in memory kept the collector running back to back.
func TestMemoryLimitCountsTheHeapIndex(t *testing.T) {
	limit := func(args ...string) int64 {
		t.Helper()
		cfg, _, ok := serveConfig(args, io.Discard)
		if !ok {
			t.Fatalf("serveConfig(%q) refused", args)
		}
		return memoryLimit(cfg)
	}
	mapped := limit("--index-capacity", "16777216")
	region, err := radix.RegionSize(radix.Config{Capacity: 16777216})
	if err != nil {
		t.Fatal(err)
	}
	if got := limit("--segment", "none", "--index-capacity", "16777216"); got != mapped+int64(region) {
		t.Errorf("index on the heap: limit %d, want %d (mapped) + %d (the index)", got, mapped, region)
	}
	cfg, _, _ := serveConfig(nil, io.Discard)
	dir := t.TempDir()
	if got := limit("--index-capacity", "16777216", "--tokenizer", "a="+dir, "--tokenizer", "b="+dir, "--tokenizer", "c=remote"); got != mapped+2*cfg.Tokenizers.PrefixCacheBytes {
		t.Errorf("two built-in tokenizers and a remote one: limit %d, want %d + 2 prefix caches of %d", got, mapped, cfg.Tokenizers.PrefixCacheBytes)
	}
}

// TestJSONLogDurations: a duration in a JSON log line reads as the flags
// write it, not as integer nanoseconds.
func TestJSONLogDurations(t *testing.T) {
	var b strings.Builder
	log, err := newLogger(&b, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("waiting", "deadline", 30*time.Second)
	if !strings.Contains(b.String(), `"deadline":"30s"`) {
		t.Fatalf("log line %s", b.String())
	}
}

// TestDemoTokenizerIgnoresWorkingDirectory: MODEL=demo is the built-in
// tokenizer wherever serve runs, as for kvfast mock and tokenize; a
// directory named demo there (the repo's benchmarks/ has one) had taken
// its place and failed the start.
func TestDemoTokenizerIgnoresWorkingDirectory(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "demo"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	cfg := node.DefaultConfig()
	cfg.Tokenizers.Specs = []prompt.Spec{{Model: "mock", Source: prompt.Source{Kind: prompt.SourceDir, Path: "demo"}}}
	cleanup, err := writeDemoTokenizer(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	got := cfg.Tokenizers.Specs[0].Source.Path
	if got == "demo" {
		t.Fatal("MODEL=demo left pointing at ./demo")
	}
	if _, err := os.Stat(filepath.Join(got, "tokenizer.json")); err != nil {
		t.Fatalf("the built-in tokenizer's files: %v", err)
	}
}

// TestMemoryLimitSaturates: budgets meant as "no bound" do not wrap the
// soft limit round to a few hundred MiB, or below zero.
func TestMemoryLimitSaturates(t *testing.T) {
	for _, budget := range []string{"9223372036854775807", "4611686018427387904"} {
		cfg, _, ok := serveConfig([]string{"--segment", "none", "--body-budget-bytes", budget, "--response-budget-bytes", budget}, io.Discard)
		if !ok {
			t.Fatalf("budgets of %s refused", budget)
		}
		if got := memoryLimit(cfg); got != math.MaxInt64 {
			t.Errorf("budgets of %s: limit %d, want %d", budget, got, int64(math.MaxInt64))
		}
	}
}

// TestSecretFilesAreBounded: a key file is read only if it is a regular
// file or a pipe, and only up to maxSecretFileBytes. /dev/zero filled
// memory, and a FIFO nobody writes held start-up without a word.
func TestSecretFilesAreBounded(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "token")
	if err := os.WriteFile(good, []byte("sk-good\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, err := readToken("admin token", good); err != nil || tok != "sk-good" {
		t.Fatalf("a regular file: %q, %v", tok, err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, bytes.Repeat([]byte("k"), maxSecretFileBytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readSecretFile("API keys", big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("a file over the bound: %v", err)
	}
	if _, err := readSecretFile("API keys", "/dev/zero"); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("/dev/zero: %v", err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// Nobody writes it: refused as empty, not waited on for ever (the
	// test's own deadline is the bound if that regresses).
	if _, err := readToken("admin token", fifo); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("a FIFO nobody writes: %v", err)
	}
	// A pipe with a writer, as a shell's <(...) gives, is read.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	go func() {
		_, _ = w.WriteString("sk-piped\n")
		w.Close()
	}()
	if tok, err := readToken("admin token", "/dev/fd/"+strconv.Itoa(int(r.Fd()))); err != nil || tok != "sk-piped" {
		t.Errorf("a pipe: %q, %v", tok, err)
	}
}
