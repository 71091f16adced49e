package openai

import (
	"bytes"
	"math"
	"strconv"
	"unicode/utf8"
	"unsafe"

	"github.com/kvfast/kvfast/internal/jsonscan"
)

// DefaultMaxBodyBytes bounds a request body when the Parser sets no limit. A
// 128K-token prompt written as token ids is under 1 MiB; the rest is room
// for chat messages carrying inline images.
const DefaultMaxBodyBytes = 16 << 20

// API names the OpenAI endpoint a body was posted to. It decides which field
// holds the prompt: prompt for completions, messages for chat.
type API uint8

const (
	APICompletions API = iota + 1
	APIChatCompletions
)

// PromptKind says which field of ParsedRequest holds the prompt.
type PromptKind uint8

const (
	PromptNone     PromptKind = iota
	PromptTokens              // Tokens: exact, KV-aware routing
	PromptText                // Text: approximate routing by text chunks
	PromptMessages            // Messages: approximate routing by text chunks
	// PromptEmbeds: vLLM's prompt_embeds (Embeds) with no prompt, or an
	// empty one, as vLLM's own example sends it. The tensor is no text a
	// tokenizer reads: routed approximately by its bytes, and by load.
	PromptEmbeds
)

// Parser reads the few fields routing needs from an OpenAI completions or
// chat-completions body. The zero Parser applies the defaults. A Parser is
// read-only while parsing, so one value serves every goroutine.
type Parser struct {
	// MaxBodyBytes refuses larger bodies; 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int
	// MaxTokenID is the largest token id accepted in a prompt, normally the
	// vocabulary size minus one; 0 means any uint32.
	MaxTokenID uint32
}

// ParsedRequest is what routing learns from a request body. Its byte slices
// alias the parsed body unless the JSON escaped them, so the body must stay
// unchanged while they are in use. Reuse one value per request through
// AcquireParsedRequest so that Tokens keeps its capacity.
type ParsedRequest struct {
	API API
	// Model is the model name, nil when absent or null.
	Model []byte
	// CacheSalt is vLLM's cache_salt, nil when absent. Requests with
	// different salts never share cached blocks.
	CacheSalt []byte
	// LoRAPath is SGLang's lora_path when a string: the LoRA adapter a
	// request for the base model asks for (SGLang's older spelling of
	// model "base:adapter"). nil when absent or not a string (a list,
	// one adapter per prompt of a batch, is the engine's to judge).
	LoRAPath []byte
	Prompt   PromptKind
	// Tokens holds the prompt token ids when Prompt is PromptTokens.
	Tokens []uint32
	// Text is the prompt string exactly as it appears between the quotes in
	// the body, escapes included, when Prompt is PromptText. Approximate
	// hashing wants stable bytes, not decoded text.
	Text []byte
	// Messages is the raw JSON array of chat messages, brackets included,
	// when Prompt is PromptMessages. It is known to be an array of objects
	// and no more: reading roles and content, for a tokenizer or a chat
	// template, belongs in this package as a walk over these bytes.
	Messages []byte
	// Embeds is vLLM's prompt_embeds, a base64 string (a serialized
	// tensor) as it appears between its quotes, or nil. It is the prompt
	// (PromptEmbeds) only when prompt is absent or empty.
	Embeds []byte
	Stream bool
	// MaxTokens is max_completion_tokens if given, else max_tokens, else 0:
	// the precedence engines apply.
	MaxTokens int64
	// Choices is n, the completions asked for per prompt; 0 when absent
	// (engines then generate one). With several, the first finish_reason
	// does not end the request.
	Choices int64
	// AddSpecialTokens is vLLM's add_special_tokens: whether the engine
	// adds the tokenizer's BOS/EOS when it tokenizes the prompt.
	AddSpecialTokens SpecialTokens
	// Session is the request's session_control (session.go).
	Session SessionControl

	modelBuf, saltBuf, loraBuf []byte
	maxTokens, maxCompl        int64
}

// SpecialTokens is what a request says of add_special_tokens.
type SpecialTokens uint8

