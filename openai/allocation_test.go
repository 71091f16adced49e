//go:build !race

package openai

import (
	"strings"
	"testing"
)

func TestParseAllocations(t *testing.T) {
	text := strings.Repeat(`The quick brown fox \"jumps\" over the lazy dog.\n`, 300)
	cases := []struct {
		name string
		api  API
		body []byte
	}{
		{"tokens 4K", APICompletions, tokenBody(benchTokens(4096, 151935), ", ", true)},
		{"tokens compact", APICompletions, tokenBody(benchTokens(1024, 151935), ",", false)},
		{"batch of one", APICompletions, []byte(`{"prompt":[[1,2,3]],"stream":true}`)},
		{"text", APICompletions, []byte(`{"model":"m","prompt":"` + text + `","max_tokens":5}`)},
		{"escaped model and salt", APICompletions, []byte(`{"model":"m\u00e9","cache_salt":"s\/t","prompt":"x"}`)},
		{"chat", APIChatCompletions, []byte(`{"model":"m","messages":[{"role":"system","content":"` + text +
			`"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"stream":true,"logit_bias":{"5":1}}`)},
		{"deeply nested unknown field", APICompletions, []byte(`{"prompt":"x","d":` +
			strings.Repeat("[", 500) + strings.Repeat("]", 500) + `}`)},
		{"session control", APIChatCompletions, []byte(`{"messages":[{"role":"user","content":"hi"}],` +
			`"session_control":{"\u006fpen":{"capacity_of_str_len":65536},"close":false}}`)},
		{"token ids written as floats", APICompletions, []byte(`{"prompt":[1.0,-0,2e3,151935.0]}`)},
		{"refused: token ids 1e999 and 1.5", APICompletions, []byte(`{"prompt":[1e999,1.5]}`)},
		{"refused: batch", APICompletions, []byte(`{"prompt":[[1],[2]]}`)},
		{"refused: malformed", APICompletions, []byte(`{"prompt":[1,2,`)},
		{"refused: numbers out of range", APICompletions, []byte(`{"prompt":"x","max_tokens":1e999,"stream":-1E+400}`)},
	}
	p := Parser{MaxTokenID: 151935}
	r := new(ParsedRequest)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_ = p.Parse(tc.body, tc.api, r) // grow r's buffers once
			if n := testing.AllocsPerRun(50, func() { _ = p.Parse(tc.body, tc.api, r) }); n != 0 {
				t.Fatalf("Parse made %v allocations", n)
			}
		})
	}
}

func TestErrorAllocations(t *testing.T) {
	buf := make([]byte, 0, 512)
	if n := testing.AllocsPerRun(50, func() { buf = ErrBatchNotSupported.AppendJSON(buf[:0]) }); n != 0 {
		t.Fatalf("AppendJSON made %v allocations", n)
	}
}

func TestSSEScanAllocations(t *testing.T) {
	stream := []byte(strings.Join(vllmStream(64), "") + ": ping\r\n\r\nevent: error\ndata: {\"error\":{}}\n\n")
	n := testing.AllocsPerRun(50, func() {
		for b := stream; len(b) > 0; {
			end, _ := EventEnd(b, 0)
			if end < 0 {
				break
			}
			_ = ParseEvent(b[:end])
			b = b[end:]
		}
	})
	if n != 0 {
		t.Fatalf("scanning made %v allocations", n)
	}
}
