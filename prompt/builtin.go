package prompt

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/cespare/xxhash/v2"

	"github.com/kvfast/kvfast/chat"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/tokenizer"
)

// Builtin renders prompts inside the router: the model's chat template
// (package chat) and its tokenizer (package tokenizer), exactly as the
// engine computes them, with tokenized prefixes cached at the template's
// special-token boundaries so that a new turn tokenizes only its tail.
type Builtin struct {
	model string
	tok   *tokenizer.Tokenizer
	tmpl  *chat.Template // nil when the model has no chat template
	bos   string
	eos   string
	cache *PrefixCache // nil when caching is off
	seed  uint64       // separates this tokenizer's segments in a shared cache
	// maxBytes bounds the body and the rendered text a request may have
	// for the router to tokenize it (ErrTooLarge beyond).
	maxBytes int
	// budget, shared by a registry's built-in renderers, bounds the bytes
	// they render at once (ErrBusy beyond); nil, as Open leaves it for
	// the mock engine and kvfast tokenize, is no bound.
	budget *builtinBudget

	outcomes outcomeCounters
	bufs     sync.Pool // *builtinBufs
}

// builtinBufs are one call's scratch: the rendered or decoded prompt text
// and its safe cut offsets.
type builtinBufs struct {
	text []byte
	cuts []int
}

// maxPooledText keeps one huge prompt from pinning its buffer in the pool.
const maxPooledText = 1 << 20

// ErrMedia is why a chat request with images, audio or video routes
// approximately on the built-in path: the engine expands each item into
// placeholder tokens of its own (how many depends on the item), which
// only the engine's render endpoint can report.
var ErrMedia = errors.New("multimodal content: the engine's placeholder tokens are its own")

// ErrOwnTemplate is why a chat request carrying its own chat_template
// routes approximately: an engine that accepts it (vLLM with
// --trust-request-chat-template) renders that template, not the model's,
// and the router does not compile a client's template per request.
var ErrOwnTemplate = errors.New("the request names a chat_template of its own")

// ErrTooLarge is why a request larger than MaxRenderBytes routes
// approximately: tokenizing it would cost the router more than the
// routing is worth, and an engine would most likely refuse it anyway.
var ErrTooLarge = errors.New("the request is larger than the router tokenizes")

// ErrNoChatTemplate is why a chat request to a model without a chat
// template routes approximately: the engine refuses it, or applies a
// default the router does not know.
var ErrNoChatTemplate = errors.New("the model's tokenizer_config.json has no chat template")

// NewBuiltin builds model's renderer from its tokenizer files, with cfg's
// prefix-cache budget (PrefixCacheBytes, 0: no cache) and size bound
// (MaxRenderBytes).
func NewBuiltin(model string, files Files, cfg Config) (*Builtin, error) {
	cacheBytes, maxRenderBytes := cfg.PrefixCacheBytes, cfg.MaxRenderBytes
	tok, err := tokenizer.Load(files.Dir)
	if err != nil {
		return nil, fmt.Errorf("cannot load the tokenizer of model %q: %w", model, err)
	}
	tc := tok.Config()
	b := &Builtin{model: model, tok: tok, bos: tc.BOSToken, eos: tc.EOSToken, maxBytes: maxRenderBytes,
		seed: xxhash.Sum64String("kvfast/prompt-cache\x00" + files.Dir)}
	if tc.ChatTemplate != "" {
		if b.tmpl, err = chat.Compile(tc.ChatTemplate); err != nil {
			return nil, fmt.Errorf("cannot compile the chat template of model %q: %w", model, err)
		}
	}
	if cacheBytes > 0 {
		b.cache = NewPrefixCache(cacheBytes)
	}
	return b, nil
}

// unimplementedCalls lists what the model's chat template calls that
// kvfast does not render (chat.Template.Unimplemented).
func (b *Builtin) unimplementedCalls() []string {
	if b.tmpl == nil {
		return nil
	}
	return b.tmpl.Unimplemented()
}

// Tokens implements Renderer.
func (b *Builtin) Tokens(_ context.Context, dst []uint32, api openai.API, body []byte, r *openai.ParsedRequest) ([]uint32, error) {
	if len(body) > b.maxBytes {
		b.outcomes.unsupported.Add(1)
		return dst, ErrTooLarge
	}
	if b.budget != nil {
		n := int64(len(body))
		if !b.budget.acquire(n) {
			b.outcomes.busy.Add(1)
			return dst, ErrBusy
		}
		defer b.budget.release(n)
	}
	bufs, _ := b.bufs.Get().(*builtinBufs)
	if bufs == nil {
		bufs = new(builtinBufs)
	}
	dst, err := b.tokens(bufs, dst, api, body, r)
	if cap(bufs.text) <= maxPooledText {
		b.bufs.Put(bufs)
	}
	switch {
	case err == nil:
		b.outcomes.ok.Add(1)
	case errors.Is(err, ErrInvalidRequest):
		b.outcomes.rejected.Add(1)
	default: // no chat template, media a string template cannot carry
		b.outcomes.unsupported.Add(1)
	}
	return dst, err
}

func (b *Builtin) tokens(bufs *builtinBufs, dst []uint32, api openai.API, body []byte, r *openai.ParsedRequest) ([]uint32, error) {
	var addSpecial bool
	switch r.Prompt {
	case openai.PromptText:
		bufs.text = r.AppendText(bufs.text[:0])
		// vLLM tokenizes a completions prompt with special tokens unless
		// the request says otherwise.
		addSpecial = r.AddSpecialTokens != openai.SpecialOmit
	case openai.PromptMessages:
		if b.tmpl == nil {
			return dst, ErrNoChatTemplate
		}
		in, err := chat.DecodeInput(body)
		if err == nil && in.HasOwnTemplate() {
			return dst, ErrOwnTemplate
		}
		if err == nil {
			bufs.text, err = b.tmpl.Render(bufs.text[:0], in, b.bos, b.eos)
		}
		if errors.Is(err, chat.ErrInvalidRequest) {
			return dst, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
		if errors.Is(err, chat.ErrTooCostly) {
			return dst, ErrTooLarge // routed as a prompt over --tokenize-max-bytes is
		}
		if err != nil {
			return dst, err
		}
		if in.HasMedia() {
			return dst, ErrMedia
		}

		if len(bufs.text) > b.maxBytes {
			return dst, ErrTooLarge
		}
		addSpecial = in.AddSpecialTokens()
	default:
		return dst, ErrNotRendered
	}
	// The special tokens wrap the whole text, as the engine's tokenizer
	// class puts them (EngineAffixes); the cached segments are the text's
	// own ids.
	prefix, suffix := b.tok.EngineAffixes()
	if addSpecial {
		dst = append(dst, prefix...)
	}
	if b.cache == nil {
		dst = b.tok.Encode(dst, bufs.text, false)
	} else {
		bufs.cuts = b.tok.AppendCuts(bufs.cuts[:0], bufs.text)
		dst = b.cache.Encode(dst, b.tok, b.seed, bufs.text, bufs.cuts)
	}
	if addSpecial {
		dst = append(dst, suffix...)
	}
	return dst, nil
}

// status fills the parts of a model's status the renderer knows.
func (b *Builtin) status(st *ModelStatus) {
	o := b.outcomes.load()
	st.Outcomes = &o
	if b.cache != nil {
		cs := b.cache.Stats()
		st.PrefixCache = &cs
	}
}