const (
	SpecialDefault SpecialTokens = iota // absent or null: the engine's default for the API
	SpecialAdd                          // true
	SpecialOmit                         // false
)

// Reset empties r and keeps its buffers.
func (r *ParsedRequest) Reset() {
	*r = ParsedRequest{
		Tokens:   r.Tokens[:0],
		modelBuf: r.modelBuf[:0],
		saltBuf:  r.saltBuf[:0],
		loraBuf:  r.loraBuf[:0],
	}
}

// ApproxText returns the bytes approximate routing hashes: the prompt text or
// the raw messages array, or nil for a token prompt.
func (r *ParsedRequest) ApproxText() []byte {
	switch r.Prompt {
	case PromptText:
		return r.Text
	case PromptMessages:
		return r.Messages
	case PromptEmbeds:
		return r.Embeds
	}
	return nil
}

// AppendText appends the text prompt, decoded from its JSON escapes, to
// dst: what a tokenizer reads, where Text is what routing hashes. It appends
// nothing unless Prompt is PromptText.
func (r *ParsedRequest) AppendText(dst []byte) []byte {
	return jsonscan.AppendUnescaped(dst, r.Text)
}

// maxPooledTokens keeps the pool from pinning the buffer of one huge prompt.
const maxPooledTokens = 1 << 18

// Recycle empties r for the next request, as Reset does, and lets go of any
// buffer one huge request grew past what is worth keeping. Owners that pool
// a ParsedRequest inside a larger value call it instead of
// ReleaseParsedRequest.
func (r *ParsedRequest) Recycle() {
	if cap(r.Tokens) > maxPooledTokens {
		r.Tokens = nil
	}
	if cap(r.modelBuf) > 1024 {
		r.modelBuf = nil
	}
	if cap(r.saltBuf) > 1024 {
		r.saltBuf = nil
	}
	if cap(r.loraBuf) > 1024 {
		r.loraBuf = nil
	}
	r.Reset()
}

// The fields whose errors are tracked separately, so that a later duplicate
// key replaces an earlier one's verdict as well as its value: JSON parsers
// in engines keep the last duplicate, and we must judge what they will see.
const (
	fModel = iota
	fPrompt
	fMessages
	fStream
	fMaxTokens
	fMaxCompl
	fCacheSalt
	fChoices
	fAddSpecial
	fSessionControl
	fLoRAPath
	fEmbeds
	numFields
)

// Parse validates body as one JSON document and fills r with the routing
// fields, decoding token ids into r.Tokens. It builds no tree and makes no
// allocation once r's buffers have grown to fit.
//
// A body that is not JSON yields ErrMalformedJSON even when it also has a bad
// field. Otherwise the first bad field, in a fixed order, decides the error.
// On error r is left empty. Unknown fields are validated and ignored.
func (p *Parser) Parse(body []byte, api API, r *ParsedRequest) error {
	return p.run(body, api, r, true)
}

// ParsePrompt parses raw, the value of the prompt field of a completions
// body, into r exactly as Parse reads that field: the same forms, limits and
// errors, and ErrMissingPrompt for null. It serves a reader that decodes the
// rest of the body by other means; r.MaxTokens and the other fields stay
// zero.
func (p *Parser) ParsePrompt(raw []byte, r *ParsedRequest) error {
	return p.run(raw, APICompletions, r, false)
}

