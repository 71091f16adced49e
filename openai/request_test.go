package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/internal/jsonscan"
)

func TestParseAccepts(t *testing.T) {
	type want struct {
		model, salt string
		lora        string
		kind        PromptKind
		tokens      []uint32
		text        string // raw, as in the body
		messages    string
		stream      bool
		maxTokens   int64
	}
	cases := []struct {
		name string
		api  API
		body string
		want want
	}{
		{"tokens", APICompletions,
			`{"model":"llama","prompt":[1,2,3],"stream":true,"max_tokens":16}`,
			want{model: "llama", kind: PromptTokens, tokens: []uint32{1, 2, 3}, stream: true, maxTokens: 16}},
		{"tokens with python separators", APICompletions,
			"{\"model\": \"m\", \"prompt\": [ 10 , 0,\t7\n], \"stream\": false}",
			want{model: "m", kind: PromptTokens, tokens: []uint32{10, 0, 7}}},
		{"largest uint32 id without a vocabulary limit", APICompletions,
			`{"prompt":[4294967295]}`,
			want{kind: PromptTokens, tokens: []uint32{math.MaxUint32}}},
		{"batch of one token array", APICompletions,
			`{"prompt":[[5, 6]]}`,
			want{kind: PromptTokens, tokens: []uint32{5, 6}}},
		{"text", APICompletions,
			`{"prompt":"hello world"}`,
			want{kind: PromptText, text: "hello world"}},
		{"text keeps its escapes", APICompletions,
			`{"prompt":"a\"b\\n\u00e9"}`,
			want{kind: PromptText, text: `a\"b\\n\u00e9`}},
		{"batch of one string", APICompletions,
			`{"prompt":["hi"]}`,
			want{kind: PromptText, text: "hi"}},
		{"escaped model and key", APICompletions,
			`{"\u006dodel":"m\u00e9\ud83d\ude00","prompt":[1]}`,
			want{model: "mé😀", kind: PromptTokens, tokens: []uint32{1}}},
		{"lone surrogate becomes U+FFFD", APICompletions,
			`{"model":"a\ud800b","prompt":[1]}`,
			want{model: "a\uFFFDb", kind: PromptTokens, tokens: []uint32{1}}},
		{"max_completion_tokens wins", APICompletions,
			`{"max_completion_tokens":7,"prompt":"x","max_tokens":9}`,
			want{kind: PromptText, text: "x", maxTokens: 7}},
		{"integral float and digit string, as vLLM's pydantic reads them", APICompletions,
			`{"prompt":"x","max_tokens":20.0,"max_completion_tokens":"2048"}`,
			want{kind: PromptText, text: "x", maxTokens: 2048}},
		{"a digit string, escaped", APICompletions,
			`{"prompt":"x","max_tokens":"\u0035"}`,
			want{kind: PromptText, text: "x", maxTokens: 5}},
		{"pydantic's lax integer strings and true", APICompletions,
			`{"prompt":"x","max_tokens":"+7","max_completion_tokens":"1_024","n":true}`,
			want{kind: PromptText, text: "x", maxTokens: 1024}},
		{"a string integer with a fraction of zeros, underscored and padded", APICompletions,
			`{"prompt":"x","max_tokens":" 4_2.0 "}`,
			want{kind: PromptText, text: "x", maxTokens: 42}},
		{"an exponent", APICompletions,
			`{"prompt":"x","max_tokens":1e3}`,
			want{kind: PromptText, text: "x", maxTokens: 1000}},
		{"cache salt", APICompletions,
			`{"prompt":"x","cache_salt":"tenant-a"}`,
			want{kind: PromptText, text: "x", salt: "tenant-a"}},
		{"nulls mean absent", APICompletions,
			`{"model":null,"prompt":"x","stream":null,"max_tokens":null,"cache_salt":null}`,
			want{kind: PromptText, text: "x"}},
		{"last duplicate wins, verdict included", APICompletions,
			`{"prompt":"x","stream":"bad","prompt":[3],"stream":true,"model":1,"model":"b"}`,
			want{model: "b", kind: PromptTokens, tokens: []uint32{3}, stream: true}},
		{"unknown fields of every shape", APICompletions,
			`{"logit_bias":{"1":-100,"2":[true,false,null]},"stop":["a","\n"],"n":1,"temperature":0.7e-1,` +
				`"stream_options":{"include_usage":true},"prompt":[1],"x":[[[{}]]],"y":-0.0E+2}`,
			want{kind: PromptTokens, tokens: []uint32{1}}},
		{"chat keeps raw messages", APIChatCompletions,
			`{"model":"m","messages":[ {"role":"user","content":"hi"} , {"role":"assistant","content":[]}],"stream":true}`,
			want{model: "m", kind: PromptMessages, stream: true,
				messages: `[ {"role":"user","content":"hi"} , {"role":"assistant","content":[]}]`}},
		{"chat ignores prompt", APIChatCompletions,
			`{"prompt":true,"messages":[{}]}`,
			want{kind: PromptMessages, messages: `[{}]`}},
		{"completions ignores messages", APICompletions,
			`{"messages":7,"prompt":"p"}`,
			want{kind: PromptText, text: "p"}},
		{"SGLang's lora_path, a string; escaped", APIChatCompletions,
			`{"model":"m","lora_path":"s\u0071l","messages":[{}]}`,
			want{model: "m", lora: "sql", kind: PromptMessages, messages: `[{}]`}},
		{"SGLang's lora_path, a batch's list: the engine's to judge", APICompletions,
			`{"lora_path":["sql"],"prompt":"p"}`,
			want{kind: PromptText, text: "p"}},
		{"surrounding whitespace", APICompletions,
			" \r\n\t{ \"prompt\" :\"p\" } \n",
			want{kind: PromptText, text: "p"}},
	}
	var p Parser
	r := new(ParsedRequest)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := p.Parse([]byte(tc.body), tc.api, r); err != nil {
				t.Fatalf("Parse: %v", err)
			}
			got := want{
				model: string(r.Model), salt: string(r.CacheSalt), lora: string(r.LoRAPath), kind: r.Prompt,
				tokens: r.Tokens, text: string(r.Text), messages: string(r.Messages),
				stream: r.Stream, maxTokens: r.MaxTokens,
			}
			if len(got.tokens) == 0 {
				got.tokens = nil
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
			if r.API != tc.api {
				t.Fatalf("API = %d, want %d", r.API, tc.api)
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	cases := []struct {
		name   string
		api    API
		parser Parser
		body   string
		want   *Error
	}{
		{"empty body", APICompletions, Parser{}, ``, ErrMalformedJSON},
		{"only spaces", APICompletions, Parser{}, `   `, ErrMalformedJSON},
		{"unclosed object", APICompletions, Parser{}, `{"prompt":"x"`, ErrMalformedJSON},
		{"unclosed token array", APICompletions, Parser{}, `{"prompt":[1,2}`, ErrMalformedJSON},
		{"trailing comma in tokens", APICompletions, Parser{}, `{"prompt":[1,2,]}`, ErrMalformedJSON},
		{"trailing comma in object", APICompletions, Parser{}, `{"prompt":"x",}`, ErrMalformedJSON},
		{"trailing garbage", APICompletions, Parser{}, `{"prompt":"x"} x`, ErrMalformedJSON},
		{"two documents", APICompletions, Parser{}, `{"prompt":"x"}{}`, ErrMalformedJSON},
		{"leading zero token", APICompletions, Parser{}, `{"prompt":[01]}`, ErrMalformedJSON},
		{"leading zero elsewhere", APICompletions, Parser{}, `{"prompt":"x","n":01}`, ErrMalformedJSON},
		{"control char in string", APICompletions, Parser{}, "{\"prompt\":\"a\tb\"}", ErrMalformedJSON},
		{"bad escape", APICompletions, Parser{}, `{"prompt":"a\qb"}`, ErrMalformedJSON},
		{"short unicode escape", APICompletions, Parser{}, `{"prompt":"a\u12"}`, ErrMalformedJSON},
		{"single quotes", APICompletions, Parser{}, `{'prompt':'x'}`, ErrMalformedJSON},
		{"bare word", APICompletions, Parser{}, `{"prompt":"x","stream":True}`, ErrMalformedJSON},
		{"malformed beats semantic", APICompletions, Parser{}, `{"prompt":[],"stream":"x",`, ErrMalformedJSON},
		{"malformed after a bad token", APICompletions, Parser{}, `{"prompt":[-1,2,]}`, ErrMalformedJSON},
		{"malformed after a batch", APICompletions, Parser{}, `{"prompt":[[1],[2,]]}`, ErrMalformedJSON},
		{"malformed inside messages", APIChatCompletions, Parser{}, `{"messages":[{"role":}]}`, ErrMalformedJSON},
		{"malformed in ignored field", APIChatCompletions, Parser{}, `{"messages":[{}],"prompt":[1,]}`, ErrMalformedJSON},
		{"too deep", APICompletions, Parser{}, `{"prompt":"x","d":` + strings.Repeat("[", jsonscan.MaxDepth) + strings.Repeat("]", jsonscan.MaxDepth) + `}`, ErrMalformedJSON},

		{"array body", APICompletions, Parser{}, `[1,2]`, ErrNotObject},
		{"string body", APICompletions, Parser{}, `"prompt"`, ErrNotObject},
		{"body over the limit", APICompletions, Parser{MaxBodyBytes: 16}, `{"prompt":"0123456789"}`, ErrBodyTooLarge},

		{"invalid UTF-8 in prompt", APICompletions, Parser{}, "{\"prompt\":\"a\xffb\"}", ErrInvalidUTF8},
		{"truncated UTF-8 in prompt", APICompletions, Parser{}, "{\"prompt\":\"caf\xc3\"}", ErrInvalidUTF8},
		{"surrogate bytes in prompt", APICompletions, Parser{}, "{\"prompt\":\"\xed\xa0\x80\"}", ErrInvalidUTF8},
		{"invalid UTF-8 in chat content", APIChatCompletions, Parser{}, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi \xc0\xaf\"}]}", ErrInvalidUTF8},
		{"invalid UTF-8 in a key", APICompletions, Parser{}, "{\"prompt\":\"x\",\"k\x80\":1}", ErrInvalidUTF8},
		{"invalid UTF-8 in model", APICompletions, Parser{}, "{\"model\":\"m\xfe\",\"prompt\":[1]}", ErrInvalidUTF8},

		{"model not a string", APICompletions, Parser{}, `{"model":1,"prompt":"x"}`, ErrModelType},
		{"prompt bool", APICompletions, Parser{}, `{"prompt":true}`, ErrPromptType},
		{"prompt object", APICompletions, Parser{}, `{"prompt":{"a":1}}`, ErrPromptType},
		{"prompt number", APICompletions, Parser{}, `{"prompt":5}`, ErrPromptType},
		{"mixed token array", APICompletions, Parser{}, `{"prompt":[1,"a"]}`, ErrPromptType},
		{"fractional token", APICompletions, Parser{}, `{"prompt":[1.5]}`, ErrPromptType},
		{"fractional exponent token", APICompletions, Parser{}, `{"prompt":[15e-1]}`, ErrPromptType},
		{"negative float token", APICompletions, Parser{}, `{"prompt":[2,-1.0]}`, ErrTokenOutOfRange},
		{"float token over vocabulary", APICompletions, Parser{MaxTokenID: 1000}, `{"prompt":[1.001e3]}`, ErrTokenOutOfRange},
		{"token 1e999", APICompletions, Parser{}, `{"prompt":[1e999]}`, ErrTokenOutOfRange},
		{"token written 1.", APICompletions, Parser{}, `{"prompt":[1.]}`, ErrMalformedJSON},
		{"array of bools", APICompletions, Parser{}, `{"prompt":[true]}`, ErrPromptType},
		{"nested strings", APICompletions, Parser{}, `{"prompt":[["a"]]}`, ErrPromptType},
		{"stream string", APICompletions, Parser{}, `{"prompt":"x","stream":"maybe"}`, ErrStreamType},
		{"stream number", APICompletions, Parser{}, `{"prompt":"x","stream":2}`, ErrStreamType},
		{"max_tokens word", APICompletions, Parser{}, `{"prompt":"x","max_tokens":"five"}`, ErrMaxTokensType},
		{"max_tokens fraction", APICompletions, Parser{}, `{"prompt":"x","max_tokens":1.5}`, ErrMaxTokensType},
		{"max_tokens zero", APICompletions, Parser{}, `{"prompt":"x","max_tokens":0}`, ErrMaxTokensRange},
		{"max_tokens false", APICompletions, Parser{}, `{"prompt":"x","max_tokens":false}`, ErrMaxTokensRange},
		{"max_tokens string fraction", APICompletions, Parser{}, `{"prompt":"x","max_tokens":"5.5"}`, ErrMaxTokensType},
		{"max_tokens double sign", APICompletions, Parser{}, `{"prompt":"x","max_tokens":"++5"}`, ErrMaxTokensType},
		{"max_tokens double underscore", APICompletions, Parser{}, `{"prompt":"x","max_tokens":"1__0"}`, ErrMaxTokensType},
		{"max_tokens trailing underscore", APICompletions, Parser{}, `{"prompt":"x","max_tokens":"10_"}`, ErrMaxTokensType},
		{"max_tokens empty fraction", APICompletions, Parser{}, `{"prompt":"x","max_tokens":"5."}`, ErrMaxTokensType},
		{"max_tokens inner space", APICompletions, Parser{}, `{"prompt":"x","max_tokens":"5 0"}`, ErrMaxTokensType},
		{"max_completion_tokens negative", APICompletions, Parser{}, `{"prompt":"x","max_completion_tokens":-3}`, ErrMaxCompletionTokensRange},
		{"max_completion_tokens word", APIChatCompletions, Parser{}, `{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":"x"}`, ErrMaxCompletionTokensType},
		{"max_tokens overflow", APICompletions, Parser{}, `{"prompt":"x","max_tokens":9223372036854775808}`, ErrMaxTokensRange},
		{"empty cache salt", APICompletions, Parser{}, `{"prompt":"x","cache_salt":""}`, ErrCacheSaltType},
		{"messages string", APIChatCompletions, Parser{}, `{"messages":"hi"}`, ErrMessagesType},
		{"messages of numbers", APIChatCompletions, Parser{}, `{"messages":[{},1]}`, ErrMessagesType},

		{"negative token", APICompletions, Parser{}, `{"prompt":[-1]}`, ErrTokenOutOfRange},
		{"token over uint32", APICompletions, Parser{}, `{"prompt":[4294967296]}`, ErrTokenOutOfRange},
		{"huge token", APICompletions, Parser{}, `{"prompt":[123456789012345678901234567890]}`, ErrTokenOutOfRange},
		{"token over vocabulary", APICompletions, Parser{MaxTokenID: 1000}, `{"prompt":[1000,1001]}`, ErrTokenOutOfRange},
		{"token over vocabulary in batch of one", APICompletions, Parser{MaxTokenID: 1000}, `{"prompt":[[1001]]}`, ErrTokenOutOfRange},

		{"empty string prompt", APICompletions, Parser{}, `{"prompt":""}`, ErrEmptyPrompt},
		{"empty token array", APICompletions, Parser{}, `{"prompt":[ ]}`, ErrEmptyPrompt},
		{"empty inner array", APICompletions, Parser{}, `{"prompt":[[]]}`, ErrEmptyPrompt},
		{"empty string in array", APICompletions, Parser{}, `{"prompt":[""]}`, ErrEmptyPrompt},
		{"empty messages", APIChatCompletions, Parser{}, `{"messages":[]}`, ErrEmptyMessages},

		{"batch of token arrays", APICompletions, Parser{}, `{"prompt":[[1,2],[3]]}`, ErrBatchNotSupported},
		{"batch of strings", APICompletions, Parser{}, `{"prompt":["a","b"]}`, ErrBatchNotSupported},

		{"no prompt", APICompletions, Parser{}, `{"model":"m"}`, ErrMissingPrompt},
		{"null prompt", APICompletions, Parser{}, `{"prompt":null}`, ErrMissingPrompt},
		{"prompt replaced by null", APICompletions, Parser{}, `{"prompt":[1],"prompt":null}`, ErrMissingPrompt},
		{"chat without messages", APIChatCompletions, Parser{}, `{"prompt":"x"}`, ErrMissingMessages},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := new(ParsedRequest)
			err := tc.parser.Parse([]byte(tc.body), tc.api, r)
			if err != tc.want {
				t.Fatalf("Parse = %v, want %v", err, tc.want)
			}
			if r.Prompt != PromptNone || len(r.Tokens) != 0 || r.Model != nil {
				t.Fatalf("a failed parse left %+v", r)
			}
			// encoding/json accepts invalid UTF-8 (it decodes it as U+FFFD).
			if wantValid := tc.want != ErrMalformedJSON; tc.want != ErrBodyTooLarge && tc.want != ErrInvalidUTF8 && json.Valid([]byte(tc.body)) != wantValid {
				t.Fatalf("encoding/json disagrees on validity (want valid=%v)", wantValid)
			}
		})
	}
}

