package main

import (
	"bufio"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// replayStandIn answers completions with two tokens and reports half of
// every prompt as cached, or fails every request with 503.
func replayStandIn(t *testing.T, fail bool) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Prompt []uint32 `json:"prompt"`
		}
		if fail || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.Error(w, "no", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("x-kvfast-worker", "w7")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":null}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"b\",\"finish_reason\":\"length\"}]}\n\n")
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n",
			len(req.Prompt), len(req.Prompt)/2)
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func writeTrace(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "t.jsonl")
	var b strings.Builder
	for i := range 6 {
		fmt.Fprintf(&b, `{"timestamp":%d,"input_length":600,"output_length":2,"hash_ids":[1,%d]}`+"\n", i, i+2)
	}
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReplayCommand(t *testing.T) {
	trace := writeTrace(t)
	run := func(args ...string) (int, string, string) {
		var out, errOut strings.Builder
		code := replayCommand(args, &out, &errOut, false)
		return code, out.String(), errOut.String()
	}
	t.Run("help", func(t *testing.T) {
		code, _, stderr := run("--help")
		if code != 0 || !strings.Contains(stderr, "--speedup factor") || !strings.Contains(stderr, "Exit status") {
			t.Fatalf("code %d, help:\n%s", code, stderr)
		}
	})
	t.Run("usage errors", func(t *testing.T) {
		for _, args := range [][]string{
			{"--bogus"}, {"extra"}, {"--speedup", "0"}, {"--vocab", "0"}, {"--vocab", "1"}, {"--workload", "images"},
			{"--trace", filepath.Join(t.TempDir(), "missing.jsonl")},
			{"--trace", trace, "--trace-block-size", "8"}, // 600 tokens need 75 blocks of 8
			{"--trace", trace, "--max-body-bytes", "1000"},
			{"--trace", "gen:medium"},                          // no such generated trace
			{"--trace", "gen:low", "--trace-block-size", "16"}, // it has its own
		} {
			if code, _, stderr := run(args...); code != 2 || stderr == "" {
				t.Errorf("%q: code %d, stderr %q", args, code, stderr)
			}
		}
	})
	t.Run("a generated trace, as the demo's", func(t *testing.T) {
		open := replayStandIn(t, false)
		code, stdout, stderr := run("--router", open, "--trace", "gen:low", "--max-requests", "3", "--concurrency", "1", "--block-tokens", "4", "--json")
		if code != 0 || !strings.Contains(stdout, `"source": "generated:low"`) {
			t.Fatalf("code %d, stdout %s, stderr %s", code, stdout, stderr)
		}
	})
	t.Run("api key", func(t *testing.T) {
		const key = "s3cret-replay-key"
		open := replayStandIn(t, false)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer "+key {
				http.Error(w, `{"error":{"message":"invalid API key"}}`, http.StatusUnauthorized)
				return
			}
			proxy, err := http.NewRequest(r.Method, open+r.URL.Path, r.Body)
			if err != nil {
				t.Error(err)
				return
			}
			resp, err := http.DefaultClient.Do(proxy)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			w.WriteHeader(resp.StatusCode)
			_, _ = io.Copy(w, resp.Body)
		}))
		t.Cleanup(srv.Close)
		// The router's own --api-key-file, comments and all: its first key
		// is sent.
		keyPath := filepath.Join(t.TempDir(), "key")
		if err := os.WriteFile(keyPath, []byte("# the team's keys\n\n"+key+"\nsk-another\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		args := []string{"--router", srv.URL, "--trace", trace, "--speedup", "100", "--block-tokens", "16"}
		if code, stdout, stderr := run(args...); code != 1 || !strings.Contains(stdout, "HTTP 401") {
			t.Fatalf("without the key: code %d, stdout %s, stderr %s", code, stdout, stderr)
		}
		code, stdout, stderr := run(append(args, "--api-key-file", keyPath)...)
		if code != 0 || strings.Contains(stdout+stderr, key) {
			t.Fatalf("with the key: code %d, stdout %s, stderr %s", code, stdout, stderr)
		}
		if code, _, stderr := run(append(args, "--api-key-file", filepath.Join(t.TempDir(), "none"))...); code != 2 || !strings.Contains(stderr, "cannot read the API key") {
			t.Fatalf("missing key file: code %d, stderr %s", code, stderr)
		}
	})
	t.Run("a router that is no URL is refused before the plan", func(t *testing.T) {
		code, _, stderr := run("--router", "notaurl", "--trace", trace, "--speedup", "100")
		if code != 2 || !strings.Contains(stderr, "--router: router URL") || strings.Contains(stderr, "requests from") {
			t.Fatalf("code %d, stderr %q", code, stderr)
		}
		// host:port without its scheme, either way it fails to parse.
		for _, router := range []string{"127.0.0.1:8080", "localhost:8080"} {
			code, _, stderr := run("--router", router, "--trace", trace, "--speedup", "100")
			if code != 2 || !strings.Contains(stderr, "give its scheme, as in http://"+router) {
				t.Errorf("--router %s: code %d, stderr %q", router, code, stderr)
			}
		}
	})
	t.Run("unwritable output fails before the run", func(t *testing.T) {
		var mu sync.Mutex
		requests := 0
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			requests++
			mu.Unlock()
			http.Error(w, "no", http.StatusServiceUnavailable)
		}))
		t.Cleanup(srv.Close)
		dir := t.TempDir()
		missing := filepath.Join(dir, "missing", "x")
		for _, flagName := range []string{"--html", "--requests-out"} {
			code, _, stderr := run("--router", srv.URL, "--trace", trace, "--speedup", "100", flagName, missing)
			mu.Lock()
			n := requests
			mu.Unlock()
			if code != 2 || n != 0 || !strings.Contains(stderr, flagName+": cannot create "+missing) {
				t.Fatalf("%s: code %d after %d requests, stderr %q", flagName, code, n, stderr)
			}
		}
		// The check leaves no file behind, nor truncates an existing one.
		kept := filepath.Join(dir, "kept.html")
		if err := os.WriteFile(kept, []byte("old"), 0o600); err != nil {
			t.Fatal(err)
		}
		fresh := filepath.Join(dir, "fresh.jsonl")
		if err := checkWritable(kept); err != nil {
			t.Fatal(err)
		}
		if err := checkWritable(fresh); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(kept); err != nil || string(b) != "old" {
			t.Fatalf("existing file now %q, %v", b, err)
		}
		if _, err := os.Stat(fresh); !os.IsNotExist(err) {
			t.Fatalf("checked path left behind: %v", err)
		}
	})
	t.Run("json, html and per-request output", func(t *testing.T) {
		dir := t.TempDir()
		htmlPath, reqPath := filepath.Join(dir, "r.html"), filepath.Join(dir, "r.jsonl")
		code, stdout, stderr := run("--router", replayStandIn(t, false), "--trace", trace, "--max-requests", "5",
			"--speedup", "100", "--block-tokens", "16", "--json", "--html", htmlPath, "--requests-out", reqPath, "--label", "kv")
		if code != 0 {
			t.Fatalf("code %d, stderr %s", code, stderr)
		}
		var sum struct {
			Requests    int            `json:"requests"`
			Errors      int            `json:"errors"`
			HitRate     float64        `json:"hit_rate"`
			BlockTokens int            `json:"block_tokens"`
			Workers     map[string]int `json:"workers"`
			Bound       struct{ Tokens float64 }
		}
		if err := json.Unmarshal([]byte(stdout), &sum); err != nil {
			t.Fatalf("stdout is not JSON: %v\n%s", err, stdout)
		}
		// Prompts are 16 + ceil(88*16/512)=3 tokens; the stand-in caches 19/2 = 9.
		if sum.Requests != 5 || sum.Errors != 0 || sum.HitRate != 9.0/19.0 || sum.BlockTokens != 16 || sum.Workers["w7"] != 5 {
			t.Fatalf("summary %+v", sum)
		}
		if want := 4.0 * 16 / (5 * 19); sum.Bound.Tokens != want {
			t.Fatalf("bound %v, want %v", sum.Bound.Tokens, want)
		}
		f, err := os.Open(reqPath)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		lines := 0
		for sc := bufio.NewScanner(f); sc.Scan(); lines++ {
			var r struct{ Worker string }
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.Worker != "w7" {
				t.Fatalf("request line %q: %v", sc.Text(), err)
			}
		}
		if lines != 5 {
			t.Fatalf("%d request lines, want 5", lines)
		}
		html, err := os.ReadFile(htmlPath)
		if err != nil {
			t.Fatal(err)
		}
		d := xml.NewDecoder(strings.NewReader(string(html)))
		for {
			if _, err := d.Token(); err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("HTML report not well-formed: %v", err)
			}
		}
		if !strings.Contains(string(html), `data-policy="kv"`) {
			t.Fatal("HTML report lacks the labelled CDF")
		}
	})
	t.Run("chat workload", func(t *testing.T) {
		var paths, bodies []string
		var mu sync.Mutex
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var req struct {
				Messages []struct{ Role, Content string } `json:"messages"`
			}
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) == 0 {
				http.Error(w, "no messages", http.StatusBadRequest)
				return
			}
			mu.Lock()
			paths = append(paths, r.URL.Path)
			bodies = append(bodies, req.Messages[len(req.Messages)-1].Role)
			mu.Unlock()
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":\"length\"}]}\n\n")
			fmt.Fprint(w, "data: [DONE]\n\n")
		}))
		t.Cleanup(srv.Close)
		code, stdout, stderr := run("--router", srv.URL, "--trace", trace, "--workload", "chat", "--block-tokens", "8", "--concurrency", "2", "--quiet")
		if code != 0 || !strings.Contains(stdout, "chat, 8 words per hash id") {
			t.Fatalf("code %d, stderr %s, report:\n%s", code, stderr, stdout)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(paths) != 6 || paths[0] != "/v1/chat/completions" || bodies[0] != "user" {
			t.Fatalf("the router got %v, conversations ending with %v", paths, bodies)
		}
	})
	t.Run("untimed trace", func(t *testing.T) {
		untimed := filepath.Join(t.TempDir(), "untimed.jsonl")
		raw, err := os.ReadFile(trace)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(untimed, regexp.MustCompile(`"timestamp":\d+,`).ReplaceAll(raw, nil), 0o600); err != nil {
			t.Fatal(err)
		}
		if code, _, stderr := run("--router", replayStandIn(t, false), "--trace", untimed, "--quiet"); code != 2 || !strings.Contains(stderr, "timestamp is missing") {
			t.Fatalf("timestamp mode: code %d, stderr %s", code, stderr)
		}
		code, stdout, stderr := run("--router", replayStandIn(t, false), "--trace", untimed, "--concurrency", "2", "--quiet")
		if code != 0 || !strings.Contains(stdout, "6 sent, 6 ok") {
			t.Fatalf("at a fixed concurrency: code %d, stderr %s, report:\n%s", code, stderr, stdout)
		}
	})
	t.Run("text report and failures", func(t *testing.T) {
		code, stdout, _ := run("--router", replayStandIn(t, false), "--trace", trace, "--concurrency", "2", "--quiet")
		if code != 0 || !strings.Contains(stdout, "TTFT        p50") || !strings.Contains(stdout, "of the infinite-cache bound") {
			t.Fatalf("code %d, report:\n%s", code, stdout)
		}
		code, stdout, stderr := run("--router", replayStandIn(t, true), "--trace", trace, "--concurrency", "2")
		if code != 1 || !strings.Contains(stdout, "HTTP 503") || !strings.Contains(stderr, "6 of 6 requests failed") {
			t.Fatalf("code %d, stdout %s, stderr %s", code, stdout, stderr)
		}
	})
}
