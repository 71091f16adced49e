package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Bounds on what a tokenizer.json may describe; real ones stay far below.
const (
	maxVocab       = 4 << 20
	maxMerges      = 8 << 20
	maxAddedTokens = 1 << 20
	maxTokenID     = 1<<24 - 1
	maxTokenBytes  = 64 << 10
	maxPatternLen  = 64 << 10
	maxNesting     = 16
)

// ErrUnsupported is wrapped by New's error for a tokenizer.json this
// package cannot reproduce exactly: a component it does not implement
// (another model type, BPE dropout, another normalizer or pre-tokenizer).
// A caller routes such a model approximately.
var ErrUnsupported = errors.New("unsupported")

type tokenizerFile struct {
	Version       *string          `json:"version"`
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Model         json.RawMessage  `json:"model"`
}

type addedTokenJSON struct {
	ID         *uint32 `json:"id"`
	Content    *string `json:"content"`
	SingleWord bool    `json:"single_word"`
	LStrip     bool    `json:"lstrip"`
	RStrip     bool    `json:"rstrip"`
	Normalized *bool   `json:"normalized"`
	Special    bool    `json:"special"`
}

type modelJSON struct {
	Type                    *string           `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	FuseUnk                 *bool             `json:"fuse_unk"`
	ByteFallback            *bool             `json:"byte_fallback"`
	IgnoreMerges            *bool             `json:"ignore_merges"`
	Vocab                   map[string]uint32 `json:"vocab"`
	Merges                  json.RawMessage   `json:"merges"`
}

// New builds a tokenizer from the bytes of tokenizer.json and of
// tokenizer_config.json (configJSON may be nil). It refuses, with an
// error, any file it could not tokenize exactly as the model's own
// implementation does.
func New(tokenizerJSON, configJSON []byte) (*Tokenizer, error) {
	if len(tokenizerJSON) > MaxTokenizerJSONBytes {
		return nil, fmt.Errorf("cannot load tokenizer.json: larger than %d bytes", MaxTokenizerJSONBytes)
	}
	initClasses()
	var f tokenizerFile
	if err := json.Unmarshal(tokenizerJSON, &f); err != nil {
		return nil, fmt.Errorf("cannot parse tokenizer.json: %w", err)
	}
	if f.Version != nil && *f.Version != "1.0" {
		return nil, fmt.Errorf("cannot load tokenizer.json: version %q: %w", *f.Version, ErrUnsupported)
	}
	t := &Tokenizer{}
	var err error
	if t.normalizer, err = parseNormalizer(f.Normalizer, 0); err != nil {
		return nil, fmt.Errorf("cannot load tokenizer.json: normalizer: %w", err)
	}
	if t.pre, err = parsePreTokenizer(f.PreTokenizer, 0, nil); err != nil {
		return nil, fmt.Errorf("cannot load tokenizer.json: pre_tokenizer: %w", err)
	}
	byteLevel := false
	for i, p := range t.pre {
		if _, ok := p.(byteLevelPre); ok {
			if i != len(t.pre)-1 {
				return nil, fmt.Errorf("cannot load tokenizer.json: pre_tokenizer: ByteLevel before another pre-tokenizer: %w", ErrUnsupported)
			}
			byteLevel = true
		}
	}
	cfg, err := parseModel(f.Model)
	if err != nil {
		return nil, fmt.Errorf("cannot load tokenizer.json: model: %w", err)
	}
	cfg.byteLevel = byteLevel
	maxID := -1
	for _, id := range cfg.vocab {
		maxID = max(maxID, int(id))
	}
	added, err := assignAddedIDs(f.AddedTokens, cfg.vocab, t.normalizer)
	if err != nil {
		return nil, fmt.Errorf("cannot load tokenizer.json: added_tokens: %w", err)
	}
	if t.model, err = newBPE(cfg); err != nil {
		return nil, fmt.Errorf("cannot load tokenizer.json: model: %w", err)
	}
	var raw, normalized []addedToken
	var rawPatterns, normPatterns []string
	for _, a := range added {
		maxID = max(maxID, int(a.tok.id))
		if a.tok.normalized {
			normalized = append(normalized, a.tok)
			normPatterns = append(normPatterns, a.pattern)
		} else {
			raw = append(raw, a.tok)
			rawPatterns = append(rawPatterns, a.pattern)
		}
	}
	t.cutAround = map[uint32]struct{}{}
	for _, tok := range raw {
		if !tok.lstrip && !tok.rstrip && !tok.singleWord {
			t.cutAround[tok.id] = struct{}{}
		}
	}
	for _, p := range t.pre {
		if m, ok := p.(metaspacePre); ok && m.scheme == prependFirst {
			t.positional = true
		}
	}
	if len(raw) > 0 {
		if t.rawTokens, err = buildTrie(raw, rawPatterns); err != nil {
			return nil, fmt.Errorf("cannot load tokenizer.json: added_tokens: %w", err)
		}
	}
	if len(normalized) > 0 {
		if t.normTokens, err = buildTrie(normalized, normPatterns); err != nil {
			return nil, fmt.Errorf("cannot load tokenizer.json: added_tokens: %w", err)
		}
	}
	if t.prefix, t.suffix, err = parsePostProcessor(f.PostProcessor, 0); err != nil {
		return nil, fmt.Errorf("cannot load tokenizer.json: post_processor: %w", err)
	}
	for _, id := range append(append([]uint32(nil), t.prefix...), t.suffix...) {
		maxID = max(maxID, int(id))
	}
	t.vocabSize = maxID + 1
	if configJSON != nil {
		if t.config, err = parseConfig(configJSON); err != nil {
			return nil, err
		}
	}
	t.setEngineAffixes()
	return t, nil
}

// typeOf reads the "type" of a tagged component; "" when it has none.
func typeOf(raw json.RawMessage) (string, error) {
	var tagged struct {
		Type *string `json:"type"`
	}
	if err := json.Unmarshal(raw, &tagged); err != nil {
		return "", err
	}
	if tagged.Type == nil {
		return "", nil
	}
	return *tagged.Type, nil
}

func isNull(raw json.RawMessage) bool {
	return len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null"
}

// patternJSON is {"String": s} or {"Regex": r}.
type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

func (p patternJSON) matcher() (matcher, error) {
	switch {
	case p.String != nil && p.Regex == nil:
		if len(*p.String) > maxPatternLen {
			return nil, fmt.Errorf("cannot use a pattern of %d bytes", len(*p.String))
		}
		return newMatcher(*p.String, true)
	case p.Regex != nil && p.String == nil:
		if len(*p.Regex) > maxPatternLen {
			return nil, fmt.Errorf("cannot use a pattern of %d bytes", len(*p.Regex))
		}
		return newMatcher(*p.Regex, false)
	}
	return nil, errors.New("cannot read pattern: want exactly one of String and Regex")
}

func parseNormalizer(raw json.RawMessage, depth int) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	if depth > maxNesting {
		return nil, errors.New("cannot nest normalizers that deep")
	}
	typ, err := typeOf(raw)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "Sequence":
		var s struct {
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		var seq normSequence
		for _, r := range s.Normalizers {
			n, err := parseNormalizer(r, depth+1)
			if err != nil {
				return nil, err
			}
			// Flattened: normSequence owns the state's two scratch
			// buffers, which a nested sequence would share.
			if inner, ok := n.(normSequence); ok {
				seq = append(seq, inner...)
			} else if n != nil {
				seq = append(seq, n)
			}
		}
		switch len(seq) {
		case 0:
			return nil, nil
		case 1:
			return seq[0], nil
		}
		return seq, nil
	case "NFC":
		return unicodeNorm{norm.NFC}, nil
	case "NFD":
		return unicodeNorm{norm.NFD}, nil
	case "NFKC":
		return unicodeNorm{norm.NFKC}, nil
	case "NFKD":
		return unicodeNorm{norm.NFKD}, nil
	case "Lowercase":
		return lowercase{}, nil
	case "StripAccents":
		return stripAccents{}, nil
	case "Strip":
		var s struct {
			Left  bool `json:"strip_left"`
			Right bool `json:"strip_right"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return strip{s.Left, s.Right}, nil
	case "Prepend":
		var p struct {
			Prepend *string `json:"prepend"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, err
		}
		if p.Prepend == nil {
			return nil, errors.New("cannot read Prepend: no prepend")
		}
		return prepend{*p.Prepend}, nil
	case "Replace":
		var r struct {
			Pattern patternJSON `json:"pattern"`
			Content *string     `json:"content"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, err
		}
		if r.Content == nil {
			return nil, errors.New("cannot read Replace: no content")
		}
		m, err := r.Pattern.matcher()
		if err != nil {
			return nil, err
		}
		return replace{m: m, content: *r.Content}, nil
	}
	return nil, fmt.Errorf("normalizer %q: %w", typ, ErrUnsupported)
}

