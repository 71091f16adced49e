package chat

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The filters, tests, globals and methods below are the ones chat
// templates use, with the behaviour of Jinja2's built-ins and of the
// Python str, list and dict methods that ImmutableSandboxedEnvironment
// lets a template call. Methods that would modify a value are refused,
// as that sandbox refuses them.

type filterFn func(r *renderer, v value, args []value, kw []kwarg) (value, error)
type testFn func(v value, args []value) (bool, error)

var filters map[string]filterFn
var tests map[string]testFn

func knownFilter(name string) bool { _, ok := filters[name]; return ok }
func knownTest(name string) bool   { _, ok := tests[name]; return ok }

// argOf returns positional argument i, or the keyword argument name, or def.
func argOf(args []value, kw []kwarg, i int, name string, def value) value {
	if i < len(args) {
		return args[i]
	}
	for _, k := range kw {
		if k.name == name {
			return k.v
		}
	}
	return def
}

func (r *renderer) applyFilter(f *filterExpr, v value) (value, error) {
	if f.unimplemented {
		return undefined, fmt.Errorf("%w: the template uses the %s filter, which chat does not implement", ErrUnsupported, f.name)
	}
	args, kws, err := r.evalArgs(f.args, f.kw)
	if err != nil {
		return undefined, err
	}
	return filters[f.name](r, v, args, kws)
}

func (r *renderer) applyTest(t *testExpr, v value) (bool, error) {
	if t.unimplemented {
		return false, fmt.Errorf("%w: the template uses the %s test, which chat does not implement", ErrUnsupported, t.name)
	}
	args, _, err := r.evalArgs(t.args, nil)
	if err != nil {
		return false, err
	}
	return tests[t.name](v, args)
}

func needStr(v value, what string) (string, error) {
	switch v.k {
	case kStr:
		return v.s, nil
	case kUndefined:
		return "", undefinedErr(v)
	}
	return "", rtErr("%s expects a string, not '%s'", what, typeName(v))
}

func length(v value) (int, error) {
	switch v.k {
	case kStr:
		return utf8.RuneCountInString(v.s), nil
	case kList, kTuple:
		return len(v.items()), nil
	case kDict, kNamespace:
		return len(v.dict.keys), nil
	case kRange:
		return int(rangeLen(v)), nil
	case kUndefined:
		return 0, nil
	}
	return 0, rtErr("object of type '%s' has no len()", typeName(v))
}

