package prompt

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// toyTokenizer has the shape that matters to the prefix cache: added
// special tokens are matched first and split the input, and each piece
// between them is encoded on its own by a rule that merges across every
// other position (3-byte chunks from the piece's start, so a cut inside a
// piece shifts every chunk after it). With firstOnly it also marks the
// piece at offset 0 of the input, as a Metaspace pre-tokenizer with
// prepend_scheme "first" does, which makes pieces depend on their place.
type toyTokenizer struct {
	specials  []string // id = index + 1
	firstOnly bool
}

const toyMarker = 999

func (tk toyTokenizer) Encode(dst []uint32, text []byte, addSpecial bool) []uint32 {
	if addSpecial {
		panic("the prefix cache must encode without special tokens")
	}
	piece := 0
	for i := 0; i < len(text); {
		if id, n := tk.special(text[i:]); n > 0 {
			dst = append(dst, id)
			i += n
			continue
		}
		j := i
		for j < len(text) {
			if _, n := tk.special(text[j:]); n > 0 {
				break
			}
			j++
		}
		if tk.firstOnly && i == 0 {
			dst = append(dst, toyMarker)
		}
		for k := i; k < j; k += 3 {
			dst = append(dst, 1000+uint32(xxhash.Sum64(text[k:min(k+3, j)])%100000))
		}
		piece++
		i = j
	}
	return dst
}

func (tk toyTokenizer) special(b []byte) (uint32, int) {
	for i, s := range tk.specials {
		if bytes.HasPrefix(b, []byte(s)) {
			return uint32(i + 1), len(s)
		}
	}
	return 0, 0
}

// specialCuts is where the adapter cuts a rendered prompt: right after
// every special token.
func specialCuts(tk toyTokenizer, text []byte) []int {
	var cuts []int
	for i := 0; i < len(text); {
		if _, n := tk.special(text[i:]); n > 0 {
			i += n
			cuts = append(cuts, i)
			continue
		}
		i++
	}
	return cuts
}

var toySpecials = []string{"<|im_start|>", "<|im_end|>", "<s>"}

// randomTurn appends one chat turn in a template's shape to text.
func randomTurn(rng *rand.Rand, text []byte) []byte {
	roles := []string{"system", "user", "assistant"}
	text = append(text, "<|im_start|>"...)
	text = append(text, roles[rng.IntN(len(roles))]...)
	text = append(text, '\n')
	for range rng.IntN(40) {
		text = append(text, byte('a'+rng.IntN(26)))
		if rng.IntN(7) == 0 {
			text = append(text, ' ')
		}
	}
	return append(text, "<|im_end|>\n"...)
}

// TestPrefixCacheBoundaryRule: cutting a prompt right after its special
// tokens and encoding the pieces separately gives the whole prompt's ids,
// for conversations that grow turn by turn, with the cache reusing every
// earlier turn. The controls show the property is not vacuous: a cut
// inside a piece, or a tokenizer that treats the first piece specially,
// breaks it.
func TestPrefixCacheBoundaryRule(t *testing.T) {
	tk := toyTokenizer{specials: toySpecials}
	rng := rand.New(rand.NewPCG(1, 2))
	c := NewPrefixCache(1 << 20)
	for conv := range 50 {
		var text []byte
		seed := uint64(conv % 5) // conversations sharing a seed may share prefixes too
		if conv%2 == 0 {
			text = append(text, "<|im_start|>system\nYou are brief.<|im_end|>\n"...)
		}
		for turn := range 6 {
			text = randomTurn(rng, text)
			prompt := append(slices.Clip(text), "<|im_start|>assistant\n"...)
			want := tk.Encode(nil, prompt, false)
			before := c.Stats()
			got := c.Encode([]uint32{7}, tk, seed, prompt, specialCuts(tk, prompt))
			if got[0] != 7 || !slices.Equal(got[1:], want) {
				t.Fatalf("conversation %d turn %d: %v, want %v", conv, turn, got[1:], want)
			}
			if after := c.Stats(); turn > 0 && after.Hits == before.Hits {
				t.Fatalf("conversation %d turn %d: nothing of the earlier turns was reused", conv, turn)
			}
		}
	}
	st := c.Stats()
	if st.Hits == 0 || st.Misses == 0 || st.Segments == 0 || st.Bytes <= 0 || st.Evictions != 0 {
		t.Fatalf("stats %+v", st)
	}

	t.Run("cuts inside a piece break it", func(t *testing.T) {
		prompt := []byte("<|im_start|>user\nabcdefgh<|im_end|>\n")
		if got, want := NewPrefixCache(1<<20).Encode(nil, tk, 0, prompt, []int{20}), tk.Encode(nil, prompt, false); slices.Equal(got, want) {
			t.Fatal("a cut inside a piece did not change the ids: the toy tokenizer does not model merging")
		}
	})
	t.Run("a position-dependent tokenizer breaks it", func(t *testing.T) {
		first := toyTokenizer{specials: toySpecials, firstOnly: true}
		prompt := []byte("hello<|im_end|>world")
		got := NewPrefixCache(1<<20).Encode(nil, first, 0, prompt, specialCuts(first, prompt))
		if want := first.Encode(nil, prompt, false); slices.Equal(got, want) {
			t.Fatal("the cut did not change the ids of a prepend_scheme-first tokenizer")
		}
	})
}

