package chat

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Python's two string-formatting languages, as templates use them: the
// printf style (str % args, Jinja2's format filter) and str.format with
// its format-spec mini-language. Widths, fills, alignments, signs,
// precisions and the usual conversions format as CPython formats them.
// What is not implemented (a '*' width, %a, nested fields, a field's
// attribute or index, grouping beside zero padding, '#' or a precision on
// a float with no type)
// fails with ErrUnsupported, so that the request routes approximately: it
// is valid, and the engine renders it. What Python itself refuses (a
// number for %s's neighbour %d given a string, too few arguments) fails as
// the template's error.

// fmtSpec is one conversion's options, in either language.
type fmtSpec struct {
	fill     rune
	align    byte // '<', '>', '^', '=' (fill between sign and digits), 0: the type's default
	sign     byte // '+', ' ', or 0 (a sign only when negative)
	alt      bool // '#': 0x/0o/0b prefixes, a decimal point kept
	width    int
	prec     int  // -1: none
	grouping byte // ',' or '_' (str.format only)
	typ      byte
}

// formatLimit bounds a width or precision. Python would build the string;
// a template asking for a megabyte of padding is no chat template, and
// the renderer's output limit would refuse it anyway.
const formatLimit = 1 << 16

func errFormatUnsupported(format string, args ...any) error {
	return fmt.Errorf("%w: the template formats with %s, which chat does not implement", ErrUnsupported, fmt.Sprintf(format, args...))
}

// percentFormat is Python's printf-style f % arg.
func (r *renderer) percentFormat(f string, arg value) (value, error) {
	var args []value
	var mapping *dict
	switch arg.k {
	case kTuple:
		args = arg.items()
	case kDict:
		mapping = arg.dict
		args = []value{arg}
	default:
		args = []value{arg}
	}
	var b []byte
	ai := 0
	keyedSeen := false
	for i := 0; i < len(f); i++ {
		c := f[i]
		if c != '%' {
			b = append(b, c)
			continue
		}
		i++
		if i >= len(f) {
			return undefined, rtErr("incomplete format")
		}
		if f[i] == '%' {
			b = append(b, '%')
			continue
		}
		var v value
		keyed := false
		if f[i] == '(' {
			if mapping == nil {
				return undefined, rtErr("format requires a mapping")
			}
			end := strings.IndexByte(f[i:], ')')
			if end < 0 {
				return undefined, rtErr("incomplete format key")
			}
			key := f[i+1 : i+end]
			var ok bool
			if v, ok = mapping.getStr(key); !ok {
				return undefined, rtErr("KeyError: %q", key)
			}
			keyed = true
			i += end + 1
		}
		spec := fmtSpec{fill: ' ', prec: -1}
		zero := false
	flags:
		for ; i < len(f); i++ {
			switch f[i] {
			case '-':
				spec.align = '<'
			case '+':
				spec.sign = '+'
			case ' ':
				if spec.sign == 0 {
					spec.sign = ' '
				}
			case '#':
				spec.alt = true
			case '0':
				zero = true
			default:
				break flags
			}
		}
		var err error
		if i, spec.width, err = formatNumber(f, i); err != nil {
			return undefined, err
		}
		if i < len(f) && f[i] == '.' {
			if i, spec.prec, err = formatNumber(f, i+1); err != nil {
				return undefined, err
			}
		}
		for i < len(f) && (f[i] == 'h' || f[i] == 'l' || f[i] == 'L') {
			i++ // length modifiers, which Python ignores
		}
		if i >= len(f) {
			return undefined, rtErr("incomplete format")
		}
		spec.typ = f[i]
		if keyed {
			keyedSeen = true
		} else {
			// After a keyed conversion Python has no positional
			// argument left, the mapping included.
			if ai >= len(args) || keyedSeen {
				return undefined, rtErr("not enough arguments for format string")
			}
			v = args[ai]
			ai++
		}
		if b, err = appendPercent(b, v, spec, zero); err != nil {
			return undefined, err
		}
		if err := r.checkSize(len(b)); err != nil {
			return undefined, err
		}
	}
	// Python takes any argument with item access but a tuple or string
	// as the mapping: nothing is left over then.
	if ai < len(args) && mapping == nil && arg.k != kList && arg.k != kRange {
		return undefined, rtErr("not all arguments converted during string formatting")
	}
	return strValue(string(b)), nil
}

