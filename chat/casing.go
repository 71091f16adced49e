package chat

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Python's case mappings are Unicode's full mappings: "ß".upper() is
// "SS", "ﬁ".upper() "FI", "İ".lower() two code points, and a final capital
// sigma lower-cases to "ς". Go's are the simple one-rune mappings, and for
// every other code point the two agree (checked for all of them against
// Python 3.11, whose Unicode is 14.0, Go's 15.0, when this was written).
// Upper- or title-casing a string holding a code point whose full upper
// or title mapping is longer, or lower-casing one holding İ or a capital
// sigma, fails with ErrUnsupported, and the request routes approximately,
// rather than render text the engine would not.
//
// The predicates follow Python's definitions: islower and isupper read
// Unicode's Lowercase and Uppercase properties (Go's IsLower and IsUpper
// are the Ll and Lu categories alone), title() starts a word after any
// character without case (a digit, a CJK ideograph), not only after a
// non-letter; isdigit takes the digits of category No (superscripts,
// circled digits) and isnumeric the numerals of category Lo (CJK), which
// Go has no property for (tables below, from Python 3.11). Code points
// the two Unicode versions class differently (73 for islower) may differ.

// fullUpperMapped lists the code points whose full upper-case mapping is
// longer than one code point (SpecialCasing.txt's unconditional
// entries); their title-case mappings, where longer, are among them.
var fullUpperMapped = []rune{
	0x00DF, 0x0149, 0x01F0, 0x0390, 0x03B0, 0x0587,
	0x1E96, 0x1E97, 0x1E98, 0x1E99, 0x1E9A, 0x1F50, 0x1F52, 0x1F54, 0x1F56,
}

// fullUpperMappedRanges are the runs of them: Greek with ypogegrammeni and
// perispomeni, the Latin and Armenian ligatures.
var fullUpperMappedRanges = [][2]rune{
	{0x1F80, 0x1FAF}, {0x1FB2, 0x1FB4}, {0x1FB6, 0x1FB7}, {0x1FBC, 0x1FBC},
	{0x1FC2, 0x1FC4}, {0x1FC6, 0x1FC7}, {0x1FCC, 0x1FCC}, {0x1FD2, 0x1FD3},
	{0x1FD6, 0x1FD7}, {0x1FE2, 0x1FE4}, {0x1FE6, 0x1FE7}, {0x1FF2, 0x1FF4},
	{0x1FF6, 0x1FF7}, {0x1FFC, 0x1FFC}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17},
}

// dottedCapitalI (İ) lower-cases to two code points; capitalSigma to σ
// or, at a word's end, ς. They are the only full lower-case mappings Go
// does not share.
const (
	dottedCapitalI = 0x0130
	capitalSigma   = 0x03A3
)

func hasFullUpperMapping(r rune) bool {
	if r < 0xDF {
		return false
	}
	if slices.Contains(fullUpperMapped, r) {
		return true
	}
	for _, rg := range fullUpperMappedRanges {
		if rg[0] <= r && r <= rg[1] {
			return true
		}
	}
	return false
}

// Which mappings a casing applies.
const (
	upperCasing = 1 << iota // upper or title case
	lowerCasing
)

// checkCasable reports ErrUnsupported for a string whose casing Go would
// map otherwise than Python.
func checkCasable(s, op string, casing int) error {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return checkCasableRunes(s[i:], op, casing)
		}
	}
	return nil
}

func checkCasableRunes(s, op string, casing int) error {
	for _, r := range s {
		if casing&upperCasing != 0 && hasFullUpperMapping(r) || casing&lowerCasing != 0 && (r == dottedCapitalI || r == capitalSigma) {
			return fmt.Errorf("%w: %s of %U, whose Unicode case mapping chat does not implement", ErrUnsupported, op, r)
		}
	}
	return nil
}

// casedValue wraps a casing's result.
func casedValue(s string, err error) (value, error) {
	if err != nil {
		return undefined, err
	}
	return strValue(s), nil
}

