package chat

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Template is a compiled chat template. It is immutable, so one Template
// serves every goroutine.
type Template struct {
	root   []node
	source string
	// reads is every variable name the template reads: vLLM passes a
	// chat_template_kwargs key to the template only if the template could
	// read it.
	reads  map[string]bool
	format contentFormat
	// Limits bound each rendering; Compile sets DefaultLimits.
	Limits Limits
	// now is strftime_now's clock; tests pin it.
	now func() time.Time
	// unimplemented is what Unimplemented returns.
	unimplemented []string
}

// Unimplemented lists the calls the template makes of methods and
// functions chat does not implement, in the template's order, as
// ".ljust()" or "joiner()", then the Jinja2 filters and tests it uses
// that chat does not implement, as "|groupby" or "is callable". A
// rendering that reaches one of them fails with ErrUnsupported; the
// others render exactly.
func (t *Template) Unimplemented() []string { return slices.Clone(t.unimplemented) }

// Compile parses a chat template (the chat_template of a
// tokenizer_config.json). It refuses what it cannot render as Jinja2
// would: filters and tests Jinja2 does not have, and tags outside the set chat
// templates use (include, import, extends and do are not available in
// transformers' environment either). Calls of methods and functions chat
// does not implement compile (Unimplemented lists them), and so do
// Jinja2's filters and tests that chat lacks: a rendering that reaches one
// fails with ErrUnsupported.
func Compile(source string) (*Template, error) {
	if len(source) > maxTemplateBytes {
		return nil, fmt.Errorf("cannot compile chat template: larger than %d bytes", maxTemplateBytes)
	}
	toks, err := lex(source)
	if err != nil {
		return nil, fmt.Errorf("cannot compile chat template: %w", err)
	}
	p := &parser{toks: toks, names: map[string]bool{}}
	root, _, err := p.parseBody()
	if err != nil {
		return nil, fmt.Errorf("cannot compile chat template: %w", err)
	}
	t := &Template{root: root, source: source, reads: p.names, Limits: DefaultLimits, now: time.Now,
		unimplemented: append(markUnimplemented(root), p.unimplemented...)}
	t.format = detectFormat(root)
	return t, nil
}

// The tag transformers appends to the final message when it is to be
// continued, to find where that message ends in the rendering.
const continueTag = "CONTINUE_FINAL_MESSAGE_TAG "

// apply_chat_template's own parameters. vLLM lets a chat_template_kwargs
// key through when it is one of these even if the template does not read
// it; those that are not template variables are consumed before the
// template runs.
var hfParams = map[string]bool{
	"conversation": true, "tools": true, "documents": true, "chat_template": true,
	"add_generation_prompt": true, "continue_final_message": true, "tokenize": true,
	"padding": true, "truncation": true, "max_length": true, "return_tensors": true,
	"return_dict": true, "return_assistant_tokens_mask": true, "tokenizer_kwargs": true,
}

var rendererPool = sync.Pool{New: func() any { return new(renderer) }}

// maxPooledOutput keeps the pool from pinning the scratch buffer of one
// huge rendering.
const maxPooledOutput = 1 << 20

