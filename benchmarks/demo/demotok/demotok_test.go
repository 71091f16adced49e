package demotok

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kvfast/kvfast/benchmarks/replay"
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
