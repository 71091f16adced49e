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
// being its first served model name (its /v1/models handler). OwnedBy
// tells the two apart: vLLM's ModelCard says "vllm", SGLang's "sglang".
type ListedModel struct {
	ID     string
	Parent string // the base model of an adapter; "" for a base model
	// OwnedBy is the server's name for itself ("vllm", "sglang", or
	// anything else: OpenAI's schema leaves it free).
	OwnedBy string
}

// The owned_by vLLM and kvfast's mock engine give every entry of their
// lists (vLLM's ModelCard default; SGLang's is "sglang").
const (
	OwnedByVLLM = "vllm"
	OwnedByMock = "kvfast-mock"
)

// ReadsAdapterSpellings reports whether an engine whose model list says
// ownedBy may take a LoRA adapter in SGLang's spellings, lora_path beside
// the base model or "base:adapter" as the model: every engine but those
// known not to (vLLM ignores lora_path and answers "base:adapter" with
// 404; so does the mock). An unknown owned_by (SGLang's own, or a proxy's
// rewrite of it) may.
func ReadsAdapterSpellings(ownedBy string) bool {
	return ownedBy != OwnedByVLLM && ownedBy != OwnedByMock
}

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