// Render appends to dst the prompt text the engine renders for in, with
// bos and eos as the tokenizer's bos_token and eos_token ("" when the
// tokenizer has none). Errors the request caused wrap ErrInvalidRequest;
// media content in a template that prints content as a string, and a
// rendering that reaches a call chat does not implement, wrap
// ErrUnsupported.
func (t *Template) Render(dst []byte, in *Input, bos, eos string) ([]byte, error) {
	msgs, err := in.conversation(t.format)
	if err != nil {
		return dst, err
	}
	var final string
	if in.continueFinal {
		if msgs, final, err = t.tagFinalMessage(msgs); err != nil {
			return dst, err
		}
	}
	g := &globals{}
	g.vars = append(g.vars[:0],
		binding{"messages", msgs},
		binding{"tools", in.tools},
		binding{"documents", in.documents},
		binding{"add_generation_prompt", boolValue(in.addGenerationPrompt)},
	)
	if bos != "" {
		g.vars = append(g.vars, binding{"bos_token", strValue(bos)})
	}
	if eos != "" {
		g.vars = append(g.vars, binding{"eos_token", strValue(eos)})
	}
	for _, kw := range in.kwargs {
		switch kw.name {
		case "tokenize":
			return dst, invalid("chat_template_kwargs may not set %s", kw.name)
		case "conversation", "tools", "messages":
			if t.reads[kw.name] || hfParams[kw.name] {
				return dst, invalid("chat_template_kwargs repeats the argument %s", kw.name)
			}
			continue
		case "documents", "add_generation_prompt", "continue_final_message":
			// The request's own fields win (documents only when set).
			if kw.name == "documents" && in.documents.k == kNone {
				docs, err := checkDocuments(kw.v)
				if err != nil {
					return dst, err
				}
				g.set("documents", docs)
			}
			continue
		}
		if hfParams[kw.name] || !t.reads[kw.name] {
			continue
		}
		g.set(kw.name, kw.v)
	}
	start := len(dst)
	dst, err = t.execute(dst, g)
	if err != nil {
		return dst[:start], err
	}
	if in.continueFinal {
		cut, err := cutAtFinalMessage(dst[start:], final)
		if err != nil {
			return dst[:start], err
		}
		dst = append(dst[:start], cut...)
	}
	return dst, nil
}

// execute runs the template with the variables g, appending its output
// to dst.
func (t *Template) execute(dst []byte, g *globals) ([]byte, error) {
	r := rendererPool.Get().(*renderer)
	defer func() {
		// The output is the caller's buffer: the pooled renderer keeps
		// only its own scratch space.
		r.out = nil
		if cap(r.scratch) > maxPooledOutput {
			r.scratch = nil
		}
		// Drop the values the buffers still hold, so a pooled renderer
		// keeps no request's strings alive.
		r.globals = nil
		clear(r.vars[:cap(r.vars)])
		r.vars = r.vars[:0]
		clear(r.parts[:cap(r.parts)])
		r.parts = r.parts[:0]
		rendererPool.Put(r)
	}()
	r.out = dst
	r.base = len(dst)
	r.vars = r.vars[:0]
	r.frames = append(r.frames[:0], 0)
	r.globals = g
	r.limits = t.Limits
	r.steps, r.depth, r.built = 0, 0, 0
	r.now = t.now
	if _, err := r.execBody(t.root); err != nil {
		var re *renderError
		switch {
		case errors.Is(err, errCostly):
			return r.out[:r.base], fmt.Errorf("%w: cannot render chat template: %w", ErrTooCostly, err)
		case errors.As(err, &re), errors.Is(err, errLimit):
			return r.out[:r.base], fmt.Errorf("%w: cannot render chat template: %w", ErrInvalidRequest, err)
		}
		return r.out[:r.base], fmt.Errorf("cannot render chat template: %w", err)
	}
	return r.out, nil
}

// tagFinalMessage returns msgs with transformers' continue tag appended to
// the final message's content (to its last text part, for a list).
func (t *Template) tagFinalMessage(msgs value) (value, string, error) {
	items := msgs.items()
	last := items[len(items)-1].dict
	content, _ := last.getStr("content")
	if !strings.Contains(t.source, "content") {
		return undefined, "", invalid("continue_final_message is set but the template does not read content")
	}
	nd := last.clone()
	var final string
	switch content.k {
	case kStr:
		final = content.s
		nd.setStr("content", strValue(content.s+continueTag))
	case kList:
		parts := append([]value(nil), content.items()...)
		found := false
		for i := len(parts) - 1; i >= 0; i-- {
			if parts[i].k != kDict {
				continue
			}
			if text, ok := parts[i].dict.getStr("text"); ok {
				final = toStr(text)
				pd := parts[i].dict.clone()
				pd.setStr("text", strValue(toStr(text)+continueTag))
				parts[i] = dictValue(pd)
				found = true
				break
			}
		}
		if !found {
			return undefined, "", invalid("continue_final_message is set but the final message has no text to continue")
		}
		nd.setStr("content", listValue(parts))
	default:
		return undefined, "", invalid("continue_final_message is set but the final message has no content")
	}
	out := append([]value(nil), items...)
	out[len(out)-1] = dictValue(nd)
	return listValue(out), final, nil
}