func TestParseDepthMatchesEncodingJSON(t *testing.T) {
	var p Parser
	r := new(ParsedRequest)
	// The top-level object is one level, so the nested arrays may add
	// jsonscan.MaxDepth-1 more and no others.
	for _, extra := range []int{1, 63, 64, 65, 127, 128, 129, jsonscan.MaxDepth - 1, jsonscan.MaxDepth} {
		for _, open := range []string{"[", `{"k":`} {
			close := "]"
			if open != "[" {
				close = "}"
			}
			body := `{"prompt":"x","d":` + strings.Repeat(open, extra) + strings.Repeat(close, extra) + `}`
			err := p.Parse([]byte(body), APICompletions, r)
			valid := json.Valid([]byte(body))
			if (err == nil) != valid {
				t.Fatalf("depth %d (%s): Parse = %v, json.Valid = %v", extra+1, open, err, valid)
			}
		}
	}
}

func TestParseTokenBodies(t *testing.T) {
	for _, n := range []int{1, 15, 16, 17, 1024, 4096} {
		for _, sep := range []string{",", ", "} {
			tokens := benchTokens(n, 151935)
			body := tokenBody(tokens, sep, true)
			r := new(ParsedRequest)
			if err := (&Parser{MaxTokenID: 151935}).Parse(body, APICompletions, r); err != nil {
				t.Fatalf("n=%d sep=%q: %v", n, sep, err)
			}
			if !slices.Equal(r.Tokens, tokens) {
				t.Fatalf("n=%d sep=%q: tokens differ", n, sep)
			}
		}
	}
}

