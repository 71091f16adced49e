package chat

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strings"
	"time"
	"unicode/utf8"
	"unsafe"
)

// Limits bound one rendering, so that no template and no request can make
// it run or grow without end.
type Limits struct {
	// MaxOutputBytes bounds the rendered prompt and every string built
	// while rendering it.
	MaxOutputBytes int
	// MaxSteps bounds the loop iterations and macro calls of one
	// rendering, nested ones included.
	MaxSteps int
	// MaxCallDepth bounds macro recursion.
	MaxCallDepth int
	// MaxBuiltBytes bounds the bytes of every string and list one
	// rendering builds by concatenation, together: a template that grows
	// a string in a loop copies it whole each time (DeepSeek-V3's joins
	// every system message so), and 18,000 short system messages cost
	// seconds of CPU to render when only each string was bounded. 0: no
	// bound.
	MaxBuiltBytes int
}

// DefaultLimits leave room for any real conversation: a prompt far beyond
// any model's context and loops over tens of thousands of messages.
var DefaultLimits = Limits{
	MaxOutputBytes: 64 << 20,
	MaxSteps:       1 << 20,
	MaxCallDepth:   64,
	MaxBuiltBytes:  256 << 20,
}

// maxRange is the Jinja2 sandbox's bound on range().
const maxRange = 100000

type loopControl uint8

const (
	flowNormal loopControl = iota
	flowBreak
	flowContinue
)

type binding struct {
	name string
	v    value
}

type loopState struct {
	items []value
	index int
}

// renderer is the state of one rendering.
type renderer struct {
	out     []byte // the caller's buffer; the rendering starts at base
	base    int
	vars    []binding // innermost last
	frames  []int     // start of each scope in vars
	globals *globals
	limits  Limits
	steps   int
	depth   int
	built   int // bytes built by concatenation so far (MaxBuiltBytes)
	now     func() time.Time
	scratch []byte
	parts   []value
}

// errRuntime marks an error the template raised while rendering.
type renderError struct{ msg string }

func (e *renderError) Error() string { return e.msg }

func rtErr(format string, args ...any) error {
	return &renderError{msg: fmt.Sprintf(format, args...)}
}

var errLimit = errors.New("rendering exceeds its limits")

// errCostly marks a rendering stopped for the work it would take
// (MaxBuiltBytes), not for anything wrong with the request.
var errCostly = errors.New("rendering would cost more than routing is worth")

// build accounts n more bytes built by concatenation.
func (r *renderer) build(n int) error {
	r.built += n
	if r.limits.MaxBuiltBytes > 0 && r.built > r.limits.MaxBuiltBytes {
		return fmt.Errorf("%w: more than %d bytes built", errCostly, r.limits.MaxBuiltBytes)
	}
	return nil
}

func (r *renderer) step() error {
	r.steps++
	if r.steps > r.limits.MaxSteps {
		return fmt.Errorf("%w: more than %d loop iterations", errLimit, r.limits.MaxSteps)
	}
	return nil
}

func (r *renderer) checkSize(n int) error {
	if n > r.limits.MaxOutputBytes {
		return fmt.Errorf("%w: more than %d bytes", errLimit, r.limits.MaxOutputBytes)
	}
	return nil
}

func (r *renderer) push() { r.frames = append(r.frames, len(r.vars)) }
func (r *renderer) pop() {
	r.vars = r.vars[:r.frames[len(r.frames)-1]]
	r.frames = r.frames[:len(r.frames)-1]
}
func (r *renderer) top() int { return r.frames[len(r.frames)-1] }

func (r *renderer) set(name string, v value) {
	for i := len(r.vars) - 1; i >= r.top(); i-- {
		if r.vars[i].name == name {
			r.vars[i].v = v
			return
		}
	}
	r.vars = append(r.vars, binding{name, v})
}

func (r *renderer) lookup(name string) value {
	for i := len(r.vars) - 1; i >= 0; i-- {
		if r.vars[i].name == name {
			return r.vars[i].v
		}
	}
	if v, ok := r.globals.lookup(name); ok {
		return v
	}
	return undefinedNamed(name)
}

func (r *renderer) write(s string) error {
	r.out = append(r.out, s...)
	return r.checkOutput()
}

func (r *renderer) checkOutput() error { return r.checkSize(len(r.out) - r.base) }

func (r *renderer) execBody(nodes []node) (loopControl, error) {
	for _, n := range nodes {
		fl, err := r.exec(n)
		if err != nil || fl != flowNormal {
			return fl, err
		}
	}
	return flowNormal, nil
}

