package demotok

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvfast/kvfast/benchmarks/replay"
	"github.com/kvfast/kvfast/tokenizer"
)

var update = flag.Bool("update", false, "rewrite files/ with what testdata/train/train.mjs makes")

// missingReference skips the test, or fails it in CI, where the reference
// must be installed (scripts/setup-test-deps.sh does it).
func missingReference(t *testing.T, what string) {
	t.Helper()
	msg := what + " is missing; run scripts/setup-test-deps.sh"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// writeCorpus writes the training text: stretches of the replay's chat
// workload, one per line, so that every word of its vocabulary is seen
// both inside a line and at the start of one (as it starts a message),
// and the role names of the chat template.
func writeCorpus(t *testing.T, path string) {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	synth := replay.ChatSynth{}
	var line []byte
	for id := range uint64(8000) {
		line = append(synth.AppendText(line[:0], id, 16), '\n')
		w.Write(line)
	}
	for range 8 {
		w.WriteString("system\nuser\nassistant\n")
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestFilesRegenerate trains the tokenizer again with the pinned Hugging
// Face tokenizers and checks that the files compiled in are exactly what
// it makes; with -update, it rewrites them instead.
func TestFilesRegenerate(t *testing.T) {
	dir := filepath.Join("testdata", "train")
	if _, err := exec.LookPath("node"); err != nil {
		missingReference(t, "Node.js")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "tokenizers", "package.json")); err != nil {
		missingReference(t, "the tokenizers npm package in "+dir)
	}
	corpus := filepath.Join(t.TempDir(), "corpus.txt")
	writeCorpus(t, corpus)
	out := t.TempDir()
	cmd := exec.Command("node", "train.mjs", corpus, out)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("train.mjs: %v\n%s", err, stderr.Bytes())
	}
	for name, embedded := range map[string][]byte{"tokenizer.json": tokenizerJSON, "tokenizer_config.json": tokenizerConfigJSON} {
		made, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		if *update {
			if err := os.WriteFile(filepath.Join("files", name), made, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if !bytes.Equal(made, embedded) {
			t.Errorf("files/%s is not what train.mjs makes (%d bytes, not %d); rerun with -update if the change is meant", name, len(made), len(embedded))
		}
	}
}

// referenceEncode encodes texts with Hugging Face's tokenizers on the
// embedded files.
func referenceEncode(t *testing.T, texts []string, addSpecial bool) [][]uint32 {
	t.Helper()
	dir := filepath.Join("testdata", "train")
	if _, err := exec.LookPath("node"); err != nil {
		missingReference(t, "Node.js")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "tokenizers", "package.json")); err != nil {
		missingReference(t, "the tokenizers npm package in "+dir)
	}
	files := t.TempDir()
	if err := WriteDir(files); err != nil {
		t.Fatal(err)
	}
	in, err := json.Marshal(map[string]any{"texts": texts, "add_special": addSpecial})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", "encode.mjs", filepath.Join(files, "tokenizer.json"))
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("encode.mjs: %v\n%s", err, stderr.Bytes())
	}
	var res struct{ IDs [][]uint32 }
	if err := json.Unmarshal(out, &res); err != nil || len(res.IDs) != len(texts) {
		t.Fatalf("encode.mjs answered %s: %v", out, err)
	}
	return res.IDs
}

// TestBuiltinTokenizerMatchesReference: the built-in tokenizer (package
// tokenizer) encodes the demo's traffic, chat renderings and completions
// prompts with and without special tokens, as Hugging Face's does, and
// spends a token per word of the workload's text.
func TestBuiltinTokenizerMatchesReference(t *testing.T) {
	files := t.TempDir()
	if err := WriteDir(files); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(files)
	if err != nil {
		t.Fatal(err)
	}
	synth := replay.ChatSynth{Seed: 5}
	workload := string(synth.AppendText(nil, 77, 300))
	texts := []string{
		workload,
		"<|startoftext|><|im_start|>system\n" + workload + "<|im_end|>\n<|im_start|>user\nwhat is a block?<|im_end|>\n<|im_start|>assistant\n",
		"<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nThe cache, the prefix and 12345 tokens: café, 東京, 🙂\t\n\n  end",
		" the of and to in is that cache block prefill",
		"",
	}
	for _, addSpecial := range []bool{false, true} {
		want := referenceEncode(t, texts, addSpecial)
		for i, text := range texts {
			if got := tok.Encode(nil, []byte(text), addSpecial); !slices.Equal(got, want[i]) {
				t.Errorf("text %d, special tokens %v: built-in %v, reference %v", i, addSpecial, got, want[i])
			}
		}
	}
	if n := len(tok.Encode(nil, []byte(workload), false)); n != 300 {
		t.Errorf("300 words of the workload's text are %d tokens, want 300", n)
	}
}

// TestFiles: the files are small, and say what the doc says they say.
func TestFiles(t *testing.T) {
	if n := len(tokenizerJSON) + len(tokenizerConfigJSON); n > 300<<10 {
		t.Errorf("the files take %d bytes; keep them under 300 KB", n)
	}
	var tok struct {
		AddedTokens []struct {
			ID      uint32 `json:"id"`
			Content string `json:"content"`
			Special bool   `json:"special"`
		} `json:"added_tokens"`
		Model struct {
			Type   string            `json:"type"`
			Vocab  map[string]uint32 `json:"vocab"`
			Merges [][2]string       `json:"merges"`
		} `json:"model"`
	}
	if err := json.Unmarshal(tokenizerJSON, &tok); err != nil {
		t.Fatal(err)
	}
	if tok.Model.Type != "BPE" || len(tok.Model.Merges) < 1000 || len(tok.Model.Merges) > 9999 || len(tok.Model.Vocab) < 256+len(tok.Model.Merges)/2 {
		t.Errorf("a %s model of %d tokens and %d merges; want byte-level BPE with a few thousand merges", tok.Model.Type, len(tok.Model.Vocab), len(tok.Model.Merges))
	}
	var cfg struct {
		BOS          string `json:"bos_token"`
		EOS          string `json:"eos_token"`
		ChatTemplate string `json:"chat_template"`
	}
	if err := json.Unmarshal(tokenizerConfigJSON, &cfg); err != nil {
		t.Fatal(err)
	}
	specials := map[string]bool{}
	for _, a := range tok.AddedTokens {
		specials[a.Content] = a.Special && int(a.ID) >= len(tok.Model.Vocab)
	}
	for _, s := range []string{cfg.BOS, cfg.EOS, "<|im_start|>", "<|im_end|>"} {
		if !specials[s] {
			t.Errorf("%q is not a special token after the vocabulary", s)
		}
	}
	if cfg.ChatTemplate == "" {
		t.Error("no chat template")
	}
}

func TestWriteDir(t *testing.T) {
	dir := t.TempDir()
	if err := WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]byte{"tokenizer.json": tokenizerJSON, "tokenizer_config.json": tokenizerConfigJSON} {
		if got, err := os.ReadFile(filepath.Join(dir, name)); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %v, %d bytes, want %d", name, err, len(got), len(want))
		}
	}
	if err := WriteDir(filepath.Join(dir, "missing")); err == nil {
		t.Error("WriteDir wrote into a directory that does not exist")
	}
}