// TestParseIntegralNumberTokens: vLLM and SGLang read a prompt's token
// ids with pydantic, whose lax int takes an integral float (1.0, 1e3, and
// -0 as 0); a client that writes ids so (a float array serialized by
// Python) is routed on those ids, not refused.
func TestParseIntegralNumberTokens(t *testing.T) {
	p := Parser{MaxTokenID: 151935}
	r := new(ParsedRequest)
	for body, want := range map[string][]uint32{
		`{"prompt":[1.0,2.00, 3e0,-0,-0.0,1e3,151935.0]}`: {1, 2, 3, 0, 0, 1000, 151935},
		`{"prompt":[[7.0,8]]}`:                            {7, 8},
		`{"prompt":[0.5e1,1E+2,20e-1]}`:                   {5, 100, 2},
	} {
		if err := p.Parse([]byte(body), APICompletions, r); err != nil {
			t.Errorf("%s: %v", body, err)
			continue
		}
		if r.Prompt != PromptTokens || !slices.Equal(r.Tokens, want) {
			t.Errorf("%s: read %v, want %v", body, r.Tokens, want)
		}
	}
}

func TestParseReusesRequest(t *testing.T) {
	var p Parser
	r := new(ParsedRequest)
	if err := p.Parse([]byte(`{"model":"\u0061","prompt":[1,2,3],"stream":true,"cache_salt":"s"}`), APICompletions, r); err != nil {
		t.Fatal(err)
	}
	if err := p.Parse([]byte(`{"prompt":"t"}`), APICompletions, r); err != nil {
		t.Fatal(err)
	}
	if r.Model != nil || r.Stream || r.CacheSalt != nil || len(r.Tokens) != 0 || r.Prompt != PromptText {
		t.Fatalf("state leaked from the previous parse: %+v", r)
	}
}

