package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvfast/kvfast/benchmarks/demo"
)

// TestDemoEncodeFlags: --encode runs one policy, kv-remote by default, on
// the multimodal workload, and is refused without it.
func TestDemoEncodeFlags(t *testing.T) {
	var stderr strings.Builder
	o, _, code := parseDemoFlags([]string{"--workload", "multimodal", "--encode", "2E", "--encoder-cache-items", "16", "--images", "64"}, &stderr)
	if code != -1 || strings.Join(o.Policies, ",") != demo.PolicyKVRemote || o.Encode.Encoders != 2 || o.Engines != 8 ||
		o.EncoderCacheItems != 16 || o.Images.Images != 64 {
		t.Fatalf("code %d, policies %v, encode %v, %d engines, %d cached, %d images: %s", code, o.Policies, o.Encode, o.Engines,
			o.EncoderCacheItems, o.Images.Images, stderr.String())
	}
	for _, args := range [][]string{
		{"--encode", "2E"}, {"--workload", "multimodal", "--encode", "x"}, {"--workload", "multimodal", "--encode", "8E"},
		{"--workload", "multimodal", "--policies", "kv-builtin"}, {"--workload", "multimodal", "--image-turn-rate", "2"},
	} {
		var stderr strings.Builder
		if _, _, code := parseDemoFlags(args, &stderr); code != 2 || stderr.Len() == 0 {
			t.Errorf("%q: code %d, stderr %q", args, code, stderr.String())
		}
	}
	var help strings.Builder
	if _, _, code := parseDemoFlags([]string{"--help"}, &help); code != 0 || !strings.Contains(help.String(), "--encode NE") ||
		!strings.Contains(help.String(), "--workload multimodal") {
		t.Errorf("help (code %d) lacks the multimodal workload or --encode", code)
	}
	// A tiny comparison runs end to end.
	p := filepath.Join(t.TempDir(), "mm.jsonl")
	var b strings.Builder
	for i := range 4 {
		fmt.Fprintf(&b, `{"timestamp":%d,"input_length":1536,"output_length":3,"hash_ids":[1,2,%d]}`+"\n", 100*i, 10+i)
	}
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut strings.Builder
	code = demoCommand(context.Background(), []string{"--trace", p, "--workload", "multimodal", "--encode", "1E", "--engines", "2",
		"--image-turn-rate", "1", "--block-tokens", "16", "--engine-speedup", "inf", "--kv-blocks", "256", "--html", "",
		"--segment-dir", t.TempDir()}, &out, &errOut, false)
	if code != 0 || !strings.Contains(out.String(), "encoder hit rate") || !strings.Contains(out.String(), "kv-remote 1E by load") {
		t.Fatalf("code %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
}

// TestReplayMultimodal: kvfast replay --workload multimodal sends chat
// requests with image parts.
func TestReplayMultimodal(t *testing.T) {
	var images, chats atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/v1/chat/completions" {
			chats.Add(1)
		}
		if bytes.Contains(body, []byte(`"type":"image_url"`)) {
			images.Add(1)
		}
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	p := filepath.Join(t.TempDir(), "t.jsonl")
	var b strings.Builder
	for i := range 40 {
		j := 10 + 5*i
		fmt.Fprintf(&b, `{"timestamp":%d,"input_length":3000,"output_length":2,"hash_ids":[1,%d,%d,%d,%d,%d]}`+"\n", i, j, j+1, j+2, j+3, j+4)
	}
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut strings.Builder
	code := replayCommand([]string{"--router", srv.URL, "--trace", p, "--workload", "multimodal", "--speedup", "100",
		"--block-tokens", "4", "--quiet"}, &out, &errOut, false)
	// 200 distinct user turns, one in twenty with an image (the draw is
	// fixed by the seed): some requests carry one, most do not.
	if code != 0 || chats.Load() != 40 || images.Load() == 0 || images.Load() == 40 {
		t.Fatalf("code %d, %d chat requests, %d with images; stderr %s", code, chats.Load(), images.Load(), errOut.String())
	}
}
