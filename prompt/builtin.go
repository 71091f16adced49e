package prompt

import (
	"errors"
	"fmt"
)

// The built-in renderer plugs in here: render the chat template from
// files.Config (package chat), tokenize with files.Tokenizer (package
// tokenizer), and cache tokenized prefixes (PrefixCache). Neither package
// is part of this tree yet, so loadBuiltin refuses every model and says
// so; the registry, kvfast tokenize and the HF-cache resolution already
// call it.

// ErrNoBuiltin is why a model configured for the built-in tokenizer is
// refused: this build does not have one yet.
var ErrNoBuiltin = errors.New("this build has no built-in tokenizer yet; use MODEL=remote")

// loadBuiltin returns the built-in renderer of model, from its tokenizer
// files.
func loadBuiltin(model string, files Files) (Renderer, error) {
	return nil, fmt.Errorf("cannot load %s's tokenizer from %s: %w", model, files.Dir, ErrNoBuiltin)
}
