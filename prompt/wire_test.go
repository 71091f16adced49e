package prompt

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/kvfast/kvfast/openai"
)

// TestAppendTokenizeBody: the /tokenize body carries exactly the
// prompt-shaping fields, as the client wrote them, and a completions
// prompt as the string /tokenize takes.
func TestAppendTokenizeBody(t *testing.T) {
	cases := []struct {
		name string
		api  openai.API
		body string
		want string
	}{
		{"completions", openai.APICompletions,
			`{"model":"m","prompt":"hi \"there\"\n","max_tokens":5,"add_special_tokens":false,"stream":true}`,
			`{"model":"m","add_special_tokens":false,"prompt":"hi \"there\"\n"}`},
		{"completions batch of one, no model", openai.APICompletions,
			` { "prompt" : [ "a\u00e9" ] } `,
			`{"prompt":"a\u00e9"}`},
		{"chat", openai.APIChatCompletions,
			`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"model":"m","temperature":0,` +
				`"tools":[{"type":"function","function":{"name":"f"}}],"chat_template_kwargs":{"enable_thinking":false},` +
				`"add_generation_prompt":false,"continue_final_message":true,"add_special_tokens":true,"chat_template":"t",` +
				`"mm_processor_kwargs":{},"media_io_kwargs":null,"stream":false,"n":1}`,
			`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"model":"m",` +
				`"tools":[{"type":"function","function":{"name":"f"}}],"chat_template_kwargs":{"enable_thinking":false},` +
				`"add_generation_prompt":false,"continue_final_message":true,"add_special_tokens":true,"chat_template":"t",` +
				`"mm_processor_kwargs":{},"media_io_kwargs":null}`},
		{"chat, a duplicate key kept twice (the engine keeps the last)", openai.APIChatCompletions,
			`{"model":"a","messages":[{"role":"user","content":"x"}],"model":"b"}`,
			`{"model":"a","messages":[{"role":"user","content":"x"}],"model":"b"}`},
		{"escaped keys are read as the engine reads them", openai.APIChatCompletions,
			`{"\u006dodel":"a","messages":[{"role":"user","content":"x"}]}`,
			`{"model":"a","messages":[{"role":"user","content":"x"}]}`},
	}
	var p openai.Parser
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var r openai.ParsedRequest
			if err := p.Parse([]byte(tc.body), tc.api, &r); err != nil {
				t.Fatal(err)
			}
			got := appendTokenizeBody([]byte("junk"), []byte(tc.body), tc.api, &r)
			if string(got) != "junk"+tc.want {
				t.Fatalf("body\n%s\nwant\n%s", got[4:], tc.want)
			}
			if !json.Valid(got[4:]) {
				t.Fatalf("not JSON: %s", got[4:])
			}
		})
	}
}

func TestTokenArray(t *testing.T) {
	cases := []struct {
		body  string
		shape responseShape
		key   string
		want  string // "" for not found
	}{
		{`{"count":3,"tokens":[1,2,3],"max_model_len":8}`, shapeObject, "tokens", `[1,2,3]`},
		{` { "token_ids" : [ 1 , 2 ] , "sampling_params" : {"max_tokens":[1,{"a":"]"}]}} `, shapeObject, "token_ids", `[ 1 , 2 ]`},
		{`{"tokens":[1],"tokens":[2]}`, shapeObject, "tokens", `[2]`},
		{`[{"request_id":"x","token_ids":[7,8],"features":null}]`, shapeList, "token_ids", `[7,8]`},
		{`[ {"token_ids":[7]} ]`, shapeList, "token_ids", `[7]`},
		{`{}`, shapeObject, "tokens", ``},
		{`{"toke\u006es":[1]}`, shapeObject, "tokens", `[1]`},
		{`{"tokens":[1]`, shapeObject, "tokens", ``},
		{`{"tokens":[1]} x`, shapeObject, "tokens", ``},
		{`{"tokens":[1],}`, shapeObject, "tokens", ``},
		{`{"tokens" [1]}`, shapeObject, "tokens", ``},
		{`[{"token_ids":[1]},{"token_ids":[2]}]`, shapeList, "token_ids", ``},
		{`{"token_ids":[1]}`, shapeList, "token_ids", ``},
		{`[{"token_ids":[1]}]`, shapeObject, "token_ids", ``},
		{`[]`, shapeList, "token_ids", ``},
		{``, shapeObject, "tokens", ``},
		{`{"detail":"Not Found"}`, shapeObject, "tokens", ``},
	}
	for _, tc := range cases {
		got, ok := tokenArray([]byte(tc.body), tc.shape, tc.key)
		if string(got) != tc.want || ok != (tc.want != "") {
			t.Errorf("tokenArray(%s, %d, %s) = %q, %v; want %q", tc.body, tc.shape, tc.key, got, ok, tc.want)
		}
	}
}

func TestRouteMissing(t *testing.T) {
	cases := []struct {
		status int
		body   string
		want   bool
	}{
		{404, `{"detail":"Not Found"}`, true},
		{404, ``, true},
		{405, `{"detail":"Method Not Allowed"}`, true},
		{501, `{"error":{"message":"The model does not support Chat Completions Render API"}}`, true},
		{404, `{"error":{"message":"The model x does not exist.","type":"NotFoundError","code":404}}`, false},
		{404, `{"object":"error","message":"The model x does not exist.","code":404}`, false},
		{400, `{"detail":"Not Found"}`, false},
		{200, `{}`, false},
	}
	for _, tc := range cases {
		if got := routeMissing(tc.status, []byte(tc.body)); got != tc.want {
			t.Errorf("routeMissing(%d, %s) = %v", tc.status, tc.body, got)
		}
	}
}

// FuzzTokenArray: whatever the engine sends, tokenArray returns a value
// that encoding/json agrees is the key's, or nothing.
func FuzzTokenArray(f *testing.F) {
	for _, s := range []string{`{"tokens":[1,2]}`, `[{"token_ids":[3]}]`, `{"a":{"tokens":[1]},"tokens":[]}`, `[`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		for _, shape := range []responseShape{shapeObject, shapeList} {
			got, ok := tokenArray([]byte(body), shape, "tokens")
			if !ok {
				continue
			}
			var obj map[string]json.RawMessage
			var doc any = &obj
			if shape == shapeList {
				var list []map[string]json.RawMessage
				if err := json.Unmarshal([]byte(body), &list); err != nil || len(list) != 1 {
					t.Fatalf("found %s in %q, which is not a list of one object: %v", got, body, err)
				}
				obj = list[0]
			} else if err := json.Unmarshal([]byte(body), doc); err != nil {
				t.Fatalf("found %s in %q, which is not an object: %v", got, body, err)
			}
			var a, b any
			if err := json.Unmarshal(got, &a); err != nil {
				t.Fatalf("found %q in %q: %v", got, body, err)
			}
			if err := json.Unmarshal(obj["tokens"], &b); err != nil || !reflect.DeepEqual(a, b) {
				t.Fatalf("found %s in %q; encoding/json has %s", got, body, obj["tokens"])
			}
		}
	})
}
