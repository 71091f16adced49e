package replay

import (
	"encoding/json"
	"strconv"
)

// requestBody writes /v1/completions and /v1/chat/completions request
// bodies. The fixed part is rendered once; per request only max_tokens and
// the prompt or messages are appended, into a buffer the caller reuses,
// because a Mooncake prompt is tens of thousands of token ids (or words)
// and encoding/json would box and reflect over each.
type requestBody struct {
	head []byte // `{"model":...,"max_tokens":`
}

// newRequestBody renders the fields every request shares. stream_options
// asks for the final usage chunk that carries cached_tokens; ignore_eos
// makes vLLM-compatible engines generate exactly max_tokens, as the trace
// recorded. Both APIs take them all.
func newRequestBody(model string) requestBody {
	m, _ := json.Marshal(model) // a Go string always marshals
	head := []byte(`{"model":`)
	head = append(head, m...)
	head = append(head, `,"stream":true,"stream_options":{"include_usage":true},"ignore_eos":true,"max_tokens":`...)
	return requestBody{head: head}
}

// appendBody appends one complete completions body to dst.
func (c requestBody) appendBody(dst []byte, prompt []uint32, maxTokens int) []byte {
	dst = append(dst, c.head...)
	dst = strconv.AppendInt(dst, int64(maxTokens), 10)
	dst = append(dst, `,"prompt":[`...)
	for i, tok := range prompt {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(tok), 10)
	}
	return append(dst, "]}"...)
}

// appendChat appends one complete chat body to dst: rec's conversation.
func (c requestBody) appendChat(dst []byte, s ChatSynth, rec *Record, maxTokens int) []byte {
	dst = append(dst, c.head...)
	dst = strconv.AppendInt(dst, int64(maxTokens), 10)
	dst = append(dst, `,"messages":`...)
	dst = s.appendMessages(dst, rec)
	return append(dst, '}')
}
