package chat

import (
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/kvfast/kvfast/internal/jsonscan"
)

// JSON in both directions with Python's json module's behaviour, since
// that is what the engine's side runs: json.loads for request values and
// tool-call arguments (ints and floats kept apart, big integers exact,
// NaN and Infinity accepted, a repeated key keeping its first place and
// its last value), and transformers' tojson filter, which is json.dumps
// with ensure_ascii off.

// decodeJSON decodes the JSON value at b[i] and returns the index after
// it; python selects json.loads' extensions (NaN, Infinity).
func decodeJSON(b []byte, i, depth int, python bool) (value, int, error) {
	i = jsonscan.SkipSpace(b, i)
	if i >= len(b) {
		return undefined, -1, errJSON
	}
	if depth > jsonscan.MaxDepth {
		return undefined, -1, errJSON
	}
	switch c := b[i]; {
	case c == '"':
		s, end, err := decodeString(b, i)
		return strValue(s), end, err
	case c == '{':
		d := newDict(4)
		i = jsonscan.SkipSpace(b, i+1)
		if i < len(b) && b[i] == '}' {
			return dictValue(d), i + 1, nil
		}
		for {
			if i >= len(b) || b[i] != '"' {
				return undefined, -1, errJSON
			}
			key, end, err := decodeString(b, i)
			if err != nil {
				return undefined, -1, err
			}
			i = jsonscan.SkipSpace(b, end)
			if i >= len(b) || b[i] != ':' {
				return undefined, -1, errJSON
			}
			v, end, err := decodeJSON(b, i+1, depth+1, python)
			if err != nil {
				return undefined, -1, err
			}
			d.setStr(key, v)
			i = jsonscan.SkipSpace(b, end)
			if i >= len(b) {
				return undefined, -1, errJSON
			}
			if b[i] == '}' {
				return dictValue(d), i + 1, nil
			}
			if b[i] != ',' {
				return undefined, -1, errJSON
			}
			i = jsonscan.SkipSpace(b, i+1)
		}
	case c == '[':
		var items []value
		i = jsonscan.SkipSpace(b, i+1)
		if i < len(b) && b[i] == ']' {
			return listValue(items), i + 1, nil
		}
		for {
			v, end, err := decodeJSON(b, i, depth+1, python)
			if err != nil {
				return undefined, -1, err
			}
			items = append(items, v)
			i = jsonscan.SkipSpace(b, end)
			if i >= len(b) {
				return undefined, -1, errJSON
			}
			if b[i] == ']' {
				return listValue(items), i + 1, nil
			}
			if b[i] != ',' {
				return undefined, -1, errJSON
			}
			i++
		}
	case c == 't':
		return vTrue, jsonscan.ScanLiteral(b, i, "true"), litErr(jsonscan.ScanLiteral(b, i, "true"))
	case c == 'f':
		return vFalse, jsonscan.ScanLiteral(b, i, "false"), litErr(jsonscan.ScanLiteral(b, i, "false"))
	case c == 'n':
		return none, jsonscan.ScanLiteral(b, i, "null"), litErr(jsonscan.ScanLiteral(b, i, "null"))
	case python && c == 'N':
		end := jsonscan.ScanLiteral(b, i, "NaN")
		return floatValue(math.NaN()), end, litErr(end)
	case python && c == 'I':
		end := jsonscan.ScanLiteral(b, i, "Infinity")
		return floatValue(math.Inf(1)), end, litErr(end)
	case python && c == '-' && i+1 < len(b) && b[i+1] == 'I':
		end := jsonscan.ScanLiteral(b, i+1, "Infinity")
		return floatValue(math.Inf(-1)), end, litErr(end)
	}
	end := jsonscan.ScanNumber(b, i)
	if end < 0 {
		return undefined, -1, errJSON
	}
	return numberValue(string(b[i:end])), end, nil
}

func litErr(end int) error {
	if end < 0 {
		return errJSON
	}
	return nil
}

// numberValue turns JSON number text into an int, a big int or a float,
// as Python's json module does.
func numberValue(s string) value {
	if strings.ContainsAny(s, ".eE") {
		f, _ := strconv.ParseFloat(s, 64)
		return floatValue(f)
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return intValue(n)
	}
	b, _ := new(big.Int).SetString(s, 10)
	return fromBig(b)
}

func decodeString(b []byte, i int) (string, int, error) {
	end, escaped := jsonscan.ScanString(b, i)
	if end < 0 {
		return "", -1, errJSON
	}
	raw := b[i+1 : end-1]
	if !escaped {
		return string(raw), end, nil
	}
	return string(jsonscan.AppendUnescaped(nil, raw)), end, nil
}

// parseJSONText is json.loads(s): one value, surrounded by whitespace only.
func parseJSONText(s string) (value, bool) {
	b := []byte(s)
	v, end, err := decodeJSON(b, 0, 0, true)
	if err != nil || jsonscan.SkipSpace(b, end) != len(b) {
		return undefined, false
	}
	return v, true
}

type jsonOpts struct {
	ensureASCII bool
	indent      string
	hasIndent   bool
	itemSep     string
	keySep      string
	sortKeys    bool
}

