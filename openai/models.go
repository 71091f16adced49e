package openai

import (
	"encoding/json"
	"fmt"
	"io"
)

// ListedModel is one entry of an engine's GET /v1/models answer. vLLM
// lists each LoRA adapter with parent set to its base model and each
// base model with parent null (vllm/entrypoints/openai/serving_models.py,
// show_available_models); SGLang lists its served model alone.
type ListedModel struct {
	ID     string
	Parent string // the base model of an adapter; "" for a base model
}

// ReadModelList reads a GET /v1/models answer, at most limit bytes of it.
func ReadModelList(r io.Reader, limit int64) ([]ListedModel, error) {
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(r, limit)).Decode(&list); err != nil {
		return nil, fmt.Errorf("cannot read the model list: %w", err)
	}
	out := make([]ListedModel, len(list.Data))
	for i, m := range list.Data {
		out[i].ID = m.ID
		if m.Parent != nil {
			out[i].Parent = *m.Parent
		}
	}
	return out, nil
}
