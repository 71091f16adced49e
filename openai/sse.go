package openai

import (
	"bytes"

	"github.com/kvfast/kvfast/internal/jsonscan"
)

// EventKind is what routing makes of one server-sent event of an OpenAI
// stream.
type EventKind uint8

const (
	// EventOther is anything routing does not count: comments, keep-alives,
	// usage-only chunks, payloads that are not JSON objects.
	EventOther EventKind = iota
	// EventItem is a chunk carrying at least one choice: one step of
	// generation.
	EventItem
	// EventDone is the "data: [DONE]" sentinel that ends an OpenAI stream.
	EventDone
	// EventError is an error the engine reports in the stream, as
	// {"error":{…}}, {"object":"error",…} or an "event: error" field.
	EventError
)

func (k EventKind) String() string {
	switch k {
	case EventItem:
		return "item"
	case EventDone:
		return "done"
	case EventError:
		return "error"
	}
	return "other"
}

// Event is the routing view of one stream event or response body.
type Event struct {
	Kind EventKind
	// FinishReason is the first non-null choices[].finish_reason of an
	// item, which makes it the terminal item. It aliases the scanned bytes.
	FinishReason []byte
	// Finishes is how many of the item's choices carry a non-null
	// finish_reason: vLLM and SGLang send one choice per event, but an
	// engine may end several of a request's n choices in one.
	Finishes int
	// ErrorCode is an error's integer "code", where vLLM and SGLang put
	// the HTTP status of the failure ({"error":{…,"code":500}}, or vLLM's
	// older top-level {"object":"error",…,"code":400}); 0 when the error
	// has none (a string code, or an `event: error` line).
	ErrorCode int
}

// EventEnd scans b, the start of an event stream, for the blank line that
// ends its first event, and returns the length of that event, blank line
// included. Until the event is complete it returns -1 and where to resume:
// pass that back as lineStart once more bytes follow, so that no byte is
// scanned twice. lineStart is 0 for a fresh event; -1 says that b starts in
// the middle of a line (the rest of which therefore is not blank).
//
// Lines may end in "\n" or "\r\n"; a stream that ends lines in a bare "\r"
// never splits into events.
func EventEnd(b []byte, lineStart int) (end, resume int) {
	from := lineStart
	if from < 0 {
		from = 0
	}
	for {
		k := bytes.IndexByte(b[from:], '\n')
		if k < 0 {
			return -1, lineStart
		}
		nl := from + k
		if lineStart >= 0 && (nl == lineStart || (nl == lineStart+1 && b[lineStart] == '\r')) {
			return nl + 1, 0
		}
		lineStart = nl + 1
		from = lineStart
	}
}

var (
	fieldData  = []byte("data")
	fieldEvent = []byte("event")
	doneData   = []byte("[DONE]")
	errorWord  = []byte("error")
)

