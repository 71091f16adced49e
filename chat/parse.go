package chat

import (
	"fmt"
	"math/big"
	"slices"
	"strconv"
)

// The parser builds the statement and expression tree with Jinja2's
// grammar and operator precedence: conditional expressions, then or, and,
// not, comparisons (with in, not in), + and -, ~, * / // %, **, unary
// minus and plus, and postfix attribute, item, slice, call, filter and
// test applications.

type node interface{}

type (
	textNode   struct{ s string }
	outputNode struct{ e expr }
	ifNode     struct {
		conds  []expr
		bodies [][]node
		els    []node
	}
	forNode struct {
		targets []string
		iter    expr
		cond    expr
		body    []node
		els     []node
	}
	setNode struct {
		targets []string
		ns      string // set ns.attr = ...: the namespace's name
		attr    string
		e       expr
	}
	setBlockNode struct {
		name    string
		body    []node
		filters []*filterExpr // applied to the captured text, innermost first
	}
	macroNode struct {
		name     string
		params   []string
		defaults []expr // aligned to the end of params
		body     []node
	}
	callBlockNode struct {
		call *callExpr
		body []node
	}
	filterBlockNode struct {
		body    []node
		filters []*filterExpr
	}
	breakNode    struct{}
	continueNode struct{}
)

type expr interface{}

type (
	constExpr struct{ v value }
	nameExpr  struct{ name string }
	attrExpr  struct {
		obj  expr
		name string
	}
	itemExpr  struct{ obj, key expr }
	sliceExpr struct{ obj, lo, hi, step expr }
	callExpr  struct {
		fn   expr
		args []expr
		kw   []kwExpr
		// unimplemented names the call when it is one chat does not
		// implement (markUnimplemented); "" for the rest.
		unimplemented string
	}
	kwExpr struct {
		name string
		e    expr
	}
	filterExpr struct {
		arg  expr // nil inside a filter block or set block
		name string
		args []expr
		kw   []kwExpr
		// unimplemented marks a Jinja2 filter chat does not implement.
		unimplemented bool
	}
	testExpr struct {
		arg           expr
		name          string
		args          []expr
		negate        bool
		unimplemented bool // a Jinja2 test chat does not implement
	}
	unaryExpr struct {
		op string // "-", "+", "not"
		e  expr
	}
	binExpr struct {
		op   string // + - * / // % ** ~ and or
		l, r expr
	}
	compareExpr struct {
		first expr
		ops   []string // == != < <= > >= in notin
		rest  []expr
	}
	condExpr struct{ cond, yes, no expr }
	listExpr struct {
		items []expr
		tuple bool
	}
	dictExpr struct{ keys, vals []expr }
)

// maxNesting bounds the parser's recursion, so a hostile template nests
// no deeper than this many brackets or blocks.
const maxNesting = 200

type parser struct {
	toks  []token
	pos   int
	depth int
	// names records every variable name the template reads, for vLLM's
	// chat_template_kwargs filter (which keeps only the kwargs a template
	// could read).
	names map[string]bool
	// unimplemented lists the Jinja2 filters and tests the template uses
	// that chat does not implement, as "|groupby" or "is callable".
	unimplemented []string
}

// jinjaFilters and jinjaTests are Jinja2's own (3.1): a template using
// one chat does not implement compiles, and a rendering that reaches it
// fails with ErrUnsupported; any other unknown name fails the template in
// Jinja2 too.
var (
	jinjaFilters = []string{"abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e",
		"escape", "filesizeformat", "first", "float", "forceescape", "format", "groupby", "indent", "int", "items",
		"join", "last", "length", "list", "lower", "map", "max", "min", "pprint", "random", "reject", "rejectattr",
		"replace", "reverse", "round", "safe", "select", "selectattr", "slice", "sort", "string", "striptags", "sum",
		"title", "tojson", "trim", "truncate", "unique", "upper", "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr"}
	jinjaTests = []string{"boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even", "false",
		"filter", "float", "ge", "greaterthan", "gt", "in", "integer", "iterable", "le", "lessthan", "lower", "lt",
		"mapping", "ne", "none", "number", "odd", "sameas", "sequence", "string", "test", "true", "undefined", "upper"}
)

// unimplementedName records a Jinja2 filter or test chat lacks.
func (p *parser) unimplementedName(what string) {
	if !slices.Contains(p.unimplemented, what) {
		p.unimplemented = append(p.unimplemented, what)
	}
}

