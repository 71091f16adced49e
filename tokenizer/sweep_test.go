package tokenizer

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestCodePointSweep encodes every code point of the planes in use, each
// in the contexts the split patterns tell apart (alone, after a space,
// between letters, after an apostrophe, beside digits, doubled), against
// the reference: it is where this package's Unicode tables (Go's) and the
// reference's (Oniguruma's, Rust's) would disagree.
func TestCodePointSweep(t *testing.T) {
	skipUnderRace(t)
	if testing.Short() {
		t.Skip("a million code points")
	}
	o := getOracle(t)
	const chunk = 1024
	var texts [][]byte
	for _, plane := range [][2]rune{{0, 0x40000}, {0xE0000, 0xE1000}} {
		for lo := plane[0]; lo < plane[1]; lo += chunk {
			var b strings.Builder
			for r := lo; r < lo+chunk; r++ {
				if !utf8.ValidRune(r) {
					continue
				}
				c := string(r)
				fmt.Fprintf(&b, "%s %sx%sy '%s 1%s2 %s%s\n", c, c, c, c, c, c, c)
			}
			texts = append(texts, []byte(b.String()))
		}
	}
	for _, fam := range families {
		if os.Getenv("KVFAST_SWEEP") == "sample" && !slices.Contains(sweepSample, fam.name) {
			continue
		}
		t.Run(fam.name, func(t *testing.T) {
			tok := loadFamily(t, o, fam.name)
			const batch = 16
			failures := 0
			for i := 0; i < len(texts); i += batch {
				group := texts[i:min(i+batch, len(texts))]
				want, err := o.encode(fam.name, group, false)
				if err != nil {
					t.Fatal(err)
				}
				for k, text := range group {
					if got := tok.Encode(nil, text, false); !slices.Equal(got, want[k]) {
						failures++
						if failures <= 5 {
							t.Errorf("%s", sweepDifference(tok, o, fam.name, text))
						}
					}
				}
			}
		})
	}
}

// sweepSample are the families the sweep covers with KVFAST_SWEEP=sample
// (make test): one per way of classifying characters (DeepSeek's \p{P}
// and \p{S}, o200k's letter cases, GPT-2's classes after NFKC, Qwen's
// after NFC).
var sweepSample = []string{"deepseek_v3", "gptoss", "claude", "qwen3"}

// skipUnderRace skips a differential test under the race detector. They
// encode on one goroutine, so the detector has nothing to find in them,
// and it made them three times slower: the longest part of CI. make test
// runs them without it (the tokenizer's concurrent use is raced by the
// tests of the packages that share one Tokenizer across requests).
func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("a single-goroutine differential test: make test runs it without the race detector")
	}
}

// sweepDifference narrows a failing chunk down to its first failing line.
func sweepDifference(tok *Tokenizer, o *oracle, name string, chunk []byte) string {
	lines := strings.SplitAfter(string(chunk), "\n")
	texts := make([][]byte, len(lines))
	for i, l := range lines {
		texts[i] = []byte(l)
	}
	want, err := o.encode(name, texts, false)
	if err != nil {
		return err.Error()
	}
	for i, l := range texts {
		if got := tok.Encode(nil, l, false); !slices.Equal(got, want[i]) {
			r, _ := utf8.DecodeRune(l)
			return fmt.Sprintf("U+%04X %q: %s", r, l, diffIDs(got, want[i]))
		}
	}
	return fmt.Sprintf("chunk starting %q differs only as a whole", chunk[:min(len(chunk), 40)])
}