func TestPrefixCacheCutsAndSeeds(t *testing.T) {
	tk := toyTokenizer{specials: toySpecials}
	prompt := []byte("<s>abc<|im_end|>defg<|im_end|>")
	want := tk.Encode(nil, prompt, false)
	c := NewPrefixCache(1 << 20)
	// Out-of-range, repeated and zero cuts are passed over.
	for _, cuts := range [][]int{nil, {0}, {3, 3, 16}, {3, 16, 1000}, specialCuts(tk, prompt)} {
		if got := c.Encode(nil, tk, 0, prompt, cuts); !slices.Equal(got, want) {
			t.Fatalf("cuts %v: %v, want %v", cuts, got, want)
		}
	}
	// A seed is its own namespace: the same text under another seed is a miss.
	st := c.Stats()
	c.Encode(nil, tk, 1, prompt, specialCuts(tk, prompt))
	if after := c.Stats(); after.Hits != st.Hits {
		t.Fatalf("seed 1 hit seed 0's segments: %+v then %+v", st, after)
	}
	if got := c.Encode(nil, tk, 0, nil, nil); len(got) != 0 {
		t.Fatalf("empty text: %v", got)
	}
}

// TestPrefixCacheBudget: the cache never holds more than its budget, drops
// the least recently used segment first, and stores nothing larger than
// the whole budget.
func TestPrefixCacheBudget(t *testing.T) {
	tk := toyTokenizer{specials: toySpecials}
	seg := func(s string) []byte { return []byte(s + "<|im_end|>") } // one segment each
	one := int64(4*(2+1) + segmentOverhead)                          // 5 bytes of text: 2 chunks and the special
	c := NewPrefixCache(3 * one)
	for _, s := range []string{"aaaaa", "bbbbb", "ccccc"} {
		c.Encode(nil, tk, 0, seg(s), nil)
	}
	if st := c.Stats(); st.Segments != 3 || st.Bytes != 3*one || st.Evictions != 0 {
		t.Fatalf("stats %+v", st)
	}
	c.Encode(nil, tk, 0, seg("aaaaa"), nil) // a is now the most recently used
	c.Encode(nil, tk, 0, seg("ddddd"), nil) // evicts b
	st := c.Stats()
	if st.Segments != 3 || st.Bytes != 3*one || st.Evictions != 1 || st.MaxBytes != 3*one {
		t.Fatalf("stats %+v", st)
	}
	// In this order: the hits move nothing out, the miss comes last.
	for _, tc := range []struct {
		s      string
		cached bool
	}{{"aaaaa", true}, {"ccccc", true}, {"ddddd", true}, {"bbbbb", false}} {
		before := c.Stats().Hits
		c.Encode(nil, tk, 0, seg(tc.s), nil)
		if hit := c.Stats().Hits > before; hit != tc.cached {
			t.Errorf("%s: hit %v, want %v", tc.s, hit, tc.cached)
		}
	}
	big := NewPrefixCache(one - 1)
	if got := big.Encode(nil, tk, 0, seg("aaaaa"), nil); !slices.Equal(got, tk.Encode(nil, seg("aaaaa"), false)) {
		t.Fatal(got)
	}
	if st := big.Stats(); st.Segments != 0 || st.Bytes != 0 {
		t.Fatalf("a segment over the budget was stored: %+v", st)
	}
}

// TestPrefixCacheConcurrent: conversations sharing a system prompt, encoded
// from several goroutines at once, all get the ids a fresh encode gives,
// under a budget small enough to evict while they run.
func TestPrefixCacheConcurrent(t *testing.T) {
	tk := toyTokenizer{specials: toySpecials}
	c := NewPrefixCache(8 << 10)
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for range 20 {
				text := []byte("<|im_start|>system\nShared system prompt for all.<|im_end|>\n")
				for range 5 {
					text = randomTurn(rng, text)
					want := tk.Encode(nil, text, false)
					if got := c.Encode(nil, tk, 0, text, specialCuts(tk, text)); !slices.Equal(got, want) {
						errs <- string(text)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Errorf("wrong ids for %q", e)
	}
	if st := c.Stats(); st.Bytes > 8<<10 || st.Evictions == 0 {
		t.Errorf("stats %+v: want evictions within the budget", st)
	}
}

// BenchmarkPrefixCache: a new turn of a long conversation, its earlier
// turns cached, against encoding it whole (the toy tokenizer is cheap, so
// this measures the cache's own cost: hashing and copying).
func BenchmarkPrefixCache(b *testing.B) {
	tk := toyTokenizer{specials: toySpecials}
	rng := rand.New(rand.NewPCG(3, 4))
	var text []byte
	for range 60 {
		text = randomTurn(rng, text)
	}
	cuts := specialCuts(tk, text)
	b.Run("cached", func(b *testing.B) {
		c := NewPrefixCache(1 << 20)
		var enc Encoder = tk // boxed once, as a renderer holds its tokenizer
		dst := c.Encode(nil, enc, 0, text, cuts)
		b.ReportAllocs()
		b.SetBytes(int64(len(text)))
		for b.Loop() {
			dst = c.Encode(dst[:0], enc, 0, text, cuts)
		}
	})
	b.Run("uncached", func(b *testing.B) {
		dst := tk.Encode(nil, text, false)
		b.ReportAllocs()
		b.SetBytes(int64(len(text)))
		for b.Loop() {
			dst = tk.Encode(dst[:0], text, false)
		}
	})
}