// formatNumber reads the decimal number at f[i:] (0 if none).
func formatNumber(f string, i int) (int, int, error) {
	if i < len(f) && f[i] == '*' {
		return i, 0, errFormatUnsupported("a '*' width or precision")
	}
	n := 0
	for ; i < len(f) && f[i] >= '0' && f[i] <= '9'; i++ {
		n = n*10 + int(f[i]-'0')
		if n > formatLimit {
			return i, 0, errFormatUnsupported("a width or precision over %d", formatLimit)
		}
	}
	return i, n, nil
}

// appendPercent appends one printf-style conversion of v.
func appendPercent(b []byte, v value, spec fmtSpec, zero bool) ([]byte, error) {
	if spec.align == 0 {
		spec.align = '>'
	}
	switch spec.typ {
	case 's', 'r':
		var s []byte
		if spec.typ == 's' {
			s = appendStr(nil, v)
		} else {
			s = appendRepr(nil, v)
		}
		return appendAligned(b, "", "", truncateRunes(string(s), spec.prec), spec), nil
	case 'c':
		s, err := charOf(v)
		if err != nil {
			return b, err
		}
		return appendAligned(b, "", "", s, spec), nil
	case 'd', 'i', 'u', 'x', 'X', 'o':
		if !isNumber(v) {
			return b, rtErr("%%%c format: a real number is required, not %s", spec.typ, typeName(v))
		}
		if v.k == kFloat {
			if spec.typ != 'd' && spec.typ != 'i' && spec.typ != 'u' {
				return b, rtErr("%%%c format: an integer is required, not float", spec.typ)
			}
			if math.IsInf(v.f, 0) || math.IsNaN(v.f) {
				return b, rtErr("cannot convert float %s to integer", appendPyFloat(nil, v.f, false))
			}
			v = truncFloat(v.f)
		}
		neg, digits := intDigits(v, spec.typ)
		if spec.prec > len(digits) {
			digits = strings.Repeat("0", spec.prec-len(digits)) + digits
		}
		prefix := ""
		if spec.alt {
			prefix = map[byte]string{'x': "0x", 'X': "0X", 'o': "0o"}[spec.typ]
		}
		return appendNumber(b, neg, prefix, digits, spec, zero), nil
	case 'e', 'E', 'f', 'F', 'g', 'G':
		if !isNumber(v) {
			return b, rtErr("must be real number, not %s", typeName(v))
		}
		f := v.f
		if v.k != kFloat {
			var err error
			if f, err = intToFloat(v); err != nil {
				return b, err
			}
		}
		digits, err := floatDigits(math.Abs(f), spec)
		if err != nil {
			return b, err
		}
		return appendNumber(b, math.Signbit(f) && !math.IsNaN(f), "", digits, spec, zero), nil
	case 'a':
		return b, errFormatUnsupported("%%a")
	}
	return b, rtErr("unsupported format character '%c'", spec.typ)
}

// appendNumber lays out a number's sign, prefix and digits: printf's zero
// flag pads with zeros after the sign, unless the field is left-aligned.
func appendNumber(b []byte, neg bool, prefix, digits string, spec fmtSpec, zero bool) []byte {
	if zero && spec.align != '<' {
		spec.fill, spec.align = '0', '='
	}
	return appendAligned(b, signOf(neg, spec.sign), prefix, digits, spec)
}

func signOf(neg bool, sign byte) string {
	switch {
	case neg:
		return "-"
	case sign == '+':
		return "+"
	case sign == ' ':
		return " "
	}
	return ""
}

// appendAligned pads sign+prefix+body to spec.width with spec.fill.
func appendAligned(b []byte, sign, prefix, body string, spec fmtSpec) []byte {
	pad := spec.width - len(sign) - len(prefix) - utf8.RuneCountInString(body)
	fill := func(n int) {
		for range n {
			b = utf8.AppendRune(b, spec.fill)
		}
	}
	if pad <= 0 {
		return append(append(append(b, sign...), prefix...), body...)
	}
	switch spec.align {
	case '<':
		b = append(append(append(b, sign...), prefix...), body...)
		fill(pad)
	case '^':
		fill(pad / 2)
		b = append(append(append(b, sign...), prefix...), body...)
		fill(pad - pad/2)
	case '=':
		b = append(append(b, sign...), prefix...)
		fill(pad)
		b = append(b, body...)
	default:
		fill(pad)
		b = append(append(append(b, sign...), prefix...), body...)
	}
	return b
}

func truncateRunes(s string, n int) string {
	if n < 0 {
		return s
	}
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}

