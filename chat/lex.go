package chat

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The lexer splits a template into text and tag tokens the way Jinja2's
// lexer does with transformers' settings: trim_blocks drops the newline
// after a block or comment tag, lstrip_blocks drops the spaces and tabs
// before one on its own line, "-" strips all whitespace on that side and
// "+" turns the trimming off. Newlines are normalized to "\n" and one
// trailing newline is dropped (keep_trailing_newline is off).

type tokKind uint8

const (
	tText tokKind = iota
	tVarBegin
	tVarEnd
	tBlockBegin
	tBlockEnd
	tName
	tString
	tInt
	tFloat
	tOp
	tEOF
)

type token struct {
	kind tokKind
	s    string // text, name, operator, decoded string literal, number text
	line int
}

// maxTemplateBytes bounds what Compile accepts; real chat templates are a
// few kilobytes.
const maxTemplateBytes = 1 << 20

func pyIsSpace(r rune) bool {
	return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f)
}

func rstripSpace(s string) string {
	return strings.TrimRightFunc(s, pyIsSpace)
}

func lstripSpace(s string) string {
	return strings.TrimLeftFunc(s, pyIsSpace)
}

type lexer struct {
	src  string
	pos  int
	line int
	toks []token
	// lineStarting: the previous tag ended with a newline, so text that
	// follows starts a line (for lstrip_blocks).
	lineStarting bool
}

func normalizeNewlines(s string) string {
	if strings.IndexByte(s, '\r') < 0 {
		return s
	}
	s = strings.ReplaceAll(s, "\r\n", "\n")
	return strings.ReplaceAll(s, "\r", "\n")
}

func lex(src string) ([]token, error) {
	src = normalizeNewlines(src)
	src = strings.TrimSuffix(src, "\n")
	lx := &lexer{src: src, line: 1, lineStarting: true}
	if err := lx.run(); err != nil {
		return nil, err
	}
	return lx.toks, nil
}

func (lx *lexer) errorf(format string, args ...any) error {
	return fmt.Errorf("line %d: "+format, append([]any{lx.line}, args...)...)
}

// nextTag finds the next "{{", "{%" or "{#" at or after i.
func nextTag(s string, i int) int {
	for {
		j := strings.IndexByte(s[i:], '{')
		if j < 0 {
			return -1
		}
		j += i
		if j+1 < len(s) && (s[j+1] == '{' || s[j+1] == '%' || s[j+1] == '#') {
			return j
		}
		i = j + 1
	}
}

func (lx *lexer) emitText(text string) {
	if text != "" {
		lx.toks = append(lx.toks, token{kind: tText, s: text, line: lx.line})
		lx.line += strings.Count(text, "\n")
	}
}

func (lx *lexer) run() error {
	s := lx.src
	stripNext := false // the previous tag ended with "-"
	for lx.pos < len(s) {
		start := lx.pos
		j := nextTag(s, start)
		var text string
		if j < 0 {
			text = s[start:]
		} else {
			text = s[start:j]
		}
		if stripNext {
			text = lstripSpace(text)
			stripNext = false
		}
		if j < 0 {
			lx.emitText(text)
			lx.pos = len(s)
			break
		}
		kind := s[j+1]
		mod := byte(0)
		if j+2 < len(s) && (s[j+2] == '-' || s[j+2] == '+') {
			mod = s[j+2]
		}
		switch {
		case mod == '-':
			text = rstripSpace(text)
		case mod == 0 && kind != '{':
			// lstrip_blocks: drop the spaces and tabs between the start of
			// the line and a block or comment tag.
			lpos := strings.LastIndexByte(text, '\n') + 1
			if lpos > 0 || lx.lineStarting {
				if strings.Trim(text[lpos:], " \t") == "" {
					text = text[:lpos]
				}
			}
		}
		lx.emitText(text)
		lx.pos = j + 2
		if mod != 0 {
			lx.pos++
		}
		var err error
		switch kind {
		case '#':
			stripNext, err = lx.comment()
		case '{':
			stripNext, err = lx.tag(tVarBegin, tVarEnd, '}')
		case '%':
			if lx.isRaw() {
				stripNext, err = lx.raw()
			} else {
				stripNext, err = lx.tag(tBlockBegin, tBlockEnd, '%')
			}
		}
		if err != nil {
			return err
		}
	}
	lx.toks = append(lx.toks, token{kind: tEOF, line: lx.line})
	return nil
}

