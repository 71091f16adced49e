package main

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/benchmarks/demo"
	"github.com/kvfast/kvfast/internal/syncbuf"
)

// writeDemoTrace writes 8 requests 100 ms apart that share their first two
// hash ids and differ in the third.
func writeDemoTrace(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "demo.jsonl")
	var b strings.Builder
	for i := range 8 {
		fmt.Fprintf(&b, `{"timestamp":%d,"input_length":1536,"output_length":3,"hash_ids":[1,2,%d]}`+"\n", 100*i, 10+i)
	}
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestDemoDisaggFlags: --disagg sizes the engines, runs one policy and
// replays at its own load unless the flags name one.
func TestDemoDisaggFlags(t *testing.T) {
	for _, tc := range []struct {
		args        []string
		engines     int
		policies    string
		concurrency int
		speedup     float64
	}{
		{[]string{"--disagg", "2P6D"}, 8, "kv", demo.DisaggConcurrency, 8},
		{[]string{"--disagg", "1P3D", "--engines", "4", "--policies", "round-robin"}, 4, "round-robin", demo.DisaggConcurrency, 8},
		{[]string{"--disagg", "2P6D", "--speedup", "4"}, 8, "kv", 0, 4},
		{[]string{"--disagg", "2P6D", "--concurrency", "16"}, 8, "kv", 16, 8},
		{[]string{"--disagg", "2P6D", "--workload", "chat"}, 8, demo.PolicyKVBuiltin, demo.DisaggConcurrency, 8},
	} {
		var stderr strings.Builder
		o, _, code := parseDemoFlags(tc.args, &stderr)
		if code != -1 || o.Engines != tc.engines || strings.Join(o.Policies, ",") != tc.policies || o.Concurrency != tc.concurrency ||
			o.Speedup != tc.speedup || o.Disagg.Engines() != tc.engines {
			t.Errorf("%q: code %d, %d engines, policies %v, concurrency %d, speedup %v, disagg %v: %s", tc.args, code, o.Engines,
				o.Policies, o.Concurrency, o.Speedup, o.Disagg, stderr.String())
		}
	}
}

// TestDemoUnwritableHTML: an --html path that cannot be created is a
// usage error before the run, not a lost report after it.
func TestDemoUnwritableHTML(t *testing.T) {
	var stderr strings.Builder
	missing := filepath.Join(t.TempDir(), "missing", "r.html")
	if _, _, code := parseDemoFlags([]string{"--html", missing}, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "--html: cannot create "+missing) {
		t.Fatalf("code %d, stderr %q", code, stderr.String())
	}
}