// charOf is %c's and format's 'c': a code point, or a one-character string.
func charOf(v value) (string, error) {
	switch {
	case v.k == kStr && utf8.RuneCountInString(v.s) == 1:
		return v.s, nil
	case v.k == kInt || v.k == kBool:
		if v.n < 0 || v.n > utf8.MaxRune {
			return "", rtErr("%%c arg not in range(0x110000)")
		}
		if v.n >= 0xD800 && v.n <= 0xDFFF {
			return "", errFormatUnsupported("a surrogate code point")
		}
		return string(rune(v.n)), nil
	}
	return "", rtErr("%%c requires an int or a unicode character, not %s", typeName(v))
}

// truncFloat is Python's int(f) of a finite float, exact past int64.
func truncFloat(f float64) value {
	if f > -(1<<63) && f < 1<<63 {
		return intValue(int64(f))
	}
	n, _ := big.NewFloat(f).Int(nil)
	return fromBig(n)
}

// intDigits returns an integer's sign and the digits of its magnitude in
// the base of conversion typ.
func intDigits(v value, typ byte) (bool, string) {
	base := 10
	switch typ {
	case 'x', 'X':
		base = 16
	case 'o':
		base = 8
	case 'b':
		base = 2
	}
	var neg bool
	var digits string
	if v.k == kBigInt {
		n := toBig(v)
		neg = n.Sign() < 0
		digits = new(big.Int).Abs(n).Text(base)
	} else {
		neg = v.n < 0
		u := uint64(v.n)
		if neg {
			u = -u
		}
		digits = strconv.FormatUint(u, base)
	}
	if typ == 'X' {
		digits = strings.ToUpper(digits)
	}
	return neg, digits
}

// floatDigits formats a non-negative float for e, f, g and % (str.format)
// as Python does: precision 6 unless given, inf and nan spelled out
// (upper-case for E, F and G), two-digit exponents.
func floatDigits(f float64, spec fmtSpec) (string, error) {
	upper := spec.typ == 'E' || spec.typ == 'F' || spec.typ == 'G'
	if math.IsInf(f, 0) || math.IsNaN(f) {
		s := "inf"
		if math.IsNaN(f) {
			s = "nan"
		}
		if upper {
			s = strings.ToUpper(s)
		}
		if spec.typ == '%' {
			s += "%"
		}
		return s, nil
	}
	prec := spec.prec
	if prec < 0 {
		prec = 6
	}
	var s string
	switch spec.typ {
	case 'f', 'F', '%':
		if spec.typ == '%' {
			f *= 100
		}
		s = strconv.FormatFloat(f, 'f', prec, 64)
		if spec.alt && prec == 0 {
			s += "."
		}
		if spec.typ == '%' {
			s += "%"
		}
	case 'e', 'E':
		s = strconv.FormatFloat(f, 'e', prec, 64)
		if spec.alt && prec == 0 {
			i := strings.IndexByte(s, 'e')
			s = s[:i] + "." + s[i:]
		}
	case 'g', 'G':
		if spec.alt {
			return "", errFormatUnsupported("%%#g")
		}
		// strconv's g drops trailing zeros and switches to an exponent
		// where Python's does (below 1e-4, or at 10**precision).
		s = strconv.FormatFloat(f, 'g', max(prec, 1), 64)
	}
	if upper {
		s = strings.ToUpper(s)
	}
	return s, nil
}

// pyFormat is str.format: fields {}, {0} or {name}, an optional !s or !r
// conversion, and a format spec.
func (r *renderer) pyFormat(s string, args []value, kw []kwarg) (value, error) {
	var b []byte
	auto := 0
	manual := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '}' {
			if i+1 < len(s) && s[i+1] == '}' {
				i++
				b = append(b, '}')
				continue
			}
			return undefined, rtErr("single '}' encountered in format string")
		}
		if c != '{' {
			b = append(b, c)
			continue
		}
		if i+1 < len(s) && s[i+1] == '{' {
			b = append(b, '{')
			i++
			continue
		}
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return undefined, rtErr("single '{' encountered in format string")
		}
		field := s[i+1 : i+end]
		i += end
		if strings.IndexByte(field, '{') >= 0 {
			return undefined, errFormatUnsupported("a nested replacement field")
		}
		specText := ""
		if j := strings.IndexByte(field, ':'); j >= 0 {
			field, specText = field[:j], field[j+1:]
		}
		conv := byte(0)
		if j := strings.IndexByte(field, '!'); j >= 0 {
			if j+2 != len(field) {
				return undefined, rtErr("expected ':' after conversion specifier")
			}
			conv = field[j+1]
			field = field[:j]
		}
		if strings.ContainsAny(field, ".[") {
			return undefined, errFormatUnsupported("a field's attribute or index (%q)", field)
		}
		var v value
		switch {
		case field == "":
			if manual {
				return undefined, rtErr("cannot switch from manual field specification to automatic field numbering")
			}
			if auto >= len(args) {
				return undefined, rtErr("Replacement index %d out of range for positional args tuple", auto)
			}
			v = args[auto]
			auto++
		case field[0] >= '0' && field[0] <= '9':
			if auto > 0 {
				return undefined, rtErr("cannot switch from automatic field numbering to manual field specification")
			}
			manual = true
			n, err := strconv.Atoi(field)
			if err != nil || n >= len(args) {
				return undefined, rtErr("Replacement index %s out of range for positional args tuple", field)
			}
			v = args[n]
		default:
			found := false
			for _, k := range kw {
				if k.name == field {
					v, found = k.v, true
				}
			}
			if !found {
				return undefined, rtErr("KeyError: %q", field)
			}
		}
		switch conv {
		case 0:
		case 's':
			v = strValue(toStr(v))
		case 'r':
			v = strValue(string(appendRepr(nil, v)))
		case 'a':
			return undefined, errFormatUnsupported("!a")
		default:
			return undefined, rtErr("Unknown conversion specifier %c", conv)
		}
		var err error
		if b, err = appendFormatted(b, v, specText); err != nil {
			return undefined, err
		}
		if err := r.checkSize(len(b)); err != nil {
			return undefined, err
		}
	}
	return strValue(string(b)), nil
}

