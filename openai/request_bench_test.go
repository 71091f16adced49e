package openai

import (
	"encoding/json"
	"strings"
	"testing"
)

// BenchmarkParseRequest measures the parser on token and text bodies against
// encoding/json decoding the same fields into a struct, the obvious baseline.
func BenchmarkParseRequest(b *testing.B) {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 360) // ~16 KB, ~4K tokens
	bodies := []struct {
		name string
		api  API
		body []byte
	}{
		{"tokens-1K", APICompletions, tokenBody(benchTokens(1024, 151935), ", ", true)},
		{"tokens-4K", APICompletions, tokenBody(benchTokens(4096, 151935), ", ", true)},
		{"text-16KB", APICompletions, []byte(`{"model":"m","prompt":"` + text + `","max_tokens":128,"stream":true}`)},
		{"chat-16KB", APIChatCompletions, []byte(`{"model":"m","messages":[{"role":"system","content":"You are helpful."},` +
			`{"role":"user","content":"` + text + `"}],"max_tokens":128,"stream":true}`)},
	}
	for _, bb := range bodies {
		b.Run(bb.name+"/kvfast", func(b *testing.B) {
			p := Parser{MaxTokenID: 151935}
			r := new(ParsedRequest)
			b.SetBytes(int64(len(bb.body)))
			b.ReportAllocs()
			for b.Loop() {
				if err := p.Parse(bb.body, bb.api, r); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
		b.Run(bb.name+"/encoding_json", func(b *testing.B) {
			// The fields routing needs, typed the way a straightforward
			// server would declare them.
			var req struct {
				Model     string          `json:"model"`
				Prompt    json.RawMessage `json:"prompt"`
				Messages  json.RawMessage `json:"messages"`
				Stream    bool            `json:"stream"`
				MaxTokens *int64          `json:"max_tokens"`
				CacheSalt string          `json:"cache_salt"`
			}
			var tokens []uint32
			b.SetBytes(int64(len(bb.body)))
			b.ReportAllocs()
			for b.Loop() {
				req.Prompt, req.Messages = req.Prompt[:0], req.Messages[:0]
				if err := json.Unmarshal(bb.body, &req); err != nil {
					b.Fatal(err)
				}
				if len(req.Prompt) > 0 && req.Prompt[0] == '[' {
					tokens = tokens[:0]
					if err := json.Unmarshal(req.Prompt, &tokens); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
}
