package mocker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
)

// apiRequest is what the engine needs from a completions or chat body.
type apiRequest struct {
	chat            bool
	model           string
	tokens          []uint32
	maxTokens       int // -1: not set
	stream          bool
	includeUsage    bool // stream_options.include_usage
	continuousUsage bool // stream_options.continuous_usage_stats (vLLM)
}

// apiError is an error answered with an OpenAI-style JSON body.
type apiError struct {
	status  int
	message string
	typ     string
	param   string // "" for null
	code    string // "" for null
}

func (e *apiError) Error() string { return e.message }

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{status: 400, message: fmt.Sprintf(format, args...), typ: "invalid_request_error", param: param}
}

type wireRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []wireMessage   `json:"messages"`
	MaxTokens           *int64          `json:"max_tokens"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	N                   *int64          `json:"n"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage         bool `json:"include_usage"`
		ContinuousUsageStats bool `json:"continuous_usage_stats"`
	} `json:"stream_options"`
}

type wireMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type wirePart struct {
	Type string  `json:"type"`
	Text *string `json:"text"`
}

// parseRequest decodes a /v1/completions (chat false) or
// /v1/chat/completions (chat true) body. Fields the mock engine does not
// simulate (temperature, stop, logprobs, ...) are accepted and ignored, as
// vLLM ignores unknown ones.
func parseRequest(body []byte, chat bool, dst *apiRequest) *apiError {
	*dst = apiRequest{chat: chat, tokens: dst.tokens[:0], maxTokens: -1}
	var w wireRequest
	if err := json.Unmarshal(body, &w); err != nil {
		return badRequest("", "cannot parse request body: %v", err)
	}
	dst.model = w.Model
	dst.stream = w.Stream
	if w.StreamOptions != nil {
		if !w.Stream {
			return badRequest("stream_options", "stream_options is only allowed when stream is true")
		}
		dst.includeUsage = w.StreamOptions.IncludeUsage
		dst.continuousUsage = w.StreamOptions.ContinuousUsageStats
	}
	if w.N != nil && *w.N != 1 {
		return badRequest("n", "n must be 1: the mock engine generates one choice per request")
	}
	mt, param := w.MaxTokens, "max_tokens"
	if chat && w.MaxCompletionTokens != nil {
		mt, param = w.MaxCompletionTokens, "max_completion_tokens"
	}
	if mt != nil {
		if *mt < 1 || *mt > math.MaxInt32 {
			return badRequest(param, "%s must be at least 1, got %d", param, *mt)
		}
		dst.maxTokens = int(*mt)
	}

	var err *apiError
	if chat {
		if len(w.Prompt) > 0 {
			return badRequest("prompt", "chat completions take messages, not prompt")
		}
		dst.tokens, err = chatTokens(dst.tokens, w.Messages)
	} else {
		if w.Messages != nil {
			return badRequest("messages", "completions take prompt, not messages")
		}
		dst.tokens, err = promptTokens(dst.tokens, w.Prompt, true)
	}
	if err != nil {
		return err
	}
	if len(dst.tokens) == 0 {
		p := "prompt"
		if chat {
			p = "messages"
		}
		return badRequest(p, "the prompt is empty")
	}
	return nil
}

// promptTokens decodes a completions prompt: a string, an array of token
// ids, or a one-element array holding either (a batch of one).
func promptTokens(dst []uint32, raw json.RawMessage, allowBatch bool) ([]uint32, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return dst, badRequest("prompt", "prompt is required")
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return dst, badRequest("prompt", "cannot parse prompt: %v", err)
		}
		return AppendTextTokens(dst, s), nil
	case '[':
		inner := bytes.TrimLeft(raw[1:], " \t\r\n")
		if len(inner) == 0 || inner[0] == ']' {
			return dst, badRequest("prompt", "the prompt is empty")
		}
		if inner[0] == '"' || inner[0] == '[' {
			if !allowBatch {
				return dst, badRequest("prompt", "prompt must be a string or an array of token ids")
			}
			var batch []json.RawMessage
			if err := json.Unmarshal(raw, &batch); err != nil {
				return dst, badRequest("prompt", "cannot parse prompt: %v", err)
			}
			if len(batch) != 1 {
				return dst, badRequest("prompt", "batched prompts are not supported: got %d prompts, send one per request", len(batch))
			}
			return promptTokens(dst, batch[0], false)
		}
		return appendTokenArray(dst, raw)
	}
	return dst, badRequest("prompt", "prompt must be a string or an array of token ids")
}