func init() {
	filters = map[string]filterFn{
		"length": fLength, "count": fLength,
		"trim": func(_ *renderer, v value, args []value, kw []kwarg) (value, error) {
			if v.k == kUndefined {
				return strValue(""), nil
			}
			return strValue(pyStrip(toStr(v), argOf(args, kw, 0, "chars", none), 3)), nil
		},
		"tojson": fToJSON,
		"join":   fJoin,
		"list": func(_ *renderer, v value, _ []value, _ []kwarg) (value, error) {
			items, err := iterate(v)
			if err != nil {
				return undefined, err
			}
			return listValue(append([]value(nil), items...)), nil
		},
		"first": func(_ *renderer, v value, _ []value, _ []kwarg) (value, error) {
			items, err := iterate(v)
			if err != nil || len(items) == 0 {
				return undefined, err
			}
			return items[0], nil
		},
		"last": func(_ *renderer, v value, _ []value, _ []kwarg) (value, error) {
			items, err := iterate(v)
			if err != nil || len(items) == 0 {
				return undefined, err
			}
			return items[len(items)-1], nil
		},
		"lower": func(_ *renderer, v value, _ []value, _ []kwarg) (value, error) {
			return casedValue(pyLower(toStr(v)))
		},
		"upper": func(_ *renderer, v value, _ []value, _ []kwarg) (value, error) {
			return casedValue(pyUpper(toStr(v)))
		},
		"capitalize": func(_ *renderer, v value, _ []value, _ []kwarg) (value, error) {
			return casedValue(pyCapitalize(toStr(v)))
		},
		"title": func(_ *renderer, v value, _ []value, _ []kwarg) (value, error) {
			return casedValue(jinjaTitle(toStr(v)))
		},
		"default": fDefault, "d": fDefault,
		"replace": func(_ *renderer, v value, args []value, kw []kwarg) (value, error) {
			old, err := needStr(argOf(args, kw, 0, "old", undefined), "replace")
			if err != nil {
				return undefined, err
			}
			nw, err := needStr(argOf(args, kw, 1, "new", undefined), "replace")
			if err != nil {
				return undefined, err
			}
			n := -1
			if c := argOf(args, kw, 2, "count", none); c.k == kInt {
				n = int(c.n)
			}
			return strValue(pyReplace(toStr(v), old, nw, n)), nil
		},
		"string": func(_ *renderer, v value, _ []value, _ []kwarg) (value, error) {
			return strValue(toStr(v)), nil
		},
		"safe": func(_ *renderer, v value, _ []value, _ []kwarg) (value, error) {
			return strValue(toStr(v)), nil
		},
		"e": fEscape, "escape": fEscape, "forceescape": fEscape,
		"int":   fInt,
		"float": fFloat,
		"abs": func(_ *renderer, v value, _ []value, _ []kwarg) (value, error) {
			switch v.k {
			case kInt, kBool:
				if v.n < 0 {
					return arith("-", intValue(0), v)
				}
				return intValue(v.n), nil
			case kFloat:
				return floatValue(math.Abs(v.f)), nil
			case kBigInt:
				return value{k: kBigInt, s: strings.TrimPrefix(v.s, "-")}, nil
			}
			return undefined, rtErr("bad operand type for abs(): '%s'", typeName(v))
		},
		"round":    fRound,
		"items":    fItems,
		"dictsort": fDictsort,
		"selectattr": func(r *renderer, v value, args []value, kw []kwarg) (value, error) {
			return selectOrReject(r, v, args, true, true)
		},
		"rejectattr": func(r *renderer, v value, args []value, kw []kwarg) (value, error) {
			return selectOrReject(r, v, args, true, false)
		},
		"select": func(r *renderer, v value, args []value, kw []kwarg) (value, error) {
			return selectOrReject(r, v, args, false, true)
		},
		"reject": func(r *renderer, v value, args []value, kw []kwarg) (value, error) {
			return selectOrReject(r, v, args, false, false)
		},
		"map":     fMap,
		"sum":     fSum,
		"min":     func(r *renderer, v value, a []value, k []kwarg) (value, error) { return fMinMax(r, v, a, k, -1) },
		"max":     func(r *renderer, v value, a []value, k []kwarg) (value, error) { return fMinMax(r, v, a, k, 1) },
		"sort":    fSort,
		"unique":  fUnique,
		"reverse": fReverse,
		"indent":  fIndent,
		"wordcount": func(_ *renderer, v value, _ []value, _ []kwarg) (value, error) {
			return intValue(int64(len(wordRe(toStr(v))))), nil
		},
		"batch":  fBatch,
		"center": fCenter,
		// Jinja2's format filter is value % (kwargs or args): the
		// arguments as a tuple even when there is one.
		"format": func(r *renderer, v value, args []value, kw []kwarg) (value, error) {
			if len(kw) == 0 {
				return r.percentFormat(toStr(v), tupleValue(args))
			}
			if len(args) > 0 {
				return undefined, rtErr("can't handle positional and keyword arguments at the same time")
			}
			d := newDict(len(kw))
			for _, k := range kw {
				d.setStr(k.name, k.v)
			}
			return r.percentFormat(toStr(v), dictValue(d))
		},
		"attr": func(r *renderer, v value, args []value, _ []kwarg) (value, error) {
			if len(args) == 0 {
				return undefined, rtErr("attr expects a name")
			}
			name, err := needStr(args[0], "attr")
			if err != nil {
				return undefined, err
			}
			if v.k == kDict {
				if m, ok := dictMethod(v, name); ok {
					return m, nil
				}
				return undefined, nil
			}
			return r.getAttr(v, name)
		},
	}
	tests = map[string]testFn{
		"defined":   func(v value, _ []value) (bool, error) { return v.k != kUndefined, nil },
		"undefined": func(v value, _ []value) (bool, error) { return v.k == kUndefined, nil },
		"none":      func(v value, _ []value) (bool, error) { return v.k == kNone, nil },
		"boolean":   func(v value, _ []value) (bool, error) { return v.k == kBool, nil },
		"true":      func(v value, _ []value) (bool, error) { return v.k == kBool && v.n == 1, nil },
		"false":     func(v value, _ []value) (bool, error) { return v.k == kBool && v.n == 0, nil },
		"integer":   func(v value, _ []value) (bool, error) { return v.k == kInt || v.k == kBigInt, nil },
		"float":     func(v value, _ []value) (bool, error) { return v.k == kFloat, nil },
		"number":    func(v value, _ []value) (bool, error) { return isNumber(v), nil },
		"string":    func(v value, _ []value) (bool, error) { return v.k == kStr, nil },
		"mapping":   func(v value, _ []value) (bool, error) { return v.k == kDict, nil },
		"iterable": func(v value, _ []value) (bool, error) {
			switch v.k {
			case kStr, kList, kTuple, kDict, kNamespace, kRange:
				return true, nil
			}
			return false, nil
		},
		"sequence": func(v value, _ []value) (bool, error) {
			switch v.k {
			case kStr, kList, kTuple, kDict, kRange:
				return true, nil
			}
			return false, nil
		},
		"callable": func(v value, _ []value) (bool, error) { return v.k == kFunc, nil },
		"sameas": func(v value, args []value) (bool, error) {
			if len(args) != 1 {
				return false, rtErr("sameas takes one argument")
			}
			a := args[0]
			switch v.k {
			case kNone, kUndefined, kBool:
				return v.k == a.k && v.n == a.n, nil
			case kList, kTuple:
				return a.k == v.k && a.list == v.list, nil
			case kDict, kNamespace:
				return a.k == v.k && a.dict == v.dict, nil
			case kInt:
				return a.k == kInt && a.n == v.n && v.n >= -5 && v.n <= 256, nil
			}
			return false, nil
		},
		"odd": func(v value, _ []value) (bool, error) {
			if v.k != kInt {
				return false, rtErr("odd expects an integer")
			}
			return v.n%2 != 0, nil
		},
		"even": func(v value, _ []value) (bool, error) {
			if v.k != kInt {
				return false, rtErr("even expects an integer")
			}
			return v.n%2 == 0, nil
		},
		"divisibleby": func(v value, args []value) (bool, error) {
			if len(args) != 1 || !isNumber(v) || !isNumber(args[0]) {
				return false, rtErr("divisibleby expects numbers")
			}
			m, err := arith("%", v, args[0])
			if err != nil {
				return false, err
			}
			return !truth(m), nil
		},
		// Jinja2's lower and upper tests are str.islower and str.isupper:
		// a string with no cased character is neither.
		"lower":   func(v value, _ []value) (bool, error) { return strPredicate(toStr(v), "islower") },
		"upper":   func(v value, _ []value) (bool, error) { return strPredicate(toStr(v), "isupper") },
		"escaped": func(v value, _ []value) (bool, error) { return false, nil },
		"in": func(v value, args []value) (bool, error) {
			if len(args) != 1 {
				return false, rtErr("in takes one argument")
			}
			return contains(args[0], v)
		},
	}
	for _, alias := range [][]string{
		{"eq", "=="}, {"equalto", "=="}, {"==", "=="},
		{"ne", "!="}, {"!=", "!="},
		{"lt", "<"}, {"lessthan", "<"}, {"<", "<"},
		{"le", "<="}, {"<=", "<="},
		{"gt", ">"}, {"greaterthan", ">"}, {">", ">"},
		{"ge", ">="}, {">=", ">="},
	} {
		op := alias[1]
		tests[alias[0]] = func(v value, args []value) (bool, error) {
			if len(args) != 1 {
				return false, rtErr("comparison test takes one argument")
			}
			return compare(op, v, args[0])
		}
	}
}

