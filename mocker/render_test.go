package mocker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/kvfast/kvfast/openai"
)

// TestHTTPRender: the render and tokenize endpoints answer in vLLM's shapes
// with exactly the ids the engine computes for the same request, as
// usage.prompt_tokens then confirms.
func TestHTTPRender(t *testing.T) {
	e := startEngine(t, Config{Speedup: math.Inf(1), MaxModelLen: 4096, KVBlocks: 1024})
	chatBody := `{"model":"mock","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi there"}],"max_tokens":3,"stream":true}`
	chatIDs, _ := AppendChatTokens(nil, []ChatMessage{{"system", "be brief"}, {"user", "hi there"}})
	textIDs := AppendTextTokens(nil, "<|system|> be brief <|end|> once upon")

	type generateRequest struct {
		RequestID      string          `json:"request_id"`
		TokenIDs       []uint32        `json:"token_ids"`
		Features       json.RawMessage `json:"features"`
		SamplingParams struct {
			MaxTokens int `json:"max_tokens"`
		} `json:"sampling_params"`
		Model  *string `json:"model"`
		Stream bool    `json:"stream"`
	}
	t.Run("chat render", func(t *testing.T) {
		code, body := do(t, http.MethodPost, e.URL()+"/v1/chat/completions/render", chatBody)
		if code != http.StatusOK {
			t.Fatalf("status %d: %s", code, body)
		}
		var g generateRequest
		if err := json.Unmarshal(body, &g); err != nil {
			t.Fatalf("cannot decode %s: %v", body, err)
		}
		if !slices.Equal(g.TokenIDs, chatIDs) || g.SamplingParams.MaxTokens != 3 || !g.Stream ||
			g.Model == nil || *g.Model != "mock" || string(g.Features) != "null" || g.RequestID == "" {
			t.Fatalf("render answered %s; want token_ids %v", body, chatIDs)
		}
	})
	t.Run("completions render", func(t *testing.T) {
		code, body := do(t, http.MethodPost, e.URL()+"/v1/completions/render", `{"prompt":"<|system|> be brief <|end|> once upon"}`)
		if code != http.StatusOK {
			t.Fatalf("status %d: %s", code, body)
		}
		var gs []generateRequest
		if err := json.Unmarshal(body, &gs); err != nil {
			t.Fatalf("cannot decode %s: %v", body, err)
		}
		if len(gs) != 1 || !slices.Equal(gs[0].TokenIDs, textIDs) || gs[0].Model != nil || gs[0].SamplingParams.MaxTokens != DefaultMaxTokens {
			t.Fatalf("render answered %s; want one prompt of %v", body, textIDs)
		}
	})
	t.Run("tokenize", func(t *testing.T) {
		type tokenizeResponse struct {
			Count       int      `json:"count"`
			MaxModelLen int      `json:"max_model_len"`
			Tokens      []uint32 `json:"tokens"`
		}
		for _, tc := range []struct {
			body string
			want []uint32
		}{
			{`{"model":"mock","prompt":"<|system|> be brief <|end|> once upon","add_special_tokens":true}`, textIDs},
			{`{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"},{"type":"text","text":"there"}]}],"add_generation_prompt":true}`, chatIDs},
		} {
			code, body := do(t, http.MethodPost, e.URL()+"/tokenize", tc.body)
			if code != http.StatusOK {
				t.Fatalf("%s: status %d: %s", tc.body, code, body)
			}
			var r tokenizeResponse
			if err := json.Unmarshal(body, &r); err != nil {
				t.Fatalf("cannot decode %s: %v", body, err)
			}
			if !slices.Equal(r.Tokens, tc.want) || r.Count != len(tc.want) || r.MaxModelLen != 4096 {
				t.Fatalf("%s: tokenize answered %s; want %v", tc.body, body, tc.want)
			}
		}
	})
	t.Run("refusals", func(t *testing.T) {
		for _, tc := range []struct {
			path, body string
			status     int
		}{
			{"/v1/chat/completions/render", `{"model":"other","messages":[{"role":"user","content":"x"}]}`, http.StatusNotFound},
			{"/v1/chat/completions/render", `{"messages":[{"role":"robot","content":"x"}]}`, http.StatusBadRequest},
			{"/v1/completions/render", `{"prompt":"x","max_tokens":5000}`, http.StatusBadRequest},
			{"/tokenize", `{"prompt":[1,2]}`, http.StatusBadRequest},
			{"/tokenize", `{"prompt":"x","messages":[{"role":"user","content":"x"}]}`, http.StatusBadRequest},
			{"/tokenize", `{"model":"other","prompt":"x"}`, http.StatusNotFound},
			{"/tokenize", `not json`, http.StatusBadRequest},
		} {
			code, body := do(t, http.MethodPost, e.URL()+tc.path, tc.body)
			if code != tc.status {
				t.Errorf("%s %s: status %d, want %d: %s", tc.path, tc.body, code, tc.status, body)
			}
			var eb struct {
				Error *struct{ Message string } `json:"error"`
			}
			if err := json.Unmarshal(body, &eb); err != nil || eb.Error == nil {
				t.Errorf("%s %s: not an OpenAI error body: %s", tc.path, tc.body, body)
			}
		}
		if code, _ := do(t, http.MethodGet, e.URL()+"/tokenize", ""); code != http.StatusMethodNotAllowed {
			t.Errorf("GET /tokenize: status %d", code)
		}
	})
	t.Run("the ids rendered are the ids computed", func(t *testing.T) {
		code, body := do(t, http.MethodPost, e.URL()+"/v1/chat/completions", `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi there"}],"max_tokens":3}`)
		if code != http.StatusOK {
			t.Fatalf("status %d: %s", code, body)
		}
		if r := decode(t, body); r.Usage == nil || r.Usage.PromptTokens != len(chatIDs) {
			t.Fatalf("the engine computed a prompt other than the %d ids rendered: %s", len(chatIDs), body)
		}
	})
}