func fToJSON(r *renderer, v value, args []value, kw []kwarg) (value, error) {
	o := jsonOpts{itemSep: ", ", keySep: ": "}
	o.ensureASCII = truth(argOf(args, kw, 0, "ensure_ascii", vFalse))
	switch ind := argOf(args, kw, 1, "indent", none); ind.k {
	case kNone, kUndefined:
	case kInt, kBool:
		o.hasIndent = true
		o.indent = strings.Repeat(" ", int(max(0, min(ind.n, 256))))
		o.itemSep = ","
	case kStr:
		o.hasIndent = true
		o.indent = ind.s
		o.itemSep = ","
	default:
		return undefined, rtErr("indent must be an int or a string")
	}
	if sep := argOf(args, kw, 2, "separators", none); sep.k == kList || sep.k == kTuple {
		items := sep.items()
		if len(items) != 2 || items[0].k != kStr || items[1].k != kStr {
			return undefined, rtErr("separators must be a pair of strings")
		}
		o.itemSep, o.keySep = items[0].s, items[1].s
	}
	o.sortKeys = truth(argOf(args, kw, 3, "sort_keys", vFalse))
	buf, err := appendJSON(r.scratch[:0], v, &o, 0, r)
	if err != nil {
		return undefined, err
	}
	s := string(buf)
	r.scratch = buf[:0]
	return strValue(s), nil
}

func appendJSON(dst []byte, v value, o *jsonOpts, level int, r *renderer) ([]byte, error) {
	if err := r.checkSize(len(dst)); err != nil {
		return nil, err
	}
	if level > jsonscan.MaxDepth {
		return nil, rtErr("maximum recursion depth exceeded while encoding a JSON object")
	}
	switch v.k {
	case kNone:
		return append(dst, "null"...), nil
	case kBool:
		if v.n != 0 {
			return append(dst, "true"...), nil
		}
		return append(dst, "false"...), nil
	case kInt, kBigInt:
		return appendRepr(dst, v), nil
	case kFloat:
		return appendPyFloat(dst, v.f, true), nil
	case kStr:
		return appendJSONString(dst, v.s, o.ensureASCII), nil
	case kList, kTuple:
		if v.s != "" {
			return nil, rtErr("Object of type %s is not JSON serializable", v.s)
		}
		items := v.items()
		if len(items) == 0 {
			return append(dst, "[]"...), nil
		}
		dst = append(dst, '[')
		var err error
		for i, it := range items {
			if i > 0 {
				dst = append(dst, o.itemSep...)
			}
			dst = o.newline(dst, level+1)
			if dst, err = appendJSON(dst, it, o, level+1, r); err != nil {
				return nil, err
			}
		}
		dst = o.newline(dst, level)
		return append(dst, ']'), nil
	case kDict:
		d := v.dict
		if len(d.keys) == 0 {
			return append(dst, "{}"...), nil
		}
		type entry struct {
			key string
			v   value
		}
		entries := make([]entry, len(d.keys))
		for i, k := range d.keys {
			var ks string
			switch k.k {
			case kStr:
				ks = k.s
			case kInt, kBigInt, kFloat:
				ks = string(appendJSONKeyNumber(nil, k))
			case kBool:
				ks = map[bool]string{true: "true", false: "false"}[k.n != 0]
			case kNone:
				ks = "null"
			default:
				return nil, rtErr("keys must be str, int, float, bool or None, not %s", typeName(k))
			}
			entries[i] = entry{ks, d.vals[i]}
		}
		if o.sortKeys {
			sort.SliceStable(entries, func(a, b int) bool { return entries[a].key < entries[b].key })
		}
		dst = append(dst, '{')
		var err error
		for i, e := range entries {
			if i > 0 {
				dst = append(dst, o.itemSep...)
			}
			dst = o.newline(dst, level+1)
			dst = appendJSONString(dst, e.key, o.ensureASCII)
			dst = append(dst, o.keySep...)
			if dst, err = appendJSON(dst, e.v, o, level+1, r); err != nil {
				return nil, err
			}
		}
		dst = o.newline(dst, level)
		return append(dst, '}'), nil
	}
	return nil, rtErr("Object of type %s is not JSON serializable", typeName(v))
}

func appendJSONKeyNumber(dst []byte, k value) []byte {
	if k.k == kFloat {
		return appendPyFloat(dst, k.f, true)
	}
	return appendRepr(dst, k)
}

func (o *jsonOpts) newline(dst []byte, level int) []byte {
	if !o.hasIndent {
		return dst
	}
	dst = append(dst, '\n')
	for i := 0; i < level; i++ {
		dst = append(dst, o.indent...)
	}
	return dst
}

func appendJSONString(dst []byte, s string, ascii bool) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch c {
			case '"':
				dst = append(dst, `\"`...)
			case '\\':
				dst = append(dst, `\\`...)
			case '\n':
				dst = append(dst, `\n`...)
			case '\r':
				dst = append(dst, `\r`...)
			case '\t':
				dst = append(dst, `\t`...)
			case '\b':
				dst = append(dst, `\b`...)
			case '\f':
				dst = append(dst, `\f`...)
			default:
				if c < 0x20 {
					dst = append(dst, `\u00`...)
					dst = appendHex(dst, uint32(c), 2)
				} else {
					dst = append(dst, c)
				}
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if !ascii {
			dst = append(dst, s[i:i+size]...)
			i += size
			continue
		}
		i += size
		if r >= 0x10000 {
			hi, lo := utf16.EncodeRune(r)
			dst = append(dst, `\u`...)
			dst = appendHex(dst, uint32(hi), 4)
			dst = append(dst, `\u`...)
			dst = appendHex(dst, uint32(lo), 4)
			continue
		}
		dst = append(dst, `\u`...)
		dst = appendHex(dst, uint32(r), 4)
	}
	return append(dst, '"')
}
