package tokenizer

import (
	"bytes"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites a piece of text before pre-tokenization. apply
// appends the normalized form of src to dst; src and dst never overlap.
type normalizer interface {
	apply(st *encodeState, dst, src []byte) []byte
}

type normSequence []normalizer

func (n normSequence) apply(st *encodeState, dst, src []byte) []byte {
	// Ping-pong between two scratch buffers; the last step writes dst.
	cur := src
	for i, step := range n {
		if i == len(n)-1 {
			return step.apply(st, dst, cur)
		}
		buf := &st.normA
		if i%2 == 1 {
			buf = &st.normB
		}
		*buf = step.apply(st, (*buf)[:0], cur)
		cur = *buf
	}
	return append(dst, cur...)
}

// unicodeNorm is NFC, NFD, NFKC or NFKD.
type unicodeNorm struct{ form norm.Form }

func (n unicodeNorm) apply(st *encodeState, dst, src []byte) []byte {
	// What the model's (Unicode 9.0) tables do not know is a starter they
	// leave alone, so the text is normalized around it.
	for i := 0; i < len(src); {
		if src[i] < utf8.RuneSelf {
			i++
			continue
		}
		c, size := classAt(src, i)
		if c&clNormalizedAsIs == 0 {
			i += size
			continue
		}
		dst = n.normalize(st, dst, src[:i])
		dst = append(dst, src[i:i+size]...)
		src = src[i+size:]
		i = 0
	}
	return n.normalize(st, dst, src)
}

func (n unicodeNorm) normalize(st *encodeState, dst, src []byte) []byte {
	// Copy what is already normal, and normalize the segments that may
	// not be one at a time, so that one combining mark does not send the
	// rest of a prompt through the slow path. QuickSpan, NextBoundary and
	// an Iter kept in the state allocate nothing, unlike Form.Append.
	for len(src) > 0 {
		p := n.form.QuickSpan(src)
		dst = append(dst, src[:p]...)
		src = src[p:]
		if len(src) == 0 {
			break
		}
		q := n.form.NextBoundary(src, true)
		if q <= 0 {
			q = len(src)
		}
		st.normIter.Init(n.form, src[:q])
		for !st.normIter.Done() {
			dst = append(dst, st.normIter.Next()...)
		}
		src = src[q:]
	}
	return dst
}

type lowercase struct{}

func (lowercase) apply(_ *encodeState, dst, src []byte) []byte {
	for i := 0; i < len(src); {
		r, n := decodeAt(src, i)
		i += n
		if r == 'İ' {
			// The one unconditional lower-case mapping to two
			// characters, which a per-character to_lowercase makes.
			dst = append(dst, "i\u0307"...)
			continue
		}
		dst = utf8.AppendRune(dst, unicode.ToLower(r))
	}
	return dst
}

type strip struct{ left, right bool }

func (s strip) apply(_ *encodeState, dst, src []byte) []byte {
	if s.left {
		src = bytes.TrimLeftFunc(src, isWhitespace)
	}
	if s.right {
		src = bytes.TrimRightFunc(src, isWhitespace)
	}
	return append(dst, src...)
}

type stripAccents struct{}

func (stripAccents) apply(_ *encodeState, dst, src []byte) []byte {
	for i := 0; i < len(src); {
		r, n := decodeAt(src, i)
		if classOf(r)&clMark == 0 {
			dst = append(dst, src[i:i+n]...)
		}
		i += n
	}
	return dst
}

type prepend struct{ prefix string }

func (p prepend) apply(_ *encodeState, dst, src []byte) []byte {
	if len(src) == 0 {
		return dst
	}
	return append(append(dst, p.prefix...), src...)
}

// replace substitutes content for every match of a pattern.
type replace struct {
	m       matcher
	content string
}

func (r replace) apply(st *encodeState, dst, src []byte) []byte {
	matches := r.m.appendMatches(st, src, st.replaceSpans[:0])
	st.replaceSpans = matches
	prev := 0
	for _, m := range matches {
		dst = append(dst, src[prev:m.start]...)
		dst = append(dst, r.content...)
		prev = m.end
	}
	return append(dst, src[prev:]...)
}
