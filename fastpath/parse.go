package fastpath

import (
	"encoding/binary"
	"math"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// DefaultMaxBodyBytes bounds a request body when the Parser sets no limit. A
// 128K-token prompt written as token ids is under 1 MiB; the rest is room
// for chat messages carrying inline images.
const DefaultMaxBodyBytes = 16 << 20

// maxDepth is the deepest nesting of arrays and objects accepted, the same
// limit encoding/json applies, so both agree on which documents are valid.
const maxDepth = 10000

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
	Prompt    PromptKind
	// Tokens holds the prompt token ids when Prompt is PromptTokens.
	Tokens []uint32
	// Text is the prompt string exactly as it appears between the quotes in
	// the body, escapes included, when Prompt is PromptText. Approximate
	// hashing wants stable bytes, not decoded text.
	Text []byte
	// Messages is the raw JSON array of chat messages, brackets included,
	// when Prompt is PromptMessages.
	Messages []byte
	Stream   bool
	// MaxTokens is max_completion_tokens if given, else max_tokens, else 0:
	// the precedence engines apply.
	MaxTokens int64
	// Choices is n, the completions asked for per prompt; 0 when absent
	// (engines then generate one). With several, the first finish_reason
	// does not end the request.
	Choices int64

	modelBuf, saltBuf   []byte
	maxTokens, maxCompl int64
}

// Reset empties r and keeps its buffers.
func (r *ParsedRequest) Reset() {
	*r = ParsedRequest{
		Tokens:   r.Tokens[:0],
		modelBuf: r.modelBuf[:0],
		saltBuf:  r.saltBuf[:0],
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
	}
	return nil
}

// maxPooledTokens keeps the pool from pinning the buffer of one huge prompt.
const maxPooledTokens = 1 << 18

var parsedPool = sync.Pool{New: func() any { return new(ParsedRequest) }}

// AcquireParsedRequest returns an empty ParsedRequest from a pool.
func AcquireParsedRequest() *ParsedRequest {
	return parsedPool.Get().(*ParsedRequest)
}

