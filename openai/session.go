package openai

import "github.com/kvfast/kvfast/internal/jsonscan"

// SessionControl is what a request's session_control field asks of the
// engine's session lifecycle (SGLang's open_session and close_session):
//
//	"session_control": {"open": {"capacity_of_str_len": 65536, "timeout": 600}}
//	"session_control": {"open": true}
//	"session_control": {"close": true}
//
// The router acts on it and forwards the body unchanged.
type SessionControl struct {
	// Open asks the router to open the session on the chosen worker
	// before dispatch. OpenParams is the open value when it is an object
	// (aliasing the body), nil for true.
	Open       bool
	OpenParams []byte
	// Close asks the router to close the session once this request's
	// stream has ended and its booking is freed.
	Close bool
}

// ErrSessionControlType refuses a session_control that is not an object
// of booleans or, for open, an object of parameters.
var ErrSessionControlType = badRequest("session_control", "invalid_type",
	`session_control must be an object: {"open": true | {...}} or {"close": true}`)

// sessionControl parses the value at b[i] of session_control: null, or an
// object whose open is a boolean, null or object and whose close is a
// boolean or null. Other keys are validated and ignored.
func (p *parser) sessionControl(i int) int {
	b := p.b
	sc := &p.r.Session
	*sc = SessionControl{}
	p.errs[fSessionControl] = nil
	switch b[i] {
	case 'n':
		return jsonscan.ScanLiteral(b, i, "null")
	case '{':
	default:
		p.errs[fSessionControl] = ErrSessionControlType
		return jsonscan.SkipValue(b, i, 1)
	}
	// Engines keep the last of duplicate keys: so does each key's verdict.
	var openBad, closeBad bool
	var kb [16]byte
	i = jsonscan.SkipSpace(b, i+1)
	for i < len(b) && b[i] != '}' {
		if b[i] != '"' {
			return -1
		}
		end, escaped := jsonscan.ScanString(b, i)
		if end < 0 {
			return -1
		}
		key := b[i+1 : end-1]
		if escaped {
			// Only short keys matter; a longer one decodes to no key we read.
			if len(key) <= len(kb) {
				key = jsonscan.AppendUnescaped(kb[:0], key)
			} else {
				key = nil
			}
		}
		i = jsonscan.SkipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return -1
		}
		i = jsonscan.SkipSpace(b, i+1)
		if i >= len(b) {
			return -1
		}
		start := i
		if i = jsonscan.SkipValue(b, i, 2); i < 0 {
			return -1
		}
		v := b[start:i]
		switch string(key) {
		case "open":
			sc.Open, sc.OpenParams, openBad = false, nil, false
			switch v[0] {
			case 't':
				sc.Open = true
			case '{':
				sc.Open, sc.OpenParams = true, v
			case 'f', 'n':
			default:
				openBad = true
			}
		case "close":
			sc.Close, closeBad = false, false
			switch v[0] {
			case 't':
				sc.Close = true
			case 'f', 'n':
			default:
				closeBad = true
			}
		}
		i = jsonscan.SkipSpace(b, i)
		if i >= len(b) {
			return -1
		}
		switch b[i] {
		case ',':
			i = jsonscan.SkipSpace(b, i+1)
			if i < len(b) && b[i] == '}' {
				return -1 // a trailing comma
			}
		case '}':
		default:
			return -1
		}
	}
	if i >= len(b) {
		return -1
	}
	if openBad || closeBad {
		*sc = SessionControl{}
		p.errs[fSessionControl] = ErrSessionControlType
	}
	return i + 1
}