func (p *parser) peek() token { return p.toks[p.pos] }
func (p *parser) next() token {
	t := p.toks[p.pos]
	if t.kind != tEOF {
		p.pos++
	}
	return t
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("line %d: "+format, append([]any{p.peek().line}, args...)...)
}

func (p *parser) isOp(s string) bool {
	t := p.peek()
	return t.kind == tOp && t.s == s
}
func (p *parser) isName(s string) bool {
	t := p.peek()
	return t.kind == tName && t.s == s
}

func (p *parser) expectOp(s string) error {
	if !p.isOp(s) {
		return p.errorf("expected %q", s)
	}
	p.pos++
	return nil
}

func (p *parser) expectName() (string, error) {
	t := p.peek()
	if t.kind != tName {
		return "", p.errorf("expected a name")
	}
	p.pos++
	return t.s, nil
}

func (p *parser) expectBlockEnd() error {
	if p.peek().kind != tBlockEnd {
		return p.errorf("expected end of block tag")
	}
	p.pos++
	return nil
}

func (p *parser) enter() error {
	p.depth++
	if p.depth > maxNesting {
		return p.errorf("template nests deeper than %d", maxNesting)
	}
	return nil
}
func (p *parser) leave() { p.depth-- }

// parseBody parses nodes until a block tag whose keyword is in enders, and
// returns that keyword (consumed, with the rest of its tag left to read).
func (p *parser) parseBody(enders ...string) ([]node, string, error) {
	if err := p.enter(); err != nil {
		return nil, "", err
	}
	defer p.leave()
	var out []node
	for {
		t := p.peek()
		switch t.kind {
		case tEOF:
			if len(enders) == 0 {
				return out, "", nil
			}
			return nil, "", p.errorf("missing {%% %s %%}", enders[0])
		case tText:
			p.pos++
			out = append(out, &textNode{s: t.s})
		case tVarBegin:
			p.pos++
			e, err := p.parseTuple(false)
			if err != nil {
				return nil, "", err
			}
			if p.peek().kind != tVarEnd {
				return nil, "", p.errorf("expected }}")
			}
			p.pos++
			out = append(out, &outputNode{e: e})
		case tBlockBegin:
			p.pos++
			kw, err := p.expectName()
			if err != nil {
				return nil, "", err
			}
			for _, e := range enders {
				if kw == e {
					return out, kw, nil
				}
			}
			n, err := p.parseStatement(kw)
			if err != nil {
				return nil, "", err
			}
			if n != nil {
				out = append(out, n)
			}
		default:
			return nil, "", p.errorf("unexpected token")
		}
	}
}

func (p *parser) parseStatement(kw string) (node, error) {
	switch kw {
	case "if":
		return p.parseIf()
	case "for":
		return p.parseFor()
	case "set":
		return p.parseSet()
	case "macro":
		return p.parseMacro()
	case "call":
		return p.parseCallBlock()
	case "filter":
		return p.parseFilterBlock()
	case "generation":
		// transformers' assistant-mask tag renders its body unchanged.
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		body, _, err := p.parseBody("endgeneration")
		if err != nil {
			return nil, err
		}
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		return &filterBlockNode{body: body}, nil
	case "break", "continue":
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		if kw == "break" {
			return &breakNode{}, nil
		}
		return &continueNode{}, nil
	}
	return nil, p.errorf("unknown or unsupported tag %q", kw)
}

func (p *parser) parseIf() (node, error) {
	n := &ifNode{}
	for {
		cond, err := p.parseTuple(false)
		if err != nil {
			return nil, err
		}
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		body, end, err := p.parseBody("elif", "else", "endif")
		if err != nil {
			return nil, err
		}
		n.conds = append(n.conds, cond)
		n.bodies = append(n.bodies, body)
		switch end {
		case "elif":
			continue
		case "else":
			if err := p.expectBlockEnd(); err != nil {
				return nil, err
			}
			n.els, _, err = p.parseBody("endif")
			if err != nil {
				return nil, err
			}
		}
		return n, p.expectBlockEnd()
	}
}

func (p *parser) parseTargets() ([]string, error) {
	var names []string
	paren := p.isOp("(")
	if paren {
		p.pos++
	}
	for {
		name, err := p.expectName()
		if err != nil {
			return nil, err
		}
		names = append(names, name)
		if !p.isOp(",") {
			break
		}
		p.pos++
	}
	if paren {
		if err := p.expectOp(")"); err != nil {
			return nil, err
		}
	}
	return names, nil
}