func (r *renderer) exec(n node) (loopControl, error) {
	switch n := n.(type) {
	case *textNode:
		return flowNormal, r.write(n.s)
	case *outputNode:
		return flowNormal, r.output(n.e)
	case *ifNode:
		for i, c := range n.conds {
			v, err := r.eval(c)
			if err != nil {
				return flowNormal, err
			}
			if truth(v) {
				return r.execBody(n.bodies[i])
			}
		}
		return r.execBody(n.els)
	case *forNode:
		return flowNormal, r.execFor(n)
	case *setNode:
		return flowNormal, r.execSet(n)
	case *setBlockNode:
		s, err := r.capture(n.body)
		if err != nil {
			return flowNormal, err
		}
		v := strValue(s)
		for _, f := range n.filters {
			if v, err = r.applyFilter(f, v); err != nil {
				return flowNormal, err
			}
		}
		r.set(n.name, v)
		return flowNormal, nil
	case *macroNode:
		r.set(n.name, value{k: kFunc, fn: &function{name: n.name, macro: n}})
		return flowNormal, nil
	case *callBlockNode:
		caller := &macroNode{name: "caller", body: n.body}
		v, err := r.callFunc(n.call, &kwarg{name: "caller", v: value{k: kFunc, fn: &function{name: "caller", macro: caller}}})
		if err != nil {
			return flowNormal, err
		}
		r.out = appendStr(r.out, v)
		return flowNormal, r.checkOutput()
	case *filterBlockNode:
		if n.filters == nil {
			return r.execBody(n.body)
		}
		s, err := r.capture(n.body)
		if err != nil {
			return flowNormal, err
		}
		v := strValue(s)
		for _, f := range n.filters {
			if v, err = r.applyFilter(f, v); err != nil {
				return flowNormal, err
			}
		}
		r.out = appendStr(r.out, v)
		return flowNormal, r.checkOutput()
	case *breakNode:
		return flowBreak, nil
	case *continueNode:
		return flowContinue, nil
	}
	return flowNormal, rtErr("unknown node %T", n)
}

// capture renders nodes into a string instead of the output.
func (r *renderer) capture(nodes []node) (string, error) {
	mark := len(r.out)
	r.push()
	_, err := r.execBody(nodes)
	r.pop()
	if err != nil {
		return "", err
	}
	s := string(r.out[mark:])
	r.out = r.out[:mark]
	return s, nil
}

// output writes the value of e. A chain of + or ~ over strings is written
// piece by piece, which spares building the concatenation that the usual
// '<|im_start|>' + role + '\n' + content + '<|im_end|>' would allocate.
func (r *renderer) output(e expr) error {
	if b, ok := e.(*binExpr); ok && (b.op == "+" || b.op == "~") {
		// The operands go on r.parts, which a nested rendering (a macro
		// call among them) extends and trims back past our own.
		start := len(r.parts)
		parts, ok, err := r.flattenConcat(b, r.parts)
		r.parts = parts[:start]
		if err != nil {
			return err
		}
		if ok {
			for _, p := range parts[start:] {
				r.out = appendStr(r.out, p)
			}
			return r.checkOutput()
		}
	}
	v, err := r.eval(e)
	if err != nil {
		return err
	}
	r.out = appendStr(r.out, v)
	return r.checkOutput()
}

// flattenConcat evaluates a left-leaning chain of one operator. It reports
// false when the chain is not all strings (for +) so that the caller
// evaluates it the ordinary way, with Python's errors.
func (r *renderer) flattenConcat(b *binExpr, parts []value) ([]value, bool, error) {
	if l, ok := b.l.(*binExpr); ok && l.op == b.op {
		var ok bool
		var err error
		if parts, ok, err = r.flattenConcat(l, parts); err != nil || !ok {
			return parts, ok, err
		}
	} else {
		v, err := r.eval(b.l)
		if err != nil {
			return parts, false, err
		}
		if b.op == "+" && v.k != kStr {
			return parts, false, nil
		}
		parts = append(parts, v)
	}
	v, err := r.eval(b.r)
	if err != nil {
		return parts, false, err
	}
	if b.op == "+" && v.k != kStr {
		return parts, false, nil
	}
	return append(parts, v), true, nil
}

func iterate(v value) ([]value, error) {
	switch v.k {
	case kList, kTuple:
		return v.items(), nil
	case kDict, kNamespace:
		return v.dict.keys, nil
	case kStr:
		out := make([]value, 0, len(v.s))
		for _, c := range v.s {
			out = append(out, strValue(string(c)))
		}
		return out, nil
	case kRange:
		n := rangeLen(v)
		out := make([]value, n)
		for i := range out {
			out[i] = intValue(v.rng[0] + int64(i)*v.rng[2])
		}
		return out, nil
	case kUndefined:
		return nil, nil
	}
	return nil, rtErr("'%s' object is not iterable", typeName(v))
}

