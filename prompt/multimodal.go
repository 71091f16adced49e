package prompt

import (
	"context"
	"errors"

	"github.com/kvfast/kvfast/internal/jsonscan"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/radix"
)

// Multimodal prompts. An engine caches the blocks of an image's (audio's,
// video's) placeholder tokens under the image's hash as well as the
// tokens, which are the same for every image (see radix, FoldMMKey). Only
// the engine knows an input's hash and where its placeholders land, and
// vLLM's render endpoint says both: its GenerateRequest carries
//
//	"features": {"mm_hashes": {"image": ["<hash>", …], …},
//	             "mm_placeholders": {"image": [{"offset": 5, "length": 576}, …], …},
//	             "kwargs_data": …}
//
// the i-th hash of a modality going with its i-th placeholder range, and
// null for a text-only prompt (vllm/entrypoints/serve/disagg/protocol.py,
// MultiModalFeatures and PlaceholderRangeInfo, and
// vllm/entrypoints/serve/render/serving.py, _extract_mm_features, at
// vllm-project/vllm@9f0eedbc7393). The engine's block keys use the
// input's identifier, which is its mm_hash (with the adapter's name
// prefixed under tower-connector LoRA, which the feed drops), in the
// order of the placeholders' offsets; so does this package.

// MultimodalRenderer is a Renderer that also reports a prompt's
// multimodal inputs, when the engine says what they are.
type MultimodalRenderer interface {
	Renderer
	// TokensMultimodal is Tokens, and it also fills mm (which it resets
	// first; nil to ignore) with the prompt's multimodal inputs. mm stays
	// empty when the engine reports none: a text prompt, or an engine
	// whose endpoint does not report them (/tokenize).
	TokensMultimodal(ctx context.Context, dst []uint32, mm *Multimodal, api openai.API, body []byte, r *openai.ParsedRequest) ([]uint32, error)
}

// Limits on the multimodal inputs accepted from an engine: far above any
// real prompt (vLLM's default limit is a handful of items per prompt, and
// its hashes are 64 hex digits), and bounding what a broken engine can
// make the router hold.
const (
	MaxMultimodalItems   = 256
	MaxMultimodalIDBytes = 256
)

// Multimodal holds one rendered prompt's multimodal inputs. Its buffers
// are reused, so steady-state rendering allocates nothing; Items alias
// them and are valid until the next Reset or render.
type Multimodal struct {
	// Items are the inputs, sorted by Offset, their placeholders
	// disjoint and within the prompt; radix.AppendBlockHashesMM takes
	// them as they are.
	Items []radix.MMItem

	buf   []byte // hashes and modality names, decoded
	spans []mmSpan
}

// mmSpan is one input while a response is read: its modality
// (buf[modLo:modHi]) and index in it, which pair a hash with its range;
// its hash, buf[lo:hi]; and its range once found.
type mmSpan struct {
	modLo, modHi   int
	index          int
	lo, hi         int
	offset, length int
	placed         bool
}

// Reset empties m, keeping its buffers.
func (m *Multimodal) Reset() {
	clear(m.Items) // drop references into buf
	m.Items, m.buf, m.spans = m.Items[:0], m.buf[:0], m.spans[:0]
}

var errFeatures = errors.New("features is not vLLM's MultiModalFeatures with one placeholder range, within the prompt, for each hash")

// parseFeatures reads a GenerateRequest's features value (raw JSON, known
// valid) into m, for a prompt of n tokens. null means none. A hash
// without its range, a range without its hash, a range outside the prompt
// or overlapping another, or a limit exceeded refuses the whole answer:
// hashing with a wrong key could claim another image's blocks.
func (m *Multimodal) parseFeatures(raw []byte, n int) error {
	m.Reset()
	if jsonscan.ScanLiteral(raw, jsonscan.SkipSpace(raw, 0), "null") >= 0 {
		return nil
	}
	var hashes, ranges []byte
	var kb [maxEscapedKey]byte
	i, ok := openContainer(raw, 0, '{')
	for ok {
		key, val, next := nextField(raw, i, &kb)
		if next < 0 {
			break
		}
		switch string(key) {
		case "mm_hashes":
			hashes = val
		case "mm_placeholders":
			ranges = val
		}
		i = next
	}
	if !ok || hashes == nil || ranges == nil || !m.readHashes(hashes) || !m.readRanges(ranges, n) || !m.finish() {
		m.Reset()
		return errFeatures
	}
	return nil
}

