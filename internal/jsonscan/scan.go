package jsonscan

import "encoding/binary"

// MaxDepth is the deepest nesting of arrays and objects accepted, the same
// limit encoding/json applies, so both agree on which documents are valid.
const MaxDepth = 10000

// SkipSpace returns the index of the first byte at or after i that is not
// JSON whitespace, or len(b).
func SkipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// ScanLiteral returns the index after lit (true, false or null) at b[i], or
// -1 if b does not hold it there.
func ScanLiteral(b []byte, i int, lit string) int {
	if len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit {
		return i + len(lit)
	}
	return -1
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// ScanNumber returns the index after the JSON number at b[i], or -1.
func ScanNumber(b []byte, i int) int {
	if i < len(b) && b[i] == '-' {
		i++
	}
	if i >= len(b) {
		return -1
	}
	switch c := b[i]; {
	case c == '0':
		i++
	case c >= '1' && c <= '9':
		i++
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !isDigit(b[i]) {
			return -1
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return -1
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	return i
}

const (
	swarOnes  = 0x0101010101010101
	swarHighs = 0x8080808080808080
)

// stringSpecial reports whether any of the 8 bytes in x is a quote, a
// backslash or a control character: the only bytes a string scan must stop
// at. The answer for the word is exact; which byte set the flag is not (a
// borrow can mark a later one), so the caller then looks byte by byte.
func stringSpecial(x uint64) bool {
	q := x ^ (swarOnes * '"')
	s := x ^ (swarOnes * '\\')
	return ((x-swarOnes*0x20)&^x|(q-swarOnes)&^q|(s-swarOnes)&^s)&swarHighs != 0
}

// ScanString validates the JSON string at b[i] == '"' and returns the index
// after its closing quote, or -1, and whether it contains escapes. Its
// contents, b[i+1:end-1], are raw: decode them with AppendUnescaped when
// escaped is true.
func ScanString(b []byte, i int) (end int, escaped bool) {
	i++
	for {
		for i+8 <= len(b) && !stringSpecial(binary.LittleEndian.Uint64(b[i:])) {
			i += 8
		}
		// Within the flagged word, or the last few bytes of b: find the
		// special byte before going back to whole words.
		for i < len(b) && b[i] != '"' && b[i] != '\\' && b[i] >= 0x20 {
			i++
		}
		if i >= len(b) {
			return -1, escaped
		}
		switch b[i] {
		case '"':
			return i + 1, escaped
		case '\\':
			escaped = true
			if i+1 >= len(b) {
				return -1, escaped
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || hex4(b[i+2:i+6]) < 0 {
					return -1, escaped
				}
				i += 6
			default:
				return -1, escaped
			}
		default: // a control character
			return -1, escaped
		}
	}
}

// SkipValue validates the JSON value at b[i], which sits inside depth open
// containers, and returns the index after it, or -1.
func SkipValue(b []byte, i, depth int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		end, _ := ScanString(b, i)
		return end
	case '{', '[':
		return skipContainer(b, i, depth)
	case 't':
		return ScanLiteral(b, i, "true")
	case 'f':
		return ScanLiteral(b, i, "false")
	case 'n':
		return ScanLiteral(b, i, "null")
	}
	return ScanNumber(b, i)
}

// skipContainer validates the array or object at b[i] without recursion, so
// that hostile nesting costs a bit per level rather than a stack frame. The
// common shallow case keeps its bit stack in two words; only documents
// nested deeper than that pay for clearing a stack sized for MaxDepth.
func skipContainer(b []byte, i, depth int) int {
	var shallow [2]uint64
	if end := walkContainer(b, i, depth, shallow[:]); end != errTooDeep {
		return end
	}
	return skipDeepContainer(b, i, depth)
}

func skipDeepContainer(b []byte, i, depth int) int {
	var deep [MaxDepth/64 + 1]uint64
	return walkContainer(b, i, depth, deep[:])
}

// errTooDeep is walkContainer's answer when its bit stack is full.
const errTooDeep = -2

// walkContainer does skipContainer's work with isObject as the stack of
// open containers, one bit each (set for an object).
func walkContainer(b []byte, i, depth int, isObject []uint64) int {
	const (
		stValue = iota
		stKey
		stAfter
	)
	level := 0
	st := stValue
	for {
		switch st {
		case stKey:
			if i >= len(b) || b[i] != '"' {
				return -1
			}
			end, _ := ScanString(b, i)
			if end < 0 {
				return -1
			}
			i = SkipSpace(b, end)
			if i >= len(b) || b[i] != ':' {
				return -1
			}
			i = SkipSpace(b, i+1)
			st = stValue
		case stValue:
			if i >= len(b) {
				return -1
			}
			switch c := b[i]; c {
			case '{', '[':
				if depth++; depth > MaxDepth {
					return -1
				}
				if level == len(isObject)*64 {
					return errTooDeep
				}
				obj := c == '{'
				word, bit := level>>6, uint64(1)<<(level&63)
				if obj {
					isObject[word] |= bit
				} else {
					isObject[word] &^= bit
				}
				level++
				i = SkipSpace(b, i+1)
				if i >= len(b) {
					return -1
				}
				switch {
				case obj && b[i] == '}', !obj && b[i] == ']':
					i++
					level--
					depth--
					st = stAfter
				case obj:
					st = stKey
				}
				continue
			case '"':
				i, _ = ScanString(b, i)
			case 't':
				i = ScanLiteral(b, i, "true")
			case 'f':
				i = ScanLiteral(b, i, "false")
			case 'n':
				i = ScanLiteral(b, i, "null")
			default:
				i = ScanNumber(b, i)
			}
			if i < 0 {
				return -1
			}
			st = stAfter
		case stAfter:
			if level == 0 {
				return i
			}
			i = SkipSpace(b, i)
			if i >= len(b) {
				return -1
			}
			obj := isObject[(level-1)>>6]&(1<<((level-1)&63)) != 0
			switch c := b[i]; {
			case c == ',':
				i = SkipSpace(b, i+1)
				if obj {
					st = stKey
				} else {
					st = stValue
				}
			case obj && c == '}', !obj && c == ']':
				i++
				level--
				depth--
			default:
				return -1
			}
		}
	}
}
