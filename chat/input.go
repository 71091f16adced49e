package chat

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/kvfast/kvfast/internal/jsonscan"
)

// ErrInvalidRequest wraps every error the request itself caused: a body or
// message of the wrong shape, or a template that refuses the conversation
// (raise_exception, a type error, an undefined value, a rendering past its
// limits). vLLM answers all of these with 400, and so should the router.
var ErrInvalidRequest = errors.New("invalid chat request")

// ErrTooCostly is what Render's errors wrap when rendering would take
// more work than Limits.MaxBuiltBytes allows: nothing is wrong with the
// request, which the engine renders itself; the router routes it without
// the rendered prompt.
var ErrTooCostly = errors.New("chat request too costly to render for routing")

// ErrUnsupported says the request is valid but cannot be rendered exactly
// here: images, audio or video in a conversation whose template prints
// content as a string, where the engine inserts its model's own
// placeholders, or a rendering that reaches a call chat does not
// implement (Template.Unimplemented). The caller should fall back to
// approximate routing.
var ErrUnsupported = errors.New("chat request cannot be rendered exactly")

var errJSON = errors.New("malformed JSON")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidRequest}, args...)...)
}

// Input is a chat-completions request's template variables, decoded once
// and rendered with any number of templates. It is read-only after
// DecodeInput, so one Input may be rendered concurrently.
type Input struct {
	messages            []message
	tools               value
	documents           value
	kwargs              []binding // chat_template_kwargs, in request order
	addGenerationPrompt bool
	continueFinal       bool
	addSpecialTokens    bool
	hasMedia            bool
	ownTemplate         bool // a chat_template of the request's own

	// The messages as a template sees them, built on first use for each
	// of vLLM's two content formats.
	once    [2]sync.Once
	convert [2]value
	convErr [2]error
}

// message is one chat message as vLLM's parser keeps it.
type message struct {
	role       string
	parts      []part
	toolCalls  value // list, or undefined when absent
	reasoning  value // undefined when absent
	toolCallID value // undefined when absent
	name       value // str, or undefined
	task       value // str, or undefined
	tools      value // the developer role's tools
}

// part is a content part: text, or a media item of a modality.
type part struct {
	text     string
	modality string // "" for text
}

// AddSpecialTokens reports the request's add_special_tokens: whether the
// tokenizer should add its BOS/EOS on top of what the template wrote.
// vLLM's default for chat is false.
func (in *Input) AddSpecialTokens() bool { return in.addSpecialTokens }

// HasMedia reports whether a message carries images, audio or video. The
// engine expands those into placeholder tokens of its own, so token ids
// rendered here match the engine's only up to them.
func (in *Input) HasMedia() bool { return in.hasMedia }

// HasOwnTemplate reports whether the request names a chat_template of its
// own, which an engine that trusts request templates renders instead of
// the model's (vLLM's --trust-request-chat-template; refused otherwise),
// so that the model's template does not give the engine's tokens.
func (in *Input) HasOwnTemplate() bool { return in.ownTemplate }

// DecodeInput reads a chat-completions body as vLLM reads it for its chat
// template: messages (string or content-part content, tool calls, tool
// results, reasoning), tools, documents, chat_template_kwargs,
// add_generation_prompt (default true), continue_final_message and
// add_special_tokens (default false). Shape errors wrap ErrInvalidRequest.
func DecodeInput(body []byte) (*Input, error) {
	v, end, err := decodeJSON(body, 0, 0, true)
	if err != nil || jsonscan.SkipSpace(body, end) != len(body) {
		return nil, invalid("the body is not valid JSON")
	}
	if v.k != kDict {
		return nil, invalid("the body is not a JSON object")
	}
	in := &Input{tools: none, documents: none, addGenerationPrompt: true}
	d := v.dict
	for i, key := range d.keys {
		val := d.vals[i]
		var err error
		switch key.s {
		case "messages":
			err = in.decodeMessages(val)
		case "tools":
			in.tools, err = normalizeTools(val)
		case "documents":
			in.documents, err = checkDocuments(val)
		case "add_generation_prompt":
			in.addGenerationPrompt, err = laxBool(val, "add_generation_prompt")
		case "continue_final_message":
			in.continueFinal, err = laxBool(val, "continue_final_message")
		case "add_special_tokens":
			in.addSpecialTokens, err = laxBool(val, "add_special_tokens")
		case "chat_template":
			in.ownTemplate = in.ownTemplate || namesTemplate(val)
		case "chat_template_kwargs":
			switch val.k {
			case kNone:
			case kDict:
				for j, k := range val.dict.keys {
					if k.s == "chat_template" {
						// vLLM takes it as the request's own template,
						// as the top-level field (_validate_chat_template).
						in.ownTemplate = in.ownTemplate || namesTemplate(val.dict.vals[j])
						continue
					}
					in.kwargs = append(in.kwargs, binding{k.s, val.dict.vals[j]})
				}
			default:
				err = invalid("chat_template_kwargs must be an object")
			}
		}
		if err != nil {
			return nil, err
		}
	}
	if in.messages == nil {
		return nil, invalid("messages is required")
	}
	if in.addGenerationPrompt && in.continueFinal {
		return nil, invalid("cannot set both continue_final_message and add_generation_prompt")
	}
	return in, nil
}

