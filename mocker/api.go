package mocker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/radix"
)

// apiRequest is what the engine needs from a completions or chat body.
type apiRequest struct {
	chat            bool
	model           string
	cacheSalt       string // vLLM's cache_salt, "" for none
	tokens          []uint32
	mm              []radix.MMItem // the chat prompt's images (multimodal.go)
	maxTokens       int            // -1: not set
	stream          bool
	includeUsage    bool // stream_options.include_usage
	continuousUsage bool // stream_options.continuous_usage_stats (vLLM)

	// prompt reads a completions prompt; tokens then holds its buffer.
	prompt openai.ParsedRequest

	disagg disaggRequest // kv_transfer_params and SGLang's bootstrap fields (disagg.go)
}

// badRequest is a 400 error with vLLM's numeric code, as the mock engine
// answers bad input.
func badRequest(param, format string, args ...any) *openai.Error {
	return &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: param, Message: fmt.Sprintf(format, args...)}
}

type wireRequest struct {
	Model     string          `json:"model"`
	CacheSalt string          `json:"cache_salt"`
	Prompt    json.RawMessage `json:"prompt"`
	Messages  []wireMessage   `json:"messages"`
	// max_tokens, max_completion_tokens, n and stream are read by the
	// router's parser (parseRequest), laxly, as vLLM's pydantic reads them:
	// "5", 5.0 and "true" are a client's to send.
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	N                   json.RawMessage `json:"n"`
	Stream              json.RawMessage `json:"stream"`
	KVTransferParams    json.RawMessage `json:"kv_transfer_params"`
	BootstrapHost       *string         `json:"bootstrap_host"`
	BootstrapPort       *int            `json:"bootstrap_port"`
	BootstrapRoom       *uint64         `json:"bootstrap_room"`
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
	Type     string     `json:"type"`
	Text     *string    `json:"text"`
	ImageURL *wireImage `json:"image_url"`
}