func (r *renderer) execFor(n *forNode) error {
	seq, err := r.eval(n.iter)
	if err != nil {
		return err
	}
	items, err := iterate(seq)
	if err != nil {
		return err
	}
	if n.cond != nil {
		// The loop's condition filters before loop.index and friends are
		// counted, as Jinja2 does.
		kept := make([]value, 0, len(items))
		r.push()
		for _, it := range items {
			if err := r.bindTargets(n.targets, it); err != nil {
				r.pop()
				return err
			}
			c, err := r.eval(n.cond)
			if err != nil {
				r.pop()
				return err
			}
			if truth(c) {
				kept = append(kept, it)
			}
		}
		r.pop()
		items = kept
	}
	if len(items) == 0 {
		if n.els != nil {
			r.push()
			_, err := r.execBody(n.els)
			r.pop()
			return err
		}
		return nil
	}
	ls := &loopState{items: items}
	loopV := value{k: kLoop, loop: ls}
	for i, it := range items {
		if err := r.step(); err != nil {
			return err
		}
		ls.index = i
		r.push()
		r.vars = append(r.vars, binding{"loop", loopV})
		if err := r.bindTargets(n.targets, it); err != nil {
			r.pop()
			return err
		}
		fl, err := r.execBody(n.body)
		r.pop()
		if err != nil {
			return err
		}
		if fl == flowBreak {
			break
		}
	}
	return nil
}

func (r *renderer) bindTargets(targets []string, v value) error {
	if len(targets) == 1 {
		r.set(targets[0], v)
		return nil
	}
	items, err := iterate(v)
	if err != nil {
		return err
	}
	if len(items) != len(targets) {
		return rtErr("cannot unpack %d values into %d names", len(items), len(targets))
	}
	for i, t := range targets {
		r.set(t, items[i])
	}
	return nil
}

func (r *renderer) execSet(n *setNode) error {
	v, err := r.eval(n.e)
	if err != nil {
		return err
	}
	if n.ns != "" {
		ns := r.lookup(n.ns)
		if ns.k != kNamespace {
			return rtErr("cannot assign attribute on non-namespace object")
		}
		ns.dict.setStr(n.attr, v)
		return nil
	}
	return r.bindTargets(n.targets, v)
}

func (r *renderer) eval(e expr) (value, error) {
	switch e := e.(type) {
	case *constExpr:
		return e.v, nil
	case *nameExpr:
		return r.lookup(e.name), nil
	case *attrExpr:
		obj, err := r.eval(e.obj)
		if err != nil {
			return undefined, err
		}
		return r.getAttr(obj, e.name)
	case *itemExpr:
		obj, err := r.eval(e.obj)
		if err != nil {
			return undefined, err
		}
		key, err := r.eval(e.key)
		if err != nil {
			return undefined, err
		}
		return r.getItem(obj, key)
	case *sliceExpr:
		return r.evalSlice(e)
	case *callExpr:
		return r.callFunc(e, nil)
	case *filterExpr:
		arg, err := r.eval(e.arg)
		if err != nil {
			return undefined, err
		}
		return r.applyFilter(e, arg)
	case *testExpr:
		arg, err := r.eval(e.arg)
		if err != nil {
			return undefined, err
		}
		ok, err := r.applyTest(e, arg)
		if err != nil {
			return undefined, err
		}
		return boolValue(ok != e.negate), nil
	case *unaryExpr:
		v, err := r.eval(e.e)
		if err != nil {
			return undefined, err
		}
		switch e.op {
		case "not":
			return boolValue(!truth(v)), nil
		case "-":
			switch v.k {
			case kInt, kBool:
				if v.n == math.MinInt64 {
					return bigArith("-", intValue(0), v)
				}
				return intValue(-v.n), nil
			case kFloat:
				return floatValue(-v.f), nil
			case kBigInt:
				return bigArith("-", intValue(0), v)
			}
			return undefined, rtErr("bad operand type for unary -: '%s'", typeName(v))
		default:
			switch v.k {
			case kInt, kBool:
				return intValue(v.n), nil
			case kFloat, kBigInt:
				return v, nil
			}
			return undefined, rtErr("bad operand type for unary +: '%s'", typeName(v))
		}
	case *binExpr:
		if e.op == "and" || e.op == "or" {
			l, err := r.eval(e.l)
			if err != nil {
				return undefined, err
			}
			if truth(l) == (e.op == "or") {
				return l, nil
			}
			return r.eval(e.r)
		}
		l, err := r.eval(e.l)
		if err != nil {
			return undefined, err
		}
		rv, err := r.eval(e.r)
		if err != nil {
			return undefined, err
		}
		return r.binary(e.op, l, rv)
	case *compareExpr:
		l, err := r.eval(e.first)
		if err != nil {
			return undefined, err
		}
		for i, op := range e.ops {
			rv, err := r.eval(e.rest[i])
			if err != nil {
				return undefined, err
			}
			ok, err := compare(op, l, rv)
			if err != nil {
				return undefined, err
			}
			if !ok {
				return vFalse, nil
			}
			l = rv
		}
		return vTrue, nil
	case *condExpr:
		c, err := r.eval(e.cond)
		if err != nil {
			return undefined, err
		}
		if truth(c) {
			return r.eval(e.yes)
		}
		if e.no == nil {
			return undefined, nil
		}
		return r.eval(e.no)
	case *listExpr:
		items := make([]value, len(e.items))
		for i, it := range e.items {
			v, err := r.eval(it)
			if err != nil {
				return undefined, err
			}
			items[i] = v
		}
		if e.tuple {
			return tupleValue(items), nil
		}
		return listValue(items), nil
	case *dictExpr:
		d := newDict(len(e.keys))
		for i := range e.keys {
			k, err := r.eval(e.keys[i])
			if err != nil {
				return undefined, err
			}
			v, err := r.eval(e.vals[i])
			if err != nil {
				return undefined, err
			}
			d.set(k, v)
		}
		return dictValue(d), nil
	}
	return undefined, rtErr("unknown expression %T", e)
}