// namesTemplate reports whether a request's chat_template names a template
// of its own: vLLM renders request.chat_template or the model's, so null
// and "" are the model's.
func namesTemplate(v value) bool { return v.k != kNone && !(v.k == kStr && v.s == "") }

// laxBool accepts what pydantic's lax mode accepts for a bool.
func laxBool(v value, field string) (bool, error) {
	switch v.k {
	case kBool:
		return v.n != 0, nil
	case kInt:
		if v.n == 0 || v.n == 1 {
			return v.n == 1, nil
		}
	case kFloat:
		if v.f == 0 || v.f == 1 {
			return v.f == 1, nil
		}
	case kStr:
		switch strings.ToLower(v.s) {
		case "1", "on", "t", "true", "y", "yes":
			return true, nil
		case "0", "off", "f", "false", "n", "no":
			return false, nil
		}
	}
	return false, invalid("%s must be a boolean", field)
}

func checkDocuments(v value) (value, error) {
	switch v.k {
	case kNone:
		return none, nil
	case kList:
		for _, doc := range v.items() {
			if doc.k != kDict {
				return none, invalid("documents must be objects")
			}
			for _, x := range doc.dict.vals {
				if x.k != kStr {
					return none, invalid("document fields must be strings")
				}
			}
		}
		return v, nil
	}
	return none, invalid("documents must be an array")
}

// mediaModality maps a content part's type to the modality vLLM gives it.
var mediaModality = map[string]string{
	"image_url": "image", "input_image": "image", "image_pil": "image", "image_embeds": "image",
	"audio_url": "audio", "input_audio": "audio", "audio_embeds": "audio",
	"video_url": "video",
}

// textField maps a text-like part's type to the field holding its text.
var textField = map[string]string{
	"text": "text", "input_text": "text", "output_text": "text",
	"refusal": "refusal", "thinking": "thinking",
}

func (in *Input) decodeMessages(v value) error {
	if v.k != kList || len(v.items()) == 0 {
		return invalid("messages must be a non-empty array")
	}
	in.messages = make([]message, 0, len(v.items()))
	for i, mv := range v.items() {
		if mv.k != kDict {
			return invalid("messages[%d] is not an object", i)
		}
		d := mv.dict
		role, _ := d.getStr("role")
		if role.k != kStr {
			return invalid("messages[%d].role must be a string", i)
		}
		m := message{role: role.s, toolCalls: undefined, reasoning: undefined, toolCallID: undefined, name: undefined, task: undefined, tools: undefined}
		content, _ := d.getStr("content")
		switch content.k {
		case kUndefined, kNone:
		case kStr:
			m.parts = []part{{text: content.s}}
		case kList:
			for j, pv := range content.items() {
				p, skip, err := decodePart(pv)
				if err != nil {
					return invalid("messages[%d].content[%d]: %v", i, j, err)
				}
				if skip {
					continue
				}
				if p.modality != "" {
					in.hasMedia = true
				}
				m.parts = append(m.parts, p)
			}
		default:
			return invalid("messages[%d].content must be a string, an array or null", i)
		}
		if m.parts == nil {
			m.parts = []part{}
		}
		reasoning, _ := d.getStr("reasoning")
		if reasoning.k == kUndefined || reasoning.k == kNone {
			reasoning, _ = d.getStr("reasoning_content")
		}
		switch m.role {
		case "assistant":
			if calls, ok := d.getStr("tool_calls"); ok && calls.k != kNone {
				tc, err := normalizeToolCalls(calls)
				if err != nil {
					return invalid("messages[%d].tool_calls: %v", i, err)
				}
				m.toolCalls = tc
			}
			if reasoning.k != kUndefined && reasoning.k != kNone {
				m.reasoning = reasoning
			}
		case "tool":
			if id, ok := d.getStr("tool_call_id"); ok {
				m.toolCallID = id
			}
		case "developer":
			t, _ := d.getStr("tools")
			if t.k == kUndefined {
				t = none
			}
			m.tools = t
		}
		if name, _ := d.getStr("name"); name.k == kStr {
			m.name = name
		}
		if task, _ := d.getStr("task"); task.k == kStr {
			m.task = task
		}
		in.messages = append(in.messages, m)
	}
	return nil
}