func TestErrorJSON(t *testing.T) {
	for _, e := range []*Error{ErrMalformedJSON, ErrEmptyPrompt, ErrBatchNotSupported, ErrBodyTooLarge,
		{Status: 400, Type: TypeInvalidRequest, Param: "p\"q", Code: "c\\d", Message: "line\nbreak \x01"}} {
		var got struct {
			Error struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Param   *string `json:"param"`
				Code    string  `json:"code"`
			} `json:"error"`
		}
		buf := e.AppendJSON([]byte("prefix"))
		if !bytes.HasPrefix(buf, []byte("prefix")) {
			t.Fatal("AppendJSON did not append")
		}
		if err := json.Unmarshal(buf[len("prefix"):], &got); err != nil {
			t.Fatalf("%s: %v", buf, err)
		}
		g := got.Error
		if g.Message != e.Message || g.Type != e.Type || g.Code != e.Code {
			t.Fatalf("round trip: %+v vs %+v", g, e)
		}
		if (g.Param == nil) != (e.Param == "") || (g.Param != nil && *g.Param != e.Param) {
			t.Fatalf("param: %v vs %q", g.Param, e.Param)
		}
		if e.Status < 400 || e.Status > 499 || e.Type != "invalid_request_error" {
			t.Fatalf("%v is not a client error", e)
		}
		if !strings.HasPrefix(e.Error(), "kvfast: ") {
			t.Fatalf("Error() = %q", e.Error())
		}
	}
	if !errors.Is(fmt.Errorf("wrapped: %w", ErrEmptyPrompt), ErrEmptyPrompt) {
		t.Fatal("errors.Is does not see through wrapping")
	}
	// Without a code the body carries the status, as vLLM's does.
	e := &Error{Status: 503, Type: TypeServerError, Message: "bad \xff byte"}
	if got, want := string(e.AppendJSON(nil)), `{"error":{"message":"bad \ufffd byte","type":"server_error","param":null,"code":503}}`; got != want {
		t.Fatalf("AppendJSON = %s, want %s", got, want)
	}
}