// TestHTTPRenderDisabled: an engine configured without the render
// endpoints answers them as a vLLM release before them does, and still
// tokenizes.
func TestHTTPRenderDisabled(t *testing.T) {
	e := startEngine(t, Config{Speedup: math.Inf(1), DisableRender: true})
	for _, p := range []string{"/v1/chat/completions/render", "/v1/completions/render"} {
		code, body := do(t, http.MethodPost, e.URL()+p, `{"prompt":"x","messages":[{"role":"user","content":"x"}]}`)
		if code != http.StatusNotFound || string(body) != `{"detail":"Not Found"}` {
			t.Errorf("%s: status %d: %s", p, code, body)
		}
	}
	if code, body := do(t, http.MethodPost, e.URL()+"/tokenize", `{"prompt":"a b"}`); code != http.StatusOK {
		t.Errorf("/tokenize: status %d: %s", code, body)
	}
}

// byteRenderer is a Renderer unlike the toy tokenizer: a text prompt is
// one id per byte of its decoded text, from 1000; a chat prompt one id per
// byte of its raw messages array, from 2000. A prompt holding "refuse" is
// refused.
type byteRenderer struct{ calls atomic.Int64 }

func (b *byteRenderer) Tokens(_ context.Context, dst []uint32, api openai.API, _ []byte, r *openai.ParsedRequest) ([]uint32, error) {
	b.calls.Add(1)
	src, base := r.AppendText(nil), uint32(1000)
	if api == openai.APIChatCompletions {
		src, base = r.Messages, 2000
	}
	if bytes.Contains(src, []byte("refuse")) {
		return dst, errors.New("the template refuses this")
	}
	for _, c := range src {
		dst = append(dst, base+uint32(c))
	}
	return dst, nil
}

func byteIDs(s string, base uint32) []uint32 {
	var ids []uint32
	for _, c := range []byte(s) {
		ids = append(ids, base+uint32(c))
	}
	return ids
}

