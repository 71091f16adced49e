package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvfast/kvfast/benchmarks/demo/demotok"
	"github.com/kvfast/kvfast/internal/syncbuf"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/shm"
)

func TestMockCommand(t *testing.T) {
	t.Run("serves N engines until stopped", func(t *testing.T) {
		var out, errOut syncbuf.Buffer
		stop := make(chan struct{})
		code := make(chan int, 1)
		go func() {
			code <- mockCommand([]string{"--engines", "3", "--listen", "127.0.0.1:0", "--engine-speedup", "inf", "--ranks-as-dp", "--worker-id", "5", "--kv-blocks", "512"}, &out, &errOut, stop)
		}()
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(out.String(), "running") {
			if time.Now().After(deadline) {
				t.Fatalf("no start banner; stderr: %s", errOut.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
		urls := regexp.MustCompile(`http://[0-9.]+:[0-9]+`).FindAllString(out.String(), -1)
		if len(urls) != 3 || urls[0] == urls[1] {
			t.Fatalf("engine URLs %v in %q", urls, out.String())
		}
		for i, want := range []string{"worker=5 rank=0", "worker=5 rank=1", "worker=5 rank=2"} {
			if !strings.Contains(out.String(), want) {
				t.Fatalf("engine %d: %q missing from %q", i, want, out.String())
			}
		}
		for _, u := range urls {
			resp, err := http.Post(u+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"a b c","max_tokens":2}`))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"completion_tokens":2`)) {
				t.Fatalf("%s: %d %s", u, resp.StatusCode, b)
			}
		}
		close(stop)
		if c := <-code; c != 0 {
			t.Fatalf("exit %d; stderr: %s", c, errOut.String())
		}
	})
	t.Run("publishes on ZMQ", func(t *testing.T) {
		var out, errOut syncbuf.Buffer
		stop := make(chan struct{})
		code := make(chan int, 1)
		go func() {
			code <- mockCommand([]string{"--engines", "2", "--listen", "127.0.0.1:0", "--engine-speedup", "inf",
				"--publish", "zmq-sglang", "--zmq-listen", "tcp://127.0.0.1:0", "--zmq-replay", "tcp://127.0.0.1:0",
				"--lora-adapters", "sql, chat", "--host-blocks", "64"}, &out, &errOut, stop)
		}()
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(out.String(), "running") {
			if time.Now().After(deadline) {
				t.Fatalf("no start banner; stderr: %s", errOut.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
		if strings.Count(out.String(), "host=64") != 2 {
			t.Errorf("the banner does not show the CPU tier: %q", out.String())
		}
		m := regexp.MustCompile(`events zmq sglang (tcp://[0-9.]+:[0-9]+) replay (tcp://[0-9.]+:[0-9]+)`).FindAllStringSubmatch(out.String(), -1)
		if len(m) != 2 || m[0][1] == m[1][1] || m[0][2] == m[1][2] || m[0][1] == m[0][2] {
			t.Fatalf("ZMQ endpoints %v in %q", m, out.String())
		}
		u := regexp.MustCompile(`http://[0-9.]+:[0-9]+`).FindString(out.String())
		resp, err := http.Get(u + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !bytes.Contains(b, []byte(`"id":"sql"`)) || !bytes.Contains(b, []byte(`"id":"chat"`)) {
			t.Fatalf("adapters missing from /v1/models: %s", b)
		}
		close(stop)
		if c := <-code; c != 0 {
			t.Fatalf("exit %d; stderr: %s", c, errOut.String())
		}
	})
	t.Run("the demo tokenizer", func(t *testing.T) {
		var out, errOut syncbuf.Buffer
		stop := make(chan struct{})
		code := make(chan int, 1)
		go func() {
			code <- mockCommand([]string{"--listen", "127.0.0.1:0", "--engine-speedup", "inf", "--tokenizer", "demo"}, &out, &errOut, stop)
		}()
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(out.String(), "running") {
			if time.Now().After(deadline) {
				t.Fatalf("no start banner; stderr: %s", errOut.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
		url := regexp.MustCompile(`http://[0-9.]+:[0-9]+`).FindString(out.String())
		if !strings.Contains(out.String(), "tokenizer demo") {
			t.Errorf("the banner does not name the tokenizer: %q", out.String())
		}
		body := `{"model":"mock","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi there"}]}`
		resp, err := http.Post(url+"/v1/chat/completions/render", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			TokenIDs []uint32 `json:"token_ids"`
		}
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("render: status %d, %v", resp.StatusCode, err)
		}
		rd, err := demotok.Open("mock")
		if err != nil {
			t.Fatal(err)
		}
		var req openai.ParsedRequest
		if err := (&openai.Parser{}).Parse([]byte(body), openai.APIChatCompletions, &req); err != nil {
			t.Fatal(err)
		}
		want, err := rd.Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(body), &req)
		if err != nil || !slices.Equal(got.TokenIDs, want) {
			t.Errorf("the engine rendered %v, the demo tokenizer %v (%v)", got.TokenIDs, want, err)
		}
		close(stop)
		if c := <-code; c != 0 {
			t.Fatalf("exit %d; stderr: %s", c, errOut.String())
		}
	})
	t.Run("flags", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			code int
		}{
			{[]string{"--help"}, 0},
			{[]string{"--engines", "0"}, 2},
			{[]string{"--listen", "nocolon"}, 2},
			{[]string{"--listen", "127.0.0.1:x"}, 2},
			{[]string{"--listen", "127.0.0.1:65535", "--engines", "2"}, 2},
			{[]string{"--port", "0"}, 2}, // the listen address carries the port
			{[]string{"extra"}, 2},
			{[]string{"--listen", "127.0.0.1:0", "--block-size", "-3"}, 2},
			{[]string{"--listen", "127.0.0.1:0", "--block-size", "0"}, 2}, // not the library's default, 16
			{[]string{"--listen", "127.0.0.1:0", "--segment", "/nonexistent/kvfast.shm"}, 1},
			{[]string{"--publish", "bogus"}, 2},
			{[]string{"--publish", "shm"}, 2}, // without --segment
			{[]string{"--publish", "zmq", "--segment", "/dev/shm/x"}, 2},
			{[]string{"--publish", "zmq", "--zmq-listen", "udp://127.0.0.1:1"}, 2},
			{[]string{"--publish", "zmq", "--zmq-replay", "tcp://127.0.0.1"}, 2},
			{[]string{"--publish", "zmq", "--zmq-listen", "tcp://127.0.0.1:65535", "--engines", "2"}, 2},
			{[]string{"--listen", "127.0.0.1:0", "--tokenizer", "/nonexistent/tokenizer"}, 1},
			{[]string{"--listen", "127.0.0.1:0", "--tokenizer", "remote"}, 1},
			{[]string{"--sliding-window", "64", "--publish", "zmq-sglang"}, 2},
			{[]string{"--sliding-window", "64", "--segment", "/dev/shm/x"}, 2},
			{[]string{"--sliding-window", "64", "--host-blocks", "8", "--publish", "zmq"}, 2},
			{[]string{"--listen", "127.0.0.1:0", "--host-blocks", "-1"}, 2},
			// Refused, where the runtime's out-of-memory crash ended it;
			// values no engine takes are usage errors like the flags'.
			{[]string{"--listen", "127.0.0.1:0", "--kv-blocks", "2000000000"}, 2},
			{[]string{"--listen", "127.0.0.1:0", "--sliding-window", "64"}, 2}, // no events to name the groups in
			{[]string{"--listen", "127.0.0.1:0", "--publish", "zmq", "--zmq-listen", "tcp://127.0.0.1:0", "--sliding-window", "1"}, 2},
		} {
			var out, errOut syncbuf.Buffer
			stop := make(chan struct{})
			close(stop)
			if got := mockCommand(tc.args, &out, &errOut, stop); got != tc.code {
				t.Errorf("%v: exit %d, want %d; stderr %s", tc.args, got, tc.code, errOut.String())
			}
			if slices.Contains(tc.args, "--block-size") && !strings.Contains(errOut.String(), "kvfast mock: --block-size") {
				t.Errorf("%v: stderr %q does not name --block-size", tc.args, errOut.String())
			}
		}
	})
}

// TestMockWithoutASegment: --segment none is no segment, as kvfast serve
// takes it; it had been taken for a file named "none", which no router
// had created, and the engines failed to start.
func TestMockWithoutASegment(t *testing.T) {
	var out, errOut syncbuf.Buffer
	stop := make(chan struct{})
	code := make(chan int, 1)
	go func() {
		code <- mockCommand([]string{"--segment", "none", "--listen", "127.0.0.1:0", "--engine-speedup", "inf"}, &out, &errOut, stop)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(out.String(), "running") {
		if time.Now().After(deadline) || strings.Contains(errOut.String(), "waiting for a router") {
			close(stop)
			t.Fatalf("--segment none: no start banner; stderr %q, exit %d", errOut.String(), <-code)
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	if c := <-code; c != 0 || strings.Contains(out.String(), "events to none") {
		t.Fatalf("exit %d, stdout %q, stderr %q", c, out.String(), errOut.String())
	}
}

// TestMockRefusesZeroSizes: a size or period of 0 on the command line is
// a mistake (the library reads it as its default, another value than the
// one given), refused before any engine starts.
func TestMockRefusesZeroSizes(t *testing.T) {
	for _, args := range [][]string{
		{"--kv-blocks", "0"}, {"--block-size", "0"}, {"--max-batched-tokens", "0"},
		{"--max-seqs", "0"}, {"--default-max-tokens", "0"}, {"--heartbeat", "0s"},
	} {
		var out, errOut bytes.Buffer
		stopped := make(chan struct{})
		close(stopped) // taken, the engines would stop at once: exit 0, not a hang
		if code := mockCommand(append(args, "--listen", "127.0.0.1:0"), &out, &errOut, stopped); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", args, code, errOut.String())
		}
	}
}

// TestMockWaitsForTheSegment: engines started before their router (the
// README's quick start, pasted) wait for it to create the segment, then
// register; they had exited at once, the router then left with none.
func TestMockWaitsForTheSegment(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seg")
	var out, errOut syncbuf.Buffer
	stop := make(chan struct{})
	code := make(chan int, 1)
	go func() {
		code <- mockCommand([]string{"--segment", path, "--listen", "127.0.0.1:0", "--engine-speedup", "inf"}, &out, &errOut, stop)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(errOut.String(), "waiting for a router to create the segment") {
		if time.Now().After(deadline) {
			close(stop)
			t.Fatalf("no word of waiting; stdout %q, stderr %q, exit %d", out.String(), errOut.String(), <-code)
		}
		time.Sleep(5 * time.Millisecond)
	}
	seg, err := shm.Open(path, shm.Options{Index: radix.Config{Capacity: 1 << 12}})
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	for !strings.Contains(out.String(), "running") {
		if time.Now().After(deadline) {
			close(stop)
			t.Fatalf("no start banner after the segment appeared; stderr %q, exit %d", errOut.String(), <-code)
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	if c := <-code; c != 0 {
		t.Fatalf("exit %d; stderr: %s", c, errOut.String())
	}
}
