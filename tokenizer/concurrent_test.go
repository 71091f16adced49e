package tokenizer

import (
	"slices"
	"sync"
	"testing"
)

// TestEncodeConcurrently: one Tokenizer shared by goroutines, as the
// router shares it across requests, encodes each text as it does alone.
// This is what the race detector has to check in this package; the
// differential tests, on one goroutine, skip under it (skipUnderRace).
func TestEncodeConcurrently(t *testing.T) {
	requireReference(t)
	var cases []corpusCase
	for _, c := range corpus(t) {
		if len(c.text) <= 16<<10 { // the huge texts add time, not interleavings
			cases = append(cases, c)
		}
	}
	for _, name := range []string{"qwen3", "deepseek_v3"} { // NFC and \p{P}/\p{S} classes

		t.Run(name, func(t *testing.T) {
			tok := loadFamily(t, nil, name)
			want := make([][]uint32, len(cases))
			for i, c := range cases {
				want[i] = tok.Encode(nil, c.text, true)
			}
			const goroutines = 4
			var wg sync.WaitGroup
			errs := make(chan string, goroutines)
			for g := range goroutines {
				wg.Go(func() {
					// Each goroutine starts at a different text, so that
					// different texts are in flight at once.
					for k := range cases {
						i := (k + g*len(cases)/goroutines) % len(cases)
						if got := tok.Encode(nil, cases[i].text, true); !slices.Equal(got, want[i]) {
							errs <- cases[i].name
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for name := range errs {
				t.Errorf("%s: a concurrent Encode gave other ids than a lone one", name)
			}
		})
	}
}
