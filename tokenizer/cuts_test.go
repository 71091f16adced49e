package tokenizer

import (
	"slices"
	"testing"
)

// TestCutsKeepIDs: encoding a text in the pieces AppendCuts names gives
// the ids of encoding it whole, for every reference family, on corpus text
// interleaved with the family's own added tokens (as a rendered chat
// template interleaves them). Encode itself is held to Hugging Face's ids
// by TestExactAgainstReference, so this ties the cuts to the engine too.
func TestCutsKeepIDs(t *testing.T) {
	skipUnderRace(t)
	requireReference(t)
	cases := corpus(t)
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			tok, err := Load(familyDir(fam.name))
			if err != nil {
				t.Fatal(err)
			}
			if tok.rawTokens == nil {
				t.Skip("no raw added tokens to cut around")
			}
			added := tok.rawTokens.tokens
			var text []byte
			for i, c := range cases[:min(len(cases), 200)] {
				a := added[i%len(added)]
				text = append(text, a.content...)
				text = append(text, c.text...)
				if i%3 == 0 {
					text = append(text, a.content...) // adjacent tokens, and a token at a piece's end
				}
			}
			whole := tok.Encode(nil, text, false)
			cuts := tok.AppendCuts(nil, text)
			if !tok.positional && len(cuts) == 0 {
				t.Fatal("no cuts in a text full of added tokens")
			}
			if !slices.IsSorted(cuts) {
				t.Fatalf("cuts not ascending: %v", cuts[:min(len(cuts), 20)])
			}
			var pieces []uint32
			start := 0
			for _, c := range append(cuts, len(text)) {
				pieces = tok.Encode(pieces, text[start:c], false)
				start = c
			}
			if !slices.Equal(pieces, whole) {
				t.Fatalf("%d cuts change the ids:\n%s", len(cuts), diffIDs(pieces, whole))
			}
			t.Logf("%d bytes, %d cuts, %d ids", len(text), len(cuts), len(whole))
		})
	}
}