func pyUpper(s string) (string, error) {
	if err := checkCasable(s, "upper()", upperCasing); err != nil {
		return "", err
	}
	return strings.ToUpper(s), nil
}

func pyLower(s string) (string, error) {
	if err := checkCasable(s, "lower()", lowerCasing); err != nil {
		return "", err
	}
	return strings.ToLower(s), nil
}

// pyCapitalize is str.capitalize: the first character in title case
// (Python 3.8 on), the rest lower-cased.
func pyCapitalize(s string) (string, error) {
	if err := checkCasable(s, "capitalize()", upperCasing|lowerCasing); err != nil {
		return "", err
	}
	r, size := utf8.DecodeRuneInString(s)
	if size == 0 {
		return s, nil
	}
	return string(unicode.ToTitle(r)) + strings.ToLower(s[size:]), nil
}

// pyTitle is str.title: a character after a cased one is lower-cased, any
// other title-cased.
func pyTitle(s string) (string, error) {
	if err := checkCasable(s, "title()", upperCasing|lowerCasing); err != nil {
		return "", err
	}
	var b strings.Builder
	prevCased := false
	for _, r := range s {
		if prevCased {
			b.WriteRune(unicode.ToLower(r))
		} else {
			b.WriteRune(unicode.ToTitle(r))
		}
		prevCased = isCased(r)
	}
	return b.String(), nil
}

// jinjaTitle is Jinja2's title filter: each word, split at whitespace and
// at -({[<, gets an upper-case first character and a lower-case rest.
func jinjaTitle(s string) (string, error) {
	if err := checkCasable(s, "the title filter", upperCasing|lowerCasing); err != nil {
		return "", err
	}
	var b strings.Builder
	start := true
	for _, r := range s {
		if pyIsSpace(r) || strings.ContainsRune("-({[<", r) {
			b.WriteRune(r)
			start = true
			continue
		}
		if start {
			b.WriteRune(unicode.ToUpper(r))
			start = false
		} else {
			b.WriteRune(unicode.ToLower(r))
		}
	}
	return b.String(), nil
}

// isLowercase and isUppercase are Unicode's Lowercase and Uppercase
// properties, which Python's islower and isupper read.
func isLowercase(r rune) bool {
	return unicode.IsLower(r) || unicode.Is(unicode.Other_Lowercase, r)
}

func isUppercase(r rune) bool {
	return unicode.IsUpper(r) || unicode.Is(unicode.Other_Uppercase, r)
}

// isCased is Unicode's Cased property.
func isCased(r rune) bool { return isLowercase(r) || isUppercase(r) || unicode.IsTitle(r) }

// strPredicate is str.isdigit, isalpha and the others.
func strPredicate(s, name string) (bool, error) {
	if s == "" {
		return false, nil
	}
	cased := false
	for _, r := range s {
		switch name {
		case "isdecimal":
			if !unicode.IsDigit(r) {
				return false, nil
			}
		case "isdigit":
			if !unicode.IsDigit(r) && !inRanges(digitNo, r) {
				return false, nil
			}
		case "isnumeric":
			if !unicode.IsNumber(r) && !(r >= 0x3405 && slices.Contains(numericLo, r)) {
				return false, nil
			}
		case "isalpha":
			if !unicode.IsLetter(r) {
				return false, nil
			}
		case "isalnum":
			if !unicode.IsLetter(r) && !unicode.IsNumber(r) {
				return false, nil
			}
		case "isspace":
			if !pyIsSpace(r) {
				return false, nil
			}
		case "islower":
			if isUppercase(r) || unicode.IsTitle(r) {
				return false, nil
			}
			cased = cased || isLowercase(r)
		case "isupper":
			if isLowercase(r) || unicode.IsTitle(r) {
				return false, nil
			}
			cased = cased || isUppercase(r)
		}
	}
	if name == "islower" || name == "isupper" {
		return cased, nil
	}
	return true, nil
}

