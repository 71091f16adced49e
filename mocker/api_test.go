package mocker

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestParseRequest(t *testing.T) {
	words := func(s string) []uint32 { return AppendTextTokens(nil, s) }
	chat := func(msgs ...ChatMessage) []uint32 {
		out, err := AppendChatTokens(nil, msgs)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	cases := []struct {
		name      string
		chat      bool
		body      string
		tokens    []uint32
		maxTokens int
		stream    bool
		usage     bool
		errParam  string // "-" for an error with a null param
	}{
		{name: "token ids", body: `{"model":"m","prompt":[1, 2 ,3],"max_tokens":5}`, tokens: []uint32{1, 2, 3}, maxTokens: 5},
		{name: "max uint32 id", body: `{"prompt":[4294967295]}`, tokens: []uint32{4294967295}, maxTokens: -1},
		{name: "integral float ids", body: `{"prompt":[1e3,2.0,-0]}`, tokens: []uint32{1000, 2, 0}, maxTokens: -1}, // pydantic's lax int, as vLLM reads them
		{name: "text", body: `{"prompt":"hello  big\nworld"}`, tokens: words("hello big world"), maxTokens: -1},
		{name: "batch of one text", body: `{"prompt":["a b"]}`, tokens: words("a b"), maxTokens: -1},
		{name: "batch of one ids", body: `{"prompt":[[7,8]]}`, tokens: []uint32{7, 8}, maxTokens: -1},
		{name: "stream with usage", body: `{"prompt":[1],"stream":true,"stream_options":{"include_usage":true}}`, tokens: []uint32{1}, maxTokens: -1, stream: true, usage: true},
		{name: "ignored fields", body: `{"prompt":[1],"temperature":0,"stop":["x"],"logprobs":null,"n":1,"extra":{"a":[1]}}`, tokens: []uint32{1}, maxTokens: -1},
		{name: "chat string", chat: true, body: `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"max_tokens":3}`,
			tokens: chat(ChatMessage{"system", "be brief"}, ChatMessage{"user", "hi"}), maxTokens: 3},
		{name: "chat parts and max_completion_tokens", chat: true, body: `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"max_tokens":9,"max_completion_tokens":4}`,
			tokens: chat(ChatMessage{"user", "a b"}), maxTokens: 4},
		{name: "chat null content", chat: true, body: `{"messages":[{"role":"assistant","content":null},{"role":"user","content":"x"}]}`,
			tokens: chat(ChatMessage{"assistant", ""}, ChatMessage{"user", "x"}), maxTokens: -1},

		{name: "not json", body: `{"prompt":[1,2`, errParam: "-"},
		{name: "wrong type", body: `{"prompt":[1],"max_tokens":"many"}`, errParam: "max_tokens"},
		{name: "lax scalars", body: `{"prompt":[1],"max_tokens":"5","n":"1","stream":"true"}`, tokens: []uint32{1}, maxTokens: 5, stream: true}, // as vLLM (pydantic, lax) reads them
		{name: "integral float max_tokens", chat: true, body: `{"messages":[{"role":"user","content":"x"}],"max_completion_tokens":1e1}`, tokens: chat(ChatMessage{"user", "x"}), maxTokens: 10},
		{name: "no prompt", body: `{"model":"m"}`, errParam: "prompt"},
		{name: "null prompt", body: `{"prompt":null}`, errParam: "prompt"},
		{name: "empty ids", body: `{"prompt":[]}`, errParam: "prompt"},
		{name: "empty text", body: `{"prompt":"   "}`, errParam: "prompt"},
		{name: "negative id", body: `{"prompt":[1,-2]}`, errParam: "prompt"},
		{name: "float id", body: `{"prompt":[1.5]}`, errParam: "prompt"},
		{name: "id too big", body: `{"prompt":[4294967296]}`, errParam: "prompt"},
		{name: "mixed array", body: `{"prompt":[1,"a"]}`, errParam: "prompt"},
		{name: "object prompt", body: `{"prompt":{"a":1}}`, errParam: "prompt"},
		{name: "batch of two", body: `{"prompt":["a","b"]}`, errParam: "prompt"},
		{name: "nested too deep", body: `{"prompt":[[["a"]]]}`, errParam: "prompt"},
		{name: "zero max tokens", body: `{"prompt":[1],"max_tokens":0}`, errParam: "max_tokens"},
		{name: "n of two", body: `{"prompt":[1],"n":2}`, errParam: "n"},
		{name: "stream options without stream", body: `{"prompt":[1],"stream_options":{"include_usage":true}}`, errParam: "stream_options"},
		{name: "messages on completions", body: `{"prompt":[1],"messages":[]}`, errParam: "messages"},
		{name: "prompt on chat", chat: true, body: `{"prompt":[1],"messages":[{"role":"user","content":"x"}]}`, errParam: "prompt"},
		{name: "no messages", chat: true, body: `{"messages":[]}`, errParam: "messages"},
		{name: "bad role", chat: true, body: `{"messages":[{"role":"wizard","content":"x"}]}`, errParam: "messages"},
		{name: "image part", chat: true, body: `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`,
			tokens: append(append([]uint32{TokenUser}, slices.Repeat([]uint32{TokenImage}, ImageTokens)...), TokenEndOfTurn, TokenAssistant), maxTokens: -1},
		{name: "audio part", chat: true, body: `{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]}`, errParam: "messages"},
		{name: "image part without url", chat: true, body: `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}`, errParam: "messages"},
		{name: "numeric content", chat: true, body: `{"messages":[{"role":"user","content":5}]}`, errParam: "messages"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var r apiRequest
			err := parseRequest(context.Background(), []byte(tc.body), tc.chat, nil, &r)
			if tc.errParam != "" {
				if err == nil {
					t.Fatalf("accepted: %+v", r)
				}
				if want := strings.TrimPrefix(tc.errParam, "-"); err.Param != want || err.Status != 400 {
					t.Fatalf("error %d param %q (%s), want 400 param %q", err.Status, err.Param, err.Message, want)
				}
				var body struct {
					Error struct {
						Message string `json:"message"`
						Type    string `json:"type"`
					} `json:"error"`
				}
				if jerr := json.Unmarshal(err.AppendJSON(nil), &body); jerr != nil || body.Error.Message == "" || body.Error.Type == "" {
					t.Fatalf("error body not OpenAI-shaped: %v %s", jerr, err.AppendJSON(nil))
				}
				return
			}
			if err != nil {
				t.Fatalf("rejected: %v", err)
			}
			if !slices.Equal(r.tokens, tc.tokens) || r.maxTokens != tc.maxTokens || r.stream != tc.stream || r.includeUsage != tc.usage {
				t.Fatalf("got %+v", r)
			}
		})
	}
}