// ParseEvent classifies one complete event, as delimited by EventEnd. It
// reads the first data line only: OpenAI-compatible engines put each JSON
// chunk on one line. It never allocates.
func ParseEvent(ev []byte) Event {
	var data []byte
	hasData, isError := false, false
	for len(ev) > 0 {
		var line []byte
		if k := bytes.IndexByte(ev, '\n'); k >= 0 {
			line, ev = ev[:k], ev[k+1:]
		} else {
			line, ev = ev, nil
		}
		if n := len(line); n > 0 && line[n-1] == '\r' {
			line = line[:n-1]
		}
		if len(line) == 0 || line[0] == ':' {
			continue
		}
		name, value := line, []byte(nil)
		if k := bytes.IndexByte(line, ':'); k >= 0 {
			name, value = line[:k], line[k+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		switch {
		case bytes.Equal(name, fieldData):
			if !hasData {
				data, hasData = value, true
			}
		case bytes.Equal(name, fieldEvent):
			isError = isError || bytes.Equal(value, errorWord)
		}
	}
	switch {
	case isError:
		return Event{Kind: EventError}
	case !hasData:
		return Event{}
	case bytes.Equal(data, doneData):
		return Event{Kind: EventDone}
	}
	return ParseResponse(data)
}

var (
	keyCode         = []byte("code")
	keyError        = []byte("error")
	keyObject       = []byte("object")
	keyChoices      = []byte("choices")
	keyFinishReason = []byte("finish_reason")
)

// ParseResponse classifies an OpenAI response object: a whole
// non-streaming response body, or the JSON payload of one stream event. It
// reads the three things routing needs: is it an error, does it carry
// choices, and the first non-null finish_reason. Every key and value it
// passes over must be JSON, or the payload is EventOther; what follows the
// last field it could read is left to the engine and the client to judge.
// It never allocates.
func ParseResponse(b []byte) Event {
	i := jsonscan.SkipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return Event{}
	}
	var ev Event
	choices, topCode := 0, 0
	i = jsonscan.SkipSpace(b, i+1)
	for i < len(b) && b[i] == '"' {
		ks := i + 1
		i, _ = jsonscan.ScanString(b, i)
		if i < 0 {
			return Event{}
		}
		key := b[ks : i-1]
		if i = jsonscan.SkipSpace(b, i); i >= len(b) || b[i] != ':' {
			return Event{}
		}
		i = jsonscan.SkipSpace(b, i+1)
		if i >= len(b) {
			return Event{}
		}
		vs := i
		switch {
		case bytes.Equal(key, keyError):
			if b[i] != 'n' { // anything but null
				ev.Kind = EventError
				if b[i] == '{' {
					ev.ErrorCode = objectCode(b, i)
				}
			}
		case bytes.Equal(key, keyCode):
			topCode = intAt(b, i)
		case bytes.Equal(key, keyObject):
			if b[i] == '"' && bytes.HasPrefix(b[i+1:], []byte(`error"`)) {
				ev.Kind = EventError
			}
		case bytes.Equal(key, keyChoices) && b[i] == '[':
			var reason []byte
			var finishes int
			choices, reason, finishes, i = scanChoices(b, i)
			if i < 0 {
				return Event{}
			}
			if ev.FinishReason == nil {
				ev.FinishReason, ev.Finishes = reason, finishes
			}
		}
		if i == vs {
			if i = jsonscan.SkipValue(b, i, 1); i < 0 {
				return Event{}
			}
		}
		if i = jsonscan.SkipSpace(b, i); i < len(b) && b[i] == ',' {
			i = jsonscan.SkipSpace(b, i+1)
		}
	}
	switch {
	case ev.Kind == EventError:
		ev.FinishReason, ev.Finishes = nil, 0
		if ev.ErrorCode == 0 {
			ev.ErrorCode = topCode
		}
	case choices > 0:
		ev.Kind = EventItem
	default:
		ev.FinishReason, ev.Finishes = nil, 0
	}
	return ev
}

// objectCode returns the integer "code" of the object at b[i] == '{', or
// 0 when it has none or is not JSON.
func objectCode(b []byte, i int) int {
	i = jsonscan.SkipSpace(b, i+1)
	for i < len(b) && b[i] == '"' {
		ks := i + 1
		if i, _ = jsonscan.ScanString(b, i); i < 0 {
			return 0
		}
		key := b[ks : i-1]
		if i = jsonscan.SkipSpace(b, i); i >= len(b) || b[i] != ':' {
			return 0
		}
		if i = jsonscan.SkipSpace(b, i+1); i >= len(b) {
			return 0
		}
		if bytes.Equal(key, keyCode) {
			return intAt(b, i)
		}
		if i = jsonscan.SkipValue(b, i, 2); i < 0 {
			return 0
		}
		if i = jsonscan.SkipSpace(b, i); i < len(b) && b[i] == ',' {
			i = jsonscan.SkipSpace(b, i+1)
		}
	}
	return 0
}

// intAt returns the JSON number at b[i] when it is a small non-negative
// integer (an HTTP status), else 0.
func intAt(b []byte, i int) int {
	n, end := 0, i
	for end < len(b) && end-i < 4 && b[end] >= '0' && b[end] <= '9' {
		n = n*10 + int(b[end]-'0')
		end++
	}
	if end == i || (end < len(b) && (b[end] == '.' || b[end] == 'e' || b[end] == 'E' || (b[end] >= '0' && b[end] <= '9'))) {
		return 0
	}
	return n
}

// scanChoices counts the elements of the choices array at b[i] == '[' and
// those with a string finish_reason, and returns the first such reason and
// the index after the array, or -1.
func scanChoices(b []byte, i int) (n int, reason []byte, finishes int, end int) {
	i = jsonscan.SkipSpace(b, i+1)
	for i < len(b) && b[i] != ']' {
		n++
		if b[i] == '{' {
			var r []byte
			if r, i = choiceReason(b, i); r != nil {
				finishes++
			}
			if reason == nil {
				reason = r
			}
		} else {
			i = jsonscan.SkipValue(b, i, 2)
		}
		if i < 0 {
			return n, reason, finishes, -1
		}
		if i = jsonscan.SkipSpace(b, i); i < len(b) && b[i] == ',' {
			i = jsonscan.SkipSpace(b, i+1)
		} else if i >= len(b) || b[i] != ']' {
			return n, reason, finishes, -1
		}
	}
	if i >= len(b) {
		return n, reason, finishes, -1
	}
	return n, reason, finishes, i + 1
}

// choiceReason walks the choice object at b[i] == '{' and returns the raw
// contents of its finish_reason, nil unless the first such key holds a
// string, and the index after the object, or -1.
func choiceReason(b []byte, i int) (reason []byte, end int) {
	seen := false
	i = jsonscan.SkipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return nil, i + 1
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return nil, -1
		}
		ks := i + 1
		if i, _ = jsonscan.ScanString(b, i); i < 0 {
			return nil, -1
		}
		key := b[ks : i-1]
		if i = jsonscan.SkipSpace(b, i); i >= len(b) || b[i] != ':' {
			return nil, -1
		}
		vs := jsonscan.SkipSpace(b, i+1)
		if i = jsonscan.SkipValue(b, vs, 3); i < 0 {
			return nil, -1
		}
		if !seen && bytes.Equal(key, keyFinishReason) {
			seen = true
			if b[vs] == '"' && i-1 > vs+1 {
				// An empty string is no reason: some servers send "" for
				// null, and a choice still generating must not read as
				// finished.
				reason = b[vs+1 : i-1]
			}
		}
		if i = jsonscan.SkipSpace(b, i); i >= len(b) {
			return nil, -1
		}
		switch b[i] {
		case ',':
			i = jsonscan.SkipSpace(b, i+1)
		case '}':
			return reason, i + 1
		default:
			return nil, -1
		}
	}
}
