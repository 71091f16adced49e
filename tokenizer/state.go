package tokenizer

import (
	"hash/maphash"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// encodeState is the scratch memory of one Encode call; Tokenizer pools
// them, so that a steady stream of requests allocates nothing.
type encodeState struct {
	lossy    []byte
	rawSegs  []addedMatch
	normSegs []addedMatch
	norm     []byte
	normA    []byte
	normB    []byte
	normIter norm.Iter

	arena    []byte
	piecesA  []piece
	piecesB  []piece
	matches  []span
	segments []segment
	spans    []span

	replaceSpans []span
	runes        []rune
	runeOffsets  []int

	syms  []symbol
	queue mergeQueue
	unit  []byte
	unit2 []byte

	cache wordCache
}

// maxRetainedBytes caps what a pooled state keeps of a buffer that a huge
// input grew, so that one large prompt does not pin its memory.
const maxRetainedBytes = 16 << 20

// trim drops buffers a huge input grew past maxRetainedBytes.
func (st *encodeState) trim() {
	if cap(st.lossy) > maxRetainedBytes {
		st.lossy = nil
	}
	if cap(st.norm) > maxRetainedBytes {
		st.norm = nil
	}
	if cap(st.normA) > maxRetainedBytes {
		st.normA = nil
	}
	if cap(st.normB) > maxRetainedBytes {
		st.normB = nil
	}
	if cap(st.arena) > maxRetainedBytes {
		st.arena = nil
	}
	if cap(st.piecesA)*24 > maxRetainedBytes {
		st.piecesA = nil
	}
	if cap(st.piecesB)*24 > maxRetainedBytes {
		st.piecesB = nil
	}
	if cap(st.matches)*16 > maxRetainedBytes {
		st.matches = nil
	}
	if cap(st.segments)*24 > maxRetainedBytes {
		st.segments = nil
	}
	if cap(st.spans)*16 > maxRetainedBytes {
		st.spans = nil
	}
	if cap(st.rawSegs)*24 > maxRetainedBytes {
		st.rawSegs = nil
	}
	if cap(st.normSegs)*24 > maxRetainedBytes {
		st.normSegs = nil
	}
	if cap(st.replaceSpans)*16 > maxRetainedBytes {
		st.replaceSpans = nil
	}
	if cap(st.runes)*4 > maxRetainedBytes {
		st.runes, st.runeOffsets = nil, nil
	}
	if cap(st.syms)*16 > maxRetainedBytes {
		st.syms = nil
	}
	if cap(st.queue)*12 > maxRetainedBytes {
		st.queue = nil
	}
}

// Word cache geometry: a word of up to cacheKeyBytes bytes that BPE turns
// into at most cacheMaxIDs tokens is remembered, in a direct-mapped table
// of cacheSlots entries (about 450 KiB per pooled state).
const (
	cacheSlots    = 4096
	cacheKeyBytes = 32
	cacheMaxIDs   = 16
)

type cacheSlot struct {
	hash uint64 // 0: empty
	klen uint8
	n    uint8
	key  [cacheKeyBytes]byte
	ids  [cacheMaxIDs]uint32
}

// wordCache remembers the tokens of recent words: prose repeats its
// words, and a hit skips BPE.
type wordCache struct {
	seed  maphash.Seed
	slots []cacheSlot
}

func (c *wordCache) get(word []byte) ([]uint32, uint64, bool) {
	if c.slots == nil {
		c.seed = maphash.MakeSeed()
		c.slots = make([]cacheSlot, cacheSlots)
	}
	h := maphash.Bytes(c.seed, word) | 1
	s := &c.slots[h&(cacheSlots-1)]
	if s.hash == h && int(s.klen) == len(word) && string(s.key[:s.klen]) == string(word) {
		return s.ids[:s.n], h, true
	}
	return nil, h, false
}

func (c *wordCache) put(h uint64, word []byte, ids []uint32) {
	s := &c.slots[h&(cacheSlots-1)]
	s.hash = h
	s.klen = uint8(copy(s.key[:], word))
	s.n = uint8(copy(s.ids[:], ids))
}

// appendLossy appends s with every maximal ill-formed subsequence replaced
// by U+FFFD, as a WHATWG UTF-8 decoder (Node's, a browser's) reads bytes
// into a string.
func appendLossy(dst, s []byte) []byte {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRune(s[i:])
		if r != utf8.RuneError || n > 1 {
			dst = append(dst, s[i:i+n]...)
			i += n
			continue
		}
		dst = append(dst, "\uFFFD"...)
		i += maximalSubpart(s[i:])
	}
	return dst
}

// maximalSubpart is the length of the ill-formed sequence at the start of
// s that one U+FFFD replaces: a lead byte and the continuation bytes that
// could still have completed it.
func maximalSubpart(s []byte) int {
	lo, hi := byte(0x80), byte(0xBF)
	need := 0
	switch b := s[0]; {
	case b >= 0xC2 && b <= 0xDF:
		need = 1
	case b == 0xE0:
		need, lo = 2, 0xA0
	case b == 0xED:
		need, hi = 2, 0x9F
	case b >= 0xE1 && b <= 0xEF:
		need = 2
	case b == 0xF0:
		need, lo = 3, 0x90
	case b == 0xF4:
		need, hi = 3, 0x8F
	case b >= 0xF1 && b <= 0xF3:
		need = 3
	default:
		return 1
	}
	i := 1
	for ; i <= need && i < len(s); i++ {
		if s[i] < lo || s[i] > hi {
			break
		}
		lo, hi = 0x80, 0xBF
	}
	return i
}
