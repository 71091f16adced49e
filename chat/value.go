package chat

import (
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// kind is a template value's Python type. Templates are written against
// Python's semantics (what str(x) prints, what + means, what tojson
// emits), so values keep the distinctions Python keeps: int and float,
// tuple and list, None and undefined.
type kind uint8

const (
	kUndefined kind = iota
	kNone
	kBool
	kInt
	kBigInt // an integer beyond int64, kept as its decimal digits
	kFloat
	kStr
	kList
	kTuple
	kDict
	kNamespace
	kRange
	kFunc
	kLoop
)

// value is one template value. Scalars and strings live in the struct
// itself, so evaluating most expressions allocates nothing.
type value struct {
	k    kind
	n    int64   // bool (0/1), int
	f    float64 // float
	s    string  // str, bigint digits, undefined's name, a dict view's type
	list *[]value
	dict *dict
	fn   *function
	loop *loopState
	rng  *[3]int64 // range: start, stop, step
}

var (
	undefined = value{k: kUndefined}
	none      = value{k: kNone}
	vTrue     = value{k: kBool, n: 1}
	vFalse    = value{k: kBool}
)

func undefinedNamed(name string) value { return value{k: kUndefined, s: name} }
func boolValue(b bool) value {
	if b {
		return vTrue
	}
	return vFalse
}
func intValue(n int64) value     { return value{k: kInt, n: n} }
func floatValue(f float64) value { return value{k: kFloat, f: f} }
func strValue(s string) value    { return value{k: kStr, s: s} }
func listValue(items []value) value {
	return value{k: kList, list: &items}
}
func tupleValue(items []value) value {
	return value{k: kTuple, list: &items}
}
func dictValue(d *dict) value { return value{k: kDict, dict: d} }

// function is a callable: a built-in global, a bound method, or a macro.
type function struct {
	name  string
	call  func(r *renderer, args []value, kw []kwarg) (value, error)
	macro *macroNode
}

type kwarg struct {
	name string
	v    value
}

func (v value) items() []value {
	if v.list == nil {
		return nil
	}
	return *v.list
}

// dict is Python's insertion-ordered dict. Chat-template dicts are small
// (a message, a tool call), so lookups scan; keys are compared as Python
// compares them, so 1, 1.0 and True are one key. A dict that set grows
// past indexAfter keys gains an index of its string keys: a request can
// carry one object of tens of thousands of keys (any field, even one the
// template never reads), and decoding it by scans took seconds of CPU
// (60,000 keys: 8 s).
type dict struct {
	keys  []value
	vals  []value
	index map[string]int // string keys' positions; nil until set passes indexAfter
}

// indexAfter is the size past which set indexes a dict's string keys;
// below it a scan is as fast as hashing.
const indexAfter = 16

func newDict(n int) *dict {
	return &dict{keys: make([]value, 0, n), vals: make([]value, 0, n)}
}

// clone copies d, index and all: a copy of a wide dict keeps its fast
// lookups.
func (d *dict) clone() *dict {
	return &dict{keys: slices.Clone(d.keys), vals: slices.Clone(d.vals), index: maps.Clone(d.index)}
}

func (d *dict) find(key value) int {
	if key.k == kStr && d.index != nil {
		if i, ok := d.index[key.s]; ok {
			return i
		}
		return -1
	}
	if key.k == kStr {
		for i := range d.keys {
			if d.keys[i].k == kStr && d.keys[i].s == key.s {
				return i
			}
		}
		return -1
	}
	for i := range d.keys {
		if equal(d.keys[i], key) {
			return i
		}
	}
	return -1
}

func (d *dict) getStr(key string) (value, bool) {
	if d.index != nil {
		if i, ok := d.index[key]; ok {
			return d.vals[i], true
		}
		return undefined, false
	}
	for i := range d.keys {
		if d.keys[i].k == kStr && d.keys[i].s == key {
			return d.vals[i], true
		}
	}
	return undefined, false
}

// set keeps a replaced key where it first appeared, as Python does.
func (d *dict) set(key, v value) {
	if i := d.find(key); i >= 0 {
		d.vals[i] = v
		return
	}
	d.keys = append(d.keys, key)
	d.vals = append(d.vals, v)
	switch {
	case d.index != nil:
		if key.k == kStr {
			d.index[key.s] = len(d.keys) - 1
		}
	case len(d.keys) > indexAfter:
		// Only set builds the index, never a lookup: a dict a template
		// only reads may be shared by renders running at once.
		d.index = make(map[string]int, 2*len(d.keys))
		for i, k := range d.keys {
			if k.k == kStr {
				d.index[k.s] = i
			}
		}
	}
}

func (d *dict) setStr(key string, v value) { d.set(strValue(key), v) }

// truth is Python's bool(v).
func truth(v value) bool {
	switch v.k {
	case kUndefined, kNone:
		return false
	case kBool, kInt:
		return v.n != 0
	case kBigInt:
		return true
	case kFloat:
		return v.f != 0
	case kStr:
		return v.s != ""
	case kList, kTuple:
		return len(v.items()) > 0
	case kDict, kNamespace:
		return len(v.dict.keys) > 0
	case kRange:
		return rangeLen(v) > 0
	}
	return true
}

func typeName(v value) string {
	switch v.k {
	case kUndefined:
		return "Undefined"
	case kNone:
		return "NoneType"
	case kBool:
		return "bool"
	case kInt, kBigInt:
		return "int"
	case kFloat:
		return "float"
	case kStr:
		return "str"
	case kList:
		return "list"
	case kTuple:
		return "tuple"
	case kDict:
		return "dict"
	case kNamespace:
		return "Namespace"
	case kRange:
		return "range"
	case kLoop:
		return "LoopContext"
	}
	return "function"
}

// appendStr appends Python's str(v): what {{ v }} prints.
func appendStr(dst []byte, v value) []byte {
	switch v.k {
	case kUndefined:
		return dst
	case kStr:
		return append(dst, v.s...)
	}
	return appendRepr(dst, v)
}

func toStr(v value) string {
	if v.k == kStr {
		return v.s
	}
	return string(appendStr(nil, v))
}

// appendRepr appends Python's repr(v), which str() of a container uses for
// its items.
func appendRepr(dst []byte, v value) []byte {
	switch v.k {
	case kUndefined:
		return append(dst, "Undefined"...) // jinja2.Undefined's repr
	case kNone:
		return append(dst, "None"...)
	case kBool:
		if v.n != 0 {
			return append(dst, "True"...)
		}
		return append(dst, "False"...)
	case kInt:
		return strconv.AppendInt(dst, v.n, 10)
	case kBigInt:
		return append(dst, v.s...)
	case kFloat:
		return appendPyFloat(dst, v.f, false)
	case kStr:
		return appendPyStrRepr(dst, v.s)
	case kList, kTuple:
		if v.s != "" {
			// A dict view (items(), keys(), values()) prints as Python's.
			dst = append(dst, v.s...)
			dst = append(dst, '(')
			dst = appendRepr(dst, listValue(v.items()))
			return append(dst, ')')
		}
		open, close := byte('['), byte(']')
		if v.k == kTuple {
			open, close = '(', ')'
		}
		dst = append(dst, open)
		items := v.items()
		for i, it := range items {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			dst = appendRepr(dst, it)
		}
		if v.k == kTuple && len(items) == 1 {
			dst = append(dst, ',')
		}
		return append(dst, close)
	case kDict:
		dst = append(dst, '{')
		for i := range v.dict.keys {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			dst = appendRepr(dst, v.dict.keys[i])
			dst = append(dst, ": "...)
			dst = appendRepr(dst, v.dict.vals[i])
		}
		return append(dst, '}')
	case kNamespace:
		dst = append(dst, "<Namespace "...)
		dst = appendRepr(dst, dictValue(v.dict))
		return append(dst, '>')
	case kRange:
		r := v.rng
		dst = append(dst, "range("...)
		dst = strconv.AppendInt(dst, r[0], 10)
		dst = append(dst, ", "...)
		dst = strconv.AppendInt(dst, r[1], 10)
		if r[2] != 1 {
			dst = append(dst, ", "...)
			dst = strconv.AppendInt(dst, r[2], 10)
		}
		return append(dst, ')')
	case kLoop:
		return append(dst, "<LoopContext>"...)
	}
	return append(dst, "<function>"...)
}

// appendPyFloat formats f as Python's repr does: the shortest digits that
// round-trip, positional from 1e-4 up to 1e16, scientific beyond, and
// always with a decimal point or exponent. For JSON, inf and nan are
// spelled as Python's json module spells them.
func appendPyFloat(dst []byte, f float64, forJSON bool) []byte {
	switch {
	case math.IsInf(f, 1):
		if forJSON {
			return append(dst, "Infinity"...)
		}
		return append(dst, "inf"...)
	case math.IsInf(f, -1):
		if forJSON {
			return append(dst, "-Infinity"...)
		}
		return append(dst, "-inf"...)
	case math.IsNaN(f):
		if forJSON {
			return append(dst, "NaN"...)
		}
		return append(dst, "nan"...)
	}
	var buf [32]byte
	e := strconv.AppendFloat(buf[:0], f, 'e', -1, 64)
	// e is [-]d[.ddd]e±XX
	neg := e[0] == '-'
	if neg {
		e = e[1:]
	}
	epos := 0
	for epos < len(e) && e[epos] != 'e' {
		epos++
	}
	mant := e[:epos]
	exp, _ := strconv.Atoi(string(e[epos+1:]))
	digits := make([]byte, 0, 20)
	for _, c := range mant {
		if c != '.' {
			digits = append(digits, c)
		}
	}
	if neg {
		dst = append(dst, '-')
	}
	if exp >= -5 && exp < 16 {
		// positional; Python switches to exponent below 1e-4
		if exp < -4 {
			goto sci
		}
		if exp < 0 {
			dst = append(dst, "0."...)
			for i := 0; i < -exp-1; i++ {
				dst = append(dst, '0')
			}
			return append(dst, digits...)
		}
		if len(digits) <= exp+1 {
			dst = append(dst, digits...)
			for i := len(digits); i < exp+1; i++ {
				dst = append(dst, '0')
			}
			return append(dst, ".0"...)
		}
		dst = append(dst, digits[:exp+1]...)
		dst = append(dst, '.')
		return append(dst, digits[exp+1:]...)
	}
sci:
	dst = append(dst, digits[0])
	if len(digits) > 1 {
		dst = append(dst, '.')
		dst = append(dst, digits[1:]...)
	}
	dst = append(dst, 'e')
	if exp < 0 {
		dst = append(dst, '-')
		exp = -exp
	} else {
		dst = append(dst, '+')
	}
	if exp < 10 {
		dst = append(dst, '0')
	}
	return strconv.AppendInt(dst, int64(exp), 10)
}

// appendPyStrRepr appends Python's repr of a str: single quotes unless the
// text has a single quote and no double quote, and escapes for what
// Python does not consider printable.
func appendPyStrRepr(dst []byte, s string) []byte {
	q := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		q = '"'
	}
	dst = append(dst, q)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			// Not reachable from valid JSON input; printed as Python
			// prints a lone surrogate escape.
			dst = append(dst, `\udc`...)
			dst = appendHex(dst, uint32(s[i]), 2)
			i++
			continue
		}
		i += size
		switch {
		case r == rune(q) || r == '\\':
			dst = append(dst, '\\', byte(r))
		case r == '\n':
			dst = append(dst, `\n`...)
		case r == '\r':
			dst = append(dst, `\r`...)
		case r == '\t':
			dst = append(dst, `\t`...)
		case r < 0x20 || r == 0x7f:
			dst = append(dst, `\x`...)
			dst = appendHex(dst, uint32(r), 2)
		case r < 0x7f:
			dst = append(dst, byte(r))
		case isPyPrintable(r):
			dst = utf8.AppendRune(dst, r)
		case r < 0x100:
			dst = append(dst, `\x`...)
			dst = appendHex(dst, uint32(r), 2)
		case r < 0x10000:
			dst = append(dst, `\u`...)
			dst = appendHex(dst, uint32(r), 4)
		default:
			dst = append(dst, `\U`...)
			dst = appendHex(dst, uint32(r), 8)
		}
	}
	return append(dst, q)
}

func appendHex(dst []byte, v uint32, width int) []byte {
	const hexdigits = "0123456789abcdef"
	for i := width - 1; i >= 0; i-- {
		dst = append(dst, hexdigits[(v>>(4*uint(i)))&0xf])
	}
	return dst
}

// isPyPrintable approximates Python's str.isprintable for one character:
// printable unless it is in the Unicode categories Cc, Cf, Cs, Co, Cn, Zl,
// Zp or Zs (the ASCII space excepted).
func isPyPrintable(r rune) bool {
	if r == ' ' {
		return true
	}
	return !unicodeNonPrintable(r)
}

func rangeLen(v value) int64 {
	r := v.rng
	start, stop, step := r[0], r[1], r[2]
	if step > 0 && start < stop {
		return (stop - start + step - 1) / step
	}
	if step < 0 && start > stop {
		return (start - stop - step - 1) / -step
	}
	return 0
}