// undefinedErr is what using an undefined value for more than printing or
// testing raises, worded as Jinja2 words it.
func undefinedErr(v value) error {
	if v.s != "" {
		return rtErr("'%s' is undefined", v.s)
	}
	return rtErr("undefined value")
}

func (r *renderer) getAttr(obj value, name string) (value, error) {
	switch obj.k {
	case kUndefined:
		return undefined, undefinedErr(obj)
	case kDict:
		// Jinja2 tries the Python attribute before the item, so a dict's
		// methods shadow keys of the same name.
		if m, ok := dictMethod(obj, name); ok {
			return m, nil
		}
		if err := errUnimplementedMethod(obj, name); err != nil {
			return undefined, err
		}
		if v, ok := obj.dict.getStr(name); ok {
			return v, nil
		}
		if isUnsafeMethod(obj, name) {
			return undefined, rtErr("access to attribute '%s' of 'dict' object is unsafe.", name)
		}
		return undefinedNamed(""), nil
	case kNamespace:
		if v, ok := obj.dict.getStr(name); ok {
			return v, nil
		}
		return undefined, nil
	case kStr:
		if m, ok := strMethod(obj, name); ok {
			return m, nil
		}
		if err := errUnimplementedMethod(obj, name); err != nil {
			return undefined, err
		}
	case kList, kTuple:
		if m, ok := listMethod(obj, name); ok {
			return m, nil
		}
		if err := errUnimplementedMethod(obj, name); err != nil {
			return undefined, err
		}
	case kLoop:
		return loopAttr(obj.loop, name)
	}
	if isUnsafeMethod(obj, name) {
		return undefined, rtErr("access to attribute '%s' of '%s' object is unsafe.", name, typeName(obj))
	}
	return undefined, nil
}

func (r *renderer) getItem(obj, key value) (value, error) {
	switch obj.k {
	case kUndefined:
		return undefined, undefinedErr(obj)
	case kDict, kNamespace:
		if i := obj.dict.find(key); i >= 0 {
			return obj.dict.vals[i], nil
		}
		if key.k == kStr && obj.k == kDict {
			if m, ok := dictMethod(obj, key.s); ok {
				return m, nil
			}
		}
		return undefined, nil
	case kList, kTuple, kStr, kRange:
		if key.k == kStr {
			return r.getAttr(obj, key.s)
		}
		if key.k != kInt && key.k != kBool {
			return undefined, nil
		}
		i := key.n
		switch obj.k {
		case kStr:
			return strIndex(obj.s, i), nil
		case kRange:
			n := rangeLen(obj)
			if i < 0 {
				i += n
			}
			if i < 0 || i >= n {
				return undefined, nil
			}
			return intValue(obj.rng[0] + i*obj.rng[2]), nil
		}
		items := obj.items()
		if i < 0 {
			i += int64(len(items))
		}
		if i < 0 || i >= int64(len(items)) {
			return undefined, nil
		}
		return items[i], nil
	case kLoop:
		if key.k == kStr {
			return loopAttr(obj.loop, key.s)
		}
	}
	return undefined, nil
}

func strIndex(s string, i int64) value {
	n := int64(utf8.RuneCountInString(s))
	if i < 0 {
		i += n
	}
	if i < 0 || i >= n {
		return undefined
	}
	for _, c := range s {
		if i == 0 {
			return strValue(string(c))
		}
		i--
	}
	return undefined
}