func fLength(_ *renderer, v value, _ []value, _ []kwarg) (value, error) {
	n, err := length(v)
	return intValue(int64(n)), err
}

func fDefault(_ *renderer, v value, args []value, kw []kwarg) (value, error) {
	def := argOf(args, kw, 0, "default_value", strValue(""))
	boolean := truth(argOf(args, kw, 1, "boolean", vFalse))
	if v.k == kUndefined || (boolean && !truth(v)) {
		return def, nil
	}
	return v, nil
}

func fEscape(_ *renderer, v value, _ []value, _ []kwarg) (value, error) {
	s := toStr(v)
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;")
	return strValue(r.Replace(s)), nil
}

func fJoin(r *renderer, v value, args []value, kw []kwarg) (value, error) {
	sep := toStr(argOf(args, kw, 0, "d", strValue("")))
	attr := argOf(args, kw, 1, "attribute", none)
	items, err := iterate(v)
	if err != nil {
		return undefined, err
	}
	buf := r.scratch[:0]
	for i, it := range items {
		if i > 0 {
			buf = append(buf, sep...)
		}
		if attr.k != kNone {
			if it, err = attrOrItem(r, it, attr); err != nil {
				return undefined, err
			}
		}
		buf = appendStr(buf, it)
		if err := r.checkSize(len(buf)); err != nil {
			return undefined, err
		}
	}
	s := string(buf)
	r.scratch = buf[:0]
	return strValue(s), nil
}

// attrOrItem is Jinja2's environment.getitem used by the attribute=
// arguments: "a.b" walks into nested values, an integer part indexes.
func attrOrItem(r *renderer, v value, attr value) (value, error) {
	if attr.k == kInt {
		return r.getItem(v, attr)
	}
	for _, part := range strings.Split(toStr(attr), ".") {
		var key value
		if n, err := strconv.ParseInt(part, 10, 64); err == nil {
			key = intValue(n)
		} else {
			key = strValue(part)
		}
		var err error
		if v, err = r.getItem(v, key); err != nil {
			return undefined, err
		}
	}
	return v, nil
}