func TestParsePromptMatchesParse(t *testing.T) {
	p := Parser{MaxTokenID: 1000}
	whole, alone := new(ParsedRequest), new(ParsedRequest)
	for _, prompt := range []string{
		`[1, 2 ,3]`, ` [[7,8]] `, `"a \"b\""`, `["x"]`, `null`, `""`, `[]`, `[[]]`, `[1001]`, `[-1]`, `[1.5]`,
		`["a","b"]`, `[[1],[2]]`, `[[["a"]]]`, `{"a":1}`, `true`, `[1,`, `"open`, ``, `[1] x`,
	} {
		errWhole := p.Parse([]byte(`{"prompt":`+prompt+`}`), APICompletions, whole)
		errAlone := p.ParsePrompt([]byte(prompt), alone)
		if errAlone != errWhole {
			t.Fatalf("%s: ParsePrompt = %v, Parse = %v", prompt, errAlone, errWhole)
		}
		if alone.Prompt != whole.Prompt || !slices.Equal(alone.Tokens, whole.Tokens) || string(alone.Text) != string(whole.Text) || alone.API != whole.API {
			t.Fatalf("%s: ParsePrompt read %+v, Parse %+v", prompt, alone, whole)
		}
	}
	if err := (&Parser{MaxBodyBytes: 4}).ParsePrompt([]byte(`[1,2,3]`), alone); err != ErrBodyTooLarge {
		t.Fatalf("ParsePrompt over the limit = %v", err)
	}
}

