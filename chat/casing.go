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
// Python 3.11 when this was written). A casing of a string holding one of
// those few code points fails with ErrUnsupported, and the request routes
// approximately, rather than render text the engine would not.
//
// The predicates follow Python's definitions: islower and isupper read
// Unicode's Lowercase and Uppercase properties (Go's IsLower and IsUpper
// are the Ll and Lu categories alone), title() starts a word after any
// character without case (a digit, a CJK ideograph), not only after a
// non-letter. isdigit and isnumeric hold for characters Go has no table
// of (superscript digits, CJK numerals): a string holding a character of
// those categories, No and Lo, is unsupported there.

// fullCaseMapped lists the code points with a full case mapping longer
// than one code point (SpecialCasing.txt's unconditional entries).
var fullCaseMapped = []rune{
	0x00DF, 0x0130, 0x0149, 0x01F0, 0x0390, 0x03B0, 0x0587,
	0x1E96, 0x1E97, 0x1E98, 0x1E99, 0x1E9A, 0x1F50, 0x1F52, 0x1F54, 0x1F56,
}

// fullCaseMappedRanges are the runs of them: Greek with ypogegrammeni and
// perispomeni, the Latin and Armenian ligatures.
var fullCaseMappedRanges = [][2]rune{
	{0x1F80, 0x1FAF}, {0x1FB2, 0x1FB4}, {0x1FB6, 0x1FB7}, {0x1FBC, 0x1FBC},
	{0x1FC2, 0x1FC4}, {0x1FC6, 0x1FC7}, {0x1FCC, 0x1FCC}, {0x1FD2, 0x1FD3},
	{0x1FD6, 0x1FD7}, {0x1FE2, 0x1FE4}, {0x1FE6, 0x1FE7}, {0x1FF2, 0x1FF4},
	{0x1FF6, 0x1FF7}, {0x1FFC, 0x1FFC}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17},
}

// capitalSigma lower-cases to σ or, at a word's end, ς.
const capitalSigma = 0x03A3

func hasFullCaseMapping(r rune) bool {
	if r < 0xDF {
		return false
	}
	if slices.Contains(fullCaseMapped, r) {
		return true
	}
	for _, rg := range fullCaseMappedRanges {
		if rg[0] <= r && r <= rg[1] {
			return true
		}
	}
	return false
}

// checkCasable reports ErrUnsupported for a string whose casing Go would
// map otherwise than Python; lowering says whether any of it lower-cases.
func checkCasable(s, op string, lowering bool) error {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return checkCasableRunes(s[i:], op, lowering)
		}
	}
	return nil
}

func checkCasableRunes(s, op string, lowering bool) error {
	for _, r := range s {
		if hasFullCaseMapping(r) || lowering && r == capitalSigma {
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
	if err := checkCasable(s, "upper()", false); err != nil {
		return "", err
	}
	return strings.ToUpper(s), nil
}

func pyLower(s string) (string, error) {
	if err := checkCasable(s, "lower()", true); err != nil {
		return "", err
	}
	return strings.ToLower(s), nil
}

// pyCapitalize is str.capitalize: the first character in title case
// (Python 3.8 on), the rest lower-cased.
func pyCapitalize(s string) (string, error) {
	if err := checkCasable(s, "capitalize()", true); err != nil {
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
	if err := checkCasable(s, "title()", true); err != nil {
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
	if err := checkCasable(s, "the title filter", true); err != nil {
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
	unsure := func(r rune) (bool, error) {
		return false, fmt.Errorf("%w: %s of %U, which chat has no Unicode table for", ErrUnsupported, name, r)
	}
	cased := false
	for _, r := range s {
		switch name {
		case "isdecimal":
			if !unicode.IsDigit(r) {
				return false, nil
			}
		case "isdigit":
			// Python's digits are Nd and some of No.
			if unicode.Is(unicode.No, r) {
				return unsure(r)
			}
			if !unicode.IsDigit(r) {
				return false, nil
			}
		case "isnumeric":
			// Every N character is numeric, and some Lo ones.
			if unicode.Is(unicode.Lo, r) {
				return unsure(r)
			}
			if !unicode.IsNumber(r) {
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

// Python's own methods of str, dict and list. One chat does not implement
// fails its rendering with ErrUnsupported when the template looks it up:
// left undefined, "x.zfill is defined" would take the other branch.
var pythonMethods = map[kind][]string{
	kStr: {"capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format",
		"format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower",
		"isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip", "maketrans",
		"partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit",
		"rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title", "translate", "upper", "zfill"},
	kDict:  {"clear", "copy", "fromkeys", "get", "items", "keys", "pop", "popitem", "setdefault", "update", "values"},
	kList:  {"append", "clear", "copy", "count", "extend", "index", "insert", "pop", "remove", "reverse", "sort"},
	kTuple: {"count", "index"},
}

// errUnimplementedMethod reports a Python method chat does not implement,
// or nil for a name that is none.
func errUnimplementedMethod(obj value, name string) error {
	if !slices.Contains(pythonMethods[obj.k], name) || isUnsafeMethod(obj, name) {
		return nil
	}
	return fmt.Errorf("%w: the template reads %s.%s, which chat does not implement", ErrUnsupported, typeName(obj), name)
}