// cutAtFinalMessage ends the rendering where the final message ends, as
// transformers does: at the continue tag if the template kept its
// trailing space, else at the tag with trailing whitespace trimmed.
func cutAtFinalMessage(out []byte, final string) ([]byte, error) {
	tag := strings.TrimSpace(continueTag)
	final = strings.TrimFunc(final, pyIsSpace)
	s := string(out)
	if !strings.Contains(s, final) || !strings.Contains(s, tag) {
		return nil, invalid("continue_final_message is set but the final message does not appear in the rendering")
	}
	at := strings.LastIndex(s, tag)
	if strings.HasPrefix(s[at:], continueTag) {
		return out[:at], nil
	}
	return []byte(rstripSpace(s[:at])), nil
}

// globals are the variables a rendering starts with, then the built-in
// functions.
type globals struct {
	vars []binding
}

func (g *globals) set(name string, v value) {
	for i := range g.vars {
		if g.vars[i].name == name {
			g.vars[i].v = v
			return
		}
	}
	g.vars = append(g.vars, binding{name, v})
}

func (g *globals) lookup(name string) (value, bool) {
	for i := range g.vars {
		if g.vars[i].name == name {
			return g.vars[i].v, true
		}
	}
	fn, ok := builtinGlobals[name]
	return fn, ok
}

var builtinGlobals map[string]value

func init() {
	builtinGlobals = map[string]value{
		"raise_exception": method("raise_exception", func(_ *renderer, args []value, _ []kwarg) (value, error) {
			msg := ""
			if len(args) > 0 {
				msg = toStr(args[0])
			}
			return undefined, &renderError{msg: msg}
		}),
		"strftime_now": method("strftime_now", func(r *renderer, args []value, _ []kwarg) (value, error) {
			if len(args) != 1 || args[0].k != kStr {
				return undefined, rtErr("strftime_now takes one format string")
			}
			return strValue(strftime(r.now(), args[0].s)), nil
		}),
		"range": method("range", func(_ *renderer, args []value, _ []kwarg) (value, error) {
			var b [3]int64
			b[2] = 1
			for _, a := range args {
				if a.k != kInt && a.k != kBool {
					return undefined, rtErr("'%s' object cannot be interpreted as an integer", typeName(a))
				}
			}
			switch len(args) {
			case 1:
				b[1] = args[0].n
			case 2:
				b[0], b[1] = args[0].n, args[1].n
			case 3:
				b[0], b[1], b[2] = args[0].n, args[1].n, args[2].n
				if b[2] == 0 {
					return undefined, rtErr("range() arg 3 must not be zero")
				}
			default:
				return undefined, rtErr("range expected 1 to 3 arguments")
			}
			v := value{k: kRange, rng: &b}
			if rangeLen(v) > maxRange {
				return undefined, rtErr("Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", maxRange)
			}
			return v, nil
		}),
		"namespace": method("namespace", func(_ *renderer, args []value, kw []kwarg) (value, error) {
			d := newDict(len(kw))
			for _, a := range args {
				if a.k != kDict {
					return undefined, rtErr("namespace takes a mapping")
				}
				for i, k := range a.dict.keys {
					d.set(k, a.dict.vals[i])
				}
			}
			for _, k := range kw {
				d.setStr(k.name, k.v)
			}
			return value{k: kNamespace, dict: d}, nil
		}),
		"dict": method("dict", func(_ *renderer, args []value, kw []kwarg) (value, error) {
			d := newDict(len(kw))
			if len(args) > 0 {
				if args[0].k != kDict {
					return undefined, rtErr("dict takes a mapping")
				}
				for i, k := range args[0].dict.keys {
					d.set(k, args[0].dict.vals[i])
				}
			}
			for _, k := range kw {
				d.setStr(k.name, k.v)
			}
			return dictValue(d), nil
		}),
	}
}

