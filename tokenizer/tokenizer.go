package tokenizer

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"unicode/utf8"
)

// Tokenizer turns text into token ids as the Hugging Face tokenizer
// described by a tokenizer.json does. It is immutable once built and safe
// for concurrent use.
type Tokenizer struct {
	rawTokens  *tokenTrie // added tokens matched in the raw text
	normTokens *tokenTrie // added tokens matched in normalized text
	normalizer normalizer // nil when there is none
	pre        []preTokenizer
	model      *bpeModel

	// The post-processor's special tokens around a single sequence, and
	// those transformers' tokenizer class puts there (EngineAffixes).
	prefix, suffix             []uint32
	enginePrefix, engineSuffix []uint32

	vocabSize int
	config    Config

	// cutAround holds the raw added tokens a text may be cut around
	// (AppendCuts): those that strip no whitespace and need no word
	// boundary. positional is set when the pre-tokenizer treats the start
	// of the text specially (Metaspace's "first" scheme), so that no cut
	// is safe.
	cutAround  map[uint32]struct{}
	positional bool

	states sync.Pool
}

// Config is what tokenizer_config.json (and chat_template.jinja, which
// transformers prefers to the config's own template) says that the router
// needs.
type Config struct {
	// BOSToken and EOSToken are the tokens' text, "" when absent.
	BOSToken, EOSToken string
	// ChatTemplate is the default chat template, "" when none; when the
	// file has a list of named templates, it is the one named "default".
	ChatTemplate string
	// ChatTemplates holds all named templates when the file has a list.
	ChatTemplates map[string]string
	// AddBOSToken and AddEOSToken are as given, nil when absent.
	// transformers' Llama- and Gemma-style tokenizer classes rebuild the
	// post-processor from them; Encode follows tokenizer.json alone, and
	// EngineAffixes follows transformers.
	AddBOSToken, AddEOSToken *bool
	// TokenizerClass is the class transformers loads the files as.
	TokenizerClass string
}

// Size limits on operator-supplied files: they are read whole, so a
// runaway file must fail to load rather than exhaust memory.
const (
	MaxTokenizerJSONBytes = 256 << 20
	MaxConfigJSONBytes    = 32 << 20
	MaxChatTemplateBytes  = 8 << 20
)

// Load reads dir/tokenizer.json and, if present, dir/tokenizer_config.json
// and dir/chat_template.jinja.
func Load(dir string) (*Tokenizer, error) {
	tokJSON, err := readLimited(filepath.Join(dir, "tokenizer.json"), MaxTokenizerJSONBytes)
	if err != nil {
		return nil, fmt.Errorf("cannot load tokenizer: %w", err)
	}
	cfgJSON, err := readLimited(filepath.Join(dir, "tokenizer_config.json"), MaxConfigJSONBytes)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("cannot load tokenizer: %w", err)
	}
	t, err := New(tokJSON, cfgJSON)
	if err != nil {
		return nil, err
	}
	tmpl, err := readLimited(filepath.Join(dir, "chat_template.jinja"), MaxChatTemplateBytes)
	switch {
	case err == nil:
		t.config.ChatTemplate = string(tmpl)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("cannot load tokenizer: %w", err)
	}
	return t, nil
}

func readLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("cannot read %s: larger than %d bytes", path, limit)
	}
	return b, nil
}

// Config returns what tokenizer_config.json says.
func (t *Tokenizer) Config() Config { return t.config }

// Encode appends the token ids of text to dst, exactly as HF tokenizers'
// encode(text, add_special_tokens=addSpecial) does: added and special
// tokens in the text are matched as tokens, then the normalizer, the
// pre-tokenizer and the model run, and, when addSpecial is set, the
// post-processor's special tokens (BOS/EOS) are added. It never truncates
// or pads. Text that is not valid UTF-8 is read as a WHATWG decoder reads
// it, each maximal ill-formed subsequence becoming U+FFFD. Safe for
// concurrent use; in the steady state it makes no allocations.
func (t *Tokenizer) Encode(dst []uint32, text []byte, addSpecial bool) []uint32 {
	st, _ := t.states.Get().(*encodeState)
	if st == nil {
		st = new(encodeState)
	}
	if addSpecial {
		dst = append(dst, t.prefix...)
	}
	if !utf8.Valid(text) {
		st.lossy = appendLossy(st.lossy[:0], text)
		text = st.lossy
	}
	dst = t.encodeText(st, dst, text)
	if addSpecial {
		dst = append(dst, t.suffix...)
	}
	st.trim()
	t.states.Put(st)
	return dst
}

// EngineAffixes are the special tokens an engine's transformers tokenizer
// puts around a single sequence when asked to add them: those of
// tokenizer.json's post-processor (Encode(text, true) is prefix,
// Encode(text, false), suffix), except for the classes whose constructor
// replaces that post-processor with BOS and EOS as add_bos_token (default
// true) and add_eos_token (default false) say
// (LlamaTokenizerFast.update_post_processor, and Gemma's): DeepSeek-V3's
// tokenizer.json adds nothing, its config says LlamaTokenizerFast with
// add_bos_token, and vLLM's prompts begin with BOS. The slices are the
// tokenizer's own; callers must not modify them.
func (t *Tokenizer) EngineAffixes() (prefix, suffix []uint32) { return t.enginePrefix, t.engineSuffix }

// rebuildsPostProcessor lists the tokenizer classes whose transformers
// constructor rebuilds the post-processor from add_bos_token and
// add_eos_token.
var rebuildsPostProcessor = map[string]bool{
	"LlamaTokenizer": true, "LlamaTokenizerFast": true,
	"CodeLlamaTokenizer": true, "CodeLlamaTokenizerFast": true,
	"GemmaTokenizer": true, "GemmaTokenizerFast": true,
}

