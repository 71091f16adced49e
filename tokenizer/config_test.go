package tokenizer

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConfigOfRealFiles(t *testing.T) {
	requireReference(t)
	yes, no := true, false
	for _, c := range []struct {
		family, bos, eos string
		template         bool
		addBOS, addEOS   *bool
	}{
		{"llama3", "<|begin_of_text|>", "<|end_of_text|>", true, nil, nil},
		{"qwen3", "", "<|im_end|>", true, &no, nil},
		{"gemma3", "<bos>", "<end_of_turn>", true, &yes, &no},
		{"deepseek_v3", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", true, &yes, &no},
		{"llama2", "<s>", "</s>", false, &yes, &no},
	} {
		cfg := loadFamily(t, nil, c.family).Config()
		if cfg.BOSToken != c.bos || cfg.EOSToken != c.eos {
			t.Errorf("%s: BOS %q EOS %q, want %q %q", c.family, cfg.BOSToken, cfg.EOSToken, c.bos, c.eos)
		}
		if (cfg.ChatTemplate != "") != c.template {
			t.Errorf("%s: chat template %.40q, want one: %v", c.family, cfg.ChatTemplate, c.template)
		}
		if !sameBool(cfg.AddBOSToken, c.addBOS) || !sameBool(cfg.AddEOSToken, c.addEOS) {
			t.Errorf("%s: add_bos_token %v add_eos_token %v, want %v %v", c.family, cfg.AddBOSToken, cfg.AddEOSToken, c.addBOS, c.addEOS)
		}
	}
}

func sameBool(a, b *bool) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func TestConfigNamedTemplatesAndJinjaFile(t *testing.T) {
	const tokJSON = `{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}}`
	cfg := `{"bos_token":null,"eos_token":{"content":"</s>","lstrip":false},
		"chat_template":[{"name":"default","template":"D"},{"name":"tool_use","template":"T"}]}`
	tok, err := New([]byte(tokJSON), []byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	got := tok.Config()
	if got.BOSToken != "" || got.EOSToken != "</s>" || got.ChatTemplate != "D" || got.ChatTemplates["tool_use"] != "T" {
		t.Errorf("Config() = %+v", got)
	}
	if ids := tok.Encode(nil, []byte("abab"), true); len(ids) != 2 || ids[0] != 2 || ids[1] != 2 {
		t.Errorf("Encode(abab) = %v, want [2 2]", ids)
	}

	dir := t.TempDir()
	for name, content := range map[string]string{
		"tokenizer.json":        tokJSON,
		"tokenizer_config.json": cfg,
		"chat_template.jinja":   "J",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tok, err = Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tok.Config().ChatTemplate != "J" {
		t.Errorf("chat_template.jinja should win over the config's template, got %q", tok.Config().ChatTemplate)
	}
}

func TestLoadRefusesWhatItCannotReproduce(t *testing.T) {
	for name, c := range map[string]struct {
		tokJSON, cfg, want string
	}{
		"wordpiece":       {`{"model":{"type":"WordPiece","vocab":{}}}`, "", "unsupported"},
		"dropout":         {`{"model":{"type":"BPE","dropout":0.1,"vocab":{},"merges":[]}}`, "", "unsupported"},
		"unigram-norm":    {`{"normalizer":{"type":"Precompiled","precompiled_charsmap":""},"model":{"type":"BPE","vocab":{},"merges":[]}}`, "", "unsupported"},
		"missing-merge":   {`{"model":{"type":"BPE","vocab":{"a":0},"merges":["a b"]}}`, "", "cannot build BPE"},
		"bad-merge-line":  {`{"model":{"type":"BPE","vocab":{"a":0},"merges":["a b c"]}}`, "", "not two tokens"},
		"version":         {`{"version":"2.0","model":{"type":"BPE","vocab":{},"merges":[]}}`, "", "version"},
		"not-json":        {`{"model":`, "", "cannot parse tokenizer.json"},
		"bad-config":      {`{"model":{"type":"BPE","vocab":{},"merges":[]}}`, `{"bos_token":7}`, "bos_token"},
		"huge-id":         {`{"model":{"type":"BPE","vocab":{"a":4000000000},"merges":[]}}`, "", "above"},
		"template-pair-b": {`{"post_processor":{"type":"TemplateProcessing","single":[{"Sequence":{"id":"B","type_id":0}}],"special_tokens":{}},"model":{"type":"BPE","vocab":{},"merges":[]}}`, "", "unsupported"},
	} {
		var cfg []byte
		if c.cfg != "" {
			cfg = []byte(c.cfg)
		}
		_, err := New([]byte(c.tokJSON), cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "cannot ") {
			t.Errorf("%s: New() error = %v, want a \"cannot …\" error mentioning %q", name, err, c.want)
		}
		if c.want == "unsupported" && !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s: error %v does not wrap ErrUnsupported", name, err)
		}
	}
	if _, err := Load(t.TempDir()); err == nil || !strings.HasPrefix(err.Error(), "cannot load tokenizer") {
		t.Errorf("Load(empty dir) error = %v", err)
	}
}