// parseFormatSpec reads [[fill]align][sign][z][#][0][width][grouping][.precision][type].
// A '0' before the width fills with zeros, where no fill is given, and
// (for a number without an alignment) between the sign and the digits.
func parseFormatSpec(text string, number bool) (fmtSpec, error) {
	spec := fmtSpec{fill: ' ', prec: -1}
	explicitFill := false
	i := 0
	isAlign := func(c byte) bool { return c == '<' || c == '>' || c == '^' || c == '=' }
	if r, size := utf8.DecodeRuneInString(text); size > 0 && size < len(text) && isAlign(text[size]) {
		spec.fill, spec.align, i, explicitFill = r, text[size], size+1, true
	} else if len(text) > 0 && isAlign(text[0]) {
		spec.align, i = text[0], 1
	}
	if i < len(text) && (text[i] == '+' || text[i] == '-' || text[i] == ' ') {
		if text[i] != '-' {
			spec.sign = text[i]
		}
		i++
	}
	if i < len(text) && text[i] == 'z' {
		return spec, errFormatUnsupported("the z option")
	}
	if i < len(text) && text[i] == '#' {
		spec.alt = true
		i++
	}
	if i < len(text) && text[i] == '0' {
		if !explicitFill {
			spec.fill = '0'
		}
		if number && spec.align == 0 {
			spec.align = '='
		}
		i++
	}
	var err error
	if i, spec.width, err = formatNumber(text, i); err != nil {
		return spec, err
	}
	if i < len(text) && (text[i] == ',' || text[i] == '_') {
		spec.grouping = text[i]
		i++
	}
	if i < len(text) && text[i] == '.' {
		start := i + 1
		if i, spec.prec, err = formatNumber(text, start); err != nil {
			return spec, err
		}
		if i == start {
			return spec, rtErr("Format specifier missing precision")
		}
	}
	if i < len(text) {
		spec.typ = text[i]
		i++
	}
	if i != len(text) {
		return spec, rtErr("Invalid format specifier '%s'", text)
	}
	if spec.typ == 'n' {
		return spec, errFormatUnsupported("the locale's n format")
	}
	return spec, nil
}