func TestAppendText(t *testing.T) {
	var p Parser
	r := new(ParsedRequest)
	if err := p.Parse([]byte(`{"prompt":"caf\u00e9 \"au\" lait\n"}`), APICompletions, r); err != nil {
		t.Fatal(err)
	}
	if got := string(r.AppendText([]byte("> "))); got != "> café \"au\" lait\n" {
		t.Fatalf("AppendText = %q", got)
	}
	if err := p.Parse([]byte(`{"prompt":[1,2]}`), APICompletions, r); err != nil {
		t.Fatal(err)
	}
	if got := r.AppendText(nil); len(got) != 0 {
		t.Fatalf("a token prompt has text %q", got)
	}
}

// benchTokens returns n deterministic token ids below vocab.
func benchTokens(n int, vocab uint32) []uint32 {
	out := make([]uint32, n)
	x := uint32(2463534242)
	for i := range out {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		out[i] = x % vocab
	}
	return out
}

// tokenBody renders a completions body the way OpenAI client libraries do.
func tokenBody(tokens []uint32, sep string, stream bool) []byte {
	b := []byte(`{"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": [`)
	for i, t := range tokens {
		if i > 0 {
			b = append(b, sep...)
		}
		b = strconv.AppendUint(b, uint64(t), 10)
	}
	b = append(b, `], "max_tokens": 128, "temperature": 0.0, "stream": `...)
	b = strconv.AppendBool(b, stream)
	return append(b, `, "stream_options": {"include_usage": true}}`...)
}