func loopAttr(ls *loopState, name string) (value, error) {
	n := int64(len(ls.items))
	i := int64(ls.index)
	switch name {
	case "index":
		return intValue(i + 1), nil
	case "index0":
		return intValue(i), nil
	case "revindex":
		return intValue(n - i), nil
	case "revindex0":
		return intValue(n - i - 1), nil
	case "first":
		return boolValue(i == 0), nil
	case "last":
		return boolValue(i == n-1), nil
	case "length":
		return intValue(n), nil
	case "depth":
		return intValue(1), nil
	case "depth0":
		return intValue(0), nil
	case "previtem":
		if i == 0 {
			return undefined, nil
		}
		return ls.items[i-1], nil
	case "nextitem":
		if i == n-1 {
			return undefined, nil
		}
		return ls.items[i+1], nil
	case "cycle":
		return value{k: kFunc, fn: &function{name: "cycle", call: func(_ *renderer, args []value, _ []kwarg) (value, error) {
			if len(args) == 0 {
				return undefined, rtErr("no items for cycling given")
			}
			return args[int(i)%len(args)], nil
		}}}, nil
	}
	return undefined, nil
}

func sliceIndices(n int64, lo, hi, step value) (int64, int64, int64, error) {
	st := int64(1)
	if step.k != kUndefined && step.k != kNone {
		if step.k != kInt {
			return 0, 0, 0, rtErr("slice indices must be integers")
		}
		st = step.n
		if st == 0 {
			return 0, 0, 0, rtErr("slice step cannot be zero")
		}
	}
	norm := func(v value, def int64) (int64, error) {
		if v.k == kUndefined || v.k == kNone {
			return def, nil
		}
		if v.k != kInt && v.k != kBool {
			return 0, rtErr("slice indices must be integers or None")
		}
		x := v.n
		if x < 0 {
			x += n
			if x < 0 {
				if st < 0 {
					x = -1
				} else {
					x = 0
				}
			}
		} else if x >= n {
			if st < 0 {
				x = n - 1
			} else {
				x = n
			}
		}
		return x, nil
	}
	var start, stop int64
	var err error
	if st > 0 {
		if start, err = norm(lo, 0); err != nil {
			return 0, 0, 0, err
		}
		if stop, err = norm(hi, n); err != nil {
			return 0, 0, 0, err
		}
	} else {
		if start, err = norm(lo, n-1); err != nil {
			return 0, 0, 0, err
		}
		if stop, err = norm(hi, -1); err != nil {
			return 0, 0, 0, err
		}
	}
	return start, stop, st, nil
}

