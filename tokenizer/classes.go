package tokenizer

import (
	"sync"
	"unicode"
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
)

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

func computeClass(r rune) charClass {
	var c charClass
	if unicode.IsLetter(r) {
		c |= clLetter
		switch {
		case unicode.Is(unicode.Lu, r):
			c |= clUpper
		case unicode.Is(unicode.Ll, r):
			c |= clLower
		case unicode.Is(unicode.Lt, r):
			c |= clTitle
		case unicode.Is(unicode.Lm, r):
			c |= clModifier
		case unicode.Is(unicode.Lo, r):
			c |= clOtherLetter
		}
	}
	if unicode.IsNumber(r) {
		c |= clNumber
	}
	if unicode.IsSpace(r) {
		c |= clSpace
	}
	if unicode.IsMark(r) {
		c |= clMark
	}
	if unicode.IsPunct(r) {
		c |= clPunct
	}
	if unicode.IsSymbol(r) {
		c |= clSymbol
	}
	if unicode.IsLetter(r) || unicode.Is(unicode.Nl, r) || unicode.Is(unicode.Other_Alphabetic, r) ||
		unicode.IsMark(r) || unicode.Is(unicode.Nd, r) || unicode.Is(unicode.Pc, r) ||
		unicode.Is(unicode.Join_Control, r) {
		c |= clWord
	}
	if r == '\r' || r == '\n' {
		c |= clNewline
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