// TestApproxText pins what approximate routing hashes: a chat request's
// raw messages, a text prompt's raw bytes, and nothing for token prompts.
func TestApproxText(t *testing.T) {
	r := new(ParsedRequest)
	if err := (&Parser{}).Parse([]byte(`{"messages":[{"role":"user","content":"hello there"}]}`), APIChatCompletions, r); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r.ApproxText(), r.Messages) || len(r.ApproxText()) == 0 {
		t.Fatalf("chat approx text = %q, want the messages %q", r.ApproxText(), r.Messages)
	}
	if err := (&Parser{}).Parse([]byte(`{"prompt":"hello there"}`), APICompletions, r); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(r.ApproxText(), []byte("hello there")) {
		t.Fatalf("text approx text = %q", r.ApproxText())
	}
	if err := (&Parser{}).Parse([]byte(`{"prompt":[1,2]}`), APICompletions, r); err != nil || r.ApproxText() != nil {
		t.Fatalf("a token prompt has approximate text %q (err %v)", r.ApproxText(), err)
	}
}

// TestAddSpecialTokens reads vLLM's add_special_tokens, which decides
// whether the engine adds BOS/EOS to the prompt it tokenizes.
func TestAddSpecialTokens(t *testing.T) {
	for body, want := range map[string]SpecialTokens{
		`{"prompt":"hi"}`: SpecialDefault,
		`{"prompt":"hi","add_special_tokens":null}`:                            SpecialDefault,
		`{"prompt":"hi","add_special_tokens":true}`:                            SpecialAdd,
		`{"prompt":"hi","add_special_tokens":false}`:                           SpecialOmit,
		`{"add_special_tokens":true,"prompt":"hi","add_special_tokens":false}`: SpecialOmit,
	} {
		r := new(ParsedRequest)
		if err := (&Parser{}).Parse([]byte(body), APICompletions, r); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if r.AddSpecialTokens != want {
			t.Errorf("%s: AddSpecialTokens = %d, want %d", body, r.AddSpecialTokens, want)
		}
	}
	r := new(ParsedRequest)
	if err := (&Parser{}).Parse([]byte(`{"prompt":"hi","add_special_tokens":2}`), APICompletions, r); err != ErrAddSpecialTokensType {
		t.Errorf("2 for add_special_tokens: %v", err)
	}
}

// TestLaxBooleans: vLLM reads its bool fields as pydantic's lax mode does,
// so a request it serves is not refused here.
func TestLaxBooleans(t *testing.T) {
	for value, want := range map[string]bool{`"true"`: true, `"Yes"`: true, `"on"`: true, `1`: true, `1.0`: true, `1e0`: true, `"1"`: true,
		`"false"`: false, `"NO"`: false, `"off"`: false, `0`: false, `0.0`: false, `-0`: false, `"f"`: false, `"\u0030"`: false, `"\u0074rue"`: true} {
		r := new(ParsedRequest)
		body := `{"prompt":"hi","stream":` + value + `,"add_special_tokens":` + value + `}`
		if err := (&Parser{}).Parse([]byte(body), APICompletions, r); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		add := SpecialOmit
		if want {
			add = SpecialAdd
		}
		if r.Stream != want || r.AddSpecialTokens != add {
			t.Errorf("%s: stream %v, add_special_tokens %d; want %v, %d", value, r.Stream, r.AddSpecialTokens, want, add)
		}
	}
}