func (r *renderer) evalSlice(e *sliceExpr) (value, error) {
	obj, err := r.eval(e.obj)
	if err != nil {
		return undefined, err
	}
	var parts [3]value
	for i, x := range [3]expr{e.lo, e.hi, e.step} {
		if x == nil {
			parts[i] = none
			continue
		}
		if parts[i], err = r.eval(x); err != nil {
			return undefined, err
		}
	}
	var items []value
	isStr := false
	switch obj.k {
	case kList, kTuple:
		items = obj.items()
	case kStr:
		isStr = true
		if isASCII(obj.s) {
			start, stop, st, err := sliceIndices(int64(len(obj.s)), parts[0], parts[1], parts[2])
			if err != nil {
				return undefined, err
			}
			if st == 1 {
				if start >= stop {
					return strValue(""), nil
				}
				return strValue(obj.s[start:stop]), nil
			}
			var b []byte
			for i := start; (st > 0 && i < stop) || (st < 0 && i > stop); i += st {
				b = append(b, obj.s[i])
			}
			return strValue(string(b)), nil
		}
		for _, c := range obj.s {
			items = append(items, strValue(string(c)))
		}
	case kRange:
		items, _ = iterate(obj)
	case kUndefined:
		return undefined, undefinedErr(obj)
	default:
		return undefined, rtErr("'%s' object is not subscriptable", typeName(obj))
	}
	start, stop, st, err := sliceIndices(int64(len(items)), parts[0], parts[1], parts[2])
	if err != nil {
		return undefined, err
	}
	var out []value
	for i := start; (st > 0 && i < stop) || (st < 0 && i > stop); i += st {
		out = append(out, items[i])
	}
	if isStr {
		var b strings.Builder
		for _, v := range out {
			b.WriteString(v.s)
		}
		return strValue(b.String()), nil
	}
	if obj.k == kTuple {
		return tupleValue(out), nil
	}
	return listValue(out), nil
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

func (r *renderer) evalArgs(args []expr, kws []kwExpr) ([]value, []kwarg, error) {
	var vals []value
	if len(args) > 0 {
		vals = make([]value, len(args))
		for i, a := range args {
			v, err := r.eval(a)
			if err != nil {
				return nil, nil, err
			}
			vals[i] = v
		}
	}
	var kv []kwarg
	if len(kws) > 0 {
		kv = make([]kwarg, len(kws))
		for i, k := range kws {
			v, err := r.eval(k.e)
			if err != nil {
				return nil, nil, err
			}
			kv[i] = kwarg{name: k.name, v: v}
		}
	}
	return vals, kv, nil
}

func (r *renderer) callFunc(e *callExpr, extra *kwarg) (value, error) {
	if e.unimplemented != "" {
		return undefined, fmt.Errorf("%w: the template calls %s, which chat does not implement", ErrUnsupported, e.unimplemented)
	}
	fnv, err := r.eval(e.fn)
	if err != nil {
		return undefined, err
	}
	args, kws, err := r.evalArgs(e.args, e.kw)
	if err != nil {
		return undefined, err
	}
	if extra != nil {
		kws = append(kws, *extra)
	}
	return r.call(fnv, args, kws)
}

func (r *renderer) call(fnv value, args []value, kws []kwarg) (value, error) {
	if fnv.k != kFunc {
		if fnv.k == kUndefined {
			return undefined, undefinedErr(fnv)
		}
		return undefined, rtErr("'%s' object is not callable", typeName(fnv))
	}
	fn := fnv.fn
	if fn.macro == nil {
		return fn.call(r, args, kws)
	}
	if err := r.step(); err != nil {
		return undefined, err
	}
	r.depth++
	defer func() { r.depth-- }()
	if r.depth > r.limits.MaxCallDepth {
		return undefined, fmt.Errorf("%w: macros nest deeper than %d", errLimit, r.limits.MaxCallDepth)
	}
	m := fn.macro
	r.push()
	defer r.pop()
	nDefaults := len(m.defaults)
	firstDefault := len(m.params) - nDefaults
	var varargs []value
	for i, p := range m.params {
		switch {
		case i < len(args):
			r.vars = append(r.vars, binding{p, args[i]})
		default:
			found := false
			for _, k := range kws {
				if k.name == p {
					r.vars = append(r.vars, binding{p, k.v})
					found = true
					break
				}
			}
			if found {
				continue
			}
			if i >= firstDefault {
				d, err := r.eval(m.defaults[i-firstDefault])
				if err != nil {
					return undefined, err
				}
				r.vars = append(r.vars, binding{p, d})
			} else {
				r.vars = append(r.vars, binding{p, undefinedNamed(p)})
			}
		}
	}
	if len(args) > len(m.params) {
		varargs = args[len(m.params):]
	}
	extra := newDict(0)
	var caller value
	for _, k := range kws {
		isParam := false
		for _, p := range m.params {
			if p == k.name {
				isParam = true
			}
		}
		if k.name == "caller" {
			caller = k.v
			continue
		}
		if !isParam {
			extra.setStr(k.name, k.v)
		}
	}
	r.vars = append(r.vars, binding{"varargs", tupleValue(varargs)}, binding{"kwargs", dictValue(extra)})
	if caller.k == kFunc {
		r.vars = append(r.vars, binding{"caller", caller})
	}
	s, err := r.capture(m.body)
	if err != nil {
		return undefined, err
	}
	return strValue(s), nil
}

func (r *renderer) binary(op string, a, b value) (value, error) {
	switch op {
	case "~":
		buf := appendStr(r.scratch[:0], a)
		buf = appendStr(buf, b)
		if err := r.checkSize(len(buf)); err != nil {
			return undefined, err
		}
		if err := r.build(len(buf)); err != nil {
			return undefined, err
		}
		r.scratch = buf[:0]
		return strValue(string(buf)), nil
	case "+":
		switch {
		case a.k == kStr && b.k == kStr:
			if err := r.checkSize(len(a.s) + len(b.s)); err != nil {
				return undefined, err
			}
			if err := r.build(len(a.s) + len(b.s)); err != nil {
				return undefined, err
			}
			return strValue(a.s + b.s), nil
		case (a.k == kList && b.k == kList) || (a.k == kTuple && b.k == kTuple):
			if err := r.build((len(a.items()) + len(b.items())) * int(unsafe.Sizeof(value{}))); err != nil {
				return undefined, err
			}
			out := make([]value, 0, len(a.items())+len(b.items()))
			out = append(append(out, a.items()...), b.items()...)
			if a.k == kTuple {
				return tupleValue(out), nil
			}
			return listValue(out), nil
		}
	case "*":
		if a.k == kStr || a.k == kList || a.k == kTuple {
			return r.repeat(a, b)
		}
		if b.k == kStr || b.k == kList || b.k == kTuple {
			return r.repeat(b, a)
		}
	case "%":
		if a.k == kStr {
			return r.percentFormat(a.s, b)
		}
	}
	if isNumber(a) && isNumber(b) {
		return arith(op, a, b)
	}
	if a.k == kUndefined {
		return undefined, undefinedErr(a)
	}
	if b.k == kUndefined {
		return undefined, undefinedErr(b)
	}
	if op == "+" && a.k == kStr {
		return undefined, rtErr(`can only concatenate str (not "%s") to str`, typeName(b))
	}
	return undefined, rtErr("unsupported operand type(s) for %s: '%s' and '%s'", op, typeName(a), typeName(b))
}

func (r *renderer) repeat(seq, times value) (value, error) {
	if times.k != kInt && times.k != kBool {
		return undefined, rtErr("can't multiply sequence by non-int of type '%s'", typeName(times))
	}
	n := times.n
	if n < 0 {
		n = 0
	}
	var unit int
	if seq.k == kStr {
		unit = len(seq.s)
	} else {
		unit = len(seq.items())
	}
	if unit > 0 && n > int64(r.limits.MaxOutputBytes/unit) {
		return undefined, fmt.Errorf("%w: a repeated sequence grows past %d", errLimit, r.limits.MaxOutputBytes)
	}
	if seq.k == kStr {
		return strValue(strings.Repeat(seq.s, int(n))), nil
	}
	out := make([]value, 0, unit*int(n))
	for i := int64(0); i < n; i++ {
		out = append(out, seq.items()...)
	}
	if seq.k == kTuple {
		return tupleValue(out), nil
	}
	return listValue(out), nil
}

func isNumber(v value) bool {
	return v.k == kInt || v.k == kFloat || v.k == kBool || v.k == kBigInt
}

func toFloat(v value) float64 {
	switch v.k {
	case kFloat:
		return v.f
	case kBigInt:
		f, _ := new(big.Float).SetString(v.s)
		x, _ := f.Float64()
		return x
	}
	return float64(v.n)
}

func toBig(v value) *big.Int {
	if v.k == kBigInt {
		b, _ := new(big.Int).SetString(v.s, 10)
		return b
	}
	return big.NewInt(v.n)
}

func fromBig(b *big.Int) value {
	if b.IsInt64() {
		return intValue(b.Int64())
	}
	return value{k: kBigInt, s: b.String()}
}

func bigArith(op string, a, b value) (value, error) {
	x, y := toBig(a), toBig(b)
	z := new(big.Int)
	switch op {
	case "+":
		z.Add(x, y)
	case "-":
		z.Sub(x, y)
	case "*":
		if x.BitLen()+y.BitLen() > 4096 {
			return undefined, fmt.Errorf("%w: integer too large", errLimit)
		}
		z.Mul(x, y)
	case "//", "%":
		if y.Sign() == 0 {
			return undefined, rtErr("integer division or modulo by zero")
		}
		q, m := new(big.Int).DivMod(x, y, new(big.Int))
		// Go's DivMod is Euclidean; Python floors.
		if m.Sign() != 0 && y.Sign() < 0 {
			q.Add(q, big.NewInt(1))
			m.Add(m, y)
		}
		if op == "//" {
			return fromBig(q), nil
		}
		return fromBig(m), nil
	case "**":
		if y.Sign() < 0 {
			return floatValue(math.Pow(toFloat(a), toFloat(b))), nil
		}
		if !y.IsInt64() || int64(x.BitLen())*y.Int64() > 4096 {
			return undefined, fmt.Errorf("%w: integer too large", errLimit)
		}
		z.Exp(x, y, nil)
	default:
		return undefined, rtErr("unsupported operand %s", op)
	}
	return fromBig(z), nil
}

func arith(op string, a, b value) (value, error) {
	if a.k != kFloat && b.k != kFloat {
		if a.k == kBigInt || b.k == kBigInt {
			if op == "/" {
				if toBig(b).Sign() == 0 {
					return undefined, rtErr("division by zero")
				}
				return floatValue(toFloat(a) / toFloat(b)), nil
			}
			return bigArith(op, a, b)
		}
		x, y := a.n, b.n
		switch op {
		case "+":
			if s := x + y; (s > x) == (y > 0) {
				return intValue(s), nil
			}
			return bigArith(op, a, b)
		case "-":
			if s := x - y; (s < x) == (y > 0) {
				return intValue(s), nil
			}
			return bigArith(op, a, b)
		case "*":
			if x == 0 || y == 0 {
				return intValue(0), nil
			}
			if p := x * y; p/y == x && !(x == -1 && y == math.MinInt64) && !(y == -1 && x == math.MinInt64) {
				return intValue(p), nil
			}
			return bigArith(op, a, b)
		case "/":
			if y == 0 {
				return undefined, rtErr("division by zero")
			}
			return floatValue(float64(x) / float64(y)), nil
		case "//", "%":
			if y == 0 {
				return undefined, rtErr("integer division or modulo by zero")
			}
			if x == math.MinInt64 && y == -1 {
				return bigArith(op, a, b)
			}
			q, m := x/y, x%y
			if m != 0 && (m < 0) != (y < 0) {
				q--
				m += y
			}
			if op == "//" {
				return intValue(q), nil
			}
			return intValue(m), nil
		case "**":
			return bigArith(op, a, b)
		}
	}
	x, y := toFloat(a), toFloat(b)
	switch op {
	case "+":
		return floatValue(x + y), nil
	case "-":
		return floatValue(x - y), nil
	case "*":
		return floatValue(x * y), nil
	case "/":
		if y == 0 {
			return undefined, rtErr("float division by zero")
		}
		return floatValue(x / y), nil
	case "//", "%":
		if y == 0 {
			return undefined, rtErr("float modulo")
		}
		m := math.Mod(x, y)
		if m != 0 && (m < 0) != (y < 0) {
			m += y
		}
		if op == "%" {
			return floatValue(m), nil
		}
		return floatValue(math.Floor((x - m) / y)), nil
	case "**":
		return floatValue(math.Pow(x, y)), nil
	}
	return undefined, rtErr("unsupported operand %s", op)
}

// equal is Python's ==.
func equal(a, b value) bool {
	if isNumber(a) && isNumber(b) {
		if a.k == kFloat || b.k == kFloat {
			return toFloat(a) == toFloat(b)
		}
		if a.k == kBigInt || b.k == kBigInt {
			return toBig(a).Cmp(toBig(b)) == 0
		}
		return a.n == b.n
	}
	if a.k != b.k {
		return false
	}
	switch a.k {
	case kUndefined, kNone:
		return true
	case kStr:
		return a.s == b.s
	case kList, kTuple:
		x, y := a.items(), b.items()
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equal(x[i], y[i]) {
				return false
			}
		}
		return true
	case kDict, kNamespace:
		if a.dict == b.dict {
			return true
		}
		if a.k == kNamespace || len(a.dict.keys) != len(b.dict.keys) {
			return false
		}
		for i, k := range a.dict.keys {
			j := b.dict.find(k)
			if j < 0 || !equal(a.dict.vals[i], b.dict.vals[j]) {
				return false
			}
		}
		return true
	case kRange:
		return *a.rng == *b.rng
	}
	return a.fn == b.fn && a.loop == b.loop
}

