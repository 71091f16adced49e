package demotok

import (
	_ "embed"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvfast/kvfast/prompt"
)

// Name is the value of kvfast mock --tokenizer that selects this
// tokenizer.
const Name = "demo"

var (
	//go:embed files/tokenizer.json
	tokenizerJSON []byte
	//go:embed files/tokenizer_config.json
	tokenizerConfigJSON []byte
)

// WriteDir writes tokenizer.json and tokenizer_config.json into dir, which
// must exist.
func WriteDir(dir string) error {
	for name, b := range map[string][]byte{"tokenizer.json": tokenizerJSON, "tokenizer_config.json": tokenizerConfigJSON} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return fmt.Errorf("cannot write the demo tokenizer: %w", err)
		}
	}
	return nil
}

// Open returns the built-in renderer of the demo tokenizer for model (the
// name the engine serves), as prompt.Open builds it from a directory. The
// directory is a temporary one, gone when Open returns: the renderer keeps
// what it loaded.
func Open(model string) (prompt.Renderer, error) {
	dir, err := os.MkdirTemp("", "kvfast-demotok-")
	if err != nil {
		return nil, fmt.Errorf("cannot write the demo tokenizer: %w", err)
	}
	defer os.RemoveAll(dir)
	if err := WriteDir(dir); err != nil {
		return nil, err
	}
	return prompt.Open(model, dir, prompt.DefaultConfig(), 0)
}