func parsePreTokenizer(raw json.RawMessage, depth int, out []preTokenizer) ([]preTokenizer, error) {
	if isNull(raw) {
		return out, nil
	}
	if depth > maxNesting {
		return nil, errors.New("cannot nest pre-tokenizers that deep")
	}
	typ, err := typeOf(raw)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "Sequence":
		var s struct {
			PreTokenizers []json.RawMessage `json:"pretokenizers"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		for _, r := range s.PreTokenizers {
			if isNull(r) {
				return nil, errors.New("cannot read Sequence: null pre-tokenizer")
			}
			if out, err = parsePreTokenizer(r, depth+1, out); err != nil {
				return nil, err
			}
		}
		return out, nil
	case "Split":
		var s struct {
			Pattern  patternJSON `json:"pattern"`
			Behavior string      `json:"behavior"`
			Invert   bool        `json:"invert"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		b, err := parseBehavior(s.Behavior)
		if err != nil {
			return nil, err
		}
		m, err := s.Pattern.matcher()
		if err != nil {
			return nil, err
		}
		return append(out, splitPre{m: m, behavior: b, invert: s.Invert}), nil
	case "ByteLevel":
		var b struct {
			AddPrefixSpace *bool `json:"add_prefix_space"`
			TrimOffsets    *bool `json:"trim_offsets"`
			UseRegex       *bool `json:"use_regex"`
		}
		if err := json.Unmarshal(raw, &b); err != nil {
			return nil, err
		}
		// The model's loader requires both; use_regex defaults to true.
		if b.AddPrefixSpace == nil || b.TrimOffsets == nil {
			return nil, errors.New("cannot read ByteLevel: add_prefix_space and trim_offsets are required")
		}
		return append(out, byteLevelPre{addPrefixSpace: *b.AddPrefixSpace, useRegex: b.UseRegex == nil || *b.UseRegex}), nil
	case "Metaspace":
		var m struct {
			Replacement    *string `json:"replacement"`
			AddPrefixSpace *bool   `json:"add_prefix_space"`
			PrependScheme  *string `json:"prepend_scheme"`
			Split          *bool   `json:"split"`
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, err
		}
		if m.Replacement == nil || utf8.RuneCountInString(*m.Replacement) != 1 {
			return nil, errors.New("cannot read Metaspace: replacement must be one character")
		}
		scheme := prependAlways
		if m.PrependScheme != nil {
			switch *m.PrependScheme {
			case "always":
			case "first":
				scheme = prependFirst
			case "never":
				scheme = prependNever
			default:
				return nil, fmt.Errorf("cannot read Metaspace: prepend_scheme %q", *m.PrependScheme)
			}
		}
		if m.AddPrefixSpace != nil && !*m.AddPrefixSpace {
			if scheme != prependNever {
				return nil, errors.New("cannot read Metaspace: add_prefix_space does not match declared prepend_scheme")
			}
		}
		split := m.Split == nil || *m.Split
		return append(out, metaspacePre{replacement: *m.Replacement, scheme: scheme, splitting: split}), nil
	case "Digits":
		var d struct {
			Individual bool `json:"individual_digits"`
		}
		if err := json.Unmarshal(raw, &d); err != nil {
			return nil, err
		}
		b := splitContiguous
		if d.Individual {
			b = splitIsolated
		}
		return append(out, charPre{is: isNumeric, behavior: b}), nil
	case "WhitespaceSplit":
		return append(out, charPre{is: isWhitespace, behavior: splitRemoved}), nil
	case "CharDelimiterSplit":
		var d struct {
			Delimiter string `json:"delimiter"`
		}
		if err := json.Unmarshal(raw, &d); err != nil {
			return nil, err
		}
		if utf8.RuneCountInString(d.Delimiter) != 1 {
			return nil, errors.New("cannot read CharDelimiterSplit: delimiter must be one character")
		}
		r, _ := utf8.DecodeRuneInString(d.Delimiter)
		return append(out, delimiterPre(r)), nil
	}
	return nil, fmt.Errorf("pre-tokenizer %q: %w", typ, ErrUnsupported)
}