// order compares a and b as Python's < does: -1, 0 or 1.
func order(a, b value) (int, error) {
	if isNumber(a) && isNumber(b) {
		if a.k == kFloat || b.k == kFloat {
			x, y := toFloat(a), toFloat(b)
			switch {
			case x < y:
				return -1, nil
			case x > y:
				return 1, nil
			}
			return 0, nil
		}
		return toBig(a).Cmp(toBig(b)), nil
	}
	if a.k == kStr && b.k == kStr {
		return strings.Compare(a.s, b.s), nil
	}
	if (a.k == kList || a.k == kTuple) && a.k == b.k {
		x, y := a.items(), b.items()
		for i := 0; i < len(x) && i < len(y); i++ {
			if !equal(x[i], y[i]) {
				return order(x[i], y[i])
			}
		}
		switch {
		case len(x) < len(y):
			return -1, nil
		case len(x) > len(y):
			return 1, nil
		}
		return 0, nil
	}
	return 0, rtErr("'<' not supported between instances of '%s' and '%s'", typeName(a), typeName(b))
}

func contains(container, item value) (bool, error) {
	switch container.k {
	case kStr:
		if item.k != kStr {
			return false, rtErr("'in <string>' requires string as left operand, not %s", typeName(item))
		}
		return strings.Contains(container.s, item.s), nil
	case kList, kTuple:
		for _, it := range container.items() {
			if equal(it, item) {
				return true, nil
			}
		}
		return false, nil
	case kDict, kNamespace:
		return container.dict.find(item) >= 0, nil
	case kRange:
		items, _ := iterate(container)
		for _, it := range items {
			if equal(it, item) {
				return true, nil
			}
		}
		return false, nil
	case kUndefined:
		return false, undefinedErr(container)
	}
	return false, rtErr("argument of type '%s' is not iterable", typeName(container))
}

func compare(op string, a, b value) (bool, error) {
	switch op {
	case "==":
		return equal(a, b), nil
	case "!=":
		return !equal(a, b), nil
	case "in":
		return contains(b, a)
	case "notin":
		ok, err := contains(b, a)
		return !ok, err
	}
	c, err := order(a, b)
	if err != nil {
		return false, err
	}
	switch op {
	case "<":
		return c < 0, nil
	case "<=":
		return c <= 0, nil
	case ">":
		return c > 0, nil
	}
	return c >= 0, nil
}
