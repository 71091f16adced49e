package replay

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// benchRecord is a typical long Mooncake prompt: 40160 tokens.
func benchRecord() *Record {
	rec := &Record{InputLength: 40160, OutputLength: 6, HashIDs: make([]uint64, 79)}
	for i := range rec.HashIDs {
		rec.HashIDs[i] = uint64(i)
	}
	return rec
}

// BenchmarkPromptBody measures synthesising a prompt and encoding its
// request body into reused buffers, against encoding/json as the baseline.
func BenchmarkPromptBody(b *testing.B) {
	rec := benchRecord()
	synth := TokenSynth{}
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		body := newRequestBody("mock")
		var tokens []uint32
		var buf []byte
		for b.Loop() {
			tokens = synth.AppendPrompt(tokens[:0], rec)
			buf = body.appendBody(buf[:0], tokens, rec.OutputLength)
		}
		b.ReportMetric(float64(b.N)*float64(len(tokens))/b.Elapsed().Seconds(), "tokens/s")
	})
	b.Run("chat", func(b *testing.B) {
		b.ReportAllocs()
		body := newRequestBody("mock")
		chat := ChatSynth{}.normalized()
		var buf []byte
		for b.Loop() {
			buf = body.appendChat(buf[:0], chat, rec, rec.OutputLength)
		}
		words, _ := chat.PromptLen(rec)
		b.ReportMetric(float64(b.N)*float64(words)/b.Elapsed().Seconds(), "words/s")
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		type request struct {
			Model         string          `json:"model"`
			Stream        bool            `json:"stream"`
			StreamOptions map[string]bool `json:"stream_options"`
			IgnoreEOS     bool            `json:"ignore_eos"`
			MaxTokens     int             `json:"max_tokens"`
			Prompt        []uint32        `json:"prompt"`
		}
		var tokens []uint32
		for b.Loop() {
			tokens = synth.AppendPrompt(tokens[:0], rec)
			if _, err := json.Marshal(request{"mock", true, map[string]bool{"include_usage": true}, true, rec.OutputLength, tokens}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)*float64(len(tokens))/b.Elapsed().Seconds(), "tokens/s")
	})
}

// BenchmarkReadStream measures the client's cost per streamed output event.
func BenchmarkReadStream(b *testing.B) {
	const events = 100
	var sb strings.Builder
	for i := range events {
		finish := "null"
		if i == events-1 {
			finish = `"length"`
		}
		sb.WriteString(`data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"mock","choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":` + finish + "}]}\n\n")
	}
	sb.WriteString(`data: {"choices":[],"usage":{"prompt_tokens":40160,"completion_tokens":100,"prompt_tokens_details":{"cached_tokens":30000}}}` + "\n\ndata: [DONE]\n\n")
	body := sb.String()
	var (
		r   runner
		buf requestBuffers
		rd  strings.Reader
	)
	b.ReportAllocs()
	for b.Loop() {
		rd.Reset(body)
		var rr RequestResult
		buf.gaps = buf.gaps[:0]
		if err := r.readStream(&rd, &buf, time.Now(), &rr); err != nil || rr.Chunks != events {
			b.Fatal(err, rr.Chunks)
		}
	}
	b.ReportMetric(float64(b.N)*events/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkHitBound measures the bound over the shipped trace, prefix
// analysis included.
func BenchmarkHitBound(b *testing.B) {
	path := shippedTracePath(b)
	tr, err := LoadTrace(path, TraceOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		fresh := &Trace{BlockSize: tr.BlockSize, Records: tr.Records}
		_ = fresh.HitBound(0)
	}
	b.ReportMetric(float64(b.N)*float64(tr.Len())/b.Elapsed().Seconds(), "records/s")
}