func parseModel(raw json.RawMessage) (bpeConfig, error) {
	var c bpeConfig
	if isNull(raw) {
		return c, errors.New("cannot load a tokenizer without a model")
	}
	var m modelJSON
	if err := json.Unmarshal(raw, &m); err != nil {
		return c, err
	}
	if m.Type != nil && *m.Type != "BPE" {
		return c, fmt.Errorf("model %q: %w", *m.Type, ErrUnsupported)
	}
	if m.Vocab == nil || isNull(m.Merges) {
		return c, errors.New("cannot read BPE: missing vocab or merges")
	}
	if m.Dropout != nil && *m.Dropout != 0 {
		// Dropout samples merges at random: no one can reproduce it.
		return c, fmt.Errorf("BPE dropout %v: %w", *m.Dropout, ErrUnsupported)
	}
	if len(m.Vocab) > maxVocab {
		return c, fmt.Errorf("cannot read BPE: %d vocabulary entries, more than %d", len(m.Vocab), maxVocab)
	}
	for k, id := range m.Vocab {
		if id > maxTokenID {
			return c, fmt.Errorf("cannot read BPE: token %q has id %d, above %d", k, id, maxTokenID)
		}
		if len(k) > maxTokenBytes {
			return c, fmt.Errorf("cannot read BPE: a token of %d bytes", len(k))
		}
	}
	merges, err := parseMerges(m.Merges)
	if err != nil {
		return c, err
	}
	c.vocab = m.Vocab
	c.merges = merges
	c.unk = m.UnkToken
	if m.ContinuingSubwordPrefix != nil {
		c.prefix = *m.ContinuingSubwordPrefix
	}
	if m.EndOfWordSuffix != nil {
		c.suffix = *m.EndOfWordSuffix
	}
	c.fuseUnk = m.FuseUnk != nil && *m.FuseUnk
	c.byteFallback = m.ByteFallback != nil && *m.ByteFallback
	c.ignoreMerges = m.IgnoreMerges != nil && *m.IgnoreMerges
	return c, nil
}