// TestHTTPRenderer: an engine with a Renderer computes, caches, renders
// and tokenizes text and chat prompts with it, not with the toy tokenizer;
// token-id prompts bypass it; a prompt it refuses is the client's error.
func TestHTTPRenderer(t *testing.T) {
	rd := &byteRenderer{}
	e := startEngine(t, Config{Speedup: math.Inf(1), BlockSize: 4, KVBlocks: 1024, Renderer: rd})
	const text = "abcdefgh ijklmnop"
	const messages = `[{"role":"user","content":"hi"}]`
	textIDs, chatIDs := byteIDs(text, 1000), byteIDs(messages, 2000)
	ids := func(path, body string) []uint32 {
		t.Helper()
		code, b := do(t, http.MethodPost, e.URL()+path, body)
		if code != http.StatusOK {
			t.Fatalf("%s %s: status %d: %s", path, body, code, b)
		}
		var out struct {
			TokenIDs []uint32 `json:"token_ids"`
			Tokens   []uint32 `json:"tokens"`
		}
		if b[0] == '[' {
			b = b[1 : len(b)-1]
		}
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("cannot decode %s: %v", b, err)
		}
		return append(out.TokenIDs, out.Tokens...)
	}
	for _, tc := range []struct {
		path, body string
		want       []uint32
	}{
		{"/v1/completions/render", `{"prompt":"` + text + `"}`, textIDs},
		{"/v1/completions/render", `{"prompt":["` + text + `"]}`, textIDs},
		{"/v1/chat/completions/render", `{"messages":` + messages + `}`, chatIDs},
		{"/tokenize", `{"prompt":"` + text + `"}`, textIDs},
		{"/tokenize", `{"messages":` + messages + `}`, chatIDs},
		{"/v1/completions/render", `{"prompt":[7,8,9]}`, []uint32{7, 8, 9}},
	} {
		if got := ids(tc.path, tc.body); !slices.Equal(got, tc.want) {
			t.Errorf("%s %s: ids %v, want %v", tc.path, tc.body, got, tc.want)
		}
	}

	// Generation computes the same ids, and caches them: a second prompt
	// sharing the first 12 bytes finds 3 blocks of 4.
	for i, tc := range []struct {
		path, body     string
		prompt, cached int
	}{
		{"/v1/completions", `{"prompt":"` + text + `","max_tokens":2}`, len(textIDs), 0},
		{"/v1/completions", `{"prompt":"abcdefgh ijkXYZ","max_tokens":2}`, 15, 12},
		{"/v1/chat/completions", `{"messages":` + messages + `,"max_tokens":2}`, len(chatIDs), 0},
	} {
		code, b := do(t, http.MethodPost, e.URL()+tc.path, tc.body)
		if code != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, code, b)
		}
		u := decode(t, b).Usage
		if u == nil || u.PromptTokens != tc.prompt || u.PromptTokensDetails.CachedTokens != tc.cached {
			t.Errorf("request %d: usage %+v, want %d prompt tokens, %d cached", i, u, tc.prompt, tc.cached)
		}
	}

	before := rd.calls.Load()
	if code, b := do(t, http.MethodPost, e.URL()+"/v1/completions", `{"prompt":[1,2,3,4,5],"max_tokens":1}`); code != http.StatusOK {
		t.Fatalf("token-id prompt: status %d: %s", code, b)
	}
	if rd.calls.Load() != before {
		t.Error("a token-id prompt went through the renderer")
	}
	for _, tc := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt":"please refuse"}`},
		{"/v1/chat/completions/render", `{"messages":[{"role":"user","content":"refuse"}]}`},
		{"/tokenize", `{"prompt":"refuse"}`},
		{"/v1/chat/completions", `{"messages":"not an array"}`},
	} {
		code, b := do(t, http.MethodPost, e.URL()+tc.path, tc.body)
		if code != http.StatusBadRequest || decode(t, b).Error == nil {
			t.Errorf("%s %s: status %d, want 400 with an error body: %s", tc.path, tc.body, code, b)
		}
	}
}
