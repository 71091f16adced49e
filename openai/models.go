package openai

import (
	"encoding/json"
	"fmt"
	"io"
)

// ListedModel is one entry of an engine's GET /v1/models answer. vLLM
// lists each LoRA adapter with parent set to its base model and each
// base model with parent null (vllm/entrypoints/openai/serving_models.py,
// show_available_models); SGLang does the same, its adapters' parent
// being its first served model name (its /v1/models handler). OwnedBy tells the two apart: vLLM's ModelCard says
// "vllm", SGLang's "sglang".
type ListedModel struct {
	ID     string
	Parent string // the base model of an adapter; "" for a base model
	// OwnedBy is the server's name for itself ("vllm", "sglang", or
	// anything else: OpenAI's schema leaves it free).
	OwnedBy string
}

// OwnedBySGLang is the owned_by SGLang gives every entry of its list.
const OwnedBySGLang = "sglang"

// ReadModelList reads a GET /v1/models answer, at most limit bytes of it.
func ReadModelList(r io.Reader, limit int64) ([]ListedModel, error) {
	var list struct {
		Data []struct {
			ID      string  `json:"id"`
			Parent  *string `json:"parent"`
			OwnedBy string  `json:"owned_by"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(r, limit)).Decode(&list); err != nil {
		return nil, fmt.Errorf("cannot read the model list: %w", err)
	}
	out := make([]ListedModel, len(list.Data))
	for i, m := range list.Data {
		out[i].ID, out[i].OwnedBy = m.ID, m.OwnedBy
		if m.Parent != nil {
			out[i].Parent = *m.Parent
		}
	}
	return out, nil
}