// parseMerges reads merges as pairs, [["a","b"],...], or as the older
// strings, ["a b",...].
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	var pairs [][2]string
	if err := json.Unmarshal(raw, &pairs); err == nil {
		if len(pairs) > maxMerges {
			return nil, fmt.Errorf("cannot read BPE: %d merges, more than %d", len(pairs), maxMerges)
		}
		return pairs, nil
	}
	var lines []string
	if err := json.Unmarshal(raw, &lines); err != nil {
		return nil, fmt.Errorf("cannot read BPE merges: %w", err)
	}
	if len(lines) > maxMerges {
		return nil, fmt.Errorf("cannot read BPE: %d merges, more than %d", len(lines), maxMerges)
	}
	pairs = make([][2]string, 0, len(lines))
	for _, l := range lines {
		if strings.HasPrefix(l, "#version") {
			continue
		}
		a, b, ok := strings.Cut(l, " ")
		if !ok || strings.Contains(b, " ") {
			return nil, fmt.Errorf("cannot read BPE merge %d: %q is not two tokens", len(pairs)+1, l)
		}
		pairs = append(pairs, [2]string{a, b})
	}
	return pairs, nil
}

// assigned is an added token with the text it is matched by.
type assigned struct {
	tok     addedToken
	pattern string
}

