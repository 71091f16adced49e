package prompt

import (
	"github.com/kvfast/kvfast/internal/jsonscan"
	"github.com/kvfast/kvfast/openai"
)

// The engines' render and tokenize endpoints, as of the sources cited.
//
// vLLM (github.com/vllm-project/vllm):
//   - POST /v1/chat/completions/render takes a ChatCompletionRequest, the
//     very body a client posts to /v1/chat/completions, and answers one
//     GenerateRequest object whose "token_ids" are the prompt ids the
//     engine would compute (and "features", the multimodal inputs'
//     hashes and placeholder ranges, when there are images: see
//     multimodal.go); POST /v1/completions/render takes a
//     CompletionRequest and answers a list of GenerateRequest, one per
//     prompt. vllm/entrypoints/serve/render/api_router.py @1c608d646e4c,
//     vllm/entrypoints/serve/render/serving.py @0001948bc769,
//     vllm/entrypoints/serve/disagg/protocol.py @06408932946d.
//   - POST /tokenize takes {"model","prompt","add_special_tokens"
//     (default true)} or {"model","messages","add_generation_prompt"
//     (default true),"continue_final_message","add_special_tokens"
//     (default false),"chat_template","chat_template_kwargs","tools",
//     "mm_processor_kwargs","media_io_kwargs"} and answers {"count",
//     "max_model_len","tokens","token_strs"}.
//     vllm/entrypoints/serve/tokenize/protocol.py @030ea52effcb,
//     vllm/entrypoints/serve/tokenize/api_router.py @045d7575500e.
//     Unknown fields are accepted but logged on every request, which is
//     why the body is built from the prompt-shaping fields only.
//
// SGLang (github.com/sgl-project/sglang) has no render endpoint. POST
// /tokenize (and /v1/tokenize) takes {"model","prompt" (a string or a
// list of them),"add_special_tokens" (default true)} and answers
// {"tokens","count","max_model_len"}: python/sglang/srt/entrypoints/
// http_server.py @0025436eab05, openai/serving_tokenize.py @0351c1fafe4c.
// Releases of that vintage tokenize text only, so a chat request sent there
// is refused (outcome rejected) and routes approximately.

// Paths of the endpoints a Remote calls.
const (
	pathRenderCompletions = "/v1/completions/render"
	pathRenderChat        = "/v1/chat/completions/render"
	pathTokenize          = "/tokenize"
)

// chatTokenizeFields are the chat request fields that shape the prompt,
// copied into a /tokenize body as the client sent them.
var chatTokenizeFields = []string{"model", "messages", "tools", "add_generation_prompt", "continue_final_message",
	"add_special_tokens", "chat_template", "chat_template_kwargs", "mm_processor_kwargs", "media_io_kwargs"}

// completionTokenizeFields are the completions fields copied; the prompt is
// written from the parsed request, since /tokenize takes only a string.
var completionTokenizeFields = []string{"model", "add_special_tokens"}

// appendTokenizeBody appends to dst the /tokenize body for the text or chat
// prompt of body, which r is the parse of (so body is known to be a valid
// JSON object).
func appendTokenizeBody(dst, body []byte, api openai.API, r *openai.ParsedRequest) []byte {
	fields := completionTokenizeFields
	if api == openai.APIChatCompletions {
		fields = chatTokenizeFields
	}
	dst = append(dst, '{')
	n := 0
	i := jsonscan.SkipSpace(body, 0) + 1
	var kb [maxEscapedKey]byte
	for {
		key, val, next := nextField(body, i, &kb)
		if next < 0 {
			break
		}
		i = next
		for _, f := range fields {
			if string(key) == f {
				if n > 0 {
					dst = append(dst, ',')
				}
				n++
				dst = append(dst, '"')
				dst = append(dst, f...)
				dst = append(dst, `":`...)
				dst = append(dst, val...)
				break
			}
		}
	}
	if api != openai.APIChatCompletions {
		if n > 0 {
			dst = append(dst, ',')
		}
		// r.Text is the string's contents as the body escaped them, so it
		// is valid between quotes as it is.
		dst = append(dst, `"prompt":"`...)
		dst = append(dst, r.Text...)
		dst = append(dst, '"')
	}
	return append(dst, '}')
}

