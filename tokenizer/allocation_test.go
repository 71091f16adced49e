//go:build !race

package tokenizer

import "testing"

// TestEncodeAllocatesNothing asserts the hot path's promise: once its
// pooled state has grown, Encode makes no allocation, for every family
// and for the corpus's hardest texts (normalization, invalid UTF-8, long
// words that take the heap-based merge).
func TestEncodeAllocatesNothing(t *testing.T) {
	requireReference(t)
	cases := corpus(t)
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			tok := loadFamily(t, nil, fam.name)
			dst := make([]uint32, 0, 1<<20)
			for _, c := range cases {
				dst = tok.Encode(dst[:0], c.text, true) // grow the state
			}
			for _, c := range cases {
				if len(c.text) > 1<<20 {
					continue // a huge input may outgrow what a pooled state keeps
				}
				encode := func() { dst = tok.Encode(dst[:0], c.text, true) }
				// AllocsPerRun runs at GOMAXPROCS 1, which gives sync.Pool a
				// new set of per-P caches: warm those first, then measure.
				testing.AllocsPerRun(1, encode)
				allocs := testing.AllocsPerRun(5, encode)
				if allocs != 0 {
					t.Errorf("%s: Encode made %v allocations, want 0", c.name, allocs)
				}
			}
		})
	}
}
