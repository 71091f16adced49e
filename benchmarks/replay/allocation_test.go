//go:build !race

package replay

import "testing"

func TestZeroAllocs(t *testing.T) {
	rec := &Record{InputLength: 40160, HashIDs: make([]uint64, 79)}
	for i := range rec.HashIDs {
		rec.HashIDs[i] = uint64(i)
	}
	synth := TokenSynth{}
	chat := ChatSynth{}.normalized()
	tokens := make([]uint32, 0, synth.PromptLen(rec))
	body := newRequestBody("mock")
	buf := make([]byte, 0, 1<<20)
	tests := []struct {
		name string
		fn   func()
	}{
		{"AppendPrompt", func() { tokens = synth.AppendPrompt(tokens[:0], rec) }},
		{"appendBody", func() { buf = body.appendBody(buf[:0], tokens, 92) }},
		{"appendChat", func() { buf = body.appendChat(buf[:0], chat, rec, 92) }},
		{"Percentile", func() { _ = Percentile(nil, 0.5) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if n := testing.AllocsPerRun(20, tt.fn); n != 0 {
				t.Fatalf("%v allocations per run, want 0", n)
			}
		})
	}
}