// readHashes reads mm_hashes, {modality: [hash, …], …}.
func (m *Multimodal) readHashes(raw []byte) bool {
	var kb [maxEscapedKey]byte
	i, ok := openContainer(raw, 0, '{')
	if !ok {
		return false
	}
	for {
		modality, list, next := nextField(raw, i, &kb)
		if next < 0 {
			return true
		}
		i = next
		if modality == nil || m.modalitySeen(modality) {
			return false // too long a name, or a modality twice
		}
		modLo := len(m.buf)
		m.buf = append(m.buf, modality...)
		modHi := len(m.buf)
		j, ok := openContainer(list, 0, '[')
		for index := 0; ok; index++ {
			v, next := nextElement(list, j)
			if next < 0 {
				break
			}
			j = next
			end, escaped := jsonscan.ScanString(v, 0)
			if end != len(v) || len(m.spans) >= MaxMultimodalItems {
				return false
			}
			lo := len(m.buf)
			if escaped {
				m.buf = jsonscan.AppendUnescaped(m.buf, v[1:end-1])
			} else {
				m.buf = append(m.buf, v[1:end-1]...)
			}
			if hi := len(m.buf); hi == lo || hi-lo > MaxMultimodalIDBytes {
				return false
			}
			m.spans = append(m.spans, mmSpan{modLo: modLo, modHi: modHi, index: index, lo: lo, hi: len(m.buf)})
		}
		if !ok {
			return false
		}
	}
}

func (m *Multimodal) modalitySeen(name []byte) bool {
	for _, s := range m.spans {
		if string(m.buf[s.modLo:s.modHi]) == string(name) {
			return true
		}
	}
	return false
}

// readRanges reads mm_placeholders, {modality: [{"offset", "length", …},
// …], …}, placing each range on its hash.
func (m *Multimodal) readRanges(raw []byte, n int) bool {
	var kb, fb [maxEscapedKey]byte
	i, ok := openContainer(raw, 0, '{')
	if !ok {
		return false
	}
	for {
		modality, list, next := nextField(raw, i, &kb)
		if next < 0 {
			return true
		}
		i = next
		j, ok := openContainer(list, 0, '[')
		for index := 0; ok; index++ {
			v, next := nextElement(list, j)
			if next < 0 {
				break
			}
			j = next
			s := m.span(modality, index)
			if s == nil || s.placed {
				return false // a range without a hash
			}
			s.offset, s.length = -1, -1
			k, isObject := openContainer(v, 0, '{')
			for isObject {
				key, num, next := nextField(v, k, &fb)
				if next < 0 {
					break
				}
				k = next
				switch string(key) {
				case "offset":
					s.offset = smallInt(num)
				case "length":
					s.length = smallInt(num)
				}
			}
			if !isObject || s.offset < 0 || s.length < 1 || s.offset > n-s.length {
				return false
			}
			s.placed = true
		}
		if !ok {
			return false
		}
	}
}

func (m *Multimodal) span(modality []byte, index int) *mmSpan {
	for i := range m.spans {
		s := &m.spans[i]
		if s.index == index && string(m.buf[s.modLo:s.modHi]) == string(modality) {
			return s
		}
	}
	return nil
}

// finish checks that every hash found its range, sorts the inputs by
// offset (vLLM's argsort_mm_positions) and builds Items.
func (m *Multimodal) finish() bool {
	for _, s := range m.spans {
		if !s.placed {
			return false
		}
	}
	// Insertion sort: a handful of inputs, and no allocation.
	for i := 1; i < len(m.spans); i++ {
		for j := i; j > 0 && m.spans[j].offset < m.spans[j-1].offset; j-- {
			m.spans[j], m.spans[j-1] = m.spans[j-1], m.spans[j]
		}
	}
	for i, s := range m.spans {
		if i > 0 {
			if p := m.spans[i-1]; p.offset+p.length > s.offset {
				return false // placeholders overlap
			}
		}
		m.Items = append(m.Items, radix.MMItem{ID: m.buf[s.lo:s.hi:s.hi], Offset: s.offset, Length: s.length})
	}
	return true
}