func (p *parser) parseFor() (node, error) {
	n := &forNode{}
	var err error
	if n.targets, err = p.parseTargets(); err != nil {
		return nil, err
	}
	if !p.isName("in") {
		return nil, p.errorf("expected 'in'")
	}
	p.pos++
	if n.iter, err = p.parseTupleNoCond(); err != nil {
		return nil, err
	}
	if p.isName("if") {
		p.pos++
		if n.cond, err = p.parseTuple(false); err != nil {
			return nil, err
		}
	}
	if p.isName("recursive") {
		return nil, p.errorf("recursive loops are not supported")
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	body, end, err := p.parseBody("else", "endfor")
	if err != nil {
		return nil, err
	}
	n.body = body
	if end == "else" {
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		if n.els, _, err = p.parseBody("endfor"); err != nil {
			return nil, err
		}
	}
	return n, p.expectBlockEnd()
}

func (p *parser) parseSet() (node, error) {
	first, err := p.expectName()
	if err != nil {
		return nil, err
	}
	if p.isOp(".") {
		p.pos++
		attr, err := p.expectName()
		if err != nil {
			return nil, err
		}
		if err := p.expectOp("="); err != nil {
			return nil, err
		}
		e, err := p.parseTuple(false)
		if err != nil {
			return nil, err
		}
		p.names[first] = true
		return &setNode{ns: first, attr: attr, e: e}, p.expectBlockEnd()
	}
	targets := []string{first}
	for p.isOp(",") {
		p.pos++
		name, err := p.expectName()
		if err != nil {
			return nil, err
		}
		targets = append(targets, name)
	}
	if p.isOp("=") {
		p.pos++
		e, err := p.parseTuple(false)
		if err != nil {
			return nil, err
		}
		return &setNode{targets: targets, e: e}, p.expectBlockEnd()
	}
	if len(targets) != 1 {
		return nil, p.errorf("a set block takes one name")
	}
	n := &setBlockNode{name: first}
	for p.isOp("|") {
		p.pos++
		f, err := p.parseFilter(nil)
		if err != nil {
			return nil, err
		}
		n.filters = append(n.filters, f)
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	if n.body, _, err = p.parseBody("endset"); err != nil {
		return nil, err
	}
	return n, p.expectBlockEnd()
}

func (p *parser) parseMacro() (node, error) {
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	n := &macroNode{name: name}
	if err := p.expectOp("("); err != nil {
		return nil, err
	}
	for !p.isOp(")") {
		param, err := p.expectName()
		if err != nil {
			return nil, err
		}
		n.params = append(n.params, param)
		if p.isOp("=") {
			p.pos++
			d, err := p.parseExpr(false)
			if err != nil {
				return nil, err
			}
			n.defaults = append(n.defaults, d)
		} else if len(n.defaults) > 0 {
			return nil, p.errorf("non-default parameter follows default parameter")
		}
		if !p.isOp(",") {
			break
		}
		p.pos++
	}
	if err := p.expectOp(")"); err != nil {
		return nil, err
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	if n.body, _, err = p.parseBody("endmacro"); err != nil {
		return nil, err
	}
	return n, p.expectBlockEnd()
}

func (p *parser) parseCallBlock() (node, error) {
	e, err := p.parseExpr(false)
	if err != nil {
		return nil, err
	}
	call, ok := e.(*callExpr)
	if !ok {
		return nil, p.errorf("expected a call")
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	body, _, err := p.parseBody("endcall")
	if err != nil {
		return nil, err
	}
	return &callBlockNode{call: call, body: body}, p.expectBlockEnd()
}

func (p *parser) parseFilterBlock() (node, error) {
	n := &filterBlockNode{}
	for {
		f, err := p.parseFilter(nil)
		if err != nil {
			return nil, err
		}
		n.filters = append(n.filters, f)
		if !p.isOp("|") {
			break
		}
		p.pos++
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	var err error
	if n.body, _, err = p.parseBody("endfilter"); err != nil {
		return nil, err
	}
	return n, p.expectBlockEnd()
}

// parseTuple parses an expression, or a comma-separated tuple of them.
func (p *parser) parseTuple(simplified bool) (expr, error) {
	first, err := p.parseExpr(simplified)
	if err != nil {
		return nil, err
	}
	if !p.isOp(",") {
		return first, nil
	}
	items := []expr{first}
	for p.isOp(",") {
		p.pos++
		if p.tupleEnds() {
			break
		}
		e, err := p.parseExpr(simplified)
		if err != nil {
			return nil, err
		}
		items = append(items, e)
	}
	return &listExpr{items: items, tuple: true}, nil
}

// parseTupleNoCond parses a for loop's iterable, which stops before "if".
func (p *parser) parseTupleNoCond() (expr, error) { return p.parseTuple(true) }

func (p *parser) tupleEnds() bool {
	t := p.peek()
	return t.kind == tVarEnd || t.kind == tBlockEnd || t.kind == tEOF ||
		(t.kind == tOp && (t.s == ")" || t.s == "]" || t.s == "}")) ||
		(t.kind == tName && (t.s == "in" || t.s == "if"))
}

// parseExpr parses a conditional expression; simplified (a for loop's
// iterable) leaves a trailing "if" to the loop.
func (p *parser) parseExpr(simplified bool) (expr, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.leave()
	e, err := p.parseOr()
	if err != nil || simplified {
		return e, err
	}
	for p.isName("if") {
		p.pos++
		cond, err := p.parseOr()
		if err != nil {
			return nil, err
		}
		var no expr
		if p.isName("else") {
			p.pos++
			if no, err = p.parseExpr(false); err != nil {
				return nil, err
			}
		}
		e = &condExpr{cond: cond, yes: e, no: no}
	}
	return e, nil
}

func (p *parser) parseOr() (expr, error) {
	l, err := p.parseAnd()
	if err != nil {
		return nil, err
	}
	for p.isName("or") {
		p.pos++
		r, err := p.parseAnd()
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: "or", l: l, r: r}
	}
	return l, nil
}

func (p *parser) parseAnd() (expr, error) {
	l, err := p.parseNot()
	if err != nil {
		return nil, err
	}
	for p.isName("and") {
		p.pos++
		r, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: "and", l: l, r: r}
	}
	return l, nil
}

func (p *parser) parseNot() (expr, error) {
	if p.isName("not") {
		p.pos++
		if err := p.enter(); err != nil {
			return nil, err
		}
		defer p.leave()
		e, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		return &unaryExpr{op: "not", e: e}, nil
	}
	return p.parseCompare()
}

func (p *parser) parseCompare() (expr, error) {
	first, err := p.parseMath1()
	if err != nil {
		return nil, err
	}
	var ops []string
	var rest []expr
	for {
		t := p.peek()
		var op string
		switch {
		case t.kind == tOp && (t.s == "==" || t.s == "!=" || t.s == "<" || t.s == "<=" || t.s == ">" || t.s == ">="):
			op = t.s
			p.pos++
		case t.kind == tName && t.s == "in":
			op = "in"
			p.pos++
		case t.kind == tName && t.s == "not" && p.toks[p.pos+1].kind == tName && p.toks[p.pos+1].s == "in":
			op = "notin"
			p.pos += 2
		default:
			if ops == nil {
				return first, nil
			}
			return &compareExpr{first: first, ops: ops, rest: rest}, nil
		}
		r, err := p.parseMath1()
		if err != nil {
			return nil, err
		}
		ops = append(ops, op)
		rest = append(rest, r)
	}
}

func (p *parser) parseMath1() (expr, error) {
	l, err := p.parseConcat()
	if err != nil {
		return nil, err
	}
	for p.isOp("+") || p.isOp("-") {
		op := p.next().s
		r, err := p.parseConcat()
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: op, l: l, r: r}
	}
	return l, nil
}

func (p *parser) parseConcat() (expr, error) {
	l, err := p.parseMath2()
	if err != nil {
		return nil, err
	}
	for p.isOp("~") {
		p.pos++
		r, err := p.parseMath2()
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: "~", l: l, r: r}
	}
	return l, nil
}

func (p *parser) parseMath2() (expr, error) {
	l, err := p.parsePow()
	if err != nil {
		return nil, err
	}
	for p.isOp("*") || p.isOp("/") || p.isOp("//") || p.isOp("%") {
		op := p.next().s
		r, err := p.parsePow()
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: op, l: l, r: r}
	}
	return l, nil
}

