package prompt

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/openai"
)

// tinyDir is a small real tokenizer (testdata/tiny/gen.py writes it): a
// byte-level BPE with ChatML special tokens and a ChatML chat template.
const tinyDir = "testdata/tiny"

func tinyBuiltin(t *testing.T, cacheBytes int64) *Builtin {
	t.Helper()
	files, err := ResolveFiles(Source{Kind: SourceDir, Path: tinyDir})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.PrefixCacheBytes = cacheBytes
	b, err := NewBuiltin("tiny", files, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func builtinTokens(t *testing.T, b *Builtin, api openai.API, body string) []uint32 {
	t.Helper()
	ids, err := b.Tokens(context.Background(), nil, api, []byte(body), parse(t, api, body))
	if err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	return ids
}

// TestBuiltinChat renders and tokenizes a chat request as the engine does.
// The ids are Hugging Face tokenizers' own for the rendered text (see
// testdata/tiny/gen.py; checked with the tokenizers npm package).
func TestBuiltinChat(t *testing.T) {
	body := `{"messages":[{"role":"system","content":"You are the assistant in the system."},` +
		`{"role":"user","content":"hello there"}],"add_generation_prompt":false}`
	want := []uint32{282, 268, 10, 89, 263, 262, 114, 101, 258, 262, 115, 115, 105, 115, 116, 97, 110, 116, 260, 258,
		32, 268, 46, 283, 10, 282, 269, 261, 10, 104, 101, 108, 108, 111, 258, 114, 101, 283, 10}
	for _, cache := range []int64{0, 1 << 20} {
		b := tinyBuiltin(t, cache)
		for range 2 { // the second time from the cache, when there is one
			if got := builtinTokens(t, b, openai.APIChatCompletions, body); !slices.Equal(got, want) {
				t.Fatalf("cache %d: got %v\nwant %v", cache, got, want)
			}
		}
	}
}

// TestBuiltinCachesTurns: the next turn of a conversation reuses the
// segments of the turns before it and tokenizes only what is new, and the
// result is what encoding the whole rendering gives.
func TestBuiltinCachesTurns(t *testing.T) {
	b := tinyBuiltin(t, 1<<20)
	turn1 := `{"messages":[{"role":"system","content":"You are the assistant."},{"role":"user","content":"in the system"}]}`
	turn2 := `{"messages":[{"role":"system","content":"You are the assistant."},{"role":"user","content":"in the system"},` +
		`{"role":"assistant","content":"the user"},{"role":"user","content":"as the system"}]}`
	builtinTokens(t, b, openai.APIChatCompletions, turn1)
	before := b.cache.Stats()
	got := builtinTokens(t, b, openai.APIChatCompletions, turn2)
	after := b.cache.Stats()
	if hits := after.Hits - before.Hits; hits == 0 {
		t.Errorf("the second turn copied no segment from the cache: %+v → %+v", before, after)
	}
	uncached := tinyBuiltin(t, 0)
	if want := builtinTokens(t, uncached, openai.APIChatCompletions, turn2); !slices.Equal(got, want) {
		t.Fatalf("cached %v\nwhole  %v", got, want)
	}
}

// TestBuiltinText: a completions prompt is tokenized with the
// post-processor's tokens unless add_special_tokens is false, and the
// cache does not change the ids.
func TestBuiltinText(t *testing.T) {
	for _, cache := range []int64{0, 1 << 20} {
		b := tinyBuiltin(t, cache)
		plain := builtinTokens(t, b, openai.APICompletions, `{"prompt":"<|im_start|>user\nthe system<|im_end|>"}`)
		want := b.tok.Encode(nil, []byte("<|im_start|>user\nthe system<|im_end|>"), true)
		if !slices.Equal(plain, want) {
			t.Fatalf("cache %d: %v, want %v", cache, plain, want)
		}
		omit := builtinTokens(t, b, openai.APICompletions, `{"prompt":"the\u0020system","add_special_tokens":false}`)
		if want := b.tok.Encode(nil, []byte("the system"), false); !slices.Equal(omit, want) {
			t.Fatalf("cache %d: %v, want %v", cache, omit, want)
		}
	}
}

// TestBuiltinRefusals: what the client got wrong is ErrInvalidRequest (a
// 400); what the renderer cannot do routes approximately, counted.
func TestBuiltinRefusals(t *testing.T) {
	b := tinyBuiltin(t, 1<<20)
	body := `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:,"}}]}]}`
	_, err := b.Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(body), parse(t, openai.APIChatCompletions, body))
	if err == nil || errors.Is(err, ErrInvalidRequest) {
		t.Errorf("media in a string template: %v, want an approximate fallback", err)
	}
	for _, body := range []string{
		`{"messages":[{"role":"user","content":"hi"}],"chat_template":"{{ messages[0].content }}"}`,
		`{"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"chat_template":"{{ 1 }}"}}`,
	} {
		if _, err := b.Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(body), parse(t, openai.APIChatCompletions, body)); !errors.Is(err, ErrOwnTemplate) {
			t.Errorf("%s: %v, want ErrOwnTemplate (the engine would render it, not the model's)", body, err)
		}
	}
	for _, model := range []string{`null`, `""`} { // vLLM: request.chat_template or the model's
		body := `{"messages":[{"role":"user","content":"hi"}],"chat_template":` + model + `}`
		if _, err := b.Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(body), parse(t, openai.APIChatCompletions, body)); err != nil {
			t.Errorf("chat_template %s is the model's template: %v", model, err)
		}
	}
	bad := `{"messages":[{"role":"user","content":7}]}`
	if _, err := b.Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(bad), parse(t, openai.APIChatCompletions, bad)); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("content 7: %v, want ErrInvalidRequest", err)
	}
	files, err := ResolveFiles(Source{Kind: SourceDir, Path: tinyDir})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.MaxRenderBytes = 64
	small, err := NewBuiltin("tiny", files, cfg)
	if err != nil {
		t.Fatal(err)
	}
	big := `{"messages":[{"role":"user","content":"` + strings.Repeat("the system ", 10) + `"}]}`
	if _, err := small.Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(big), parse(t, openai.APIChatCompletions, big)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("a body over the bound: %v, want ErrTooLarge", err)
	}
	var st ModelStatus
	b.status(&st)
	if st.Outcomes == nil || st.Outcomes.Unsupported != 3 || st.Outcomes.Rejected != 1 || st.PrefixCache == nil {
		t.Errorf("status %+v", st)
	}
}