func fInt(_ *renderer, v value, args []value, kw []kwarg) (value, error) {
	def := argOf(args, kw, 0, "default", intValue(0))
	base := argOf(args, kw, 1, "base", intValue(10))
	switch v.k {
	case kInt, kBigInt:
		return v, nil
	case kBool:
		return intValue(v.n), nil
	case kFloat:
		if math.IsInf(v.f, 0) || math.IsNaN(v.f) {
			return def, nil
		}
		return truncFloat(v.f), nil
	case kStr:
		s := strings.TrimFunc(strings.ReplaceAll(v.s, "_", ""), pyIsSpace)
		if n, err := strconv.ParseInt(s, int(base.n), 64); err == nil {
			return intValue(n), nil
		}
		if f, err := strconv.ParseFloat(s, 64); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
			return truncFloat(f), nil
		}
	}
	return def, nil
}

func fFloat(_ *renderer, v value, args []value, kw []kwarg) (value, error) {
	def := argOf(args, kw, 0, "default", floatValue(0))
	switch v.k {
	case kInt, kBool, kBigInt:
		return floatValue(toFloat(v)), nil
	case kFloat:
		return v, nil
	case kStr:
		s := strings.TrimFunc(v.s, pyIsSpace)
		switch strings.ToLower(s) {
		case "inf", "+inf", "infinity", "+infinity":
			return floatValue(math.Inf(1)), nil
		case "-inf", "-infinity":
			return floatValue(math.Inf(-1)), nil
		case "nan", "+nan", "-nan":
			return floatValue(math.NaN()), nil
		}
		if f, err := strconv.ParseFloat(strings.ReplaceAll(s, "_", ""), 64); err == nil {
			return floatValue(f), nil
		}
	}
	return def, nil
}

func fRound(_ *renderer, v value, args []value, kw []kwarg) (value, error) {
	prec := argOf(args, kw, 0, "precision", intValue(0))
	method := toStr(argOf(args, kw, 1, "method", strValue("common")))
	if !isNumber(v) {
		return undefined, rtErr("round expects a number")
	}
	f := toFloat(v)
	p := math.Pow(10, float64(prec.n))
	switch method {
	case "ceil":
		return floatValue(math.Ceil(f*p) / p), nil
	case "floor":
		return floatValue(math.Floor(f*p) / p), nil
	}
	if prec.n == 0 {
		return floatValue(math.RoundToEven(f)), nil
	}
	if prec.n < 0 {
		return floatValue(math.RoundToEven(f*p) / p), nil
	}
	x, _ := strconv.ParseFloat(strconv.FormatFloat(f, 'f', int(prec.n), 64), 64)
	return floatValue(x), nil
}

func fItems(_ *renderer, v value, _ []value, _ []kwarg) (value, error) {
	if v.k == kUndefined {
		return listValue(nil), nil
	}
	if v.k != kDict {
		return undefined, rtErr("can only get item pairs from a mapping")
	}
	out := make([]value, len(v.dict.keys))
	for i := range v.dict.keys {
		out[i] = tupleValue([]value{v.dict.keys[i], v.dict.vals[i]})
	}
	return listValue(out), nil
}

func sortKey(v value, caseSensitive bool) value {
	if !caseSensitive && v.k == kStr {
		return strValue(strings.ToLower(v.s))
	}
	return v
}

func sortValues(items []value, key func(value) (value, error), reverse bool) error {
	keys := make([]value, len(items))
	for i, it := range items {
		k, err := key(it)
		if err != nil {
			return err
		}
		keys[i] = k
	}
	idx := make([]int, len(items))
	for i := range idx {
		idx[i] = i
	}
	var sortErr error
	sort.SliceStable(idx, func(a, b int) bool {
		c, err := order(keys[idx[a]], keys[idx[b]])
		if err != nil && sortErr == nil {
			sortErr = err
		}
		if reverse {
			return c > 0
		}
		return c < 0
	})
	if sortErr != nil {
		return sortErr
	}
	sorted := make([]value, len(items))
	for i, j := range idx {
		sorted[i] = items[j]
	}
	copy(items, sorted)
	return nil
}

func fDictsort(_ *renderer, v value, args []value, kw []kwarg) (value, error) {
	if v.k != kDict {
		return undefined, rtErr("dictsort expects a mapping")
	}
	cs := truth(argOf(args, kw, 0, "case_sensitive", vFalse))
	by := toStr(argOf(args, kw, 1, "by", strValue("key")))
	rev := truth(argOf(args, kw, 2, "reverse", vFalse))
	pos := 0
	if by == "value" {
		pos = 1
	}
	out := make([]value, len(v.dict.keys))
	for i := range v.dict.keys {
		out[i] = tupleValue([]value{v.dict.keys[i], v.dict.vals[i]})
	}
	err := sortValues(out, func(p value) (value, error) { return sortKey(p.items()[pos], cs), nil }, rev)
	return listValue(out), err
}