// ReleaseParsedRequest returns r to the pool; r must not be used afterwards.
func ReleaseParsedRequest(r *ParsedRequest) {
	if cap(r.Tokens) > maxPooledTokens {
		r.Tokens = nil
	}
	if cap(r.modelBuf) > 1024 {
		r.modelBuf = nil
	}
	if cap(r.saltBuf) > 1024 {
		r.saltBuf = nil
	}
	r.Reset()
	parsedPool.Put(r)
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
	var err error
	switch {
	case !ps.document():
		err = ErrMalformedJSON
	case ps.notObject:
		err = ErrNotObject
	default:
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
	errs      [numFields]*RequestError
}

// document reports whether the whole body is one valid JSON value.
func (p *parser) document() bool {
	b := p.b
	i := skipWS(b, 0)
	if i >= len(b) {
		return false
	}
	if b[i] != '{' {
		i = skipValue(b, i, 0)
		if i < 0 {
			return false
		}
		p.notObject = true
		return skipWS(b, i) == len(b)
	}
	i = p.object(i)
	return i >= 0 && skipWS(b, i) == len(b)
}

// object walks the top-level object at b[i] == '{' and returns the index
// after it, or -1 if it is malformed.
func (p *parser) object(i int) int {
	b := p.b
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1
	}
	var kb [128]byte
	for {
		if i >= len(b) || b[i] != '"' {
			return -1
		}
		end, escaped := scanString(b, i)
		if end < 0 {
			return -1
		}
		key := b[i+1 : end-1]
		if escaped {
			// A decoded string is never longer than its escaped form, so a
			// key that fits kb decodes in place; longer ones match nothing.
			if len(key) <= len(kb) {
				key = appendUnescaped(kb[:0], key)
			} else {
				key = nil
			}
		}
		i = skipWS(b, end)
		if i >= len(b) || b[i] != ':' {
			return -1
		}
		i = skipWS(b, i+1)
		if i >= len(b) {
			return -1
		}
		if i = p.field(key, i); i < 0 {
			return -1
		}
		i = skipWS(b, i)
		if i >= len(b) {
			return -1
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
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
	case "max_tokens":
		return p.countField(i, fMaxTokens, &r.maxTokens, ErrMaxTokensType, ErrMaxTokensRange)
	case "max_completion_tokens":
		return p.countField(i, fMaxCompl, &r.maxCompl, ErrMaxTokensType, ErrMaxTokensRange)
	case "n":
		return p.countField(i, fChoices, &r.Choices, ErrChoicesType, ErrChoicesRange)
	}
	return skipValue(p.b, i, 1)
}

func (p *parser) stringField(i, f int, dst, buf *[]byte, typeErr *RequestError, nonEmpty bool) int {
	b := p.b
	p.errs[f] = nil
	*dst = nil
	switch b[i] {
	case '"':
		end, escaped := scanString(b, i)
		if end < 0 {
			return -1
		}
		raw := b[i+1 : end-1]
		switch {
		case nonEmpty && len(raw) == 0:
			p.errs[f] = typeErr
		case escaped:
			*buf = appendUnescaped((*buf)[:0], raw)
			*dst = *buf
		default:
			*dst = raw
		}
		return end
	case 'n':
		return literal(b, i, "null")
	}
	p.errs[f] = typeErr
	return skipValue(b, i, 1)
}

func (p *parser) boolField(i, f int, dst *bool, typeErr *RequestError) int {
	b := p.b
	p.errs[f] = nil
	*dst = false
	switch b[i] {
	case 't':
		*dst = true
		return literal(b, i, "true")
	case 'f':
		return literal(b, i, "false")
	case 'n':
		return literal(b, i, "null")
	}
	p.errs[f] = typeErr
	return skipValue(b, i, 1)
}

// countField parses max_tokens-like fields: a positive integer or null.
func (p *parser) countField(i, f int, dst *int64, typeErr, rangeErr *RequestError) int {
	b := p.b
	p.errs[f] = nil
	*dst = 0
	c := b[i]
	if c == 'n' {
		return literal(b, i, "null")
	}
	if c != '-' && (c < '0' || c > '9') {
		p.errs[f] = typeErr
		return skipValue(b, i, 1)
	}
	end := scanNumber(b, i)
	if end < 0 {
		return -1
	}
	for j := i; j < end; j++ {
		if d := b[j]; d == '.' || d == 'e' || d == 'E' {
			p.errs[f] = typeErr
			return end
		}
	}
	if c == '-' {
		p.errs[f] = rangeErr
		return end
	}
	var v int64
	for j := i; j < end; j++ {
		d := int64(b[j] - '0')
		if v > (math.MaxInt64-d)/10 {
			p.errs[f] = rangeErr
			return end
		}
		v = v*10 + d
	}
	if v < 1 {
		p.errs[f] = rangeErr
		return end
	}
	*dst = v
	return end
}

func (p *parser) prompt(i int) int {
	r := p.r
	b := p.b
	p.errs[fPrompt] = nil
	r.Prompt, r.Tokens, r.Text = PromptNone, r.Tokens[:0], nil
	switch b[i] {
	case '"':
		end, _ := scanString(b, i)
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
		return literal(b, i, "null")
	}
	p.errs[fPrompt] = ErrPromptType
	return skipValue(b, i, 1)
}

// promptArray handles the array forms of prompt at b[i] == '['. A batch of
// one is the same request as its only prompt, so it is accepted as that.
func (p *parser) promptArray(i int) int {
	r := p.r
	b := p.b
	j := skipWS(b, i+1)
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
		if end, _ = scanString(b, j); end < 0 {
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
	k := skipWS(b, end)
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
	return skipValue(p.b, i, 1)
}

// tokens decodes the array of token ids at b[i] == '[' (at nesting depth
// depth) into r.Tokens. On anything but a plain in-range integer it records
// the fault and validates the rest of the array generically.
func (p *parser) tokens(i, depth int) int {
	b := p.b
	r := p.r
	r.Tokens = r.Tokens[:0]
	maxTok := uint64(p.maxTok)
	j := skipWS(b, i+1)
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
				p.errs[fPrompt] = ErrTokenOutOfRange
			} else {
				p.errs[fPrompt] = ErrPromptType
			}
			return skipValue(b, i, depth-1)
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
				p.errs[fPrompt] = ErrPromptType
				return skipValue(b, i, depth-1)
			}
		}
		if v > maxTok {
			p.errs[fPrompt] = ErrTokenOutOfRange
			return skipValue(b, i, depth-1)
		}
		r.Tokens = append(r.Tokens, uint32(v))
		if j < len(b) && b[j] == ',' { // the common compact form "1,2,3"
			j++
			if j < len(b) && b[j] >= '0' && b[j] <= '9' {
				continue
			}
			j = skipWS(b, j)
			continue
		}
		j = skipWS(b, j)
		if j >= len(b) {
			return -1
		}
		switch b[j] {
		case ',':
			j = skipWS(b, j+1)
		case ']':
			// For a batch, promptArray then checks this array is alone.
			r.Prompt = PromptTokens
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
		return literal(b, i, "null")
	case '[':
	default:
		p.errs[fMessages] = ErrMessagesType
		return skipValue(b, i, 1)
	}
	j := skipWS(b, i+1)
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
			return skipValue(b, i, 1)
		}
		if j = skipValue(b, j, 2); j < 0 {
			return -1
		}
		j = skipWS(b, j)
		if j >= len(b) {
			return -1
		}
		switch b[j] {
		case ',':
			j = skipWS(b, j+1)
		case ']':
			r.Prompt, r.Messages = PromptMessages, b[i:j+1]
			return j + 1
		default:
			return -1
		}
	}
}