// strftime formats t with C's strftime directives, as Python's
// datetime.strftime does in the C locale.
func strftime(t time.Time, f string) string {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 >= len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		switch f[i] {
		case 'Y':
			fmt.Fprintf(&b, "%d", t.Year())
		case 'y':
			fmt.Fprintf(&b, "%02d", t.Year()%100)
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'I':
			h := t.Hour() % 12
			if h == 0 {
				h = 12
			}
			fmt.Fprintf(&b, "%02d", h)
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'b', 'h':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case 'w':
			fmt.Fprintf(&b, "%d", int(t.Weekday()))
		case 'f':
			fmt.Fprintf(&b, "%06d", t.Nanosecond()/1000)
		case 'Z':
			name, _ := t.Zone()
			b.WriteString(name)
		case 'z':
			b.WriteString(t.Format("-0700"))
		case 'F':
			b.WriteString(t.Format("2006-01-02"))
		case 'T':
			b.WriteString(t.Format("15:04:05"))
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(f[i])
		}
	}
	return b.String()
}

// detectFormat is vLLM's content-format detection: a template that loops
// over the content of a message it got by looping over messages (or over a
// variable assigned from messages) reads content as parts.
func detectFormat(root []node) contentFormat {
	var sets []*setNode
	var fors []*forNode
	walkNodes(root, func(n node) {
		switch n := n.(type) {
		case *setNode:
			if n.ns == "" && len(n.targets) == 1 {
				sets = append(sets, n)
			}
		case *forNode:
			fors = append(fors, n)
		}
	})
	lists := []string{"messages"}
	for q := 0; q < len(lists); q++ {
		for _, s := range sets {
			if readsVar(s.e, lists[q], "") {
				name := s.targets[0]
				lists = append(lists, name)
				if len(lists) > 1000 {
					return formatString
				}
			}
		}
	}
	var msgVars []string
	for _, f := range fors {
		for _, l := range lists {
			if readsVar(f.iter, l, "") && len(f.targets) == 1 {
				msgVars = append(msgVars, f.targets[0])
				break
			}
		}
	}
	for _, f := range fors {
		for _, m := range msgVars {
			if readsVar(f.iter, m, "content") {
				return formatParts
			}
		}
	}
	return formatString
}

// readsVar reports whether e is name (or name.key / name['key']), seen
// through filters, tests and slices.
func readsVar(e expr, name, key string) bool {
	switch x := e.(type) {
	case *filterExpr:
		return x.arg != nil && readsVar(x.arg, name, key)
	case *testExpr:
		return readsVar(x.arg, name, key)
	case *sliceExpr:
		return readsVar(x.obj, name, key)
	}
	if key == "" {
		n, ok := e.(*nameExpr)
		return ok && n.name == name
	}
	switch x := e.(type) {
	case *itemExpr:
		c, ok := x.key.(*constExpr)
		return ok && c.v.k == kStr && c.v.s == key && readsVar(x.obj, name, "")
	case *attrExpr:
		return x.name == key && readsVar(x.obj, name, "")
	}
	return false
}

func walkNodes(nodes []node, fn func(node)) {
	for _, n := range nodes {
		fn(n)
		switch n := n.(type) {
		case *ifNode:
			for _, b := range n.bodies {
				walkNodes(b, fn)
			}
			walkNodes(n.els, fn)
		case *forNode:
			walkNodes(n.body, fn)
			walkNodes(n.els, fn)
		case *setBlockNode:
			walkNodes(n.body, fn)
		case *macroNode:
			walkNodes(n.body, fn)
		case *callBlockNode:
			walkNodes(n.body, fn)
		case *filterBlockNode:
			walkNodes(n.body, fn)
		}
	}
}