func selectOrReject(r *renderer, v value, args []value, byAttr, keep bool) (value, error) {
	items, err := iterate(v)
	if err != nil {
		return undefined, err
	}
	var attr value
	if byAttr {
		if len(args) == 0 {
			return undefined, rtErr("missing parameter for attribute name")
		}
		attr, args = args[0], args[1:]
	}
	var test testFn
	var testArgs []value
	if len(args) > 0 {
		name := toStr(args[0])
		t, ok := tests[name]
		if !ok {
			return undefined, rtErr("no test named %q", name)
		}
		test, testArgs = t, args[1:]
	}
	var out []value
	for _, it := range items {
		x := it
		if byAttr {
			if x, err = attrOrItem(r, it, attr); err != nil {
				return undefined, err
			}
		}
		var ok bool
		if test == nil {
			ok = truth(x)
		} else if ok, err = test(x, testArgs); err != nil {
			return undefined, err
		}
		if ok == keep {
			out = append(out, it)
		}
	}
	return listValue(out), nil
}

func fMap(r *renderer, v value, args []value, kw []kwarg) (value, error) {
	items, err := iterate(v)
	if err != nil {
		return undefined, err
	}
	out := make([]value, 0, len(items))
	attr := argOf(nil, kw, 0, "attribute", undefined)
	if attr.k != kUndefined {
		def := argOf(nil, kw, 0, "default", undefined)
		for _, it := range items {
			x, err := attrOrItem(r, it, attr)
			if err != nil {
				return undefined, err
			}
			if x.k == kUndefined && def.k != kUndefined {
				x = def
			}
			out = append(out, x)
		}
		return listValue(out), nil
	}
	if len(args) == 0 {
		return undefined, rtErr("map requires a filter argument")
	}
	name := toStr(args[0])
	f, ok := filters[name]
	if !ok {
		return undefined, rtErr("no filter named %q", name)
	}
	for _, it := range items {
		x, err := f(r, it, args[1:], kw)
		if err != nil {
			return undefined, err
		}
		out = append(out, x)
	}
	return listValue(out), nil
}

func fSum(r *renderer, v value, args []value, kw []kwarg) (value, error) {
	items, err := iterate(v)
	if err != nil {
		return undefined, err
	}
	attr := argOf(args, kw, 0, "attribute", none)
	total := argOf(args, kw, 1, "start", intValue(0))
	for _, it := range items {
		if attr.k != kNone {
			if it, err = attrOrItem(r, it, attr); err != nil {
				return undefined, err
			}
		}
		if total, err = r.binary("+", total, it); err != nil {
			return undefined, err
		}
	}
	return total, nil
}

func fMinMax(r *renderer, v value, args []value, kw []kwarg, sign int) (value, error) {
	items, err := iterate(v)
	if err != nil {
		return undefined, err
	}
	cs := truth(argOf(args, kw, 0, "case_sensitive", vFalse))
	attr := argOf(args, kw, 1, "attribute", none)
	var best, bestKey value
	for i, it := range items {
		k := it
		if attr.k != kNone {
			if k, err = attrOrItem(r, it, attr); err != nil {
				return undefined, err
			}
		}
		k = sortKey(k, cs)
		if i == 0 {
			best, bestKey = it, k
			continue
		}
		c, err := order(k, bestKey)
		if err != nil {
			return undefined, err
		}
		if c*sign > 0 {
			best, bestKey = it, k
		}
	}
	return best, nil
}

func fSort(r *renderer, v value, args []value, kw []kwarg) (value, error) {
	items, err := iterate(v)
	if err != nil {
		return undefined, err
	}
	rev := truth(argOf(args, kw, 0, "reverse", vFalse))
	cs := truth(argOf(args, kw, 1, "case_sensitive", vFalse))
	attr := argOf(args, kw, 2, "attribute", none)
	out := append([]value(nil), items...)
	err = sortValues(out, func(it value) (value, error) {
		if attr.k != kNone {
			x, err := attrOrItem(r, it, attr)
			return sortKey(x, cs), err
		}
		return sortKey(it, cs), nil
	}, rev)
	return listValue(out), err
}

func fUnique(r *renderer, v value, args []value, kw []kwarg) (value, error) {
	items, err := iterate(v)
	if err != nil {
		return undefined, err
	}
	cs := truth(argOf(args, kw, 0, "case_sensitive", vFalse))
	attr := argOf(args, kw, 1, "attribute", none)
	var out, seen []value
	for _, it := range items {
		k := it
		if attr.k != kNone {
			if k, err = attrOrItem(r, it, attr); err != nil {
				return undefined, err
			}
		}
		k = sortKey(k, cs)
		dup := false
		for _, s := range seen {
			if equal(s, k) {
				dup = true
				break
			}
		}
		if !dup {
			seen = append(seen, k)
			out = append(out, it)
		}
	}
	return listValue(out), nil
}

