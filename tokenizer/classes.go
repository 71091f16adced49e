package tokenizer

import (
	"slices"
	"sync"
	"unicode/utf8"
)

// charClass is the set of Unicode properties the split patterns and the
// added-token rules ask about, one bit each.
type charClass uint16

const (
	clLetter      charClass = 1 << iota // \p{L}
	clNumber                            // \p{N}
	clSpace                             // \s: the White_Space property
	clUpper                             // \p{Lu}
	clLower                             // \p{Ll}
	clTitle                             // \p{Lt}
	clModifier                          // \p{Lm}
	clOtherLetter                       // \p{Lo}
	clMark                              // \p{M}
	clPunct                             // \p{P}
	clSymbol                            // \p{S}
	clWord                              // \w of Rust's regex crate: Alphabetic, M, Nd, Pc, Join_Control
	clNewline                           // \r or \n
	// clNormalizedAsIs marks what the model's normalization tables (of
	// Unicode 9.0) had not assigned, and so leave as they are.
	clNormalizedAsIs
)

// classRange gives the class of the code points lo to hi.
type classRange struct {
	lo, hi rune
	class  charClass
}

type runeRange struct{ lo, hi rune }

//go:generate node testdata/reference/gen-unicode.mjs

// bmpClasses holds the classes of the Basic Multilingual Plane, so that
// classifying a character there is one load; it is filled once, when the
// first tokenizer is built.
var (
	bmpClasses     []charClass
	bmpClassesOnce sync.Once
)

func initClasses() {
	bmpClassesOnce.Do(func() {
		t := make([]charClass, 0x10000)
		for r := range rune(0x10000) {
			t[r] = computeClass(r)
		}
		bmpClasses = t
	})
}

// computeClass looks r up in the generated Unicode 16.0 tables: the
// model's own implementation classifies with Oniguruma's and Rust's
// tables, which are newer than Go's unicode package.
func computeClass(r rune) charClass {
	var c charClass
	if i, ok := slices.BinarySearchFunc(classRanges, r, func(cr classRange, r rune) int {
		switch {
		case cr.hi < r:
			return -1
		case cr.lo > r:
			return 1
		}
		return 0
	}); ok {
		c = classRanges[i].class
	}
	if _, ok := slices.BinarySearchFunc(unassignedInNormalization, r, func(rr runeRange, r rune) int {
		switch {
		case rr.hi < r:
			return -1
		case rr.lo > r:
			return 1
		}
		return 0
	}); ok {
		c |= clNormalizedAsIs
	}
	return c
}

func classOf(r rune) charClass {
	if uint32(r) < 0x10000 {
		return bmpClasses[r]
	}
	return computeClass(r)
}

// decodeAt returns the character at s[i] and its size; s is valid UTF-8.
func decodeAt(s []byte, i int) (rune, int) {
	if b := s[i]; b < utf8.RuneSelf {
		return rune(b), 1
	}
	return utf8.DecodeRune(s[i:])
}

// classAt returns the class of the character at s[i] and its size.
func classAt(s []byte, i int) (charClass, int) {
	if b := s[i]; b < utf8.RuneSelf {
		return bmpClasses[b], 1
	}
	r, n := utf8.DecodeRune(s[i:])
	return classOf(r), n
}

// lastRuneStart returns where the character ending at s[end] begins.
func lastRuneStart(s []byte, end int) int {
	_, n := utf8.DecodeLastRune(s[:end])
	return end - n
}