// run is Parse, or ParsePrompt when whole is false.
func (p *Parser) run(body []byte, api API, r *ParsedRequest, whole bool) error {
	r.Reset()
	limit := p.MaxBodyBytes
	if limit <= 0 {
		limit = DefaultMaxBodyBytes
	}
	if len(body) > limit {
		return ErrBodyTooLarge
	}
	maxTok := p.MaxTokenID
	if maxTok == 0 {
		maxTok = math.MaxUint32
	}
	ps := parser{b: body, r: r, maxTok: maxTok, api: api}
	var valid bool
	if whole {
		valid = ps.document()
	} else {
		valid = ps.promptValue()
	}
	var err error
	switch {
	case !valid:
		err = ErrMalformedJSON
	case !utf8.Valid(body):
		// Outside strings valid JSON is ASCII, so this refuses exactly the
		// keys and string values (prompt, chat content, model) that are not
		// UTF-8. encoding/json would quietly turn them into U+FFFD; the
		// OpenAI API refuses them, and an engine would hash or tokenize
		// different bytes than routing did.
		err = ErrInvalidUTF8
	case ps.notObject:
		err = ErrNotObject
	default:
		if r.Embeds != nil && ps.errs[fEmbeds] == nil && r.Prompt == PromptNone && (ps.errs[fPrompt] == nil || ps.errs[fPrompt] == ErrEmptyPrompt) {
			// vLLM takes the embeddings for the prompt; the OpenAI
			// client sends an empty prompt beside them.
			ps.errs[fPrompt], r.Prompt = nil, PromptEmbeds
		}
		for _, e := range ps.errs {
			if e != nil {
				err = e
				break
			}
		}
	}
	if err == nil {
		if api == APIChatCompletions {
			if r.Prompt != PromptMessages {
				err = ErrMissingMessages
			}
		} else if r.Prompt == PromptNone {
			err = ErrMissingPrompt
		}
	}
	if err != nil {
		r.Reset()
		return err
	}
	r.API = api
	r.MaxTokens = r.maxTokens
	if r.maxCompl != 0 {
		r.MaxTokens = r.maxCompl
	}
	return nil
}

type parser struct {
	b         []byte
	r         *ParsedRequest
	maxTok    uint32
	api       API
	notObject bool
	errs      [numFields]*Error
}

// document reports whether the whole body is one valid JSON value.
func (p *parser) document() bool {
	b := p.b
	i := jsonscan.SkipSpace(b, 0)
	if i >= len(b) {
		return false
	}
	if b[i] != '{' {
		i = jsonscan.SkipValue(b, i, 0)
		if i < 0 {
			return false
		}
		p.notObject = true
		return jsonscan.SkipSpace(b, i) == len(b)
	}
	i = p.object(i)
	return i >= 0 && jsonscan.SkipSpace(b, i) == len(b)
}

// promptValue reports whether the whole of b is one valid prompt value.
func (p *parser) promptValue() bool {
	b := p.b
	i := jsonscan.SkipSpace(b, 0)
	if i >= len(b) {
		return false
	}
	i = p.prompt(i)
	return i >= 0 && jsonscan.SkipSpace(b, i) == len(b)
}

// object walks the top-level object at b[i] == '{' and returns the index
// after it, or -1 if it is malformed.
func (p *parser) object(i int) int {
	b := p.b
	i = jsonscan.SkipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1
	}
	var kb [128]byte
	for {
		if i >= len(b) || b[i] != '"' {
			return -1
		}
		end, escaped := jsonscan.ScanString(b, i)
		if end < 0 {
			return -1
		}
		key := b[i+1 : end-1]
		if escaped {
			// A decoded string is never longer than its escaped form, so a
			// key that fits kb decodes in place; longer ones match nothing.
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
		if i = p.field(key, i); i < 0 {
			return -1
		}
		i = jsonscan.SkipSpace(b, i)
		if i >= len(b) {
			return -1
		}
		switch b[i] {
		case ',':
			i = jsonscan.SkipSpace(b, i+1)
		case '}':
			return i + 1
		default:
			return -1
		}
	}
}

