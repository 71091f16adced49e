package chat

import "slices"

// markUnimplemented marks the template's calls of methods and functions
// chat does not implement (str.ljust, loop.changed, joiner(), ...) and
// lists them. Unmarked, such a call would render as an undefined value
// and fail its request with an error the caller answers 400, where
// transformers renders the template and vLLM serves the request. Marked,
// a rendering that reaches one fails with ErrUnsupported instead, and
// that request routes approximately, while requests that never reach it
// (a tools branch, say) still render exactly.
//
// A name the template itself binds (set, for, macro and its parameters,
// the call block's caller) may hold anything, and is allowed; so is a
// method jinja2's sandbox refuses (list.append): it fails there too.
func markUnimplemented(root []node) (calls []string) {
	bound := map[string]bool{"caller": true}
	walkNodes(root, func(n node) {
		switch n := n.(type) {
		case *setNode:
			for _, t := range n.targets {
				bound[t] = true
			}
		case *setBlockNode:
			bound[n.name] = true
		case *forNode:
			for _, t := range n.targets {
				bound[t] = true
			}
		case *macroNode:
			bound[n.name] = true
			for _, p := range n.params {
				bound[p] = true
			}
		}
	})
	mark := func(e expr) {
		c, ok := e.(*callExpr)
		if !ok {
			return
		}
		switch fn := c.fn.(type) {
		case *nameExpr:
			if _, global := builtinGlobals[fn.name]; !global && !bound[fn.name] {
				c.unimplemented = fn.name + "()"
			}
		case *attrExpr:
			if !knownMethod(fn.name) {
				c.unimplemented = "." + fn.name + "()"
			}
		}
		if c.unimplemented != "" && !slices.Contains(calls, c.unimplemented) {
			calls = append(calls, c.unimplemented)
		}
	}
	walkNodes(root, func(n node) {
		for _, e := range nodeExprs(n) {
			walkExpr(e, mark)
		}
	})
	return calls
}

// knownMethod reports whether some value chat renders has a method name:
// a string's, a dict's, a list's, the loop's, or one the sandbox refuses.
func knownMethod(name string) bool {
	if _, ok := strMethod(strValue(""), name); ok {
		return true
	}
	if _, ok := dictMethod(value{k: kDict, dict: &dict{}}, name); ok {
		return true
	}
	if _, ok := listMethod(value{k: kList}, name); ok {
		return true
	}
	if name == "cycle" {
		return true // loop.cycle
	}
	return isUnsafeMethod(value{k: kList}, name) || isUnsafeMethod(value{k: kDict, dict: &dict{}}, name)
}

// nodeExprs lists the expressions a node holds itself (not its body's).
func nodeExprs(n node) []expr {
	switch n := n.(type) {
	case *outputNode:
		return []expr{n.e}
	case *ifNode:
		return n.conds
	case *forNode:
		return []expr{n.iter, n.cond}
	case *setNode:
		return []expr{n.e}
	case *setBlockNode:
		return filterExprs(n.filters)
	case *macroNode:
		return n.defaults
	case *callBlockNode:
		return []expr{n.call}
	case *filterBlockNode:
		return filterExprs(n.filters)
	}
	return nil
}

func filterExprs(fs []*filterExpr) []expr {
	out := make([]expr, len(fs))
	for i, f := range fs {
		out[i] = f
	}
	return out
}

// walkExpr calls fn on e and every expression inside it.
func walkExpr(e expr, fn func(expr)) {
	if e == nil {
		return
	}
	fn(e)
	walkAll := func(es []expr) {
		for _, x := range es {
			walkExpr(x, fn)
		}
	}
	walkKw := func(kw []kwExpr) {
		for _, k := range kw {
			walkExpr(k.e, fn)
		}
	}
	switch x := e.(type) {
	case *attrExpr:
		walkExpr(x.obj, fn)
	case *itemExpr:
		walkExpr(x.obj, fn)
		walkExpr(x.key, fn)
	case *sliceExpr:
		walkAll([]expr{x.obj, x.lo, x.hi, x.step})
	case *callExpr:
		walkExpr(x.fn, fn)
		walkAll(x.args)
		walkKw(x.kw)
	case *filterExpr:
		walkExpr(x.arg, fn)
		walkAll(x.args)
		walkKw(x.kw)
	case *testExpr:
		walkExpr(x.arg, fn)
		walkAll(x.args)
	case *unaryExpr:
		walkExpr(x.e, fn)
	case *binExpr:
		walkExpr(x.l, fn)
		walkExpr(x.r, fn)
	case *compareExpr:
		walkExpr(x.first, fn)
		walkAll(x.rest)
	case *condExpr:
		walkAll([]expr{x.cond, x.yes, x.no})
	case *listExpr:
		walkAll(x.items)
	case *dictExpr:
		walkAll(x.keys)
		walkAll(x.vals)
	}
}
