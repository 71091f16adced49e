package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/mocker"
)

// TestTokenizeCommand asks a mock engine, as an operator would, for the
// ids of a prompt and of a chat request, and checks they are the ids the
// engine computes.
func TestTokenizeCommand(t *testing.T) {
	e, err := mocker.Start(mocker.Config{Speedup: math.Inf(1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	run := func(stdin string, args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := tokenizeCommand(args, strings.NewReader(stdin), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	ids := func(t *testing.T, out string) []uint32 {
		t.Helper()
		var v []uint32
		if err := json.Unmarshal([]byte(out), &v); err != nil || !strings.HasSuffix(out, "]\n") {
			t.Fatalf("output %q: %v", out, err)
		}
		return v
	}

	code, out, errOut := run("<|system|> be brief <|end|> hello\n", "--tokenizer", e.URL(), "--model", "mock")
	if want := mocker.AppendTextTokens(nil, "<|system|> be brief <|end|> hello"); code != 0 || !slices.Equal(ids(t, out), want) {
		t.Fatalf("prompt: exit %d, %q (%s); want %v", code, out, errOut, want)
	}
	chat := `{"model":"mock","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`
	code, out, errOut = run(chat, "--tokenizer", e.URL(), "--chat")
	want, _ := mocker.AppendChatTokens(nil, []mocker.ChatMessage{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}})
	if code != 0 || !slices.Equal(ids(t, out), want) {
		t.Fatalf("chat: exit %d, %q (%s); want %v", code, out, errOut, want)
	}

	// The built-in tokenizer: the prompt package's small real tokenizer.
	// Its ids for this chat are Hugging Face tokenizers' own (see
	// prompt/testdata/tiny/gen.py and prompt's TestBuiltinChat).
	tiny := filepath.Join("..", "..", "prompt", "testdata", "tiny")
	code, out, errOut = run(`{"messages":[{"role":"system","content":"You are the assistant in the system."},`+
		`{"role":"user","content":"hello there"}],"add_generation_prompt":false}`, "--tokenizer", tiny, "--chat")
	wantTiny := []uint32{282, 268, 10, 89, 263, 262, 114, 101, 258, 262, 115, 115, 105, 115, 116, 97, 110, 116, 260, 258,
		32, 268, 46, 283, 10, 282, 269, 261, 10, 104, 101, 108, 108, 111, 258, 114, 101, 283, 10}
	if code != 0 || !slices.Equal(ids(t, out), wantTiny) {
		t.Fatalf("built-in chat: exit %d, %q (%s); want %v", code, out, errOut, wantTiny)
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(`{}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		stdin string
		args  []string
		code  int
		says  string
	}{
		// An unknown model is not a missing key: no --engine-api-key-file hint.
		{"x", []string{"--tokenizer", e.URL(), "--model", "other"}, 1, "status 404"},
		{"x", []string{"--tokenizer", dir}, 1, "cannot load"},
		{"x", []string{"--tokenizer", filepath.Join(dir, "missing")}, 1, "tokenizer.json"},
		{"", []string{"--tokenizer", e.URL()}, 2, "cannot read the request"},
		{`{"messages":[]}`, []string{"--tokenizer", e.URL(), "--chat"}, 2, "cannot read the request"},
		{"x", nil, 2, "want --tokenizer"},
		{"x", []string{"--tokenizer", e.URL(), "extra"}, 2, "want --tokenizer"},
		{"x", []string{"--tokenizer", e.URL(), "--timeout", "0s"}, 2, "timeout"},
	} {
		code, out, errOut := run(tc.stdin, tc.args...)
		if code != tc.code || out != "" || !strings.Contains(errOut, tc.says) || strings.Contains(errOut, "--engine-api-key-file") {
			t.Errorf("%q < %q: exit %d, stdout %q, stderr %q; want exit %d saying %q, and no hint of an engine key", tc.args, tc.stdin, code, out, errOut, tc.code, tc.says)
		}
	}
}

// TestTokenizeWithEngineKey: an engine started with an API key answers
// kvfast tokenize when given the key's file, and refuses it without.
// TestTokenizeRefusedInputExits2: a chat request the template or the
// chat rules refuse is bad input (exit 2, as the help says), not a failure
// to get the ids (1).
func TestTokenizeRefusedInputExits2(t *testing.T) {
	var out, errOut bytes.Buffer
	bad := `{"model":"m","messages":[{"role":"user","content":"hi"}],"continue_final_message":true,"add_generation_prompt":true}`
	if code := tokenizeCommand([]string{"--tokenizer", "demo", "--chat"}, strings.NewReader(bad), &out, &errOut); code != 2 ||
		!strings.Contains(errOut.String(), "continue_final_message") {
		t.Fatalf("exit %d: %s; want 2 and the reason", code, errOut.String())
	}
}

func TestTokenizeWithEngineKey(t *testing.T) {
	e, err := mocker.Start(mocker.Config{Speedup: math.Inf(1), APIKey: "engine-key"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	key := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(key, []byte("engine-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	chat := `{"model":"mock","messages":[{"role":"user","content":"hi"}]}`
	var out, errOut bytes.Buffer
	if code := tokenizeCommand([]string{"--tokenizer", e.URL(), "--chat", "--engine-api-key-file", key}, strings.NewReader(chat), &out, &errOut); code != 0 {
		t.Errorf("with the key: exit %d: %s", code, errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if code := tokenizeCommand([]string{"--tokenizer", e.URL(), "--chat"}, strings.NewReader(chat), &out, &errOut); code == 0 ||
		!strings.Contains(errOut.String(), "401") || !strings.Contains(errOut.String(), "--engine-api-key-file") {
		t.Errorf("without the key: exit %d: %s; want the engine's 401 and the hint of --engine-api-key-file", code, errOut.String())
	}
	if strings.Contains(errOut.String(), "engine-key") {
		t.Errorf("the error quotes the key: %s", errOut.String())
	}
}