// assignAddedIDs gives added tokens their ids as the model's loader does:
// the id the vocabulary (or an earlier added token) has for the content,
// else the next one past the vocabulary, whatever id the file wrote; a
// later token with an id already taken replaces the earlier one.
func assignAddedIDs(tokens []addedTokenJSON, vocab map[string]uint32, n normalizer) ([]assigned, error) {
	if len(tokens) > maxAddedTokens {
		return nil, fmt.Errorf("cannot read %d added tokens, more than %d", len(tokens), maxAddedTokens)
	}
	byContent := map[string]uint32{}
	byID := map[uint32]addedToken{}
	var order []uint32
	nextID := uint32(len(vocab))
	for _, j := range tokens {
		if j.Content == nil {
			return nil, errors.New("cannot read an added token without content")
		}
		if len(*j.Content) > maxTokenBytes {
			return nil, fmt.Errorf("cannot read an added token of %d bytes", len(*j.Content))
		}
		tok := addedToken{
			content:    *j.Content,
			special:    j.Special,
			singleWord: j.SingleWord,
			lstrip:     j.LStrip,
			rstrip:     j.RStrip,
			normalized: j.Normalized == nil || *j.Normalized,
		}
		if tok.content == "" {
			continue
		}
		if id, ok := byContent[tok.content]; ok {
			if prev, ok := byID[id]; ok && prev == withID(tok, id) {
				continue
			}
		}
		id, ok := byContent[tok.content]
		if !ok {
			id, ok = vocab[tok.content]
		}
		if !ok {
			id = nextID
			nextID++
		}
		if id > maxTokenID {
			return nil, fmt.Errorf("cannot give added token %q id %d, above %d", tok.content, id, maxTokenID)
		}
		tok.id = id
		byContent[tok.content] = id
		if _, seen := byID[id]; !seen {
			order = append(order, id)
		}
		byID[id] = tok
	}
	st := new(encodeState)
	out := make([]assigned, 0, len(order))
	for _, id := range order {
		tok := byID[id]
		pattern := tok.content
		if tok.normalized && n != nil {
			pattern = string(n.apply(st, nil, []byte(tok.content)))
		}
		out = append(out, assigned{tok: tok, pattern: pattern})
	}
	return out, nil
}

func withID(t addedToken, id uint32) addedToken {
	t.id = id
	return t
}

func parsePostProcessor(raw json.RawMessage, depth int) (prefix, suffix []uint32, err error) {
	if isNull(raw) {
		return nil, nil, nil
	}
	if depth > maxNesting {
		return nil, nil, errors.New("cannot nest post-processors that deep")
	}
	typ, err := typeOf(raw)
	if err != nil {
		return nil, nil, err
	}
	switch typ {
	case "ByteLevel":
		return nil, nil, nil // offsets only
	case "Sequence":
		var s struct {
			Processors []json.RawMessage `json:"processors"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, nil, err
		}
		for _, r := range s.Processors {
			p, q, err := parsePostProcessor(r, depth+1)
			if err != nil {
				return nil, nil, err
			}
			// Each step wraps what the previous ones made.
			prefix = append(append([]uint32(nil), p...), prefix...)
			suffix = append(suffix, q...)
		}
		return prefix, suffix, nil
	case "RobertaProcessing", "BertProcessing":
		var r struct {
			Sep [2]json.RawMessage `json:"sep"`
			Cls [2]json.RawMessage `json:"cls"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, nil, err
		}
		var sep, cls uint32
		if err := json.Unmarshal(r.Sep[1], &sep); err != nil {
			return nil, nil, fmt.Errorf("cannot read %s sep: %w", typ, err)
		}
		if err := json.Unmarshal(r.Cls[1], &cls); err != nil {
			return nil, nil, fmt.Errorf("cannot read %s cls: %w", typ, err)
		}
		return []uint32{cls}, []uint32{sep}, nil
	case "TemplateProcessing":
		return parseTemplate(raw)
	}
	return nil, nil, fmt.Errorf("post-processor %q: %w", typ, ErrUnsupported)
}