// parseRequest decodes a /v1/completions (chat false) or
// /v1/chat/completions (chat true) body. Fields the mock engine does not
// simulate (temperature, stop, logprobs, ...) are accepted and ignored, as
// vLLM ignores unknown ones. A text or chat prompt is tokenized by rd, the
// engine's renderer, or, when rd is nil, by the toy tokenizer.
func parseRequest(ctx context.Context, body []byte, chat bool, rd Renderer, dst *apiRequest) *openai.Error {
	*dst = apiRequest{chat: chat, tokens: dst.tokens[:0], maxTokens: -1, prompt: dst.prompt}
	var w wireRequest
	if err := json.Unmarshal(body, &w); err != nil {
		return badRequest("", "cannot parse request body: %v", err)
	}
	dst.model, dst.cacheSalt = w.Model, w.CacheSalt
	if err := dst.disagg.read(&w); err != nil {
		return err
	}
	if err := readScalars(body, chat, dst); err != nil {
		return err
	}
	if w.StreamOptions != nil {
		if !dst.stream {
			return badRequest("stream_options", "stream_options is only allowed when stream is true")
		}
		dst.includeUsage = w.StreamOptions.IncludeUsage
		dst.continuousUsage = w.StreamOptions.ContinuousUsageStats
	}

	var err *openai.Error
	switch {
	case chat && len(w.Prompt) > 0:
		return badRequest("prompt", "chat completions take messages, not prompt")
	case chat && rd != nil:
		dst.tokens, err = renderTokens(ctx, rd, dst.tokens, openai.APIChatCompletions, body, &dst.prompt)
	case chat:
		dst.tokens, dst.mm, err = chatTokensMM(dst.tokens, w.Messages)
	case w.Messages != nil:
		return badRequest("messages", "completions take prompt, not messages")
	case rd != nil && isTextPrompt(w.Prompt):
		dst.tokens, err = renderTokens(ctx, rd, dst.tokens, openai.APICompletions, body, &dst.prompt)
	default:
		dst.tokens, err = promptTokens(&dst.prompt, dst.tokens, w.Prompt)
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

// readScalars reads stream, n and max_tokens (max_completion_tokens for
// chat, if given) with the router's own parser, which reads them as
// vLLM's pydantic models do in lax mode: a client's "5", 5.0, "1_000" or
// "true" means what it means to vLLM. The prompt is read again after,
// into the same buffers.
func readScalars(body []byte, chat bool, dst *apiRequest) *openai.Error {
	api := openai.APICompletions
	if chat {
		api = openai.APIChatCompletions
	}
	pr := &dst.prompt
	pr.Tokens = dst.tokens[:0]
	// The HTTP server bounds the body; the parse needs no second limit.
	p := openai.Parser{MaxBodyBytes: math.MaxInt}
	if err := p.Parse(body, api, pr); err != nil {
		var e *openai.Error
		if errors.As(err, &e) && e.Param != "prompt" && e.Param != "messages" {
			return badRequest(e.Param, "%s", e.Message)
		}
		// The prompt's faults are the prompt reader's to report, below.
	}
	dst.tokens = pr.Tokens[:0]
	dst.stream = pr.Stream
	if pr.Choices > 1 {
		return badRequest("n", "n must be 1: the mock engine generates one choice per request")
	}
	if pr.MaxTokens > 0 {
		if pr.MaxTokens > math.MaxInt32 {
			return badRequest("max_tokens", "max_tokens must be at most %d, got %d", math.MaxInt32, pr.MaxTokens)
		}
		dst.maxTokens = int(pr.MaxTokens)
	}
	return nil
}

// promptTokens decodes a completions prompt with the router's own reader of
// prompt values, pr: a string, an array of token ids, or a batch of one of
// either, under the same rules and with the same refusals. Token ids are
// decoded into dst's array.
func promptTokens(pr *openai.ParsedRequest, dst []uint32, raw json.RawMessage) ([]uint32, *openai.Error) {
	if len(raw) == 0 {
		return dst, badRequest("prompt", "prompt is required")
	}
	// Token-id prompts are the bulk of the mock engine's input, tens of
	// thousands of ids per request: size the buffer once.
	if t := bytes.TrimLeft(raw, " \t\r\n"); len(t) > 0 && t[0] == '[' {
		if n := bytes.Count(raw, []byte{','}) + 1; cap(dst) < n {
			dst = make([]uint32, 0, n)
		}
	}
	pr.Tokens = dst[:0]
	// The HTTP server bounds the body; the prompt needs no second limit.
	p := openai.Parser{MaxBodyBytes: math.MaxInt}
	if err := p.ParsePrompt(raw, pr); err != nil {
		msg := err.Error()
		var e *openai.Error
		if errors.As(err, &e) {
			msg = e.Message
		}
		return dst, badRequest("prompt", "%s", msg)
	}
	if pr.Prompt == openai.PromptText {
		return AppendTextTokens(dst[:0], string(pr.AppendText(nil))), nil
	}
	return pr.Tokens, nil
}

// isTextPrompt reports whether a completions prompt is text (a string, or
// a batch of one string) rather than token ids, so that the engine's
// renderer, if it has one, tokenizes it.
func isTextPrompt(raw json.RawMessage) bool {
	t := bytes.TrimLeft(raw, " \t\r\n")
	if len(t) > 0 && t[0] == '[' {
		t = bytes.TrimLeft(t[1:], " \t\r\n")
	}
	return len(t) > 0 && t[0] == '"'
}

// renderTokens has rd compute the ids of body's text or chat prompt, into
// dst's array. The body is read by the router's own parser, as a router
// with a built-in renderer reads it before rendering, and pr, its parse,
// is handed to rd. Every failure is the request's: the engine cannot
// render it, which vLLM answers with 400 as well.
func renderTokens(ctx context.Context, rd Renderer, dst []uint32, api openai.API, body []byte, pr *openai.ParsedRequest) ([]uint32, *openai.Error) {
	param := "prompt"
	if api == openai.APIChatCompletions {
		param = "messages"
	}
	// The HTTP server bounds the body; the prompt needs no second limit.
	p := openai.Parser{MaxBodyBytes: math.MaxInt}
	if err := p.Parse(body, api, pr); err != nil {
		msg := err.Error()
		var e *openai.Error
		if errors.As(err, &e) {
			msg, param = e.Message, e.Param
		}
		return dst, badRequest(param, "%s", msg)
	}
	out, err := rd.Tokens(ctx, dst[:0], api, body, pr)
	if err != nil {
		return out[:0], badRequest(param, "cannot render the prompt: %v", err)
	}
	return out, nil
}

// chatTokens applies the chat template (AppendChatTokens) to messages whose
// content is a string, null, or an array of text parts.
func chatTokens(dst []uint32, msgs []wireMessage) ([]uint32, *openai.Error) {
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