// smallInt reads a JSON number that must be a non-negative integer below
// 2^31, else returns -1.
func smallInt(b []byte) int {
	if len(b) == 0 || len(b) > 10 {
		return -1
	}
	v := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return -1
		}
		v = v*10 + int(c-'0')
	}
	if v > 1<<31-1 {
		return -1
	}
	return v
}

// openContainer returns the index just past the opening bracket open
// ('{' or '[') of the value at b[i], and false if the value is not one.
func openContainer(b []byte, i int, open byte) (int, bool) {
	i = jsonscan.SkipSpace(b, i)
	if i >= len(b) || b[i] != open {
		return i, false
	}
	return i + 1, true
}

// nextElement reads the element of a JSON array starting at or after b[i]
// (i just past '[' or an element), known to be valid, and returns it and
// the index after it, or next < 0 at the end of the array.
func nextElement(b []byte, i int) (val []byte, next int) {
	i = jsonscan.SkipSpace(b, i)
	if i < len(b) && b[i] == ',' {
		i = jsonscan.SkipSpace(b, i+1)
	}
	if i >= len(b) || b[i] == ']' {
		return nil, -1
	}
	end := jsonscan.SkipValue(b, i, 1)
	if end < 0 {
		return nil, -1
	}
	return b[i:end], end
}

// contentParts walks the content parts of a chat request's messages (the
// raw array, known valid JSON): every element of every message's content
// array, in order. A struct rather than a callback, so that the walk
// allocates nothing.
type contentParts struct {
	messages, msg, content []byte
	i, k, j                int
	inMsg, inContent       bool
	kb                     [maxEscapedKey]byte
}

func newContentParts(messages []byte) contentParts {
	c := contentParts{messages: messages}
	var ok bool
	if c.i, ok = openContainer(messages, 0, '['); !ok {
		c.i = -1
	}
	return c
}

// next returns the next content part, or false when there is none.
func (c *contentParts) next() ([]byte, bool) {
	for {
		if c.inContent {
			part, next := nextElement(c.content, c.j)
			if next >= 0 {
				c.j = next
				return part, true
			}
			c.inContent = false
		}
		if c.inMsg {
			key, content, next := nextField(c.msg, c.k, &c.kb)
			if next < 0 {
				c.inMsg = false
				continue
			}
			c.k = next
			if string(key) == "content" {
				c.content = content
				c.j, c.inContent = openContainer(content, 0, '[')
			}
			continue
		}
		if c.i < 0 {
			return nil, false
		}
		msg, next := nextElement(c.messages, c.i)
		if next < 0 {
			c.i = -1
			return nil, false
		}
		c.i = next
		c.msg = msg
		c.k, c.inMsg = openContainer(msg, 0, '{')
	}
}

// HasMultimodalParts reports whether a chat request's messages (the raw
// array, known valid) carry a content part other than text: an image,
// audio, video or file, which an engine hashes into its cached blocks.
// It tells the front end that a request it could not learn the inputs of
// routes approximately.
func HasMultimodalParts(messages []byte) bool {
	var pb, tb [maxEscapedKey]byte
	parts := newContentParts(messages)
	for part, ok := parts.next(); ok; part, ok = parts.next() {
		p, isPart := openContainer(part, 0, '{')
		for isPart {
			pk, typ, next := nextField(part, p, &pb)
			if next < 0 {
				break
			}
			p = next
			if string(pk) != "type" {
				continue
			}
			end, escaped := jsonscan.ScanString(typ, 0)
			if end != len(typ) {
				break
			}
			t := unescapedKey(typ[1:end-1], escaped, &tb)
			switch string(t) {
			case "text", "input_text", "output_text", "refusal":
			default:
				return true
			}
		}
	}
	return false
}