func TestDemoCommand(t *testing.T) {
	trace := writeDemoTrace(t)
	run := func(args ...string) (int, string, string) {
		var out, errOut strings.Builder
		code := demoCommand(context.Background(), args, &out, &errOut, false)
		return code, out.String(), errOut.String()
	}
	tiny := []string{"--trace", trace, "--engines", "2", "--policies", "kv,round-robin", "--block-tokens", "16",
		"--speedup", "5", "--engine-speedup", "inf", "--kv-blocks", "256"}

	t.Run("help", func(t *testing.T) {
		code, _, stderr := run("--help")
		for _, want := range []string{"--policies list", "--block-tokens", "--engine-speedup", "Exit status", "prefill-load-scale auto", "--disagg NPMD", "--concurrency 32"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("help lacks %q", want)
			}
		}
		if code != 0 {
			t.Fatalf("code %d", code)
		}
	})
	t.Run("usage errors", func(t *testing.T) {
		for _, args := range [][]string{
			{"--bogus"}, {"extra"}, {"--engines", "0"}, {"--engines", "65"}, {"--policies", "kv,fastest"},
			{"--speedup", "0"}, {"--speedup", "inf"}, {"--engine-speedup", "-1"}, {"--block-tokens", "0"},
			{"--kv-blocks", "0"}, {"--max-requests", "-1"},
			{"--workload", "images"}, {"--policies", "kv-remote"}, {"--tokenizer", "/some/dir"},
			{"--workload", "chat", "--policies", "kv-local"}, {"--workload", "chat", "--tokenizer", "remote"},
			{"--disagg", "2x"}, {"--disagg", "2P6D", "--engines", "5"}, {"--disagg", "2P6D", "--policies", "kv,approx"},
			{"--trace", filepath.Join(t.TempDir(), "missing.jsonl")},
			// The trace's longest request (48 prompt + 3 output tokens)
			// cannot fit in 3 blocks of 16.
			{"--trace", trace, "--block-tokens", "16", "--kv-blocks", "3"},
		} {
			if code, _, stderr := run(args...); code != 2 || stderr == "" {
				t.Errorf("%q: code %d, stderr %q", args, code, stderr)
			}
		}
	})
	t.Run("text table, targets and HTML report", func(t *testing.T) {
		html := filepath.Join(t.TempDir(), "report.html")
		code, stdout, stderr := run(append(tiny, "--html", html)...)
		if code != 0 {
			t.Fatalf("code %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
		}
		for _, want := range []string{"TTFT p50", "hit rate", "bound", "req/s", "prefilled tok",
			"target", "kv TTFT p50 at least 3x better than round-robin", "HTML report: " + html} {
			if !strings.Contains(stdout, want) {
				t.Errorf("output lacks %q:\n%s", want, stdout)
			}
		}
		rows := map[string]int{} // policy -> table rows naming it (one per table)
		for _, line := range strings.Split(stdout, "\n") {
			if f := strings.Fields(line); len(f) > 1 {
				rows[f[0]]++
			}
		}
		if rows["kv"] != 2 || rows["round-robin"] != 2 {
			t.Errorf("want each policy in both tables:\n%s", stdout)
		}
		page, err := os.ReadFile(html)
		if err != nil {
			t.Fatal(err)
		}
		for d := xml.NewDecoder(strings.NewReader(string(page))); ; {
			if _, err := d.Token(); err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("HTML report not well-formed: %v", err)
			}
		}
		for _, want := range []string{`data-policy="kv"`, `data-policy="round-robin"`} {
			if !strings.Contains(string(page), want) {
				t.Errorf("HTML report lacks %s", want)
			}
		}
	})
	t.Run("interrupt prints what finished", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		html := filepath.Join(t.TempDir(), "report.html")
		var out strings.Builder
		errOut := &cancelOnWrite{cancel: cancel, after: "done in"}
		code := demoCommand(ctx, append(tiny, "--html", html), &out, errOut, false)
		if code != 1 {
			t.Fatalf("code %d, want 1\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
		}
		stdout := out.String()
		if !strings.HasPrefix(stdout, "interrupted:") || !strings.Contains(stdout, "kv ") || strings.Contains(stdout, "round-robin") ||
			strings.Contains(stdout, "\ntarget ") {
			t.Errorf("want kv's results alone, said to be interrupted, no target:\n%s", stdout)
		}
		if _, err := os.Stat(html); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("an interrupted demo wrote its HTML report (%v)", err)
		}
	})
	t.Run("json", func(t *testing.T) {
		code, stdout, stderr := run(append(tiny, "--json", "--html", "", "--max-requests", "6")...)
		if code != 0 {
			t.Fatalf("code %d, stderr %s", code, stderr)
		}
		var out struct {
			Engines  int
			Policies []struct {
				Policy  string
				Summary struct {
					Requests int     `json:"requests"`
					Errors   int     `json:"errors"`
					HitRate  float64 `json:"hit_rate"`
					Workers  map[string]int
				}
				Engines struct {
					PromptTokens uint64 `json:"prompt_tokens"`
				}
			}
			Checks []demo.Check
		}
		if err := json.Unmarshal([]byte(stdout), &out); err != nil {
			t.Fatalf("stdout is not JSON: %v\n%s", err, stdout)
		}
		if out.Engines != 2 || len(out.Policies) != 2 || out.Policies[0].Policy != "kv" || out.Policies[1].Policy != "round-robin" {
			t.Fatalf("JSON %+v", out)
		}
		for _, p := range out.Policies {
			s := p.Summary
			if s.Requests != 6 || s.Errors != 0 || p.Engines.PromptTokens != 6*48 {
				t.Errorf("%s: %+v, engines %+v", p.Policy, s, p.Engines)
			}
			// Each policy ran on its own two fresh engines.
			if len(s.Workers) == 0 || len(s.Workers) > 2 {
				t.Errorf("%s: workers %v", p.Policy, s.Workers)
			}
		}
		// Requests 20 ms apart share 32 of 48 tokens: kv must find them.
		if kv := out.Policies[0].Summary.HitRate; !(kv > 0) {
			t.Errorf("kv hit rate %v: the engines' events did not reach the router", kv)
		}
		if len(out.Checks) != 3 || !strings.Contains(out.Checks[1].Target, "round-robin") || !strings.Contains(out.Checks[2].Target, "pooled-LRU") {
			t.Errorf("checks %+v: want the hit rate, kv against round-robin and against the pooled LRU, no approx", out.Checks)
		}
	})
	t.Run("chat workload", func(t *testing.T) {
		chat := []string{"--trace", trace, "--engines", "2", "--workload", "chat", "--block-tokens", "16",
			"--speedup", "5", "--engine-speedup", "inf", "--kv-blocks", "256", "--json", "--html", ""}
		code, stdout, stderr := run(chat...)
		if code != 0 {
			t.Fatalf("code %d, stderr %s", code, stderr)
		}
		var out struct {
			Workload string
			Policies []struct {
				Policy  string
				Summary struct {
					Requests int     `json:"requests"`
					Errors   int     `json:"errors"`
					HitRate  float64 `json:"hit_rate"`
				}
				Tokenizer *struct {
					Mode     string
					Outcomes *struct{ OK int }
				}
			}
			Checks []demo.Check
		}
		if err := json.Unmarshal([]byte(stdout), &out); err != nil {
			t.Fatalf("stdout is not JSON: %v\n%s", err, stdout)
		}
		if out.Workload != "chat" || len(out.Policies) != 3 {
			t.Fatalf("JSON %+v", out)
		}
		for i, want := range []struct{ policy, mode string }{{"kv-builtin", "builtin"}, {"kv-remote", "remote"}, {"approx", ""}} {
			p := out.Policies[i]
			if p.Policy != want.policy || p.Summary.Requests != 8 || p.Summary.Errors != 0 {
				t.Errorf("policy %d: %+v, want %s with 8 requests and no error", i, p, want.policy)
			}
			switch {
			case want.mode == "" && p.Tokenizer != nil, want.mode != "" && (p.Tokenizer == nil || p.Tokenizer.Mode != want.mode):
				t.Errorf("%s tokenized with %+v, want %q", p.Policy, p.Tokenizer, want.mode)
			case want.mode == "remote" && (p.Tokenizer.Outcomes == nil || p.Tokenizer.Outcomes.OK != 8):
				t.Errorf("%s rendered %+v, want all 8 requests", p.Policy, p.Tokenizer.Outcomes)
			}
			// The conversations share their system prompt and first turn.
			if want.mode != "" && !(p.Summary.HitRate > 0) {
				t.Errorf("%s hit rate %v: the router did not find the engines' blocks", p.Policy, p.Summary.HitRate)
			}
		}
		if len(out.Checks) != 4 {
			t.Errorf("checks %+v: want the bound and approx for each of kv-builtin and kv-remote", out.Checks)
		}
	})
}