// parseTemplate reads a TemplateProcessing's single-sequence template as
// the special tokens before and after the sequence.
func parseTemplate(raw json.RawMessage) (prefix, suffix []uint32, err error) {
	var t struct {
		Single        []json.RawMessage `json:"single"`
		SpecialTokens map[string]struct {
			IDs []uint32 `json:"ids"`
		} `json:"special_tokens"`
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		// The single template may also be one string, "[CLS] $A [SEP]".
		var s struct {
			Single        string `json:"single"`
			SpecialTokens map[string]struct {
				IDs []uint32 `json:"ids"`
			} `json:"special_tokens"`
		}
		if err2 := json.Unmarshal(raw, &s); err2 != nil {
			return nil, nil, err
		}
		for _, f := range strings.Fields(s.Single) {
			b, _ := json.Marshal(f)
			t.Single = append(t.Single, b)
		}
		t.SpecialTokens = s.SpecialTokens
	}
	seenA := false
	for _, p := range t.Single {
		name, isSeq, err := templatePiece(p)
		if err != nil {
			return nil, nil, err
		}
		if isSeq {
			if name != "A" || seenA {
				return nil, nil, fmt.Errorf("single template uses sequence %q: %w", name, ErrUnsupported)
			}
			seenA = true
			continue
		}
		tok, ok := t.SpecialTokens[name]
		if !ok {
			return nil, nil, fmt.Errorf("cannot read TemplateProcessing: missing special token %q", name)
		}
		for _, id := range tok.IDs {
			if id > maxTokenID {
				return nil, nil, fmt.Errorf("cannot read TemplateProcessing: id %d above %d", id, maxTokenID)
			}
		}
		if seenA {
			suffix = append(suffix, tok.IDs...)
		} else {
			prefix = append(prefix, tok.IDs...)
		}
	}
	if !seenA {
		return nil, nil, errors.New("cannot read TemplateProcessing: the single template has no $A")
	}
	return prefix, suffix, nil
}

// templatePiece reads {"SpecialToken":{"id":..}}, {"Sequence":{"id":..}},
// or the string form ("$A", "$B:1", "[CLS]", "[SEP]:0").
func templatePiece(raw json.RawMessage) (name string, isSequence bool, err error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if i := strings.LastIndexByte(s, ':'); i > 0 {
			s = s[:i]
		}
		if strings.HasPrefix(s, "$") {
			seq := strings.TrimPrefix(s, "$")
			if seq == "" {
				seq = "A"
			}
			return seq, true, nil
		}
		return s, false, nil
	}
	var p struct {
		SpecialToken *struct {
			ID string `json:"id"`
		} `json:"SpecialToken"`
		Sequence *struct {
			ID string `json:"id"`
		} `json:"Sequence"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return "", false, fmt.Errorf("cannot read template piece: %w", err)
	}
	switch {
	case p.SpecialToken != nil:
		return p.SpecialToken.ID, false, nil
	case p.Sequence != nil:
		return p.Sequence.ID, true, nil
	}
	return "", false, errors.New("cannot read template piece: neither SpecialToken nor Sequence")
}