// TestBuiltinUnimplementedCall: a chat template that calls a method chat
// does not implement loads (the log and the model's status say which), its
// requests that never reach the call render exactly, and those that do
// route approximately, counted unsupported, never answered 400.
func TestBuiltinUnimplementedCall(t *testing.T) {
	dir := t.TempDir()
	tok, err := os.ReadFile(filepath.Join(tinyDir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	config := `{"eos_token":"<|im_end|>","tokenizer_class":"PreTrainedTokenizerFast","chat_template":` +
		`"{% if tools %}{{ 'tools:'.ljust(8) }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"}`
	for name, data := range map[string][]byte{"tokenizer.json": tok, "tokenizer_config.json": []byte(config)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := DefaultConfig()
	cfg.Specs = specs(t, "m="+dir)
	var logs strings.Builder
	reg, err := NewRegistry(cfg, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("the template did not load: %v", err)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), ".ljust()") {
		t.Errorf("the log does not name the call:\n%s", logs.String())
	}
	if st := reg.Status(); len(st) != 1 || !st[0].Exact || !strings.Contains(st[0].Reason, ".ljust()") {
		t.Errorf("status %+v, want exact with the call named", st)
	}
	b := reg.Renderer("m").(*Builtin)
	plain := `{"messages":[{"role":"user","content":"hello there"}]}`
	if got, want := builtinTokens(t, b, openai.APIChatCompletions, plain), b.tok.Encode(nil, []byte("hello there"), false); !slices.Equal(got, want) {
		t.Errorf("without tools: %v, want %v", got, want)
	}
	tools := `{"messages":[{"role":"user","content":"hello there"}],"tools":[{"type":"function","function":{"name":"f"}}]}`
	_, err = b.Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(tools), parse(t, openai.APIChatCompletions, tools))
	if err == nil || errors.Is(err, ErrInvalidRequest) {
		t.Errorf("with tools: %v, want an approximate fallback", err)
	}
	if o := b.outcomes.load(); o.OK != 1 || o.Unsupported != 1 || o.Rejected != 0 {
		t.Errorf("outcomes %+v, want one ok and one unsupported", o)
	}
}

// TestBuiltinBudget: a registry's built-in renderers share one budget of
// bytes rendered at once; past it a request is not rendered but refused
// with ErrBusy (routed approximately, counted busy), and a lone request
// larger than the whole budget is still rendered.
func TestBuiltinBudget(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Specs = specs(t, "a="+tinyDir, "b="+tinyDir)
	body := `{"messages":[{"role":"user","content":"hello there"}]}`
	cfg.MaxRenderInFlightBytes = int64(len(body)) + 10
	reg, err := NewRegistry(cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	a, b := reg.Renderer("a").(*Builtin), reg.Renderer("b").(*Builtin)
	if a.budget == nil || a.budget != b.budget {
		t.Fatalf("budgets %p and %p: want one, shared", a.budget, b.budget)
	}
	render := func(rd *Builtin, body string) error {
		_, err := rd.Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(body), parse(t, openai.APIChatCompletions, body))
		return err
	}
	if err := render(b, body); err != nil {
		t.Fatalf("with nothing in flight: %v", err)
	}
	// Another model's prompt of 11 bytes is being rendered.
	if !a.budget.acquire(11) {
		t.Fatal("the empty budget refused 11 bytes")
	}
	if err := render(b, body); !errors.Is(err, ErrBusy) {
		t.Fatalf("over the budget: %v, want ErrBusy", err)
	}
	a.budget.release(11)
	if err := render(b, body); err != nil {
		t.Fatalf("after the other prompt ended: %v", err)
	}
	long := `{"messages":[{"role":"user","content":"` + strings.Repeat("the system ", 20) + `"}]}`
	if err := render(a, long); err != nil {
		t.Fatalf("a lone prompt over the whole budget: %v", err)
	}
	if n := a.budget.inFlight.Load(); n != 0 {
		t.Errorf("%d bytes still held after every call returned", n)
	}
	var st ModelStatus
	b.status(&st)
	if st.Outcomes == nil || st.Outcomes.Busy != 1 || st.Outcomes.OK != 2 {
		t.Errorf("model b's outcomes %+v, want 2 ok and 1 busy", st.Outcomes)
	}
	if o, err := Open("m", tinyDir, DefaultConfig(), 0); err != nil || o.(*Builtin).budget != nil {
		t.Errorf("Open (the mock engine's renderer, which must render every prompt): %v, budget %v", err, o)
	}
}

// TestBuiltinEngineAffixes: a tokenizer class whose transformers
// constructor rebuilds the post-processor (LlamaTokenizerFast, as
// DeepSeek-V3 ships) gets BOS and EOS as add_bos_token and add_eos_token
// say, whatever tokenizer.json's post-processor adds (here nothing): the
// engine's text prompts begin with BOS, and so must the router's.
func TestBuiltinEngineAffixes(t *testing.T) {
	tokJSON, err := os.ReadFile(filepath.Join(tinyDir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	body := `{"prompt":"the system"}`
	plain := builtinTokens(t, tinyBuiltin(t, 0), openai.APICompletions, body)
	bos, eos := uint32(282), uint32(283) // <|im_start|>, <|im_end|> in the tiny vocabulary
	for _, tc := range []struct {
		config string
		want   []uint32
	}{
		{`{"tokenizer_class":"LlamaTokenizerFast","bos_token":"<|im_start|>","eos_token":"<|im_end|>","add_bos_token":true}`, append([]uint32{bos}, plain...)},
		{`{"tokenizer_class":"LlamaTokenizerFast","bos_token":"<|im_start|>","eos_token":"<|im_end|>"}`, append([]uint32{bos}, plain...)}, // add_bos_token defaults to true
		{`{"tokenizer_class":"GemmaTokenizerFast","bos_token":"<|im_start|>","eos_token":"<|im_end|>","add_bos_token":false,"add_eos_token":true}`, append(slices.Clone(plain), eos)},
		{`{"tokenizer_class":"PreTrainedTokenizerFast","bos_token":"<|im_start|>","add_bos_token":true}`, plain}, // tokenizer.json decides
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tokJSON, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(tc.config), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, cache := range []int64{0, 1 << 20} {
			cfg := DefaultConfig()
			cfg.PrefixCacheBytes = cache
			b, err := NewBuiltin("m", Files{Dir: dir}, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := builtinTokens(t, b, openai.APICompletions, body); !slices.Equal(got, tc.want) {
				t.Errorf("%s (cache %d): %v, want %v", tc.config, cache, got, tc.want)
			}
		}
	}
}