// setEngineAffixes derives EngineAffixes from the config, once loaded. A
// BOS or EOS text that is not one token of the vocabulary leaves that
// side as tokenizer.json has it.
func (t *Tokenizer) setEngineAffixes() {
	t.enginePrefix, t.engineSuffix = t.prefix, t.suffix
	c := &t.config
	if !rebuildsPostProcessor[c.TokenizerClass] {
		return
	}
	side := func(add *bool, byDefault bool, text string, fallback []uint32) []uint32 {
		if add != nil {
			byDefault = *add
		}
		if !byDefault {
			return nil
		}
		if ids := t.Encode(nil, []byte(text), false); text != "" && len(ids) == 1 {
			return ids
		}
		return fallback
	}
	t.enginePrefix = side(c.AddBOSToken, true, c.BOSToken, t.prefix)
	t.engineSuffix = side(c.AddEOSToken, false, c.EOSToken, t.suffix)
}

// AppendCuts appends to dst, ascending, the byte offsets at which text may
// be cut without changing its ids: Encode(text) equals the Encode of the
// pieces, concatenated, when special tokens are not added. They are the
// two sides of every added token matched in the raw text: the model
// splits the input there before normalizing and pre-tokenizing, so
// nothing merges across. Tokens that strip neighbouring whitespace or
// need a word boundary are left out (their match depends on what lies
// beside them), and so is every cut when the pre-tokenizer treats the
// start of the text specially. A prompt cache keys its pieces on these
// cuts. It allocates only to grow dst.
func (t *Tokenizer) AppendCuts(dst []int, text []byte) []int {
	if t.positional || t.rawTokens == nil || !utf8.Valid(text) {
		return dst
	}
	st, _ := t.states.Get().(*encodeState)
	if st == nil {
		st = new(encodeState)
	}
	st.rawSegs = t.rawTokens.appendMatches(text, st.rawSegs[:0])
	last := 0
	for _, seg := range st.rawSegs {
		if seg.token < 0 || seg.end <= seg.start {
			continue
		}
		if _, ok := t.cutAround[uint32(seg.token)]; !ok {
			continue
		}
		if seg.start > last {
			dst = append(dst, seg.start)
		}
		if seg.end < len(text) {
			dst = append(dst, seg.end)
		}
		last = seg.end
	}
	t.states.Put(st)
	return dst
}

// encodeText splits the text at the added tokens matched in raw text and
// encodes what lies between them.
func (t *Tokenizer) encodeText(st *encodeState, dst []uint32, text []byte) []uint32 {
	st.rawSegs = t.rawTokens.appendMatches(text, st.rawSegs[:0])
	for _, seg := range st.rawSegs {
		switch {
		case seg.end <= seg.start:
		case seg.token >= 0:
			dst = append(dst, uint32(seg.token))
		default:
			dst = t.encodeNormalized(st, dst, text[seg.start:seg.end], seg.start == 0)
		}
	}
	return dst
}

// encodeNormalized normalizes a stretch of text, splits it at the added
// tokens matched in normalized text, and encodes the rest.
func (t *Tokenizer) encodeNormalized(st *encodeState, dst []uint32, text []byte, first bool) []uint32 {
	if t.normalizer != nil {
		st.norm = t.normalizer.apply(st, st.norm[:0], text)
		text = st.norm
	}
	if t.normTokens == nil {
		if len(text) > 0 {
			dst = t.encodePiece(st, dst, text, first)
		}
		return dst
	}
	st.normSegs = t.normTokens.appendMatches(text, st.normSegs[:0])
	for _, seg := range st.normSegs {
		switch {
		case seg.end <= seg.start:
		case seg.token >= 0:
			dst = append(dst, uint32(seg.token))
		default:
			dst = t.encodePiece(st, dst, text[seg.start:seg.end], first && seg.start == 0)
		}
	}
	return dst
}

// encodePiece pre-tokenizes a stretch of normalized text and encodes each
// word with the model.
func (t *Tokenizer) encodePiece(st *encodeState, dst []uint32, text []byte, first bool) []uint32 {
	if len(t.pre) == 0 {
		return t.encodeWord(st, dst, text)
	}
	st.arena = append(st.arena[:0], text...)
	cur := append(st.piecesA[:0], piece{off: 0, end: len(text), first: first})
	next := st.piecesB[:0]
	for _, p := range t.pre {
		next = next[:0]
		for _, pc := range cur {
			next = p.split(st, pc, next)
		}
		cur, next = next, cur
	}
	st.piecesA, st.piecesB = cur, next
	for _, pc := range cur {
		dst = t.encodeWord(st, dst, st.arena[pc.off:pc.end])
	}
	return dst
}

// encodeWord encodes one pre-tokenized word, a stretch at a time when no
// merge spans the model's word boundary.
func (t *Tokenizer) encodeWord(st *encodeState, dst []uint32, word []byte) []uint32 {
	if t.model.wordBoundary == 0 {
		return t.encodeStretch(st, dst, word)
	}
	for i := 0; i < len(word); {
		j := t.model.nextWordStart(word, i)
		dst = t.encodeStretch(st, dst, word[i:j])
		i = j
	}
	return dst
}

// encodeStretch encodes a word or a stretch of one, through the word cache
// when it is short.
func (t *Tokenizer) encodeStretch(st *encodeState, dst []uint32, word []byte) []uint32 {
	if len(word) > cacheKeyBytes {
		return t.model.encodeWord(st, word, dst)
	}
	ids, h, ok := st.cache.get(word)
	if ok {
		return append(dst, ids...)
	}
	start := len(dst)
	dst = t.model.encodeWord(st, word, dst)
	if len(dst)-start <= cacheMaxIDs {
		st.cache.put(h, word, dst[start:])
	}
	return dst
}