// TestLaxBooleansRefused: what pydantic refuses as a bool is refused:
// other numbers, and number-like strings str_as_bool does not list.
func TestLaxBooleansRefused(t *testing.T) {
	for _, value := range []string{`2`, `0.5`, `"1.0"`, `"0.0"`, `"2"`, `"yess"`, `""`, `[]`} {
		body := `{"prompt":"hi","stream":` + value + `}`
		if err := (&Parser{}).Parse([]byte(body), APICompletions, new(ParsedRequest)); !errors.Is(err, ErrStreamType) {
			t.Errorf("%s: %v, want %v", body, err, ErrStreamType)
		}
	}
}

func TestParseSessionControl(t *testing.T) {
	var p Parser
	for _, tc := range []struct {
		body string
		want SessionControl
		err  error
	}{
		{`{"prompt":"x"}`, SessionControl{}, nil},
		{`{"prompt":"x","session_control":null}`, SessionControl{}, nil},
		{`{"prompt":"x","session_control":{"open":true}}`, SessionControl{Open: true}, nil},
		{`{"prompt":"x","session_control":{"open":{"capacity_of_str_len":9}}}`,
			SessionControl{Open: true, OpenParams: []byte(`{"capacity_of_str_len":9}`)}, nil},
		{`{"prompt":"x","session_control":{"close":true,"other":[1]}}`, SessionControl{Close: true}, nil},
		{`{"prompt":"x","session_control":{"open":"yes"}}`, SessionControl{}, ErrSessionControlType},
		{`{"prompt":"x","session_control":{"open":"yes","open":true}}`, SessionControl{Open: true}, nil},
		{`{"prompt":"x","session_control":"open"}`, SessionControl{}, ErrSessionControlType},
		{`{"prompt":"x","session_control":{"open":true,}}`, SessionControl{}, ErrMalformedJSON},
	} {
		var r ParsedRequest
		err := p.Parse([]byte(tc.body), APICompletions, &r)
		if err != tc.err {
			t.Errorf("%s: err %v, want %v", tc.body, err, tc.err)
			continue
		}
		if r.Session.Open != tc.want.Open || r.Session.Close != tc.want.Close || string(r.Session.OpenParams) != string(tc.want.OpenParams) {
			t.Errorf("%s: %+v, want %+v", tc.body, r.Session, tc.want)
		}
	}
}

func TestDecimalMagnitude(t *testing.T) {
	for _, tc := range []struct {
		num  string
		want int
	}{
		{"5", 1}, {"-5", 1}, {"123.4", 3}, {"0.05", -1}, {"0.5", 0}, {"1e1", 2},
		{"10", 2}, {"99", 2}, {"100.0", 3}, {"0012", 2}, {"1.5E-3", -2}, {"2e+3", 4},
		{"1e999", 1000}, {"-1e-999", -998},
	} {
		if got := decimalMagnitude([]byte(tc.num)); got != tc.want {
			t.Errorf("decimalMagnitude(%s) = %d, want %d", tc.num, got, tc.want)
		}
	}
	for _, zero := range []string{"0", "-0", "0.000", "0e999", "0.0E+99999999999999999999"} {
		if got := decimalMagnitude([]byte(zero)); got > -100 {
			t.Errorf("decimalMagnitude(%s) = %d, want very small", zero, got)
		}
	}
	if got := decimalMagnitude([]byte("1e99999999999999999999999")); got < 1000 {
		t.Errorf("a huge exponent read as magnitude %d", got)
	}
}

// TestParseNumberAgreesWithStrconv: refusing early must not change what
// any number means: the pre-check only spares strconv's allocated error.
func TestParseNumberAgreesWithStrconv(t *testing.T) {
	for _, num := range []string{"0", "1", "-1", "1.0", "1e0", "10e-1", "0.1e1", "1e19", "9.3e18",
		"9223372036854775807", "1e21", "9.9e20", "1e22", "1.7e308", "1.8e308", "1e999", "-1e999",
		"1e-999", "0e999", "123456789012345678901234567890", "0.000000000000000000001e21"} {
		v, ok := parseNumber([]byte(num))
		want, err := strconv.ParseFloat(num, 64)
		if decimalMagnitude([]byte(num)) > 21 {
			if ok {
				t.Errorf("parseNumber(%s) took a number above 1e21", num)
			}
			continue
		}
		if ok != (err == nil) || ok && v != want {
			t.Errorf("parseNumber(%s) = %v, %v; strconv says %v, %v", num, v, ok, want, err)
		}
	}
}
