package tokenizer

import (
	"bytes"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// span is a byte range of a piece of text.
type span struct{ start, end int }

// matcher finds the non-overlapping matches of a split pattern in a piece
// of text, leftmost first, as Oniguruma's search loop does in the model's
// own implementation.
type matcher interface {
	appendMatches(st *encodeState, s []byte, out []span) []span
}

// Patterns the hand-written matchers implement, character for character as
// tokenizer.json files spell them. Any other pattern goes to regexp2.
const (
	patternGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

	patternCL100k = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

	patternQwen = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

	patternO200k = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`

	patternDeepSeekWords = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"

	patternDigits3 = `\p{N}{1,3}`

	patternDeepSeekCJK = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
)

// handWritten returns the hand-written matcher of a known pattern.
func handWritten(pattern string) (matcher, bool) {
	switch pattern {
	case patternGPT2:
		return scanMatcher{gpt2At}, true
	case patternCL100k:
		return scanMatcher{cl100kAt}, true
	case patternQwen:
		return scanMatcher{qwenAt}, true
	case patternO200k:
		return scanMatcher{o200kAt}, true
	case patternDeepSeekWords:
		return scanMatcher{deepSeekWordsAt}, true
	case patternDigits3:
		return scanMatcher{digits3At}, true
	case patternDeepSeekCJK:
		return scanMatcher{deepSeekCJKAt}, true
	}
	return nil, false
}

// newMatcher compiles a split pattern: a hand-written matcher when there
// is one, regexp2 otherwise.
func newMatcher(pattern string, literal bool) (matcher, error) {
	if literal {
		if pattern != "" {
			return literalMatcher(pattern), nil
		}
		pattern = regexp2.Escape(pattern)
	} else if m, ok := handWritten(pattern); ok {
		return m, nil
	}
	return newRegexpMatcher(pattern)
}

// scanMatcher turns "the length of the match starting exactly here, or 0"
// into a leftmost search: a pattern that matches nothing at a position is
// tried at the next character.
type scanMatcher struct {
	at func(s []byte, i int) int
}

func (m scanMatcher) appendMatches(_ *encodeState, s []byte, out []span) []span {
	for i := 0; i < len(s); {
		if n := m.at(s, i); n > 0 {
			out = append(out, span{i, i + n})
			i += n
			continue
		}
		if s[i] < utf8.RuneSelf {
			i++
		} else {
			_, n := utf8.DecodeRune(s[i:])
			i += n
		}
	}
	return out
}

type literalMatcher string

func (m literalMatcher) appendMatches(_ *encodeState, s []byte, out []span) []span {
	for i := 0; i < len(s); {
		j := bytes.Index(s[i:], []byte(m))
		if j < 0 {
			break
		}
		out = append(out, span{i + j, i + j + len(m)})
		i += j + len(m)
	}
	return out
}

// regexpMatcher runs a pattern no hand-written matcher knows on regexp2,
// which backtracks as Oniguruma does. It allocates; the hand-written
// matchers cover the families this package is built for.
type regexpMatcher struct{ re *regexp2.Regexp }

// regexpTimeout bounds one search, so that a pathological pattern in an
// operator's file degrades a request instead of hanging it.
const regexpTimeout = 2 * time.Second

func newRegexpMatcher(pattern string) (*regexpMatcher, error) {
	re, err := regexp2.Compile(pattern)
	if err != nil {
		return nil, fmt.Errorf("cannot compile pattern %q: %w", pattern, err)
	}
	re.MatchTimeout = regexpTimeout
	return &regexpMatcher{re: re}, nil
}

func (m *regexpMatcher) appendMatches(st *encodeState, s []byte, out []span) []span {
	runes := st.runes[:0]
	offsets := st.runeOffsets[:0]
	for i, r := range string(s) {
		runes = append(runes, r)
		offsets = append(offsets, i)
	}
	offsets = append(offsets, len(s))
	st.runes, st.runeOffsets = runes, offsets

	// Oniguruma's iterator: search from the end of the last match, and
	// step one character past an empty match that sits where the last
	// match ended.
	lastEnd, lastMatchEnd := 0, -1
	for lastEnd <= len(runes) {
		mt, err := m.re.FindRunesMatchStartingAt(runes, lastEnd)
		if err != nil || mt == nil {
			break
		}
		start, end := mt.RuneIndex, mt.RuneIndex+mt.RuneLength
		if start == end && lastMatchEnd == end {
			lastEnd++
			continue
		}
		lastEnd, lastMatchEnd = end, end
		out = append(out, span{offsets[start], offsets[end]})
	}
	return out
}

// foldsTo reports whether r equals the ASCII letter lower ignoring case,
// as Unicode case folding has it (ſ folds to s).
func foldsTo(r rune, lower byte) bool {
	return r == rune(lower) || r == rune(lower-'a'+'A') || (lower == 's' && r == 'ſ')
}

// contractionAt returns the length of 's, 't, 're, 've, 'm, 'll or 'd at
// s[i] (which holds the apostrophe), 0 when none; fold selects case
// folding.
func contractionAt(s []byte, i int, fold bool) int {
	j := i + 1
	if j >= len(s) {
		return 0
	}
	eq := func(k int, lower byte) (int, bool) {
		if k >= len(s) {
			return 0, false
		}
		if !fold {
			return 1, s[k] == lower
		}
		r, n := decodeAt(s, k)
		return n, foldsTo(r, lower)
	}
	for _, c := range [...]byte{'s', 't'} {
		if n, ok := eq(j, c); ok {
			return 1 + n
		}
	}
	for _, pair := range [...][2]byte{{'r', 'e'}, {'v', 'e'}} {
		if n, ok := eq(j, pair[0]); ok {
			if n2, ok := eq(j+n, pair[1]); ok {
				return 1 + n + n2
			}
		}
	}
	if n, ok := eq(j, 'm'); ok {
		return 1 + n
	}
	if n, ok := eq(j, 'l'); ok {
		if n2, ok := eq(j+n, 'l'); ok {
			return 1 + n + n2
		}
	}
	if n, ok := eq(j, 'd'); ok {
		return 1 + n
	}
	return 0
}

// runOf returns the end of the run of characters from s[i] on whose class
// has a bit of want.
func runOf(s []byte, i int, want charClass) int {
	for i < len(s) {
		c, n := classAt(s, i)
		if c&want == 0 {
			break
		}
		i += n
	}
	return i
}

// runOfNot returns the end of the run of characters from s[i] on whose
// class has no bit of avoid.
func runOfNot(s []byte, i int, avoid charClass) int {
	for i < len(s) {
		c, n := classAt(s, i)
		if c&avoid != 0 {
			break
		}
		i += n
	}
	return i
}

// countedRun returns the end of at most max characters of class want from
// s[i] on.
func countedRun(s []byte, i int, want charClass, max int) int {
	for k := 0; k < max && i < len(s); k++ {
		c, n := classAt(s, i)
		if c&want == 0 {
			break
		}
		i += n
	}
	return i
}

// whitespaceAt matches the three whitespace alternatives the byte-level
// patterns end with, \s*[\r\n]+ (when newlines is set), \s+(?!\S) and
// \s+, at s[i], which is whitespace.
func whitespaceAt(s []byte, i int, newlines bool) int {
	k := runOf(s, i, clSpace)
	if newlines {
		// \s* backs off to the last line break of the run; bytes of a
		// multi-byte character are never \r or \n.
		for p := k - 1; p >= i; p-- {
			if s[p] == '\r' || s[p] == '\n' {
				return p + 1 - i
			}
		}
	}
	if k == len(s) {
		return k - i
	}
	if last := lastRuneStart(s, k); last > i {
		return last - i
	}
	return k - i
}

// gpt2At: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func gpt2At(s []byte, i int) int {
	if s[i] == '\'' {
		if n := contractionAt(s, i, false); n > 0 {
			return n
		}
	}
	j := i
	if s[i] == ' ' {
		j++
	}
	if j < len(s) {
		c, _ := classAt(s, j)
		switch {
		case c&clLetter != 0:
			return runOf(s, j, clLetter) - i
		case c&clNumber != 0:
			return runOf(s, j, clNumber) - i
		case c&(clSpace|clLetter|clNumber) == 0:
			return runOfNot(s, j, clSpace|clLetter|clNumber) - i
		}
	}
	if c, _ := classAt(s, i); c&clSpace != 0 {
		return whitespaceAt(s, i, false)
	}
	return 0
}

// cl100kAt is the Llama 3 / cl100k pattern, \p{N}{1,3}; qwenAt the Qwen
// one, \p{N} alone.
func cl100kAt(s []byte, i int) int { return cl100kLikeAt(s, i, 3) }
func qwenAt(s []byte, i int) int   { return cl100kLikeAt(s, i, 1) }

// cl100kLikeAt: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|
// \p{N}{1,maxDigits}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func cl100kLikeAt(s []byte, i int, maxDigits int) int {
	if s[i] == '\'' {
		if n := contractionAt(s, i, true); n > 0 {
			return n
		}
	}
	c, n := classAt(s, i)
	if c&clLetter != 0 {
		return runOf(s, i, clLetter) - i
	}
	if c&(clNumber|clNewline) == 0 && i+n < len(s) {
		if k := runOf(s, i+n, clLetter); k > i+n {
			return k - i
		}
	}
	if c&clNumber != 0 {
		return countedRun(s, i, clNumber, maxDigits) - i
	}
	j := i
	if s[i] == ' ' {
		j++
	}
	if k := runOfNot(s, j, clSpace|clLetter|clNumber); k > j {
		for k < len(s) && (s[k] == '\r' || s[k] == '\n') {
			k++
		}
		return k - i
	}
	if c&clSpace != 0 {
		return whitespaceAt(s, i, true)
	}
	return 0
}

const (
	o200kUpper = clUpper | clTitle | clModifier | clOtherLetter | clMark // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
	o200kLower = clLower | clModifier | clOtherLetter | clMark           // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
)

// o200kAt is the o200k pattern of GPT-4o and gpt-oss:
//
//	[^\r\n\p{L}\p{N}]?[Upper]*[Lower]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//	[^\r\n\p{L}\p{N}]?[Upper]+[Lower]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//	\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
func o200kAt(s []byte, i int) int {
	c, n := classAt(s, i)
	prefixed := c&(clLetter|clNumber|clNewline) == 0
	// Each word alternative first with the optional leading character
	// taken, then, backtracking, without it (which matters only when
	// that character is a mark, itself a word character).
	if prefixed {
		if end := o200kCasedWord(s, i+n); end > 0 {
			return end - i
		}
	}
	if end := o200kCasedWord(s, i); end > 0 {
		return end - i
	}
	if prefixed {
		if end := o200kUpperWord(s, i+n); end > 0 {
			return end - i
		}
	}
	if end := o200kUpperWord(s, i); end > 0 {
		return end - i
	}
	if c&clNumber != 0 {
		return countedRun(s, i, clNumber, 3) - i
	}
	j := i
	if s[i] == ' ' {
		j++
	}
	if k := runOfNot(s, j, clSpace|clLetter|clNumber); k > j {
		for k < len(s) && (s[k] == '\r' || s[k] == '\n' || s[k] == '/') {
			k++
		}
		return k - i
	}
	if c&clSpace != 0 {
		return whitespaceAt(s, i, true)
	}
	return 0
}

// o200kCasedWord matches [Upper]*[Lower]+ and an optional contraction from
// s[i]; it returns the end, or 0 when it does not match.
func o200kCasedWord(s []byte, i int) int {
	if i >= len(s) {
		return 0
	}
	u := runOf(s, i, o200kUpper)
	// [Lower]+ after the greedy [Upper]*, giving back one character at a
	// time until a lower-case one starts the rest.
	var start int
	switch {
	case u < len(s) && classAtIs(s, u, o200kLower):
		start = u
	default:
		start = -1
		for p := u; p > i; {
			p = lastRuneStart(s, p)
			if classAtIs(s, p, o200kLower) {
				start = p
				break
			}
		}
		if start < 0 {
			return 0
		}
	}
	end := runOf(s, start, o200kLower)
	if end < len(s) && s[end] == '\'' {
		end += contractionAt(s, end, true)
	}
	return end
}

// o200kUpperWord matches [Upper]+[Lower]* and an optional contraction.
func o200kUpperWord(s []byte, i int) int {
	if i >= len(s) {
		return 0
	}
	u := runOf(s, i, o200kUpper)
	if u == i {
		return 0
	}
	end := runOf(s, u, o200kLower)
	if end < len(s) && s[end] == '\'' {
		end += contractionAt(s, end, true)
	}
	return end
}

func classAtIs(s []byte, i int, want charClass) bool {
	c, _ := classAt(s, i)
	return c&want != 0
}

// deepSeekWordsAt is the last split pattern of DeepSeek V3:
//
//	[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|
//	[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|
//	\s*[\r\n]+|\s+(?!\S)|\s+
func deepSeekWordsAt(s []byte, i int) int {
	b := s[i]
	if isASCIIPunct(b) && i+1 < len(s) && isASCIILetter(s[i+1]) {
		k := i + 1
		for k < len(s) && isASCIILetter(s[k]) {
			k++
		}
		return k - i
	}
	c, n := classAt(s, i)
	if c&(clNewline|clLetter|clPunct|clSymbol) == 0 {
		if k := runOf(s, i+n, clLetter|clMark); k > i+n {
			return k - i
		}
	}
	if k := runOf(s, i, clLetter|clMark); k > i {
		return k - i
	}
	j := i
	if b == ' ' {
		j++
	}
	if k := runOf(s, j, clPunct|clSymbol); k > j {
		for k < len(s) && (s[k] == '\r' || s[k] == '\n') {
			k++
		}
		return k - i
	}
	if c&clSpace != 0 {
		return whitespaceAt(s, i, true)
	}
	return 0
}

func isASCIIPunct(b byte) bool {
	return (b >= '!' && b <= '/') || (b >= ':' && b <= '@') || (b >= '[' && b <= '`') || (b >= '{' && b <= '~')
}

func isASCIILetter(b byte) bool { return (b|0x20) >= 'a' && (b|0x20) <= 'z' }

// digits3At: \p{N}{1,3}
func digits3At(s []byte, i int) int {
	if c, _ := classAt(s, i); c&clNumber == 0 {
		return 0
	}
	return countedRun(s, i, clNumber, 3) - i
}

// deepSeekCJKAt: [\x{4e00}-\x{9fa5}\x{3040}-\x{309f}\x{30a0}-\x{30ff}]+
func deepSeekCJKAt(s []byte, i int) int {
	k := i
	for k < len(s) {
		r, n := decodeAt(s, k)
		if !((r >= 0x4e00 && r <= 0x9fa5) || (r >= 0x3040 && r <= 0x30ff)) {
			break
		}
		k += n
	}
	return k - i
}

// splitBehavior is what a split does with the matched delimiters.
type splitBehavior uint8

const (
	splitRemoved splitBehavior = iota
	splitIsolated
	splitMergedWithPrevious
	splitMergedWithNext
	splitContiguous
)

func parseBehavior(s string) (splitBehavior, error) {
	switch s {
	case "Removed":
		return splitRemoved, nil
	case "Isolated":
		return splitIsolated, nil
	case "MergedWithPrevious":
		return splitMergedWithPrevious, nil
	case "MergedWithNext":
		return splitMergedWithNext, nil
	case "Contiguous":
		return splitContiguous, nil
	}
	return 0, fmt.Errorf("cannot use split behavior %q", s)
}

// segment is a piece of text between or at matches.
type segment struct {
	start, end int
	match      bool
}

// segments turns matches into the covering list of pieces, each a match
// or the gap between two, as the model's Pattern::find_matches does (an
// empty text is one empty gap).
func appendSegments(out []segment, matches []span, n int, invert bool) []segment {
	if n == 0 {
		return append(out, segment{0, 0, invert})
	}
	prev := 0
	for _, m := range matches {
		if prev != m.start {
			out = append(out, segment{prev, m.start, invert})
		}
		out = append(out, segment{m.start, m.end, !invert})
		prev = m.end
	}
	if prev != n {
		out = append(out, segment{prev, n, invert})
	}
	return out
}

// applyBehavior turns segments into the spans to keep, in place, as
// NormalizedString::split does.
func applyBehavior(segs []segment, b splitBehavior, out []span) []span {
	switch b {
	case splitIsolated:
		for _, s := range segs {
			out = append(out, span{s.start, s.end})
		}
	case splitRemoved:
		for _, s := range segs {
			if !s.match {
				out = append(out, span{s.start, s.end})
			}
		}
	case splitContiguous:
		previous := false
		first := len(out)
		for _, s := range segs {
			if s.match == previous && len(out) > first {
				out[len(out)-1].end = s.end
			} else {
				out = append(out, span{s.start, s.end})
			}
			previous = s.match
		}
	case splitMergedWithPrevious:
		previous := false
		first := len(out)
		for _, s := range segs {
			if s.match && !previous && len(out) > first {
				out[len(out)-1].end = s.end
			} else {
				out = append(out, span{s.start, s.end})
			}
			previous = s.match
		}
	case splitMergedWithNext:
		// Walk backwards, merging a match into the piece after it.
		previous := false
		first := len(out)
		for k := len(segs) - 1; k >= 0; k-- {
			s := segs[k]
			if s.match && !previous && len(out) > first {
				out[len(out)-1].start = s.start
			} else {
				out = append(out, span{s.start, s.end})
			}
			previous = s.match
		}
		for l, r := first, len(out)-1; l < r; l, r = l+1, r-1 {
			out[l], out[r] = out[r], out[l]
		}
	}
	return out
}
