package jsonscan

import (
	"unicode/utf16"
	"unicode/utf8"
)

// hex4 decodes four hex digits, or returns -1.
func hex4(h []byte) rune {
	var r rune
	for _, c := range h[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// AppendUnescaped appends the decoded form of raw, the contents of a JSON
// string that ScanString accepted, to dst. Unpaired surrogates become
// U+FFFD, as in encoding/json. A decoded string is never longer than raw.
func AppendUnescaped(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			dst = append(dst, c)
			i++
			continue
		}
		e := raw[i+1]
		i += 2
		switch e {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := hex4(raw[i:])
			i += 4
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
					r2 = hex4(raw[i+2:])
				}
				if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
					r = d
					i += 6
				} else {
					r = utf8.RuneError
				}
			}
			dst = utf8.AppendRune(dst, r)
		default: // '"', '\\', '/'
			dst = append(dst, e)
		}
	}
	return dst
}

const hexDigits = "0123456789abcdef"

// AppendQuoted appends s to dst as a JSON string. Quotes, backslashes and
// control characters are escaped and invalid UTF-8 becomes U+FFFD, so the
// result is valid JSON whatever s holds; everything else is copied as is.
func AppendQuoted(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&15])
		case c < utf8.RuneSelf:
			dst = append(dst, c)
		default:
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, `\ufffd`...)
			} else {
				dst = append(dst, s[i:i+size]...)
			}
			i += size
			continue
		}
		i++
	}
	return append(dst, '"')
}