// skipWS returns the index of the first non-whitespace byte at or after i.
func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

func literal(b []byte, i int, lit string) int {
	if len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit {
		return i + len(lit)
	}
	return -1
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// scanNumber returns the index after the JSON number at b[i], or -1.
func scanNumber(b []byte, i int) int {
	if i < len(b) && b[i] == '-' {
		i++
	}
	if i >= len(b) {
		return -1
	}
	switch c := b[i]; {
	case c == '0':
		i++
	case c >= '1' && c <= '9':
		i++
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !isDigit(b[i]) {
			return -1
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return -1
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	return i
}

const (
	swarOnes  = 0x0101010101010101
	swarHighs = 0x8080808080808080
)

// stringSpecial reports whether any of the 8 bytes in x is a quote, a
// backslash or a control character: the only bytes a string scan must stop
// at. A borrow can flag the wrong byte, never miss one, and the caller then
// looks at bytes one by one.
func stringSpecial(x uint64) bool {
	q := x ^ (swarOnes * '"')
	s := x ^ (swarOnes * '\\')
	return ((x-swarOnes*0x20)&^x|(q-swarOnes)&^q|(s-swarOnes)&^s)&swarHighs != 0
}

// scanString validates the JSON string at b[i] == '"' and returns the index
// after its closing quote, or -1, and whether it contains escapes.
func scanString(b []byte, i int) (int, bool) {
	i++
	escaped := false
	for {
		for i+8 <= len(b) && !stringSpecial(binary.LittleEndian.Uint64(b[i:])) {
			i += 8
		}
		if i >= len(b) {
			return -1, escaped
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1, escaped
		case c == '\\':
			escaped = true
			if i+1 >= len(b) {
				return -1, escaped
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || hex4(b[i+2:i+6]) < 0 {
					return -1, escaped
				}
				i += 6
			default:
				return -1, escaped
			}
		case c < 0x20:
			return -1, escaped
		default:
			i++
		}
	}
}

// hex4 decodes four hex digits, or returns -1.
func hex4(h []byte) rune {
	var r rune
	for _, c := range h[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// appendUnescaped appends the decoded form of raw, the validated contents of
// a JSON string, to dst. Unpaired surrogates become U+FFFD, as in
// encoding/json.
func appendUnescaped(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			dst = append(dst, c)
			i++
			continue
		}
		e := raw[i+1]
		i += 2
		switch e {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := hex4(raw[i:])
			i += 4
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
					r2 = hex4(raw[i+2:])
				}
				if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
					r = d
					i += 6
				} else {
					r = utf8.RuneError
				}
			}
			dst = utf8.AppendRune(dst, r)
		default: // '"', '\\', '/'
			dst = append(dst, e)
		}
	}
	return dst
}