func TestTokenizer(t *testing.T) {
	t.Run("words and whitespace", func(t *testing.T) {
		got := AppendTextTokens(nil, " the\tcat\r\n sat ")
		want := []uint32{WordToken("the"), WordToken("cat"), WordToken("sat")}
		if !slices.Equal(got, want) {
			t.Fatalf("got %v want %v", got, want)
		}
		for _, id := range got {
			if id < VocabBase || id >= VocabSize {
				t.Fatalf("id %d out of the vocabulary", id)
			}
		}
	})
	t.Run("prefix stable", func(t *testing.T) {
		a := AppendTextTokens(nil, "one two three")
		b := AppendTextTokens(nil, "one two three four five")
		if !slices.Equal(a, b[:len(a)]) {
			t.Fatal("extending a text changed its earlier tokens")
		}
	})
	t.Run("chat turns extend the prefix", func(t *testing.T) {
		turn1 := []ChatMessage{{"system", "s"}, {"user", "q1"}}
		t1, _ := AppendChatTokens(nil, turn1)
		t2, _ := AppendChatTokens(nil, append(turn1, ChatMessage{"assistant", "a1"}, ChatMessage{"user", "q2"}))
		if !slices.Equal(t1, t2[:len(t1)]) {
			t.Fatal("the second turn does not extend the first")
		}
		if _, err := AppendChatTokens(nil, []ChatMessage{{"robot", "x"}}); err == nil {
			t.Fatal("unknown role accepted")
		}
	})
	t.Run("special-token text is the special token", func(t *testing.T) {
		msgs := []ChatMessage{{"system", "be brief"}, {"user", "hi <|end|> there"}, {"assistant", "ok"}, {"tool", "42"}, {"developer", "d"}}
		want, err := AppendChatTokens(nil, msgs)
		if err != nil {
			t.Fatal(err)
		}
		text := TextSystem + " be brief " + TextEndOfTurn + " " + TextUser + " hi <|end|> there " + TextEndOfTurn + " " +
			TextAssistant + " ok " + TextEndOfTurn + " " + TextTool + " 42 " + TextEndOfTurn + " " +
			TextDeveloper + " d " + TextEndOfTurn + " " + TextAssistant
		if got := AppendTextTokens(nil, text); !slices.Equal(got, want) {
			t.Fatalf("the template written out tokenizes to\n%v, the chat request to\n%v", got, want)
		}
		// Near misses are plain words.
		for _, w := range []string{"<|end", "<|End|>", "<|end|>x", "<|>"} {
			if got := AppendTextTokens(nil, w); got[0] != WordToken(w) {
				t.Errorf("%q tokenized as %d, want the word %d", w, got[0], WordToken(w))
			}
		}
	})
	t.Run("replies round-trip", func(t *testing.T) {
		seed := uint64(12345)
		text := string(appendText(nil, seed, 0, 50))
		got := AppendTextTokens(nil, text)
		for i, id := range got {
			if id != OutputToken(seed, i) {
				t.Fatalf("word %d of the reply tokenizes to %d, generated %d", i, id, OutputToken(seed, i))
			}
		}
		if len(got) != 50 {
			t.Fatalf("%d words", len(got))
		}
	})
}

func FuzzParseRequest(f *testing.F) {
	f.Add([]byte(`{"model":"mock","prompt":[1,2,3],"max_tokens":5,"stream":true}`), false)
	f.Add([]byte(`{"prompt":"hello world","stream":true,"stream_options":{"include_usage":true}}`), false)
	f.Add([]byte(`{"prompt":[[1, 2]]}`), false)
	f.Add([]byte(`{"prompt":[1.0, -1, 99999999999]}`), false)
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_completion_tokens":2}`), true)
	f.Add([]byte(`{"messages":[{"role":"user","content":null}]}`), true)
	f.Add([]byte(`[`), true)
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		var r apiRequest
		err := parseRequest(context.Background(), body, chat, nil, &r)
		if err != nil {
			if err.Status != 400 || err.Message == "" {
				t.Fatalf("bad error %+v", err)
			}
			if !json.Valid(err.AppendJSON(nil)) {
				t.Fatalf("error body is not JSON: %s", err.AppendJSON(nil))
			}
			return
		}
		if len(r.tokens) == 0 {
			t.Fatal("accepted an empty prompt")
		}
		if r.maxTokens != -1 && r.maxTokens < 1 {
			t.Fatalf("accepted max_tokens %d", r.maxTokens)
		}
		if r.includeUsage && !r.stream {
			t.Fatal("stream options without stream")
		}
		var again apiRequest
		if parseRequest(context.Background(), body, chat, nil, &again) != nil || !slices.Equal(again.tokens, r.tokens) {
			t.Fatal("parsing is not deterministic")
		}
	})
}
