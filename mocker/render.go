package mocker

import (
	"bytes"
	"encoding/json"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/internal/jsonscan"
	"github.com/kvfast/kvfast/openai"
)

// The render and tokenize endpoints answer in vLLM's shapes (the sources
// are cited in package prompt, whose remote renderer calls them): a router
// asks the engine for the ids it will compute for a request, and the mock
// engine answers with exactly the ids it then computes and caches.

// handleRender answers POST /v1/chat/completions/render (chat) and
// /v1/completions/render: the request is checked as /v1/chat/completions
// or /v1/completions would check it, and the answer is vLLM's
// GenerateRequest, one object for chat and a list of one for completions,
// with the images' hashes and placeholder ranges in features.
func (e *Engine) handleRender(ctx *fasthttp.RequestCtx, chat bool) {
	var req apiRequest
	maxTokens, ok := e.admit(ctx, chat, &req)
	if !ok {
		return
	}
	b := make([]byte, 0, 128+8*len(req.tokens))
	if !chat {
		b = append(b, '[')
	}
	b = append(b, `{"request_id":"`...)
	if chat {
		b = append(b, "chatcmpl-"...)
	} else {
		b = append(b, "cmpl-"...)
	}
	b = append(b, e.idTag...)
	b = strconv.AppendUint(b, e.nextID.Add(1), 10)
	b = append(b, `","token_ids":`...)
	b = appendIDs(b, req.tokens)
	b = appendFeatures(append(b, `,"features":`...), req.mm)
	b = append(b, `,"sampling_params":{"max_tokens":`...)
	b = strconv.AppendInt(b, int64(maxTokens), 10)
	b = append(b, `},"model":`...)
	if req.model == "" {
		b = append(b, "null"...)
	} else {
		b = jsonscan.AppendQuoted(b, req.model)
	}
	b = append(b, `,"stream":`...)
	b = strconv.AppendBool(b, req.stream)
	b = append(b, '}')
	if !chat {
		b = append(b, ']')
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// wireTokenize is vLLM's /tokenize body: a prompt string, or chat messages.
type wireTokenize struct {
	Model    string          `json:"model"`
	Prompt   json.RawMessage `json:"prompt"`
	Messages []wireMessage   `json:"messages"`
}

// handleTokenize answers POST /tokenize as vLLM does:
// {"count","max_model_len","tokens","token_strs"}. A prompt is tokenized as
// a completions text prompt, messages as a chat request; with a Renderer,
// the body is handed to it as that request's body, since /tokenize's
// fields (add_special_tokens, add_generation_prompt, tools, ...) are named
// and defaulted as the completions and chat requests' are.
func (e *Engine) handleTokenize(ctx *fasthttp.RequestCtx) {
	if !e.method(ctx, fasthttp.MethodPost) {
		return
	}
	var w wireTokenize
	if err := json.Unmarshal(ctx.PostBody(), &w); err != nil {
		writeError(ctx, badRequest("", "cannot parse request body: %v", err))
		return
	}
	if !e.servesModel(ctx, w.Model) {
		return
	}
	var tokens []uint32
	var pr openai.ParsedRequest
	var err *openai.Error
	switch p := bytes.TrimSpace(w.Prompt); {
	case w.Messages != nil && len(p) > 0:
		writeError(ctx, badRequest("", "give prompt or messages, not both"))
		return
	case w.Messages != nil && e.cfg.Renderer != nil:
		tokens, err = renderTokens(ctx, e.cfg.Renderer, nil, openai.APIChatCompletions, ctx.PostBody(), &pr)
	case w.Messages != nil:
		tokens, _, err = chatTokensMM(nil, w.Messages)
	case len(p) > 0 && p[0] == '"' && e.cfg.Renderer != nil:
		tokens, err = renderTokens(ctx, e.cfg.Renderer, nil, openai.APICompletions, ctx.PostBody(), &pr)
	case len(p) > 0 && p[0] == '"':
		var text string
		if err := json.Unmarshal(p, &text); err != nil {
			writeError(ctx, badRequest("prompt", "cannot parse prompt: %v", err))
			return
		}
		tokens = AppendTextTokens(nil, text)
	default:
		writeError(ctx, badRequest("prompt", "prompt must be a string, or give messages"))
		return
	}
	if err != nil {
		writeError(ctx, err)
		return
	}
	b := make([]byte, 0, 64+8*len(tokens))
	b = append(b, `{"count":`...)
	b = strconv.AppendInt(b, int64(len(tokens)), 10)
	b = append(b, `,"max_model_len":`...)
	b = strconv.AppendInt(b, int64(e.cfg.MaxModelLen), 10)
	b = append(b, `,"tokens":`...)
	b = appendIDs(b, tokens)
	b = append(b, `,"token_strs":null}`...)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// appendIDs appends ids as a JSON array.
func appendIDs(b []byte, ids []uint32) []byte {
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(id), 10)
	}
	return append(b, ']')
}