// appendFormatted appends format(v, text).
func appendFormatted(b []byte, v value, text string) ([]byte, error) {
	if text == "" {
		return appendStr(b, v), nil
	}
	spec, err := parseFormatSpec(text, v.k != kStr)
	if err != nil {
		return b, err
	}
	switch v.k {
	case kStr:
		switch {
		case spec.typ != 0 && spec.typ != 's':
			return b, rtErr("Unknown format code '%c' for object of type 'str'", spec.typ)
		case spec.sign != 0 || spec.alt || spec.grouping != 0 || spec.align == '=':
			return b, rtErr("Invalid format specifier '%s' for object of type 'str'", text)
		}
		if spec.align == 0 {
			spec.align = '<'
		}
		return appendAligned(b, "", "", truncateRunes(v.s, spec.prec), spec), nil
	case kInt, kBigInt, kBool:
		if spec.align == 0 {
			spec.align = '>'
		}
		switch spec.typ {
		case 0, 'd', 'x', 'X', 'o', 'b':
			if spec.prec >= 0 {
				return b, rtErr("Precision not allowed in integer format specifier")
			}
			neg, digits := intDigits(v, spec.typ)
			if spec.grouping != 0 {
				var err error
				if digits, err = groupDigits(digits, spec, text); err != nil {
					return b, err
				}
			}
			prefix := ""
			if spec.alt {
				prefix = map[byte]string{'x': "0x", 'X': "0X", 'o': "0o", 'b': "0b"}[spec.typ]
			}
			return appendAligned(b, signOf(neg, spec.sign), prefix, digits, spec), nil
		case 'c':
			switch {
			case spec.sign != 0 || spec.alt:
				return b, rtErr("Sign not allowed with integer format specifier 'c'")
			case spec.prec >= 0:
				return b, rtErr("Precision not allowed in integer format specifier")
			case spec.grouping != 0:
				return b, rtErr("Cannot specify '%c' with 'c'.", spec.grouping)
			}
			s, err := charOf(v)
			if err != nil {
				return b, err
			}
			return appendAligned(b, "", "", s, spec), nil
		case 'e', 'E', 'f', 'F', 'g', 'G', '%':
			f, err := intToFloat(v)
			if err != nil {
				return b, err
			}
			return appendFloatFormatted(b, f, spec, text)
		}
		return b, rtErr("Unknown format code '%c' for object of type 'int'", spec.typ)
	case kFloat:
		if spec.align == 0 {
			spec.align = '>'
		}
		switch spec.typ {
		case 0:
			if spec.prec >= 0 || spec.alt {
				return b, errFormatUnsupported("the float format %q", text)
			}
			if math.IsInf(v.f, 0) || math.IsNaN(v.f) {
				return appendFloatFormatted(b, v.f, fmtSpec{fill: spec.fill, align: spec.align, sign: spec.sign, width: spec.width, prec: -1, typ: 'f'}, text)
			}
			digits := string(appendPyFloat(nil, math.Abs(v.f), false))
			if spec.grouping != 0 {
				var err error
				if digits, err = groupDigits(digits, spec, text); err != nil {
					return b, err
				}
			}
			return appendAligned(b, signOf(math.Signbit(v.f), spec.sign), "", digits, spec), nil
		case 'e', 'E', 'f', 'F', 'g', 'G', '%':
			return appendFloatFormatted(b, v.f, spec, text)
		}
		return b, rtErr("Unknown format code '%c' for object of type 'float'", spec.typ)
	}
	return b, rtErr("unsupported format string passed to %s.__format__", typeName(v))
}

func appendFloatFormatted(b []byte, f float64, spec fmtSpec, text string) ([]byte, error) {
	digits, err := floatDigits(math.Abs(f), spec)
	if err != nil {
		return b, err
	}
	if spec.grouping != 0 {
		if digits, err = groupDigits(digits, spec, text); err != nil {
			return b, err
		}
	}
	return appendAligned(b, signOf(math.Signbit(f) && !math.IsNaN(f), spec.sign), "", digits, spec), nil
}

// groupDigits separates the leading run of digits of a formatted number
// (all of an integer's, a float's whole part) as the spec's grouping says:
// in threes for decimal digits, in fours for '_' with x, o or b (',' is
// not allowed with those).
func groupDigits(digits string, spec fmtSpec, text string) (string, error) {
	every := 3
	switch spec.typ {
	case 'x', 'X', 'o', 'b':
		if spec.grouping == ',' {
			return "", rtErr("Cannot specify ',' with '%c'.", spec.typ)
		}
		every = 4
	}
	if spec.fill == '0' && spec.align == '=' {
		// Python groups the zero padding too.
		return "", errFormatUnsupported("grouping with zero padding (%q)", text)
	}
	run := 0
	for run < len(digits) && (digits[run] >= '0' && digits[run] <= '9' || every == 4 && strings.IndexByte("abcdefABCDEF", digits[run]) >= 0) {
		run++
	}
	if run <= every {
		return digits, nil
	}
	var sb strings.Builder
	head := run % every
	if head == 0 {
		head = every
	}
	sb.WriteString(digits[:head])
	for i := head; i < run; i += every {
		sb.WriteByte(spec.grouping)
		sb.WriteString(digits[i : i+every])
	}
	sb.WriteString(digits[run:])
	return sb.String(), nil
}

// intToFloat is Python's float(n) for a float conversion of an integer:
// one too large for a float is an OverflowError, not inf.
func intToFloat(v value) (float64, error) {
	f := toFloat(v)
	if math.IsInf(f, 0) {
		return 0, rtErr("OverflowError: int too large to convert to float")
	}
	return f, nil
}
