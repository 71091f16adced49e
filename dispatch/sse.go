package dispatch

import "bytes"

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

// Event is the routing view of one event.
type Event struct {
	Kind EventKind
	// FinishReason is the first non-null choices[].finish_reason of an
	// item, which makes it the terminal item. It aliases the scanned bytes.
	FinishReason []byte
}

// EventEnd returns the length of the first complete event in b, its
// terminating blank line included, or -1 if b holds no complete event yet.
//
// Lines may end in "\n" or "\r\n"; a stream that ends lines in a bare "\r"
// is relayed all the same but never splits into events.
func EventEnd(b []byte) int {
	end, _ := eventEnd(b, 0)
	return end
}

// eventEnd scans b for the blank line that ends an event, resuming at
// lineStart, the start of the first line not yet known to be complete (0 at
// first; -1 for a line that began before b and so is not blank). It returns
// the end of the event, or -1 and where to resume once more bytes arrive.
func eventEnd(b []byte, lineStart int) (end, resume int) {
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
	return classifyJSON(data)
}

var (
	keyError        = []byte("error")
	keyObject       = []byte("object")
	keyChoices      = []byte("choices")
	keyFinishReason = []byte("finish_reason")
)

// classifyJSON reads an OpenAI chunk or response object for the three things
// routing needs: is it an error, how many choices does it carry, and the
// first non-null finish_reason. The walk is lenient: it trusts the engine
// to send JSON and only guards against reading out of bounds, so a garbled
// payload is classified as EventOther, never trusted further.
func classifyJSON(b []byte) Event {
	i := ws(b, 0)
	if i >= len(b) || b[i] != '{' {
		return Event{}
	}
	var ev Event
	choices := 0
	i = ws(b, i+1)
	for i < len(b) && b[i] == '"' {
		ks := i + 1
		i = skipString(b, i)
		if i < 0 {
			return Event{}
		}
		key := b[ks : i-1]
		if i = ws(b, i); i >= len(b) || b[i] != ':' {
			return Event{}
		}
		i = ws(b, i+1)
		if i >= len(b) {
			return Event{}
		}
		vs := i
		switch {
		case bytes.Equal(key, keyError):
			if b[i] != 'n' { // anything but null
				ev.Kind = EventError
			}
		case bytes.Equal(key, keyObject):
			if b[i] == '"' && bytes.HasPrefix(b[i+1:], []byte(`error"`)) {
				ev.Kind = EventError
			}
		case bytes.Equal(key, keyChoices) && b[i] == '[':
			var reason []byte
			choices, reason, i = scanChoices(b, i)
			if i < 0 {
				return Event{}
			}
			if ev.FinishReason == nil {
				ev.FinishReason = reason
			}
		}
		if i == vs {
			if i = skipJSON(b, i); i < 0 {
				return Event{}
			}
		}
		if i = ws(b, i); i < len(b) && b[i] == ',' {
			i = ws(b, i+1)
		}
	}
	switch {
	case ev.Kind == EventError:
		ev.FinishReason = nil
	case choices > 0:
		ev.Kind = EventItem
	default:
		ev.FinishReason = nil
	}
	return ev
}

// scanChoices counts the elements of the choices array at b[i] == '[' and
// returns the first string finish_reason among them and the index after the
// array, or -1.
func scanChoices(b []byte, i int) (n int, reason []byte, end int) {
	i = ws(b, i+1)
	for i < len(b) && b[i] != ']' {
		n++
		if b[i] == '{' {
			if r := objectString(b, i, keyFinishReason); r != nil && reason == nil {
				reason = r
			}
		}
		if i = skipJSON(b, i); i < 0 {
			return n, reason, -1
		}
		if i = ws(b, i); i < len(b) && b[i] == ',' {
			i = ws(b, i+1)
		} else if i >= len(b) || b[i] != ']' {
			return n, reason, -1
		}
	}
	if i >= len(b) {
		return n, reason, -1
	}
	return n, reason, i + 1
}

// objectString returns the raw contents of the string value of key in the
// object at b[i] == '{', or nil if it is absent or not a string.
func objectString(b []byte, i int, key []byte) []byte {
	i = ws(b, i+1)
	for i < len(b) && b[i] == '"' {
		ks := i + 1
		if i = skipString(b, i); i < 0 {
			return nil
		}
		k := b[ks : i-1]
		if i = ws(b, i); i >= len(b) || b[i] != ':' {
			return nil
		}
		i = ws(b, i+1)
		if i >= len(b) {
			return nil
		}
		if bytes.Equal(k, key) {
			if b[i] != '"' {
				return nil
			}
			end := skipString(b, i)
			if end < 0 {
				return nil
			}
			return b[i+1 : end-1]
		}
		if i = skipJSON(b, i); i < 0 {
			return nil
		}
		if i = ws(b, i); i < len(b) && b[i] == ',' {
			i = ws(b, i+1)
		}
	}
	return nil
}

func ws(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string at b[i] == '"', or -1.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '"':
			return i + 1
		case '\\':
			i++ // the escaped byte can be neither the end nor another escape
		}
	}
	return -1
}

// skipJSON returns the index after the value at b[i], or -1. Containers are
// skipped by bracket counting outside strings, which is all a lenient
// reader needs.
func skipJSON(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				if i = skipString(b, i); i < 0 {
					return -1
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return -1
	}
	start := i
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			if i == start {
				return -1 // no value here
			}
			return i
		}
		i++
	}
	return i
}