func (p *parser) parsePow() (expr, error) {
	l, err := p.parseUnary(true)
	if err != nil {
		return nil, err
	}
	for p.isOp("**") {
		p.pos++
		r, err := p.parseUnary(true)
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: "**", l: l, r: r}
	}
	return l, nil
}

func (p *parser) parseUnary(withFilter bool) (expr, error) {
	var e expr
	if p.isOp("-") || p.isOp("+") {
		op := p.next().s
		if err := p.enter(); err != nil {
			return nil, err
		}
		inner, err := p.parseUnary(false)
		p.leave()
		if err != nil {
			return nil, err
		}
		e = &unaryExpr{op: op, e: inner}
	} else {
		prim, err := p.parsePrimary()
		if err != nil {
			return nil, err
		}
		if e, err = p.parsePostfix(prim); err != nil {
			return nil, err
		}
	}
	if withFilter {
		return p.parseFilterExpr(e)
	}
	return e, nil
}

func (p *parser) parsePrimary() (expr, error) {
	t := p.next()
	switch t.kind {
	case tName:
		switch t.s {
		case "true", "True":
			return &constExpr{v: vTrue}, nil
		case "false", "False":
			return &constExpr{v: vFalse}, nil
		case "none", "None":
			return &constExpr{v: none}, nil
		}
		p.names[t.s] = true
		return &nameExpr{name: t.s}, nil
	case tString:
		s := t.s
		for p.peek().kind == tString {
			s += p.next().s
		}
		return &constExpr{v: strValue(s)}, nil
	case tInt:
		n, err := strconv.ParseInt(t.s, 10, 64)
		if err != nil {
			if _, ok := new(big.Int).SetString(t.s, 10); !ok {
				return nil, p.errorf("bad integer %q", t.s)
			}
			return &constExpr{v: value{k: kBigInt, s: t.s}}, nil
		}
		return &constExpr{v: intValue(n)}, nil
	case tFloat:
		f, err := strconv.ParseFloat(t.s, 64)
		if err != nil && f == 0 {
			return nil, p.errorf("bad float %q", t.s)
		}
		return &constExpr{v: floatValue(f)}, nil
	case tOp:
		if err := p.enter(); err != nil {
			return nil, err
		}
		defer p.leave()
		switch t.s {
		case "(":
			if p.isOp(")") {
				p.pos++
				return &listExpr{tuple: true}, nil
			}
			first, err := p.parseExpr(false)
			if err != nil {
				return nil, err
			}
			if p.isOp(")") {
				p.pos++
				return first, nil
			}
			items := []expr{first}
			for p.isOp(",") {
				p.pos++
				if p.isOp(")") {
					break
				}
				e, err := p.parseExpr(false)
				if err != nil {
					return nil, err
				}
				items = append(items, e)
			}
			if err := p.expectOp(")"); err != nil {
				return nil, err
			}
			return &listExpr{items: items, tuple: true}, nil
		case "[":
			n := &listExpr{}
			for !p.isOp("]") {
				e, err := p.parseExpr(false)
				if err != nil {
					return nil, err
				}
				n.items = append(n.items, e)
				if !p.isOp(",") {
					break
				}
				p.pos++
			}
			return n, p.expectOp("]")
		case "{":
			n := &dictExpr{}
			for !p.isOp("}") {
				k, err := p.parseExpr(false)
				if err != nil {
					return nil, err
				}
				if err := p.expectOp(":"); err != nil {
					return nil, err
				}
				v, err := p.parseExpr(false)
				if err != nil {
					return nil, err
				}
				n.keys = append(n.keys, k)
				n.vals = append(n.vals, v)
				if !p.isOp(",") {
					break
				}
				p.pos++
			}
			return n, p.expectOp("}")
		}
	}
	p.pos--
	return nil, p.errorf("unexpected %q", t.s)
}