// field parses the value at b[i] of the top-level key and returns the index
// after it, or -1 if the value is malformed JSON.
func (p *parser) field(key []byte, i int) int {
	r := p.r
	switch string(key) {
	case "model":
		return p.stringField(i, fModel, &r.Model, &r.modelBuf, ErrModelType, false)
	case "cache_salt":
		return p.stringField(i, fCacheSalt, &r.CacheSalt, &r.saltBuf, ErrCacheSaltType, true)
	case "prompt":
		if p.api != APIChatCompletions {
			return p.prompt(i)
		}
	case "messages":
		if p.api == APIChatCompletions {
			return p.messages(i)
		}
	case "stream":
		return p.boolField(i, fStream, &r.Stream, ErrStreamType)
	case "add_special_tokens":
		var add bool
		end := p.boolField(i, fAddSpecial, &add, ErrAddSpecialTokensType)
		r.AddSpecialTokens = SpecialOmit
		if add {
			r.AddSpecialTokens = SpecialAdd
		} else if p.b[i] == 'n' {
			r.AddSpecialTokens = SpecialDefault
		}
		return end
	case "max_tokens":
		return p.countField(i, fMaxTokens, &r.maxTokens, ErrMaxTokensType, ErrMaxTokensRange)
	case "max_completion_tokens":
		return p.countField(i, fMaxCompl, &r.maxCompl, ErrMaxCompletionTokensType, ErrMaxCompletionTokensRange)
	case "n":
		return p.countField(i, fChoices, &r.Choices, ErrChoicesType, ErrChoicesRange)
	case "session_control":
		return p.sessionControl(i)
	case "lora_path":
		// No type error: a list is a batch's, which SGLang judges.
		return p.stringField(i, fLoRAPath, &r.LoRAPath, &r.loraBuf, nil, false)
	case "prompt_embeds":
		if p.api != APIChatCompletions {
			return p.promptEmbeds(i)
		}
	}
	return jsonscan.SkipValue(p.b, i, 1)
}

func (p *parser) stringField(i, f int, dst, buf *[]byte, typeErr *Error, nonEmpty bool) int {
	b := p.b
	p.errs[f] = nil
	*dst = nil
	switch b[i] {
	case '"':
		end, escaped := jsonscan.ScanString(b, i)
		if end < 0 {
			return -1
		}
		raw := b[i+1 : end-1]
		switch {
		case nonEmpty && len(raw) == 0:
			p.errs[f] = typeErr
		case escaped:
			*buf = jsonscan.AppendUnescaped((*buf)[:0], raw)
			*dst = *buf
		default:
			*dst = raw
		}
		return end
	case 'n':
		return jsonscan.ScanLiteral(b, i, "null")
	}
	p.errs[f] = typeErr
	return jsonscan.SkipValue(b, i, 1)
}

func (p *parser) boolField(i, f int, dst *bool, typeErr *Error) int {
	b := p.b
	p.errs[f] = nil
	*dst = false
	switch b[i] {
	case 't':
		*dst = true
		return jsonscan.ScanLiteral(b, i, "true")
	case 'f':
		return jsonscan.ScanLiteral(b, i, "false")
	case 'n':
		return jsonscan.ScanLiteral(b, i, "null")
	}
	// What pydantic's lax mode, and so vLLM, also reads as a bool: the
	// numbers 0 and 1 (0.0 and 1e0 too: the JSON value is what counts),
	// and a few words as strings (pydantic-core's str_as_bool; chat's
	// laxBool has the same list).
	switch c := b[i]; {
	case c == '"':
		end, escaped := jsonscan.ScanString(b, i)
		if end < 0 {
			return -1
		}
		word := b[i+1 : end-1]
		var buf [32]byte
		if escaped && len(word) <= 30 { // longer holds more than a word
			word = jsonscan.AppendUnescaped(buf[:0], word)
		}
		switch {
		case oneOfFold(word, laxTrue):
			*dst = true
		case !oneOfFold(word, laxFalse):
			p.errs[f] = typeErr
		}
		return end
	case c == '-' || '0' <= c && c <= '9':
		end := jsonscan.ScanNumber(b, i)
		if end < 0 {
			return -1
		}
		v, ok := parseNumber(b[i:end])
		switch {
		case ok && v == 1:
			*dst = true
		case !ok || v != 0:
			p.errs[f] = typeErr
		}
		return end
	}
	p.errs[f] = typeErr
	return jsonscan.SkipValue(b, i, 1)
}

// laxTrue and laxFalse are pydantic's lax spellings of a bool in a
// string, matched without regard to case.
var (
	laxTrue  = []string{"1", "on", "t", "true", "y", "yes"}
	laxFalse = []string{"0", "off", "f", "false", "n", "no"}
)

