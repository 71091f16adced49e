package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
)

// parseConfig reads the fields of tokenizer_config.json that Config holds.
func parseConfig(b []byte) (Config, error) {
	var c Config
	if len(b) > MaxConfigJSONBytes {
		return c, fmt.Errorf("cannot load tokenizer_config.json: larger than %d bytes", MaxConfigJSONBytes)
	}
	var f struct {
		BOSToken     json.RawMessage `json:"bos_token"`
		EOSToken     json.RawMessage `json:"eos_token"`
		ChatTemplate json.RawMessage `json:"chat_template"`
		AddBOSToken  *bool           `json:"add_bos_token"`
		AddEOSToken  *bool           `json:"add_eos_token"`
		Class        string          `json:"tokenizer_class"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return c, fmt.Errorf("cannot parse tokenizer_config.json: %w", err)
	}
	var err error
	if c.BOSToken, err = tokenText(f.BOSToken); err != nil {
		return c, fmt.Errorf("cannot read tokenizer_config.json bos_token: %w", err)
	}
	if c.EOSToken, err = tokenText(f.EOSToken); err != nil {
		return c, fmt.Errorf("cannot read tokenizer_config.json eos_token: %w", err)
	}
	if c.ChatTemplate, c.ChatTemplates, err = chatTemplates(f.ChatTemplate); err != nil {
		return c, fmt.Errorf("cannot read tokenizer_config.json chat_template: %w", err)
	}
	c.AddBOSToken, c.AddEOSToken, c.TokenizerClass = f.AddBOSToken, f.AddEOSToken, f.Class
	return c, nil
}

// tokenText reads a special token given as a string or as an AddedToken
// object ({"content": ..., ...}); null or absent is "".
func tokenText(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", err
	}
	if obj.Content == nil {
		return "", errors.New("cannot read token: no content")
	}
	return *obj.Content, nil
}

// chatTemplates reads a template given as one string or as a list of
// {"name", "template"}; the default is the one named "default".
func chatTemplates(raw json.RawMessage) (string, map[string]string, error) {
	if isNull(raw) {
		return "", nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil, nil
	}
	var list []struct {
		Name     *string `json:"name"`
		Template *string `json:"template"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", nil, err
	}
	named := make(map[string]string, len(list))
	for _, t := range list {
		if t.Name == nil || t.Template == nil {
			return "", nil, errors.New("cannot read a named template without name or template")
		}
		named[*t.Name] = *t.Template
	}
	return named["default"], named, nil
}