func (p *parser) parsePostfix(e expr) (expr, error) {
	for {
		switch {
		case p.isOp("."):
			p.pos++
			t := p.next()
			switch t.kind {
			case tName:
				e = &attrExpr{obj: e, name: t.s}
			case tInt:
				n, _ := strconv.ParseInt(t.s, 10, 64)
				e = &itemExpr{obj: e, key: &constExpr{v: intValue(n)}}
			default:
				p.pos--
				return nil, p.errorf("expected an attribute name")
			}
		case p.isOp("["):
			p.pos++
			var err error
			if e, err = p.parseSubscript(e); err != nil {
				return nil, err
			}
		case p.isOp("("):
			var err error
			if e, err = p.parseCall(e); err != nil {
				return nil, err
			}
		default:
			return e, nil
		}
	}
}

func (p *parser) parseSubscript(obj expr) (expr, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.leave()
	var parts [3]expr
	isSlice := false
	for i := 0; i < 3; i++ {
		if !p.isOp(":") && !p.isOp("]") {
			e, err := p.parseExpr(false)
			if err != nil {
				return nil, err
			}
			parts[i] = e
		}
		if p.isOp(":") && i < 2 {
			p.pos++
			isSlice = true
			continue
		}
		break
	}
	if err := p.expectOp("]"); err != nil {
		return nil, err
	}
	if !isSlice {
		if parts[0] == nil {
			return nil, p.errorf("empty subscript")
		}
		return &itemExpr{obj: obj, key: parts[0]}, nil
	}
	return &sliceExpr{obj: obj, lo: parts[0], hi: parts[1], step: parts[2]}, nil
}