// afterBlockEnd applies trim_blocks after a block or comment tag whose end
// modifier was mod, and records whether the next text starts a line.
func (lx *lexer) afterBlockEnd(mod byte) bool {
	if mod == '-' {
		lx.lineStarting = false
		return true
	}
	if mod == 0 && lx.pos < len(lx.src) && lx.src[lx.pos] == '\n' {
		lx.pos++
		lx.line++
		lx.lineStarting = true
		return false
	}
	lx.lineStarting = false
	return false
}

func (lx *lexer) comment() (bool, error) {
	s := lx.src
	end := strings.Index(s[lx.pos:], "#}")
	if end < 0 {
		return false, lx.errorf("unclosed comment")
	}
	end += lx.pos
	body := s[lx.pos:end]
	lx.line += strings.Count(body, "\n")
	mod := byte(0)
	if len(body) > 0 && (body[len(body)-1] == '-' || body[len(body)-1] == '+') {
		mod = body[len(body)-1]
	}
	lx.pos = end + 2
	return lx.afterBlockEnd(mod), nil
}

// isRaw reports whether the block tag at lx.pos is {% raw %}.
func (lx *lexer) isRaw() bool {
	rest := strings.TrimLeft(lx.src[lx.pos:], " \t\n")
	if !strings.HasPrefix(rest, "raw") {
		return false
	}
	rest = strings.TrimLeft(rest[3:], " \t\n")
	return strings.HasPrefix(rest, "%}") || strings.HasPrefix(rest, "-%}") || strings.HasPrefix(rest, "+%}")
}

func (lx *lexer) raw() (bool, error) {
	s := lx.src
	end := strings.Index(s[lx.pos:], "%}")
	closeMod := s[lx.pos+end-1]
	lx.pos += end + 2
	stripFirst := closeMod == '-'
	if !stripFirst {
		lx.afterBlockEnd(closeMod)
	}
	// Find {% endraw %}, allowing whitespace-control modifiers.
	i := lx.pos
	for {
		j := strings.Index(s[i:], "{%")
		if j < 0 {
			return false, lx.errorf("missing endraw")
		}
		j += i
		k := j + 2
		mod := byte(0)
		if k < len(s) && (s[k] == '-' || s[k] == '+') {
			mod = s[k]
			k++
		}
		rest := strings.TrimLeft(s[k:], " \t\n")
		if !strings.HasPrefix(rest, "endraw") {
			i = j + 2
			continue
		}
		rest = strings.TrimLeft(rest[6:], " \t\n")
		endMod := byte(0)
		if len(rest) > 0 && (rest[0] == '-' || rest[0] == '+') {
			endMod = rest[0]
			rest = rest[1:]
		}
		if !strings.HasPrefix(rest, "%}") {
			i = j + 2
			continue
		}
		body := s[lx.pos:j]
		if stripFirst {
			body = lstripSpace(body)
		}
		if mod == '-' {
			body = rstripSpace(body)
		} else if mod == 0 {
			lpos := strings.LastIndexByte(body, '\n') + 1
			if strings.Trim(body[lpos:], " \t") == "" && (lpos > 0 || lx.lineStarting) {
				body = body[:lpos]
			}
		}
		lx.emitText(body)
		lx.pos = len(s) - len(rest) + 2
		return lx.afterBlockEnd(endMod), nil
	}
}