// oneOfFold reports whether b is one of words, ASCII case folded.
func oneOfFold(b []byte, words []string) bool {
	for _, w := range words {
		if equalFoldASCII(b, w) {
			return true
		}
	}
	return false
}

// equalFoldASCII reports whether b is s, ignoring ASCII case.
func equalFoldASCII(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// countField parses max_tokens-like fields: a positive integer or null,
// read as vLLM's pydantic models read an int field in their default (lax)
// mode: a float with no fractional part (2048.0, 2e3), a string that
// pydantic reads as an integer ("5", " +5 ", "5.00", "1_000"), and true are
// that integer too; a fraction is a type error. A client that computes
// max_tokens as a float sends 2048.0, which the engine serves.
func (p *parser) countField(i, f int, dst *int64, typeErr, rangeErr *Error) int {
	b := p.b
	p.errs[f] = nil
	*dst = 0
	c := b[i]
	switch {
	case c == 'n':
		return jsonscan.ScanLiteral(b, i, "null")
	case c == 't':
		*dst = 1
		return jsonscan.ScanLiteral(b, i, "true")
	case c == 'f':
		p.errs[f] = rangeErr // false is 0
		return jsonscan.ScanLiteral(b, i, "false")
	case c == '"':
		end, escaped := jsonscan.ScanString(b, i)
		if end < 0 {
			return -1
		}
		digits := b[i+1 : end-1]
		var buf [24]byte
		if escaped {
			digits = jsonscan.AppendUnescaped(buf[:0], digits)
		}
		digits = laxIntString(digits)
		if !isInteger(digits) {
			p.errs[f] = typeErr
			return end
		}
		*dst, p.errs[f] = countValue(digits, rangeErr)
		return end
	case c != '-' && (c < '0' || c > '9'):
		p.errs[f] = typeErr
		return jsonscan.SkipValue(b, i, 1)
	}
	end := jsonscan.ScanNumber(b, i)
	if end < 0 {
		return -1
	}
	if num := b[i:end]; !isInteger(num) {
		// Only a fraction, exponent or both are left: JSON has no other
		// number. Integral values count; vLLM refuses the rest.
		v, ok := parseNumber(num)
		switch {
		case ok && v != math.Trunc(v):
			p.errs[f] = typeErr
		case !ok || v < 1 || v >= math.MaxInt64:
			p.errs[f] = rangeErr
		default:
			*dst = int64(v)
		}
		return end
	}
	*dst, p.errs[f] = countValue(b[i:end], rangeErr)
	return end
}

// laxIntString returns the part of a string isInteger should read when
// pydantic's lax mode reads it as an integer, following pydantic-core's
// clean_int_str (its current rules; older releases differed): whitespace
// trimmed, a plus sign dropped, a non-empty fraction of zeros cut ("5.0",
// not "5."), then single underscores between its characters allowed
// ("1_000", "4_2.0"), which isInteger and countValue skip. Anything else
// comes back nil or as it was, for isInteger to refuse.
func laxIntString(s []byte) []byte {
	s = withoutPlus(bytes.TrimSpace(s))
	if dot := bytes.IndexByte(s, '.'); dot >= 0 && dot < len(s)-1 && len(bytes.TrimLeft(s[dot+1:], "0")) == 0 {
		s = s[:dot]
	}
	if bytes.IndexByte(s, '_') >= 0 && (s[0] == '_' || s[len(s)-1] == '_' || bytes.Contains(s, []byte("__"))) {
		return nil
	}
	return s
}

// withoutPlus drops the plus sign Rust's integer parsing, and so
// pydantic, accepts.
func withoutPlus(s []byte) []byte {
	if len(s) > 1 && s[0] == '+' && s[1] != '-' && s[1] != '+' {
		return s[1:]
	}
	return s
}

// isInteger reports whether b is a decimal integer: an optional minus
// sign and digits. Underscores are skipped: only a string's integer
// (laxIntString, which checks where they stand) can hold them.
func isInteger(b []byte) bool {
	if len(b) > 0 && b[0] == '-' {
		b = b[1:]
	}
	digits := false
	for _, d := range b {
		switch {
		case '0' <= d && d <= '9':
			digits = true
		case d != '_':
			return false
		}
	}
	return digits
}

// countValue is the decimal integer b (isInteger) when it is at least 1
// and fits an int64, else rangeErr.
func countValue(b []byte, rangeErr *Error) (int64, *Error) {
	if b[0] == '-' {
		return 0, rangeErr
	}
	var v int64
	for _, c := range b {
		if c == '_' {
			continue
		}
		d := int64(c - '0')
		if v > (math.MaxInt64-d)/10 {
			return 0, rangeErr
		}
		v = v*10 + d
	}
	if v < 1 {
		return 0, rangeErr
	}
	return v, nil
}

func (p *parser) prompt(i int) int {
	r := p.r
	b := p.b
	p.errs[fPrompt] = nil
	r.Prompt, r.Tokens, r.Text = PromptNone, r.Tokens[:0], nil
	switch b[i] {
	case '"':
		end, _ := jsonscan.ScanString(b, i)
		if end < 0 {
			return -1
		}
		if end-i == 2 {
			p.errs[fPrompt] = ErrEmptyPrompt
		} else {
			r.Prompt, r.Text = PromptText, b[i+1:end-1]
		}
		return end
	case '[':
		return p.promptArray(i)
	case 'n':
		return jsonscan.ScanLiteral(b, i, "null")
	}
	p.errs[fPrompt] = ErrPromptType
	return jsonscan.SkipValue(b, i, 1)
}

// promptEmbeds reads vLLM's prompt_embeds at b[i]: a base64 string, or a
// batch of one. An empty string or array is no embeddings.
func (p *parser) promptEmbeds(i int) int {
	b := p.b
	p.errs[fEmbeds], p.r.Embeds = nil, nil
	switch b[i] {
	case '"':
		end, _ := jsonscan.ScanString(b, i)
		if end > i+2 {
			p.r.Embeds = b[i+1 : end-1]
		}
		return end
	case '[':
		if j := jsonscan.SkipSpace(b, i+1); j < len(b) && b[j] == '"' {
			end, _ := jsonscan.ScanString(b, j)
			if end < 0 {
				return -1
			}
			switch k := jsonscan.SkipSpace(b, end); {
			case k < len(b) && b[k] == ']':
				if end > j+2 {
					p.r.Embeds = b[j+1 : end-1]
				}
				return k + 1
			case k < len(b) && b[k] == ',':
				p.errs[fEmbeds] = ErrEmbedsBatch
			}
		} else if j < len(b) && b[j] == ']' {
			return j + 1
		}
		if p.errs[fEmbeds] == nil {
			p.errs[fEmbeds] = ErrEmbedsType
		}
		return jsonscan.SkipValue(b, i, 1)
	case 'n':
		return jsonscan.ScanLiteral(b, i, "null")
	}
	p.errs[fEmbeds] = ErrEmbedsType
	return jsonscan.SkipValue(b, i, 1)
}

// promptArray handles the array forms of prompt at b[i] == '['. A batch of
// one is the same request as its only prompt, so it is accepted as that.
func (p *parser) promptArray(i int) int {
	r := p.r
	b := p.b
	j := jsonscan.SkipSpace(b, i+1)
	if j >= len(b) {
		return -1
	}
	var end int
	switch c := b[j]; {
	case c == ']':
		p.errs[fPrompt] = ErrEmptyPrompt
		return j + 1
	case c == '-' || (c >= '0' && c <= '9'):
		return p.tokens(i, 2)
	case c == '[':
		if end = p.tokens(j, 3); end < 0 || p.errs[fPrompt] != nil {
			// tokens validated nothing past the fault; do it here.
			return p.rescan(i)
		}
	case c == '"':
		if end, _ = jsonscan.ScanString(b, j); end < 0 {
			return -1
		}
		if end-j == 2 {
			p.errs[fPrompt] = ErrEmptyPrompt
		} else {
			r.Prompt, r.Text = PromptText, b[j+1:end-1]
		}
	default:
		p.errs[fPrompt] = ErrPromptType
		return p.rescan(i)
	}
	k := jsonscan.SkipSpace(b, end)
	if k >= len(b) {
		return -1
	}
	switch b[k] {
	case ']':
		return k + 1
	case ',':
		p.errs[fPrompt] = ErrBatchNotSupported
		return p.rescan(i)
	}
	return -1
}

// rescan validates the prompt array at b[i] from its start after a semantic
// fault cut the fast path short. The fault stays recorded; the prompt is
// dropped.
func (p *parser) rescan(i int) int {
	if p.errs[fPrompt] == nil {
		p.errs[fPrompt] = ErrPromptType
	}
	p.r.Prompt, p.r.Tokens, p.r.Text = PromptNone, p.r.Tokens[:0], nil
	return jsonscan.SkipValue(p.b, i, 1)
}

// tokens decodes the array of token ids at b[i] == '[' (at nesting depth
// depth) into r.Tokens. On anything but a plain in-range integer it records
// the fault and validates the rest of the array generically.
func (p *parser) tokens(i, depth int) int {
	b := p.b
	r := p.r
	r.Tokens = r.Tokens[:0]
	maxTok := uint64(p.maxTok)
	j := jsonscan.SkipSpace(b, i+1)
	if j < len(b) && b[j] == ']' {
		p.errs[fPrompt] = ErrEmptyPrompt
		return j + 1
	}
	for {
		if j >= len(b) {
			return -1
		}
		c := b[j]
		if c < '0' || c > '9' {
			if c == '-' {
				return p.laxTokens(i, j, depth)
			}
			p.errs[fPrompt] = ErrPromptType
			return jsonscan.SkipValue(b, i, depth-1)
		}
		v := uint64(c - '0')
		j++
		if c != '0' {
			for j < len(b) {
				d := b[j] - '0'
				if d > 9 {
					break
				}
				if v <= math.MaxUint32 {
					v = v*10 + uint64(d)
				}
				j++
			}
		}
		if j < len(b) {
			switch b[j] {
			case '.', 'e', 'E':
				start := j - 1
				for start > 0 && b[start-1] >= '0' && b[start-1] <= '9' {
					start--
				}
				return p.laxTokens(i, start, depth)
			}
		}
		if v > maxTok {
			p.errs[fPrompt] = ErrTokenOutOfRange
			return jsonscan.SkipValue(b, i, depth-1)
		}
		r.Tokens = append(r.Tokens, uint32(v))
		if j < len(b) && b[j] == ',' { // the common compact form "1,2,3"
			j++
			if j < len(b) && b[j] >= '0' && b[j] <= '9' {
				continue
			}
			j = jsonscan.SkipSpace(b, j)
			continue
		}
		j = jsonscan.SkipSpace(b, j)
		if j >= len(b) {
			return -1
		}
		switch b[j] {
		case ',':
			j = jsonscan.SkipSpace(b, j+1)
		case ']':
			// For a batch, promptArray then checks this array is alone.
			r.Prompt = PromptTokens
			return j + 1
		default:
			return -1
		}
	}
}

// laxTokens reads the rest of the token array at b[i] from its element
// at b[j], a number that is not a plain non-negative integer (-0, 1.0,
// 1e3), which tokens leaves to it. Python engines read such a number as a
// float and take it for a token id when it is integral (pydantic's lax
// int), so the router routes on that id; every later element is read the
// same way.
func (p *parser) laxTokens(i, j, depth int) int {
	b := p.b
	for {
		end := jsonscan.ScanNumber(b, j)
		if end < 0 {
			p.errs[fPrompt] = ErrPromptType
			return jsonscan.SkipValue(b, i, depth-1)
		}
		var fault *Error
		switch f, ok := parseNumber(b[j:end]); {
		case !ok:
			fault = ErrTokenOutOfRange // beyond 1e21
		case f != math.Trunc(f):
			fault = ErrPromptType
		case f < 0 || f > float64(p.maxTok): // -0 is 0, not below it
			fault = ErrTokenOutOfRange
		default:
			p.r.Tokens = append(p.r.Tokens, uint32(f))
		}
		if fault != nil {
			p.errs[fPrompt] = fault
			return jsonscan.SkipValue(b, i, depth-1)
		}
		j = jsonscan.SkipSpace(b, end)
		if j >= len(b) {
			return -1
		}
		switch b[j] {
		case ',':
			j = jsonscan.SkipSpace(b, j+1)
		case ']':
			p.r.Prompt = PromptTokens
			return j + 1
		default:
			return -1
		}
	}
}

func (p *parser) messages(i int) int {
	r := p.r
	b := p.b
	p.errs[fMessages] = nil
	r.Prompt, r.Messages = PromptNone, nil
	switch b[i] {
	case 'n':
		return jsonscan.ScanLiteral(b, i, "null")
	case '[':
	default:
		p.errs[fMessages] = ErrMessagesType
		return jsonscan.SkipValue(b, i, 1)
	}
	j := jsonscan.SkipSpace(b, i+1)
	if j < len(b) && b[j] == ']' {
		p.errs[fMessages] = ErrEmptyMessages
		return j + 1
	}
	for {
		if j >= len(b) {
			return -1
		}
		if b[j] != '{' {
			p.errs[fMessages] = ErrMessagesType
			return jsonscan.SkipValue(b, i, 1)
		}
		if j = jsonscan.SkipValue(b, j, 2); j < 0 {
			return -1
		}
		j = jsonscan.SkipSpace(b, j)
		if j >= len(b) {
			return -1
		}
		switch b[j] {
		case ',':
			j = jsonscan.SkipSpace(b, j+1)
		case ']':
			r.Prompt, r.Messages = PromptMessages, b[i:j+1]
			return j + 1
		default:
			return -1
		}
	}
}

// parseNumber reads a JSON number (jsonscan.ScanNumber accepted it) as a
// float64, reporting false where it is not finite. Numbers far beyond
// what any field here takes (above 1e21 in magnitude) are refused before
// strconv sees them: its range error is allocated, and a client could
// make every request pay for one with "max_tokens":1e999.
func parseNumber(num []byte) (float64, bool) {
	if decimalMagnitude(num) > 21 {
		return 0, false
	}
	v, err := strconv.ParseFloat(unsafe.String(unsafe.SliceData(num), len(num)), 64)
	return v, err == nil
}

// decimalMagnitude is the power of ten just above the absolute value of
// the JSON number num: 1 for 5, 3 for 123.4, -1 for 0.05, 2 for 1e1. Zero
// (any number with no non-zero digit) is reported as very small.
func decimalMagnitude(num []byte) int {
	const clamp = 1 << 20 // far beyond float64's range, far from overflow
	i := 0
	if i < len(num) && num[i] == '-' {
		i++
	}
	mag, seen, frac := 0, false, false
	for ; i < len(num); i++ {
		switch c := num[i]; {
		case c == '.':
			frac = true
		case c >= '0' && c <= '9':
			switch {
			case c != '0' && !seen:
				seen = true
				if !frac {
					mag = 1
				}
			case seen && !frac:
				if mag < clamp {
					mag++
				}
			case !seen && frac:
				if mag > -clamp {
					mag--
				}
			}
		default: // 'e' or 'E': the exponent follows
			if !seen {
				return -clamp
			}
			return mag + exponent(num[i+1:], clamp)
		}
	}
	if !seen {
		return -clamp
	}
	return mag
}

// exponent is the signed decimal integer b (a JSON number's exponent),
// clamped to ±limit.
func exponent(b []byte, limit int) int {
	sign := 1
	if len(b) > 0 && (b[0] == '+' || b[0] == '-') {
		if b[0] == '-' {
			sign = -1
		}
		b = b[1:]
	}
	e := 0
	for _, c := range b {
		if e < limit {
			e = e*10 + int(c-'0')
		}
	}
	return sign * min(e, limit)
}