func (p *parser) parseArgs() ([]expr, []kwExpr, error) {
	if err := p.expectOp("("); err != nil {
		return nil, nil, err
	}
	if err := p.enter(); err != nil {
		return nil, nil, err
	}
	defer p.leave()
	var args []expr
	var kws []kwExpr
	for !p.isOp(")") {
		if p.peek().kind == tName && p.toks[p.pos+1].kind == tOp && p.toks[p.pos+1].s == "=" {
			name := p.next().s
			p.pos++
			e, err := p.parseExpr(false)
			if err != nil {
				return nil, nil, err
			}
			kws = append(kws, kwExpr{name: name, e: e})
		} else {
			if len(kws) > 0 {
				return nil, nil, p.errorf("positional argument follows keyword argument")
			}
			e, err := p.parseExpr(false)
			if err != nil {
				return nil, nil, err
			}
			args = append(args, e)
		}
		if !p.isOp(",") {
			break
		}
		p.pos++
	}
	return args, kws, p.expectOp(")")
}

func (p *parser) parseCall(fn expr) (expr, error) {
	args, kws, err := p.parseArgs()
	if err != nil {
		return nil, err
	}
	return &callExpr{fn: fn, args: args, kw: kws}, nil
}

func (p *parser) parseFilter(arg expr) (*filterExpr, error) {
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	for p.isOp(".") {
		p.pos++
		part, err := p.expectName()
		if err != nil {
			return nil, err
		}
		name += "." + part
	}
	f := &filterExpr{arg: arg, name: name}
	if p.isOp("(") {
		if f.args, f.kw, err = p.parseArgs(); err != nil {
			return nil, err
		}
	}
	if !knownFilter(name) {
		if !slices.Contains(jinjaFilters, name) {
			return nil, p.errorf("no filter named %q", name)
		}
		f.unimplemented = true
		p.unimplementedName("|" + name)
	}
	return f, nil
}

func (p *parser) parseFilterExpr(e expr) (expr, error) {
	for {
		switch {
		case p.isOp("|"):
			p.pos++
			f, err := p.parseFilter(e)
			if err != nil {
				return nil, err
			}
			e = f
		case p.isName("is"):
			p.pos++
			t := &testExpr{arg: e}
			if p.isName("not") {
				p.pos++
				t.negate = true
			}
			name, err := p.expectName()
			if err != nil {
				return nil, err
			}
			for p.isOp(".") {
				p.pos++
				part, err := p.expectName()
				if err != nil {
					return nil, err
				}
				name += "." + part
			}
			t.name = name
			if !knownTest(name) {
				if !slices.Contains(jinjaTests, name) {
					return nil, p.errorf("no test named %q", name)
				}
				t.unimplemented = true
				p.unimplementedName("is " + name)
			}
			nt := p.peek()
			switch {
			case p.isOp("("):
				var kws []kwExpr
				if t.args, kws, err = p.parseArgs(); err != nil {
					return nil, err
				}
				if len(kws) > 0 {
					return nil, p.errorf("tests take no keyword arguments")
				}
			case (nt.kind == tName || nt.kind == tString || nt.kind == tInt || nt.kind == tFloat ||
				nt.kind == tOp && (nt.s == "(" || nt.s == "[" || nt.s == "{")) &&
				!(nt.kind == tName && (nt.s == "else" || nt.s == "or" || nt.s == "and")):
				if nt.kind == tName && nt.s == "is" {
					return nil, p.errorf("you cannot chain multiple tests with is")
				}
				prim, err := p.parsePrimary()
				if err != nil {
					return nil, err
				}
				arg, err := p.parsePostfix(prim)
				if err != nil {
					return nil, err
				}
				t.args = []expr{arg}
			}
			e = t
		case p.isOp("("):
			var err error
			if e, err = p.parseCall(e); err != nil {
				return nil, err
			}
		default:
			return e, nil
		}
	}
}