func fReverse(_ *renderer, v value, _ []value, _ []kwarg) (value, error) {
	if v.k == kStr {
		rs := []rune(v.s)
		for i, j := 0, len(rs)-1; i < j; i, j = i+1, j-1 {
			rs[i], rs[j] = rs[j], rs[i]
		}
		return strValue(string(rs)), nil
	}
	items, err := iterate(v)
	if err != nil {
		return undefined, err
	}
	out := make([]value, len(items))
	for i, it := range items {
		out[len(items)-1-i] = it
	}
	return listValue(out), nil
}

func fIndent(_ *renderer, v value, args []value, kw []kwarg) (value, error) {
	w := argOf(args, kw, 0, "width", intValue(4))
	first := truth(argOf(args, kw, 1, "first", vFalse))
	blank := truth(argOf(args, kw, 2, "blank", vFalse))
	var pad string
	if w.k == kStr {
		pad = w.s
	} else {
		pad = strings.Repeat(" ", int(max(0, min(w.n, 1024))))
	}
	s := toStr(v) + "\n"
	lines := strings.SplitAfter(s, "\n")
	lines = lines[:len(lines)-1]
	var b strings.Builder
	for i, line := range lines {
		if i == 0 && !first {
			b.WriteString(line)
			continue
		}
		if !blank && strings.TrimFunc(line, pyIsSpace) == "" {
			b.WriteString(line)
			continue
		}
		b.WriteString(pad)
		b.WriteString(line)
	}
	return strValue(strings.TrimSuffix(b.String(), "\n")), nil
}

func fBatch(_ *renderer, v value, args []value, kw []kwarg) (value, error) {
	items, err := iterate(v)
	if err != nil {
		return undefined, err
	}
	n := argOf(args, kw, 0, "linecount", intValue(1))
	if n.k != kInt || n.n <= 0 {
		return undefined, rtErr("batch expects a positive count")
	}
	fill := argOf(args, kw, 1, "fill_with", none)
	var out []value
	for i := 0; i < len(items); i += int(n.n) {
		end := min(i+int(n.n), len(items))
		row := append([]value(nil), items[i:end]...)
		if fill.k != kNone {
			for len(row) < int(n.n) {
				row = append(row, fill)
			}
		}
		out = append(out, listValue(row))
	}
	return listValue(out), nil
}

func fCenter(_ *renderer, v value, args []value, kw []kwarg) (value, error) {
	s := toStr(v)
	w := argOf(args, kw, 0, "width", intValue(80))
	n := utf8.RuneCountInString(s)
	if w.k != kInt || int(w.n) <= n {
		return strValue(s), nil
	}
	width := int(min(w.n, 1<<16))
	total := width - n
	// CPython's pad: the odd space goes left when the width is odd.
	left := total/2 + total&width&1
	return strValue(strings.Repeat(" ", left) + s + strings.Repeat(" ", total-left)), nil
}

