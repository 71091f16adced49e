package replay

import (
	"slices"
	"testing"
)

func TestTokenSynth(t *testing.T) {
	rec := func(in int, ids ...uint64) *Record { return &Record{InputLength: in, HashIDs: ids} }
	t.Run("deterministic", func(t *testing.T) {
		s := TokenSynth{Seed: 7}
		a := s.AppendPrompt(nil, rec(1100, 4, 5, 6))
		b := s.AppendPrompt(make([]uint32, 0, 2000), rec(1100, 4, 5, 6))
		if len(a) != 1100 || !slices.Equal(a, b) {
			t.Fatalf("two syntheses differ (len %d, %d)", len(a), len(b))
		}
		if c := (TokenSynth{Seed: 8}).AppendPrompt(nil, rec(1100, 4, 5, 6)); slices.Equal(a, c) {
			t.Fatal("different seeds give the same prompt")
		}
		// Golden values: the mapping is part of what makes results
		// comparable across versions, so a change must be deliberate.
		if got, want := a[:4], []uint32{0x5694, 0x5edd, 0x7a20, 0x238f}; !slices.Equal(got, want) {
			t.Fatalf("first tokens %#x, want %#x", got, want)
		}
	})
	t.Run("shared ids share exactly their prefix", func(t *testing.T) {
		s := TokenSynth{BlockTokens: 16}
		a := s.AppendPrompt(nil, rec(3*512, 1, 2, 3))
		b := s.AppendPrompt(nil, rec(3*512, 1, 2, 9))
		c := s.AppendPrompt(nil, rec(3*512, 2, 1, 3))
		if len(a) != 48 || len(b) != 48 {
			t.Fatalf("lengths %d, %d, want 48", len(a), len(b))
		}
		if !slices.Equal(a[:32], b[:32]) {
			t.Fatal("shared ids 1,2 gave different tokens")
		}
		if slices.Equal(a[32:], b[32:]) {
			t.Fatal("ids 3 and 9 gave the same block")
		}
		if slices.Equal(a[:16], c[:16]) || !slices.Equal(a[:16], c[16:32]) {
			t.Fatal("a block's tokens must depend on its hash id alone")
		}
	})
	t.Run("partial last block is a prefix of the full block", func(t *testing.T) {
		s := TokenSynth{}
		full := s.AppendPrompt(nil, rec(1024, 1, 2))
		part := s.AppendPrompt(nil, rec(512+100, 1, 2))
		if len(part) != 612 || !slices.Equal(part, full[:612]) {
			t.Fatalf("partial prompt (len %d) is not a prefix of the full one", len(part))
		}
		if got := s.AppendBlock(nil, 2, 100); !slices.Equal(got, full[512:612]) {
			t.Fatal("AppendBlock disagrees with AppendPrompt")
		}
	})
	t.Run("scaled prompt lengths", func(t *testing.T) {
		s := TokenSynth{BlockTokens: 32}
		for _, r := range []*Record{rec(1, 1), rec(512, 1), rec(513, 1, 2), rec(40160, make([]uint64, 79)...)} {
			got := s.AppendPrompt(nil, r)
			if len(got) != s.PromptLen(r) {
				t.Fatalf("input %d: %d tokens, PromptLen says %d", r.InputLength, len(got), s.PromptLen(r))
			}
		}
		// 40160 = 78*512 + 224, and 224 tokens of 512 become 14 of 32.
		if n := s.PromptLen(rec(40160, make([]uint64, 79)...)); n != 78*32+14 {
			t.Fatalf("40160 tokens at 32/512 scale to %d, want %d", n, 78*32+14)
		}
	})
	t.Run("vocabulary bound", func(t *testing.T) {
		for _, v := range []uint32{1, 2, 100, DefaultVocab, 1 << 31} {
			s := TokenSynth{Vocab: v}
			seen := map[uint32]bool{}
			for _, tok := range s.AppendBlock(nil, 42, 4096) {
				if tok >= v {
					t.Fatalf("vocab %d: token %d", v, tok)
				}
				seen[tok] = true
			}
			if want := min(int(v), 50); len(seen) < want {
				t.Fatalf("vocab %d: only %d distinct tokens", v, len(seen))
			}
		}
	})
	t.Run("validate", func(t *testing.T) {
		for _, s := range []TokenSynth{{BlockTokens: -1}, {TraceBlockSize: -2}, {BlockTokens: maxBlockTokens + 1}} {
			if s.Validate() == nil {
				t.Errorf("%+v accepted", s)
			}
		}
		if err := (TokenSynth{}).Validate(); err != nil {
			t.Error(err)
		}
	})
}