func decodePart(v value) (p part, skip bool, err error) {
	if v.k == kStr {
		return part{text: v.s}, false, nil
	}
	if v.k != kDict {
		return part{}, false, errors.New("a content part must be an object or a string")
	}
	typ, _ := v.dict.getStr("type")
	if typ.k != kStr {
		return part{}, false, errors.New("a content part needs a string type")
	}
	if field, ok := textField[typ.s]; ok {
		text, _ := v.dict.getStr(field)
		if (text.k == kNone || text.k == kUndefined) && (typ.s == "text" || typ.s == "refusal") {
			return part{}, true, nil
		}
		if text.k != kStr {
			return part{}, false, fmt.Errorf("a %s part needs a string %s", typ.s, field)
		}
		return part{text: text.s}, false, nil
	}
	if mod, ok := mediaModality[typ.s]; ok {
		return part{modality: mod}, false, nil
	}
	return part{}, false, fmt.Errorf("unsupported content part type %q", typ.s)
}

// normalizeToolCalls keeps each call as vLLM hands it to the template: id,
// function {arguments, name}, type, with arguments decoded from their JSON
// string (to {} when they are not JSON, as vLLM does).
func normalizeToolCalls(v value) (value, error) {
	if v.k != kList {
		return undefined, errors.New("tool_calls must be an array")
	}
	if len(v.items()) == 0 {
		// vLLM drops an empty list so the template takes its plain path.
		return undefined, nil
	}
	out := make([]value, len(v.items()))
	for i, cv := range v.items() {
		if cv.k != kDict {
			return undefined, errors.New("a tool call must be an object")
		}
		fnv, _ := cv.dict.getStr("function")
		if fnv.k != kDict {
			return undefined, errors.New("a tool call needs a function object")
		}
		call := newDict(3)
		if id, ok := cv.dict.getStr("id"); ok {
			call.setStr("id", id)
		}
		fn := newDict(2)
		args, hasArgs := fnv.dict.getStr("arguments")
		if hasArgs {
			fn.setStr("arguments", args)
		}
		if name, ok := fnv.dict.getStr("name"); ok {
			fn.setStr("name", name)
		}
		switch args.k {
		case kStr:
			if parsed, ok := parseJSONText(args.s); ok {
				fn.setStr("arguments", parsed)
			} else {
				fn.setStr("arguments", dictValue(newDict(0)))
			}
		case kDict, kList:
		default:
			fn.setStr("arguments", dictValue(newDict(0)))
		}
		call.setStr("function", dictValue(fn))
		if typ, ok := cv.dict.getStr("type"); ok {
			call.setStr("type", typ)
		}
		out[i] = dictValue(call)
	}
	return listValue(out), nil
}

