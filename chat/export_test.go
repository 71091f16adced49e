package chat

import "time"

// SetNow pins strftime_now's clock, so that a rendering can be compared
// with the reference's.
func SetNow(t *Template, now time.Time) { t.now = func() time.Time { return now } }

// RenderVars renders t with the variables of the JSON object varsJSON,
// decoded as Python's json module decodes them, and nothing else: for
// comparing the Jinja2 semantics themselves with the reference.
func RenderVars(t *Template, varsJSON []byte) (string, error) {
	v, _, err := decodeJSON(varsJSON, 0, 0, true)
	if err != nil || v.k != kDict {
		return "", errJSON
	}
	g := &globals{}
	for i, k := range v.dict.keys {
		g.set(k.s, v.dict.vals[i])
	}
	out, err := t.execute(nil, g)
	return string(out), err
}

// AddGenerationPrompt reports the request's add_generation_prompt (vLLM's
// default: true).
func (in *Input) AddGenerationPrompt() bool { return in.addGenerationPrompt }

// ReadsContentAsParts reports vLLM's content format for this template:
// true when it loops over a message's content and so receives content as
// a list of {"type": ...} parts, false when it receives one string.
func (t *Template) ReadsContentAsParts() bool { return t.format == formatParts }