// tag lexes the inside of a {{ }} or {% %} tag up to its end delimiter.
func (lx *lexer) tag(begin, end tokKind, closer byte) (bool, error) {
	s := lx.src
	lx.toks = append(lx.toks, token{kind: begin, line: lx.line})
	depth := 0
	for {
		// skip whitespace
		for lx.pos < len(s) && (s[lx.pos] == ' ' || s[lx.pos] == '\t' || s[lx.pos] == '\n') {
			if s[lx.pos] == '\n' {
				lx.line++
			}
			lx.pos++
		}
		if lx.pos >= len(s) {
			return false, lx.errorf("unexpected end of template inside a tag")
		}
		c := s[lx.pos]
		// the end delimiter, possibly with a modifier
		if depth == 0 {
			mod := byte(0)
			p := lx.pos
			if c == '-' || c == '+' {
				mod = c
				p++
			}
			if p+1 < len(s) && s[p] == closer && s[p+1] == '}' {
				lx.pos = p + 2
				lx.toks = append(lx.toks, token{kind: end, line: lx.line})
				if end == tVarEnd {
					lx.lineStarting = false
					return mod == '-', nil
				}
				return lx.afterBlockEnd(mod), nil
			}
		}
		switch {
		case c == '\'' || c == '"':
			str, n, err := lexString(s[lx.pos:])
			if err != nil {
				return false, lx.errorf("%v", err)
			}
			lx.toks = append(lx.toks, token{kind: tString, s: str, line: lx.line})
			lx.line += strings.Count(s[lx.pos:lx.pos+n], "\n")
			lx.pos += n
		case c >= '0' && c <= '9':
			kind, n := lexNumber(s[lx.pos:])
			lx.toks = append(lx.toks, token{kind: kind, s: strings.ReplaceAll(s[lx.pos:lx.pos+n], "_", ""), line: lx.line})
			lx.pos += n
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80:
			n := 0
			for lx.pos+n < len(s) {
				r, size := utf8.DecodeRuneInString(s[lx.pos+n:])
				if r == '_' || unicode.IsLetter(r) || (n > 0 && unicode.IsDigit(r)) {
					n += size
					continue
				}
				break
			}
			if n == 0 {
				return false, lx.errorf("unexpected character %q", s[lx.pos])
			}
			lx.toks = append(lx.toks, token{kind: tName, s: s[lx.pos : lx.pos+n], line: lx.line})
			lx.pos += n
		default:
			op := lexOp(s[lx.pos:])
			if op == "" {
				return false, lx.errorf("unexpected character %q", c)
			}
			switch op {
			case "(", "[", "{":
				depth++
			case ")", "]", "}":
				if depth > 0 {
					depth--
				}
			}
			lx.toks = append(lx.toks, token{kind: tOp, s: op, line: lx.line})
			lx.pos += len(op)
		}
	}
}

func lexOp(s string) string {
	for _, op := range [...]string{"//", "**", "==", "!=", "<=", ">="} {
		if strings.HasPrefix(s, op) {
			return op
		}
	}
	switch s[0] {
	case '+', '-', '/', '*', '%', '~', '[', ']', '(', ')', '{', '}', '<', '>', '=', '.', ':', '|', ',', ';':
		return s[:1]
	}
	return ""
}

// lexNumber returns the kind and length of the integer or float at s.
func lexNumber(s string) (tokKind, int) {
	digits := func(i int) int {
		for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '_' && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9') {
			i++
		}
		return i
	}
	i := digits(0)
	kind := tInt
	if i+1 < len(s) && s[i] == '.' && s[i+1] >= '0' && s[i+1] <= '9' {
		i = digits(i + 1)
		kind = tFloat
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		j := i + 1
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		if j < len(s) && s[j] >= '0' && s[j] <= '9' {
			i = digits(j)
			kind = tFloat
		}
	}
	return kind, i
}

// lexString decodes the string literal at s (starting with its quote) as
// Jinja2 does: Python's unicode-escape rules, with unknown escapes kept.
func lexString(s string) (string, int, error) {
	q := s[0]
	var b strings.Builder
	escaped := false
	for i := 1; i < len(s); i++ {
		c := s[i]
		if c == q {
			if !escaped {
				return s[1:i], i + 1, nil
			}
			return b.String(), i + 1, nil
		}
		if c != '\\' {
			if escaped {
				b.WriteByte(c)
			}
			continue
		}
		if !escaped {
			escaped = true
			b.WriteString(s[1:i])
		}
		if i+1 >= len(s) {
			break
		}
		i++
		switch e := s[i]; e {
		case '\n':
		case '\\', '\'', '"':
			b.WriteByte(e)
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'v':
			b.WriteByte('\v')
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if i+n >= len(s) {
				return "", 0, fmt.Errorf("truncated \\%c escape", e)
			}
			var r rune
			for _, h := range s[i+1 : i+1+n] {
				d := hexVal(byte(h))
				if d < 0 {
					return "", 0, fmt.Errorf("bad \\%c escape", e)
				}
				r = r*16 + rune(d)
			}
			if r > unicode.MaxRune {
				return "", 0, fmt.Errorf("escape out of range")
			}
			b.WriteRune(r)
			i += n
		case '0', '1', '2', '3', '4', '5', '6', '7':
			r := rune(e - '0')
			for k := 0; k < 2 && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '7'; k++ {
				i++
				r = r*8 + rune(s[i]-'0')
			}
			b.WriteRune(r)
		default:
			b.WriteByte('\\')
			b.WriteByte(e)
		}
	}
	return "", 0, fmt.Errorf("unterminated string literal")
}

func hexVal(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