// normalizeTools dumps the tools as vLLM's request model dumps them:
// {"type": "function", "function": {"name", "description", "parameters",
// ...the function's other fields}}, absent description and parameters
// becoming null.
func normalizeTools(v value) (value, error) {
	switch v.k {
	case kNone:
		return none, nil
	case kList:
	default:
		return none, invalid("tools must be an array")
	}
	out := make([]value, len(v.items()))
	for i, tv := range v.items() {
		if tv.k != kDict {
			return none, invalid("tools[%d] is not an object", i)
		}
		if typ, ok := tv.dict.getStr("type"); ok && !(typ.k == kStr && typ.s == "function") {
			return none, invalid("tools[%d].type must be \"function\"", i)
		}
		fnv, _ := tv.dict.getStr("function")
		if fnv.k != kDict {
			return none, invalid("tools[%d].function must be an object", i)
		}
		name, _ := fnv.dict.getStr("name")
		if name.k != kStr {
			return none, invalid("tools[%d].function.name must be a string", i)
		}
		desc, _ := fnv.dict.getStr("description")
		if desc.k == kUndefined {
			desc = none
		} else if desc.k != kNone && desc.k != kStr {
			return none, invalid("tools[%d].function.description must be a string", i)
		}
		params, _ := fnv.dict.getStr("parameters")
		if params.k == kUndefined {
			params = none
		} else if params.k != kNone && params.k != kDict {
			return none, invalid("tools[%d].function.parameters must be an object", i)
		}
		fn := newDict(3)
		fn.setStr("name", name)
		fn.setStr("description", desc)
		fn.setStr("parameters", params)
		defer1, _ := fnv.dict.getStr("defer_loading")
		topDefer, _ := tv.dict.getStr("defer_loading")
		if defer1.k == kUndefined || defer1.k == kNone {
			defer1 = topDefer
		}
		if defer1.k != kUndefined && defer1.k != kNone {
			fn.setStr("defer_loading", defer1)
		}
		for j, k := range fnv.dict.keys {
			switch k.s {
			case "name", "description", "parameters", "defer_loading":
				continue
			}
			fn.set(k, fnv.dict.vals[j])
		}
		tool := newDict(2)
		tool.setStr("type", strValue("function"))
		tool.setStr("function", dictValue(fn))
		if topDefer.k != kUndefined && topDefer.k != kNone {
			tool.setStr("defer_loading", topDefer)
		}
		out[i] = dictValue(tool)
	}
	return listValue(out), nil
}

// contentFormat is how a template reads message content (vLLM's
// chat-template content format).
type contentFormat uint8

const (
	formatString contentFormat = iota // content is one string
	formatParts                       // content is a list of {"type": ...} parts
)

// conversation returns the messages as a template of format f sees them.
func (in *Input) conversation(f contentFormat) (value, error) {
	in.once[f].Do(func() { in.convert[f], in.convErr[f] = in.buildConversation(f) })
	return in.convert[f], in.convErr[f]
}

func (in *Input) buildConversation(f contentFormat) (value, error) {
	out := make([]value, len(in.messages))
	for i := range in.messages {
		m := &in.messages[i]
		d := newDict(4)
		d.setStr("role", strValue(m.role))
		content, err := m.content(f)
		if err != nil {
			return undefined, err
		}
		d.setStr("content", content)
		if m.toolCalls.k != kUndefined {
			d.setStr("tool_calls", m.toolCalls)
		}
		if m.reasoning.k != kUndefined {
			d.setStr("reasoning", m.reasoning)
			d.setStr("reasoning_content", m.reasoning)
		}
		if m.toolCallID.k != kUndefined {
			d.setStr("tool_call_id", m.toolCallID)
		}
		if m.name.k != kUndefined {
			d.setStr("name", m.name)
		}
		if m.task.k != kUndefined {
			d.setStr("task", m.task)
		}
		if m.tools.k != kUndefined {
			d.setStr("tools", m.tools)
		}
		out[i] = dictValue(d)
	}
	return listValue(out), nil
}

func (m *message) content(f contentFormat) (value, error) {
	if f == formatString {
		if len(m.parts) == 1 && m.parts[0].modality == "" {
			return strValue(m.parts[0].text), nil
		}
		var b strings.Builder
		for i, p := range m.parts {
			if p.modality != "" {
				return undefined, fmt.Errorf("%w: %s content in a template that prints content as a string", ErrUnsupported, p.modality)
			}
			if i > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(p.text)
		}
		return strValue(b.String()), nil
	}
	items := make([]value, len(m.parts))
	allText := true
	for i, p := range m.parts {
		d := newDict(2)
		if p.modality != "" {
			allText = false
			d.setStr("type", strValue(p.modality))
		} else {
			d.setStr("type", strValue("text"))
			d.setStr("text", strValue(p.text))
		}
		items[i] = dictValue(d)
	}
	if m.role == "tool" && allText {
		// vLLM flattens a tool result's text parts for the many templates
		// that print a tool result as a string.
		texts := make([]string, len(m.parts))
		for i, p := range m.parts {
			texts[i] = p.text
		}
		return strValue(strings.Join(texts, "\n")), nil
	}
	return listValue(items), nil
}