// skipValue validates the JSON value at b[i], which sits inside depth open
// containers, and returns the index after it, or -1.
func skipValue(b []byte, i, depth int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		end, _ := scanString(b, i)
		return end
	case '{', '[':
		return skipContainer(b, i, depth)
	case 't':
		return literal(b, i, "true")
	case 'f':
		return literal(b, i, "false")
	case 'n':
		return literal(b, i, "null")
	}
	return scanNumber(b, i)
}

// skipContainer validates the array or object at b[i] without recursion, so
// that hostile nesting costs a bit per level rather than a stack frame. The
// common shallow case keeps its bit stack in two words; only documents
// nested deeper than that pay for clearing a stack sized for maxDepth.
func skipContainer(b []byte, i, depth int) int {
	var shallow [2]uint64
	if end := walkContainer(b, i, depth, shallow[:]); end != errTooDeep {
		return end
	}
	return skipDeepContainer(b, i, depth)
}

func skipDeepContainer(b []byte, i, depth int) int {
	var deep [maxDepth/64 + 1]uint64
	return walkContainer(b, i, depth, deep[:])
}

// errTooDeep is walkContainer's answer when its bit stack is full.
const errTooDeep = -2

// walkContainer does skipContainer's work with isObject as the stack of
// open containers, one bit each (set for an object).
func walkContainer(b []byte, i, depth int, isObject []uint64) int {
	const (
		stValue = iota
		stKey
		stAfter
	)
	level := 0
	st := stValue
	for {
		switch st {
		case stKey:
			if i >= len(b) || b[i] != '"' {
				return -1
			}
			end, _ := scanString(b, i)
			if end < 0 {
				return -1
			}
			i = skipWS(b, end)
			if i >= len(b) || b[i] != ':' {
				return -1
			}
			i = skipWS(b, i+1)
			st = stValue
		case stValue:
			if i >= len(b) {
				return -1
			}
			switch c := b[i]; c {
			case '{', '[':
				if depth++; depth > maxDepth {
					return -1
				}
				if level == len(isObject)*64 {
					return errTooDeep
				}
				obj := c == '{'
				word, bit := level>>6, uint64(1)<<(level&63)
				if obj {
					isObject[word] |= bit
				} else {
					isObject[word] &^= bit
				}
				level++
				i = skipWS(b, i+1)
				if i >= len(b) {
					return -1
				}
				switch {
				case obj && b[i] == '}', !obj && b[i] == ']':
					i++
					level--
					depth--
					st = stAfter
				case obj:
					st = stKey
				}
				continue
			case '"':
				i, _ = scanString(b, i)
			case 't':
				i = literal(b, i, "true")
			case 'f':
				i = literal(b, i, "false")
			case 'n':
				i = literal(b, i, "null")
			default:
				i = scanNumber(b, i)
			}
			if i < 0 {
				return -1
			}
			st = stAfter
		case stAfter:
			if level == 0 {
				return i
			}
			i = skipWS(b, i)
			if i >= len(b) {
				return -1
			}
			obj := isObject[(level-1)>>6]&(1<<((level-1)&63)) != 0
			switch c := b[i]; {
			case c == ',':
				i = skipWS(b, i+1)
				if obj {
					st = stKey
				} else {
					st = stValue
				}
			case obj && c == '}', !obj && c == ']':
				i++
				level--
				depth--
			default:
				return -1
			}
		}
	}
}