// appendTokenArray parses a JSON array of non-negative integers below 2^32
// without reflection: token-id prompts are the bulk of the mock engine's
// input, tens of thousands of ids per request.
func appendTokenArray(dst []uint32, raw []byte) ([]uint32, *apiError) {
	if n := bytes.Count(raw, []byte{','}) + 1; cap(dst)-len(dst) < n {
		dst = append(make([]uint32, 0, len(dst)+n), dst...)
	}
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return dst, badRequest("prompt", "prompt must be a string or an array of token ids")
	}
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == ']' {
		return dst, badRequest("prompt", "the prompt is empty")
	}
	for {
		if i >= len(raw) {
			return dst, badRequest("prompt", "cannot parse prompt: unexpected end of array")
		}
		if raw[i] == '-' {
			return dst, badRequest("prompt", "token ids must not be negative")
		}
		start := i
		var v uint64
		for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' {
			v = v*10 + uint64(raw[i]-'0')
			if v > math.MaxUint32 {
				return dst, badRequest("prompt", "token id at offset %d exceeds 2^32-1", start)
			}
			i++
		}
		if i == start {
			return dst, badRequest("prompt", "prompt arrays must hold only token ids")
		}
		if i < len(raw) && (raw[i] == '.' || raw[i] == 'e' || raw[i] == 'E') {
			return dst, badRequest("prompt", "token ids must be integers")
		}
		dst = append(dst, uint32(v))
		i = skipSpace(raw, i)
		if i >= len(raw) {
			return dst, badRequest("prompt", "cannot parse prompt: unexpected end of array")
		}
		switch raw[i] {
		case ',':
			i = skipSpace(raw, i+1)
		case ']':
			if skipSpace(raw, i+1) != len(raw) {
				return dst, badRequest("prompt", "cannot parse prompt: data after the array")
			}
			return dst, nil
		default:
			return dst, badRequest("prompt", "cannot parse prompt: unexpected %q in token array", raw[i])
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// chatTokens applies the chat template (AppendChatTokens) to messages whose
// content is a string, null, or an array of text parts.
func chatTokens(dst []uint32, msgs []wireMessage) ([]uint32, *apiError) {
	if len(msgs) == 0 {
		return dst, badRequest("messages", "messages must hold at least one message")
	}
	cm := make([]ChatMessage, len(msgs))
	for i, m := range msgs {
		if _, ok := RoleToken(m.Role); !ok {
			return dst, badRequest("messages", "message %d has unknown role %q", i, m.Role)
		}
		cm[i].Role = m.Role
		raw := bytes.TrimSpace(m.Content)
		switch {
		case len(raw) == 0 || string(raw) == "null":
		case raw[0] == '"':
			if err := json.Unmarshal(raw, &cm[i].Content); err != nil {
				return dst, badRequest("messages", "cannot parse message %d content: %v", i, err)
			}
		case raw[0] == '[':
			var parts []wirePart
			if err := json.Unmarshal(raw, &parts); err != nil {
				return dst, badRequest("messages", "cannot parse message %d content: %v", i, err)
			}
			var sb strings.Builder
			for j, p := range parts {
				if p.Type != "text" || p.Text == nil {
					return dst, badRequest("messages", "message %d part %d: only text parts are supported, got type %q", i, j, p.Type)
				}
				if j > 0 {
					sb.WriteByte(' ')
				}
				sb.WriteString(*p.Text)
			}
			cm[i].Content = sb.String()
		default:
			return dst, badRequest("messages", "message %d content must be a string or an array of text parts", i)
		}
	}
	out, err := AppendChatTokens(dst, cm)
	if err != nil {
		return dst, badRequest("messages", "%v", err)
	}
	return out, nil
}
