package tokenizer

// piece is a stretch of st.arena that pre-tokenization is splitting;
// first records that it starts where the input text starts, which
// Metaspace's "first" prepend scheme asks.
type piece struct {
	off, end int
	first    bool
}

// preTokenizer is one step of pre-tokenization: it appends the pieces one
// piece splits into (never empty ones), writing any rewritten text to the
// end of st.arena.
type preTokenizer interface {
	split(st *encodeState, p piece, out []piece) []piece
}

// appendSpans turns spans of p's text into pieces, dropping empty ones as
// the model's PreTokenizedString does.
func appendSpans(out []piece, p piece, spans []span) []piece {
	for _, s := range spans {
		if s.end > s.start {
			out = append(out, piece{off: p.off + s.start, end: p.off + s.end, first: p.first && s.start == 0})
		}
	}
	return out
}

// splitPre is the Split pre-tokenizer: a pattern and what to do with its
// matches.
type splitPre struct {
	m        matcher
	behavior splitBehavior
	invert   bool
}

func (s splitPre) split(st *encodeState, p piece, out []piece) []piece {
	text := st.arena[p.off:p.end]
	st.matches = s.m.appendMatches(st, text, st.matches[:0])
	if s.behavior == splitIsolated {
		// Matches and the gaps between them, in order: the common case,
		// with no segment list.
		prev := 0
		for _, m := range st.matches {
			out = appendSpan(out, p, prev, m.start)
			out = appendSpan(out, p, m.start, m.end)
			prev = m.end
		}
		return appendSpan(out, p, prev, len(text))
	}
	st.segments = appendSegments(st.segments[:0], st.matches, len(text), s.invert)
	st.spans = applyBehavior(st.segments, s.behavior, st.spans[:0])
	return appendSpans(out, p, st.spans)
}

func appendSpan(out []piece, p piece, start, end int) []piece {
	if end > start {
		out = append(out, piece{off: p.off + start, end: p.off + end, first: p.first && start == 0})
	}
	return out
}

// byteLevelPre is the ByteLevel pre-tokenizer. The model's vocabulary is
// re-keyed to raw bytes, so the byte-to-character mapping itself is a
// no-op here; what is left is the optional leading space and GPT-2's split.
type byteLevelPre struct {
	addPrefixSpace bool
	useRegex       bool
}

func (b byteLevelPre) split(st *encodeState, p piece, out []piece) []piece {
	if b.addPrefixSpace && st.arena[p.off] != ' ' {
		start := len(st.arena)
		st.arena = append(st.arena, ' ')
		st.arena = append(st.arena, st.arena[p.off:p.end]...)
		p = piece{off: start, end: len(st.arena), first: p.first}
	}
	if !b.useRegex {
		return append(out, p)
	}
	st.matches = scanMatcher{gpt2At}.appendMatches(st, st.arena[p.off:p.end], st.matches[:0])
	prev := 0
	for _, m := range st.matches {
		out = appendSpan(out, p, prev, m.start)
		out = appendSpan(out, p, m.start, m.end)
		prev = m.end
	}
	return appendSpan(out, p, prev, p.end-p.off)
}

type prependScheme uint8

const (
	prependAlways prependScheme = iota
	prependFirst
	prependNever
)

// metaspacePre is the Metaspace pre-tokenizer: spaces become the
// replacement character, which is prepended as the scheme says and then,
// when split is set, starts every piece.
type metaspacePre struct {
	replacement string
	scheme      prependScheme
	splitting   bool
}

func (m metaspacePre) split(st *encodeState, p piece, out []piece) []piece {
	start := len(st.arena)
	src := p.off
	// Re-read the source through the index: appending may move the arena.
	prependIt := false
	switch m.scheme {
	case prependAlways:
		prependIt = true
	case prependFirst:
		prependIt = p.first
	}
	if prependIt && (st.arena[src] != ' ') && !hasPrefixAt(st.arena, src, p.end, m.replacement) {
		st.arena = append(st.arena, m.replacement...)
	}
	for i := src; i < p.end; i++ {
		if c := st.arena[i]; c == ' ' {
			st.arena = append(st.arena, m.replacement...)
		} else {
			st.arena = append(st.arena, c)
		}
	}
	np := piece{off: start, end: len(st.arena), first: p.first}
	if !m.splitting {
		return append(out, np)
	}
	st.matches = literalMatcher(m.replacement).appendMatches(st, st.arena[np.off:np.end], st.matches[:0])
	st.segments = appendSegments(st.segments[:0], st.matches, np.end-np.off, false)
	st.spans = applyBehavior(st.segments, splitMergedWithNext, st.spans[:0])
	return appendSpans(out, np, st.spans)
}

func hasPrefixAt(b []byte, off, end int, prefix string) bool {
	return end-off >= len(prefix) && string(b[off:off+len(prefix)]) == prefix
}

// charPre splits on every character a predicate holds for, one match per
// character, as the model's Fn(char) -> bool pattern does.
type charPre struct {
	is       func(rune) bool
	behavior splitBehavior
}

func (c charPre) split(st *encodeState, p piece, out []piece) []piece {
	text := st.arena[p.off:p.end]
	st.matches = st.matches[:0]
	for i := 0; i < len(text); {
		r, n := decodeAt(text, i)
		if c.is(r) {
			st.matches = append(st.matches, span{i, i + n})
		}
		i += n
	}
	st.segments = appendSegments(st.segments[:0], st.matches, len(text), false)
	st.spans = applyBehavior(st.segments, c.behavior, st.spans[:0])
	return appendSpans(out, p, st.spans)
}

func isNumeric(r rune) bool { return classOf(r)&clNumber != 0 }

func isWhitespace(r rune) bool { return classOf(r)&clSpace != 0 }

// delimiterPre is CharDelimiterSplit.
func delimiterPre(d rune) charPre {
	return charPre{is: func(r rune) bool { return r == d }, behavior: splitRemoved}
}