// maxEscapedKey is the longest escaped key decoded for comparison; no
// field the endpoints name is longer, so a longer key matches none.
const maxEscapedKey = 64

// unescapedKey returns a key's raw bytes, decoded into buf when escaped
// (nil if it does not fit).
func unescapedKey(raw []byte, escaped bool, buf *[maxEscapedKey]byte) []byte {
	if !escaped {
		return raw
	}
	if len(raw) > len(buf) { // decoding never lengthens a string
		return nil
	}
	return jsonscan.AppendUnescaped(buf[:0], raw)
}

// nextField reads the member of a JSON object starting at or after b[i] (i
// just past '{' or a member), known to be valid, and returns its key
// (decoded into buf if escaped), its raw value and the index after it, or
// next < 0 at the end of the object or on malformed input.
func nextField(b []byte, i int, buf *[maxEscapedKey]byte) (key, val []byte, next int) {
	i = jsonscan.SkipSpace(b, i)
	if i < len(b) && b[i] == ',' {
		i = jsonscan.SkipSpace(b, i+1)
	}
	if i >= len(b) || b[i] != '"' {
		return nil, nil, -1
	}
	end, escaped := jsonscan.ScanString(b, i)
	if end < 0 {
		return nil, nil, -1
	}
	key = unescapedKey(b[i+1:end-1], escaped, buf)
	i = jsonscan.SkipSpace(b, end)
	if i >= len(b) || b[i] != ':' {
		return nil, nil, -1
	}
	i = jsonscan.SkipSpace(b, i+1)
	vend := jsonscan.SkipValue(b, i, 1)
	if vend < 0 {
		return nil, nil, -1
	}
	return key, b[i:vend], vend
}

// responseShape says where an endpoint's answer keeps the token ids.
type responseShape uint8

const (
	shapeObject responseShape = iota // {"<key>": [...], ...}
	shapeList                        // [{"<key>": [...], ...}]: one element per prompt, and there is one
)

// tokenArray finds the raw token-id array of an engine's answer: the value
// of key in the top-level object, or in the only element of the top-level
// list. Every other value is validated and skipped; the last duplicate of
// key wins, as in the engines' own JSON readers.
func tokenArray(b []byte, shape responseShape, key string) ([]byte, bool) {
	found, _, ok := topValues(b, shape, key, "")
	return found, ok
}

// topValues is tokenArray that also returns the value of a second key,
// other (nil when absent or other is ""), from the same scan.
func topValues(b []byte, shape responseShape, key, other string) (found, otherVal []byte, ok bool) {
	i := jsonscan.SkipSpace(b, 0)
	if shape == shapeList {
		if i >= len(b) || b[i] != '[' {
			return nil, nil, false
		}
		i = jsonscan.SkipSpace(b, i+1)
	}
	if i >= len(b) || b[i] != '{' {
		return nil, nil, false
	}
	depth := 1 + int(shape)
	var kb [maxEscapedKey]byte
	i = jsonscan.SkipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		i++
	} else {
		for {
			if i >= len(b) || b[i] != '"' {
				return nil, nil, false
			}
			end, escaped := jsonscan.ScanString(b, i)
			if end < 0 {
				return nil, nil, false
			}
			k := unescapedKey(b[i+1:end-1], escaped, &kb)
			i = jsonscan.SkipSpace(b, end)
			if i >= len(b) || b[i] != ':' {
				return nil, nil, false
			}
			i = jsonscan.SkipSpace(b, i+1)
			vend := jsonscan.SkipValue(b, i, depth)
			if vend < 0 {
				return nil, nil, false
			}
			switch {
			case string(k) == key:
				found = b[i:vend]
			case other != "" && string(k) == other:
				otherVal = b[i:vend]
			}
			i = jsonscan.SkipSpace(b, vend)
			if i >= len(b) {
				return nil, nil, false
			}
			if b[i] == '}' {
				i++
				break
			}
			if b[i] != ',' {
				return nil, nil, false
			}
			i = jsonscan.SkipSpace(b, i+1)
		}
	}
	if shape == shapeList {
		i = jsonscan.SkipSpace(b, i)
		if i >= len(b) || b[i] != ']' { // a second element: a batch, not one prompt
			return nil, nil, false
		}
		i++
	}
	if jsonscan.SkipSpace(b, i) != len(b) {
		return nil, nil, false
	}
	return found, otherVal, found != nil
}