// digitNo are the code points of category No that Python's isdigit takes
// (Numeric_Type Digit): superscripts, subscripts, circled digits.
var digitNo = [][2]rune{
	{0xB2, 0xB3}, {0xB9, 0xB9}, {0x1369, 0x1371}, {0x19DA, 0x19DA}, {0x2070, 0x2070},
	{0x2074, 0x2079}, {0x2080, 0x2089}, {0x2460, 0x2468}, {0x2474, 0x247C}, {0x2488, 0x2490},
	{0x24EA, 0x24EA}, {0x24F5, 0x24FD}, {0x24FF, 0x24FF}, {0x2776, 0x277E}, {0x2780, 0x2788},
	{0x278A, 0x2792}, {0x10A40, 0x10A43}, {0x10E60, 0x10E68}, {0x11052, 0x1105A}, {0x1F100, 0x1F10A},
}

// numericLo are the code points of category Lo that Python's isnumeric
// takes: CJK numerals.
var numericLo = []rune{
	0x3405, 0x3483, 0x382A, 0x3B4D, 0x4E00, 0x4E03, 0x4E07, 0x4E09, 0x4E5D, 0x4E8C,
	0x4E94, 0x4E96, 0x4EBF, 0x4EC0, 0x4EDF, 0x4EE8, 0x4F0D, 0x4F70, 0x5104, 0x5146,
	0x5169, 0x516B, 0x516D, 0x5341, 0x5343, 0x5344, 0x5345, 0x534C, 0x53C1, 0x53C2,
	0x53C3, 0x53C4, 0x56DB, 0x58F1, 0x58F9, 0x5E7A, 0x5EFE, 0x5EFF, 0x5F0C, 0x5F0D,
	0x5F0E, 0x5F10, 0x62FE, 0x634C, 0x67D2, 0x6F06, 0x7396, 0x767E, 0x8086, 0x842C,
	0x8CAE, 0x8CB3, 0x8D30, 0x9621, 0x9646, 0x964C, 0x9678, 0x96F6, 0xF96B, 0xF973,
	0xF978, 0xF9B2, 0xF9D1, 0xF9D3, 0xF9FD, 0x20001, 0x20064, 0x200E2, 0x20121, 0x2092A,
	0x20983, 0x2098C, 0x2099C, 0x20AEA, 0x20AFD, 0x20B19, 0x22390, 0x22998, 0x23B1B, 0x2626D,
	0x2F890,
}

func inRanges(rs [][2]rune, r rune) bool {
	if r < rs[0][0] {
		return false
	}
	for _, rg := range rs {
		if rg[0] <= r && r <= rg[1] {
			return true
		}
	}
	return false
}

// isPythonMethod says whether name is one of Python's own methods of a
// value of kind k (str, dict, list or tuple).
func isPythonMethod(k kind, name string) bool {
	switch k {
	case kStr:
		switch name {
		case "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format",
			"format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower",
			"isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip", "maketrans",
			"partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit",
			"rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title", "translate", "upper", "zfill":
			return true
		}
	case kDict:
		switch name {
		case "clear", "copy", "fromkeys", "get", "items", "keys", "pop", "popitem", "setdefault", "update", "values":
			return true
		}
	case kList:
		switch name {
		case "append", "clear", "copy", "count", "extend", "index", "insert", "pop", "remove", "reverse", "sort":
			return true
		}
	case kTuple:
		return name == "count" || name == "index"
	}
	return false
}

// errUnimplementedMethod reports a Python method chat does not implement,
// or nil for a name that is none. One chat lacks fails its rendering with
// ErrUnsupported when the template looks it up: left undefined, "x.zfill
// is defined" would take the other branch.
func errUnimplementedMethod(obj value, name string) error {
	if !isPythonMethod(obj.k, name) || isUnsafeMethod(obj, name) {
		return nil
	}
	return fmt.Errorf("%w: the template reads %s.%s, which chat does not implement", ErrUnsupported, typeName(obj), name)
}
