package mocker

import "strconv"

// The response writers append vLLM-shaped JSON to a caller's buffer. Only
// the model name and error messages come from outside: the model name is
// quoted by jsonscan.AppendQuoted, errors are openai.Error bodies; generated
// words are plain ASCII.

// respHead is what every body or chunk of one response repeats.
type respHead struct {
	id      string // "cmpl-..." or "chatcmpl-..."
	created int64
	model   []byte // JSON-quoted
	chat    bool
}

func (h *respHead) appendHead(b []byte, object string) []byte {
	b = append(b, `{"id":"`...)
	b = append(b, h.id...)
	b = append(b, `","object":"`...)
	b = append(b, object...)
	b = append(b, `","created":`...)
	b = strconv.AppendInt(b, h.created, 10)
	b = append(b, `,"model":`...)
	return append(b, h.model...)
}

func appendUsage(b []byte, prompt, completion, cached int) []byte {
	b = append(b, `"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt+completion), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(completion), 10)
	b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
	b = strconv.AppendInt(b, int64(max(cached, 0)), 10)
	return append(b, `}}`...)
}

// appendText appends the generated words [from, to) of a reply, each with a
// leading space, as the inside of a JSON string.
func appendText(b []byte, seed uint64, from, to int) []byte {
	for i := from; i < to; i++ {
		b = append(b, ' ')
		b = append(b, outputText(seed, i)...)
	}
	return b
}

// appendFull is a non-streaming response body.
func (h *respHead) appendFull(b []byte, seed uint64, prompt, completion, cached int, finish string) []byte {
	if h.chat {
		b = h.appendHead(b, "chat.completion")
		b = append(b, `,"choices":[{"index":0,"message":{"role":"assistant","content":"`...)
		b = appendText(b, seed, 0, completion)
		b = append(b, `","tool_calls":[]},"logprobs":null,"finish_reason":"`...)
	} else {
		b = h.appendHead(b, "text_completion")
		b = append(b, `,"choices":[{"index":0,"text":"`...)
		b = appendText(b, seed, 0, completion)
		b = append(b, `","logprobs":null,"finish_reason":"`...)
	}
	b = append(b, finish...)
	b = append(b, `","stop_reason":null}],`...)
	b = appendUsage(b, prompt, completion, cached)
	return append(b, '}')
}

// appendChunk is one SSE event carrying generated token i. finish is ""
// except on the last token. usage is appended when withUsage (vLLM's
// continuous_usage_stats).
func (h *respHead) appendChunk(b []byte, seed uint64, i int, finish string, withUsage bool, prompt, cached int) []byte {
	b = append(b, "data: "...)
	if h.chat {
		b = h.appendHead(b, "chat.completion.chunk")
		b = append(b, `,"choices":[{"index":0,"delta":{`...)
		if i == 0 {
			b = append(b, `"role":"assistant",`...)
		}
		b = append(b, `"content":"`...)
		b = appendText(b, seed, i, i+1)
		b = append(b, `"},"logprobs":null,"finish_reason":`...)
	} else {
		b = h.appendHead(b, "text_completion")
		b = append(b, `,"choices":[{"index":0,"text":"`...)
		b = appendText(b, seed, i, i+1)
		b = append(b, `","logprobs":null,"finish_reason":`...)
	}
	if finish == "" {
		b = append(b, `null,"stop_reason":null}]`...)
	} else {
		b = append(b, '"')
		b = append(b, finish...)
		b = append(b, `","stop_reason":null}]`...)
	}
	if withUsage {
		b = append(b, ',')
		b = appendUsage(b, prompt, i+1, cached)
	}
	return append(b, "}\n\n"...)
}

// appendUsageChunk is the final usage-only event of include_usage.
func (h *respHead) appendUsageChunk(b []byte, prompt, completion, cached int) []byte {
	b = append(b, "data: "...)
	object := "text_completion"
	if h.chat {
		object = "chat.completion.chunk"
	}
	b = h.appendHead(b, object)
	b = append(b, `,"choices":[],`...)
	b = appendUsage(b, prompt, completion, cached)
	return append(b, "}\n\n"...)
}

const sseDone = "data: [DONE]\n\n"