func wordRe(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return !(unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_') })
}

// pyStrip is str.strip/lstrip/rstrip (sides: 1 left, 2 right, 3 both).
func pyStrip(s string, chars value, sides int) string {
	cut := pyIsSpace
	if chars.k == kStr {
		set := chars.s
		cut = func(r rune) bool { return strings.ContainsRune(set, r) }
	}
	if sides&1 != 0 {
		s = strings.TrimLeftFunc(s, cut)
	}
	if sides&2 != 0 {
		s = strings.TrimRightFunc(s, cut)
	}
	return s
}

func pyReplace(s, old, nw string, n int) string {
	if old == "" && n != 0 {
		// Python inserts new around every character.
		var b strings.Builder
		count := 0
		for _, r := range s {
			if n < 0 || count < n {
				b.WriteString(nw)
				count++
			}
			b.WriteRune(r)
		}
		if n < 0 || count < n {
			b.WriteString(nw)
		}
		return b.String()
	}
	return strings.Replace(s, old, nw, n)
}

func pySplit(s string, sep value, maxsplit int64, fromRight bool) ([]value, error) {
	var parts []string
	if sep.k == kNone || sep.k == kUndefined {
		fields := strings.FieldsFunc(s, pyIsSpace)
		if maxsplit >= 0 && int64(len(fields)) > maxsplit+1 {
			// Rejoin the tail (or head) as Python leaves it unsplit.
			if !fromRight {
				rest := s
				parts = nil
				for i := int64(0); i < maxsplit; i++ {
					rest = strings.TrimLeftFunc(rest, pyIsSpace)
					end := strings.IndexFunc(rest, pyIsSpace)
					parts = append(parts, rest[:end])
					rest = rest[end:]
				}
				parts = append(parts, strings.TrimLeftFunc(rest, pyIsSpace))
			} else {
				rest := s
				var rev []string
				for i := int64(0); i < maxsplit; i++ {
					rest = strings.TrimRightFunc(rest, pyIsSpace)
					start := strings.LastIndexFunc(rest, pyIsSpace)
					rev = append(rev, rest[start+1:])
					rest = rest[:start+1]
				}
				parts = append(parts, strings.TrimRightFunc(rest, pyIsSpace))
				for i := len(rev) - 1; i >= 0; i-- {
					parts = append(parts, rev[i])
				}
			}
		} else {
			parts = fields
		}
	} else {
		sp, err := needStr(sep, "split")
		if err != nil {
			return nil, err
		}
		if sp == "" {
			return nil, rtErr("empty separator")
		}
		switch {
		case maxsplit < 0:
			parts = strings.Split(s, sp)
		case !fromRight:
			parts = strings.SplitN(s, sp, int(min(maxsplit, 1<<30))+1)
		default:
			rest := s
			var rev []string
			for i := int64(0); i < maxsplit; i++ {
				j := strings.LastIndex(rest, sp)
				if j < 0 {
					break
				}
				rev = append(rev, rest[j+len(sp):])
				rest = rest[:j]
			}
			parts = append(parts, rest)
			for i := len(rev) - 1; i >= 0; i-- {
				parts = append(parts, rev[i])
			}
		}
	}
	out := make([]value, len(parts))
	for i, p := range parts {
		out[i] = strValue(p)
	}
	return out, nil
}

func method(name string, fn func(r *renderer, args []value, kw []kwarg) (value, error)) value {
	return value{k: kFunc, fn: &function{name: name, call: fn}}
}

// runeIndex converts a byte offset in s to a code-point offset.
func runeIndex(s string, byteOff int) int64 {
	if byteOff < 0 {
		return -1
	}
	return int64(utf8.RuneCountInString(s[:byteOff]))
}

func strMethod(obj value, name string) (value, bool) {
	s := obj.s
	switch name {
	case "strip", "lstrip", "rstrip":
		sides := map[string]int{"strip": 3, "lstrip": 1, "rstrip": 2}[name]
		return method(name, func(_ *renderer, args []value, kw []kwarg) (value, error) {
			return strValue(pyStrip(s, argOf(args, kw, 0, "chars", none), sides)), nil
		}), true
	case "split", "rsplit":
		return method(name, func(_ *renderer, args []value, kw []kwarg) (value, error) {
			ms := argOf(args, kw, 1, "maxsplit", intValue(-1))
			parts, err := pySplit(s, argOf(args, kw, 0, "sep", none), ms.n, name == "rsplit")
			return listValue(parts), err
		}), true
	case "splitlines":
		return method(name, func(_ *renderer, args []value, kw []kwarg) (value, error) {
			keep := truth(argOf(args, kw, 0, "keepends", vFalse))
			var out []value
			for s2 := s; s2 != ""; {
				i := strings.IndexAny(s2, "\n\r\v\f\x1c\x1d\x1e\u0085\u2028\u2029")
				if i < 0 {
					out = append(out, strValue(s2))
					break
				}
				_, size := utf8.DecodeRuneInString(s2[i:])
				end := i + size
				if s2[i] == '\r' && end < len(s2) && s2[end] == '\n' {
					end++
				}
				if keep {
					out = append(out, strValue(s2[:end]))
				} else {
					out = append(out, strValue(s2[:i]))
				}
				s2 = s2[end:]
			}
			return listValue(out), nil
		}), true
	case "startswith", "endswith":
		return method(name, func(_ *renderer, args []value, kw []kwarg) (value, error) {
			if len(args) == 0 {
				return undefined, rtErr("%s takes at least 1 argument", name)
			}
			var cands []value
			if args[0].k == kTuple {
				cands = args[0].items()
			} else {
				cands = args[:1]
			}
			for _, c := range cands {
				p, err := needStr(c, name)
				if err != nil {
					return undefined, err
				}
				if (name == "startswith" && strings.HasPrefix(s, p)) || (name == "endswith" && strings.HasSuffix(s, p)) {
					return vTrue, nil
				}
			}
			return vFalse, nil
		}), true
	case "replace":
		return method(name, func(_ *renderer, args []value, kw []kwarg) (value, error) {
			if len(args) < 2 {
				return undefined, rtErr("replace takes at least 2 arguments")
			}
			old, err := needStr(args[0], "replace")
			if err != nil {
				return undefined, err
			}
			nw, err := needStr(args[1], "replace")
			if err != nil {
				return undefined, err
			}
			n := int64(-1)
			if c := argOf(args, kw, 2, "count", intValue(-1)); c.k == kInt {
				n = c.n
			}
			return strValue(pyReplace(s, old, nw, int(max(min(n, 1<<30), -1)))), nil
		}), true
	case "upper":
		return method(name, func(_ *renderer, _ []value, _ []kwarg) (value, error) { return casedValue(pyUpper(s)) }), true
	case "lower":
		return method(name, func(_ *renderer, _ []value, _ []kwarg) (value, error) { return casedValue(pyLower(s)) }), true
	case "title":
		return method(name, func(_ *renderer, _ []value, _ []kwarg) (value, error) { return casedValue(pyTitle(s)) }), true
	case "capitalize":
		return method(name, func(_ *renderer, _ []value, _ []kwarg) (value, error) { return casedValue(pyCapitalize(s)) }), true
	case "find", "rfind", "index", "rindex", "count":
		return method(name, func(_ *renderer, args []value, kw []kwarg) (value, error) {
			if len(args) == 0 {
				return undefined, rtErr("%s takes at least 1 argument", name)
			}
			sub, err := needStr(args[0], name)
			if err != nil {
				return undefined, err
			}
			var i int
			switch name {
			case "count":
				if sub == "" {
					return intValue(int64(utf8.RuneCountInString(s) + 1)), nil
				}
				return intValue(int64(strings.Count(s, sub))), nil
			case "find", "index":
				i = strings.Index(s, sub)
			default:
				i = strings.LastIndex(s, sub)
			}
			if i < 0 && (name == "index" || name == "rindex") {
				return undefined, rtErr("substring not found")
			}
			return intValue(runeIndex(s, i)), nil
		}), true
	case "join":
		return method(name, func(r *renderer, args []value, _ []kwarg) (value, error) {
			if len(args) != 1 {
				return undefined, rtErr("join takes exactly one argument")
			}
			items, err := iterate(args[0])
			if err != nil {
				return undefined, err
			}
			parts := make([]string, len(items))
			for i, it := range items {
				if it.k != kStr {
					return undefined, rtErr("sequence item %d: expected str instance, %s found", i, typeName(it))
				}
				parts[i] = it.s
			}
			return strValue(strings.Join(parts, s)), nil
		}), true
	case "format":
		return method(name, func(r *renderer, args []value, kw []kwarg) (value, error) {
			return r.pyFormat(s, args, kw)
		}), true
	case "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper", "isnumeric", "isdecimal":
		return method(name, func(_ *renderer, _ []value, _ []kwarg) (value, error) {
			ok, err := strPredicate(s, name)
			return boolValue(ok), err
		}), true
	}
	return undefined, false
}

func dictMethod(obj value, name string) (value, bool) {
	d := obj.dict
	switch name {
	case "get":
		return method(name, func(_ *renderer, args []value, _ []kwarg) (value, error) {
			if len(args) == 0 {
				return undefined, rtErr("get expected at least 1 argument")
			}
			if i := d.find(args[0]); i >= 0 {
				return d.vals[i], nil
			}
			if len(args) > 1 {
				return args[1], nil
			}
			return none, nil
		}), true
	case "items":
		return method(name, func(r *renderer, _ []value, _ []kwarg) (value, error) {
			v, err := fItems(r, obj, nil, nil)
			v.s = "dict_items"
			return v, err
		}), true
	case "keys":
		return method(name, func(_ *renderer, _ []value, _ []kwarg) (value, error) {
			v := listValue(append([]value(nil), d.keys...))
			v.s = "dict_keys"
			return v, nil
		}), true
	case "values":
		return method(name, func(_ *renderer, _ []value, _ []kwarg) (value, error) {
			v := listValue(append([]value(nil), d.vals...))
			v.s = "dict_values"
			return v, nil
		}), true
	case "copy":
		return method(name, func(_ *renderer, _ []value, _ []kwarg) (value, error) {
			return dictValue(d.clone()), nil
		}), true
	}
	return undefined, false
}

func listMethod(obj value, name string) (value, bool) {
	items := obj.items()
	switch name {
	case "count":
		return method(name, func(_ *renderer, args []value, _ []kwarg) (value, error) {
			if len(args) != 1 {
				return undefined, rtErr("count takes exactly one argument")
			}
			n := 0
			for _, it := range items {
				if equal(it, args[0]) {
					n++
				}
			}
			return intValue(int64(n)), nil
		}), true
	case "index":
		return method(name, func(_ *renderer, args []value, _ []kwarg) (value, error) {
			if len(args) < 1 {
				return undefined, rtErr("index takes at least one argument")
			}
			for i, it := range items {
				if equal(it, args[0]) {
					return intValue(int64(i)), nil
				}
			}
			return undefined, rtErr("value is not in list")
		}), true
	}
	return undefined, false
}

// isUnsafeMethod lists the methods ImmutableSandboxedEnvironment refuses
// because they would modify a value.
func isUnsafeMethod(obj value, name string) bool {
	if strings.HasPrefix(name, "_") {
		return true
	}
	switch obj.k {
	case kList:
		switch name {
		case "append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort":
			return true
		}
	case kDict:
		switch name {
		case "clear", "pop", "popitem", "setdefault", "update":
			return true
		}
	}
	return false
}

func unicodeNonPrintable(r rune) bool {
	if unicode.In(r, unicode.Cc, unicode.Cf, unicode.Co, unicode.Cs, unicode.Zl, unicode.Zp, unicode.Zs) {
		return true
	}
	return !unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S, unicode.Z, unicode.C)
}
