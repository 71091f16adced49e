package openai

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// BenchmarkSSEScan measures splitting and classifying a vLLM-shaped stream,
// against the obvious way: a line scanner and encoding/json per event.
func BenchmarkSSEScan(b *testing.B) {
	events := vllmStream(256)
	stream := []byte(strings.Join(events, ""))
	b.Run("kvfast", func(b *testing.B) {
		b.SetBytes(int64(len(stream)))
		b.ReportAllocs()
		items := 0
		for b.Loop() {
			for buf := stream; len(buf) > 0; {
				n, _ := EventEnd(buf, 0)
				if n < 0 {
					break
				}
				if ParseEvent(buf[:n]).Kind == EventItem {
					items++
				}
				buf = buf[n:]
			}
		}
		b.ReportMetric(float64(b.N*len(events))/b.Elapsed().Seconds(), "events/s")
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.SetBytes(int64(len(stream)))
		b.ReportAllocs()
		var chunk struct {
			Error   json.RawMessage `json:"error"`
			Choices []struct {
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		items := 0
		for b.Loop() {
			sc := bufio.NewScanner(bytes.NewReader(stream))
			for sc.Scan() {
				line := sc.Bytes()
				if !bytes.HasPrefix(line, []byte("data: ")) || bytes.Equal(line[6:], []byte("[DONE]")) {
					continue
				}
				chunk.Choices, chunk.Error = chunk.Choices[:0], nil
				if err := json.Unmarshal(line[6:], &chunk); err != nil {
					b.Fatal(err)
				}
				if len(chunk.Choices) > 0 {
					items++
				}
			}
		}
		b.ReportMetric(float64(b.N*len(events))/b.Elapsed().Seconds(), "events/s")
	})
}