// TestDemoQuietLogsErrorsOnly: --quiet leaves the routers' warnings out
// (each run's router starts before its engines and warns of it), unless
// --log-level asks for them.
func TestDemoQuietLogsErrorsOnly(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--quiet"}, "error"},
		{[]string{"--quiet", "--log-level", "info"}, "info"},
		{nil, "warn"},
	} {
		var stderr strings.Builder
		_, out, code := parseDemoFlags(append(c.args, "--html", ""), &stderr)
		if code != -1 || out.logLevel != c.want {
			t.Errorf("%v: exit %d, log level %q; want %q (%s)", c.args, code, out.logLevel, c.want, stderr.String())
		}
	}
}

// TestDemoTokenizerByName: --tokenizer demo names the demo's own
// tokenizer, as kvfast mock and tokenize know it.
func TestDemoTokenizerByName(t *testing.T) {
	var stderr strings.Builder
	o, _, code := parseDemoFlags([]string{"--workload", "chat", "--tokenizer", "demo", "--html", ""}, &stderr)
	if code != -1 || o.Tokenizer != "" {
		t.Fatalf("exit %d, tokenizer %q: %s", code, o.Tokenizer, stderr.String())
	}
}

// cancelOnWrite is a stderr that cancels the run once a line containing
// after has been written to it.
type cancelOnWrite struct {
	syncbuf.Buffer
	cancel context.CancelFunc
	after  string
}

func (w *cancelOnWrite) Write(p []byte) (int, error) {
	if strings.Contains(string(p), w.after) {
		defer w.cancel()
	}
	return w.Buffer.Write(p)
}
