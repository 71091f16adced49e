package prompt

import (
	"encoding/base64"
	"strconv"

	"github.com/cespare/xxhash/v2"

	"github.com/kvfast/kvfast/internal/jsonscan"
	"github.com/kvfast/kvfast/openai"
)

// Media: a chat request's multimodal inputs as the client sent them, for
// the encoder stage (docs/routing.md, "Encoder disaggregation"). Unlike
// Multimodal, which is what the engine's render endpoint says about the
// prompt, this is read from the request body itself, before any engine is
// asked: each image_url, audio_url, input_audio or video_url content part,
// its raw JSON (the encoder request carries it unchanged) and a content
// identity that names it for encoder-cache affinity.
//
// The identity of an inline input (a data: URL, input_audio's data) is a
// hash of its decoded bytes, so that the same picture sent twice, under
// another media type or base64 line wrapping, is the same item. The
// identity of a URL the engine fetches (http:, https:, file:) is a hash of
// the URL: the router never downloads it. Downloading would make the
// router an open fetch proxy (SSRF), put the media's latency and memory on
// the request path, and fetch every item twice, since the encoder fetches
// it again; a URL names its content well enough for affinity, and an
// encoder that fetched it once has it cached under the engine's own hash.

// MediaKind is a multimodal input's modality.
type MediaKind uint8

const (
	MediaImage MediaKind = iota + 1
	MediaAudio
	MediaVideo
)

func (k MediaKind) String() string {
	switch k {
	case MediaImage:
		return "image"
	case MediaAudio:
		return "audio"
	case MediaVideo:
		return "video"
	}
	return "media(" + strconv.Itoa(int(k)) + ")"
}

// MediaItem is one multimodal input of a request.
type MediaItem struct {
	Kind MediaKind
	// Part is the content part, a JSON object, as the client sent it: it
	// aliases the request body.
	Part []byte
	// ID is the item's content identity: a hash of its decoded bytes when
	// Inline, of its URL otherwise.
	ID     uint64
	Inline bool
	// Bytes is the size the identity was taken over: the decoded bytes of
	// an inline item, the URL's length otherwise.
	Bytes int
}

// MediaLimits bound what the router decodes of one request.
type MediaLimits struct {
	MaxItems     int // multimodal parts per request
	MaxItemBytes int // decoded bytes of one inline item, or length of one URL
}

// Default media limits: OpenAI's own limit on an image is 20 MB, and a
// prompt with more than 64 images is beyond what the engines accept by
// default (vLLM's limit_mm_per_prompt is a handful per modality).
const (
	DefaultMaxMediaItems     = 64
	DefaultMaxMediaItemBytes = 20 << 20
)

// Media holds one request's multimodal inputs. Its buffers are reused, so
// steady-state parsing allocates nothing; Items alias the parsed body and
// are valid until the next Reset or Parse.
type Media struct {
	Items []MediaItem
	buf   []byte // an escaped URL or data string, unescaped
}

// Reset empties m, keeping its buffers.
func (m *Media) Reset() {
	clear(m.Items) // drop references into the body
	m.Items = m.Items[:0]
}

// Refusals of a request whose media exceed MediaLimits.
var (
	ErrTooManyMedia = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: "messages", Code: "too_many_media_items",
		Message: "the request has more multimodal content parts (image_url, audio_url, input_audio, video_url) than this router accepts"}
	ErrMediaTooLarge = &openai.Error{Status: 413, Type: openai.TypeInvalidRequest, Param: "messages", Code: "media_item_too_large",
		Message: "a multimodal content part's decoded data, or its URL, is larger than this router accepts"}
)

// Parse reads the multimodal content parts of a chat request's messages
// (the raw array, known valid JSON) into m, in order. It returns
// ErrTooManyMedia or ErrMediaTooLarge when the request exceeds lim; a
// part it cannot read (no URL, not an object) is left to the engine to
// refuse and is not an item.
func (m *Media) Parse(messages []byte, lim MediaLimits) *openai.Error {
	m.Reset()
	var pb, tb [maxEscapedKey]byte
	parts := newContentParts(messages)
	for part, ok := parts.next(); ok; part, ok = parts.next() {
		if err := m.readPart(part, lim, &pb, &tb); err != nil {
			m.Reset()
			return err
		}
	}
	return nil
}

// readPart reads one content part; a multimodal one becomes an item.
func (m *Media) readPart(part []byte, lim MediaLimits, pb, tb *[maxEscapedKey]byte) *openai.Error {
	p, isPart := openContainer(part, 0, '{')
	var kind MediaKind
	var payload []byte // the value under the part's type name
	var payloadKey []byte
	for isPart {
		key, val, next := nextField(part, p, pb)
		if next < 0 {
			break
		}
		p = next
		if string(key) == "type" {
			// A repeated key is the last one's, as the engines' JSON
			// decoders (Python's, Go's) read it: a part that says "text"
			// and then "image_url" is an image there, and must count
			// against the item limit and go to an encoder here.
			kind, payloadKey = 0, nil
			end, escaped := jsonscan.ScanString(val, 0)
			if end != len(val) {
				continue
			}
			switch t := unescapedKey(val[1:end-1], escaped, tb); string(t) {
			case "image_url":
				kind, payloadKey = MediaImage, keyImageURL
			case "audio_url", "input_audio":
				kind = MediaAudio
				payloadKey = keyAudioURL
				if string(t) == "input_audio" {
					payloadKey = keyInputAudio
				}
			case "video_url":
				kind, payloadKey = MediaVideo, keyVideoURL
			}
		}
	}
	if kind == 0 {
		return nil
	}
	// The payload's key is known only once the type is: read it again.
	p, _ = openContainer(part, 0, '{')
	for {
		key, val, next := nextField(part, p, pb)
		if next < 0 {
			break
		}
		p = next
		if string(key) == string(payloadKey) {
			payload = val
		}
	}
	if payload == nil {
		return nil
	}
	if len(m.Items) >= lim.MaxItems {
		return ErrTooManyMedia
	}
	var it MediaItem
	var err *openai.Error
	if string(payloadKey) == string(keyInputAudio) {
		it, err = m.inputAudio(payload, lim)
	} else {
		it, err = m.url(payload, lim)
	}
	if err != nil || it.Bytes == 0 {
		return err
	}
	it.Kind, it.Part = kind, part
	it.ID ^= uint64(kind) * 0x9e3779b97f4a7c15 // the same bytes as an image and as audio are two items
	m.Items = append(m.Items, it)
	return nil
}

var (
	keyImageURL   = []byte("image_url")
	keyAudioURL   = []byte("audio_url")
	keyInputAudio = []byte("input_audio")
	keyVideoURL   = []byte("video_url")
)

// url reads {"url": "..."} (or a bare string, which vLLM also accepts).
func (m *Media) url(payload []byte, lim MediaLimits) (MediaItem, *openai.Error) {
	s := payload
	if o, isObject := openContainer(payload, 0, '{'); isObject {
		var kb [maxEscapedKey]byte
		s = nil
		for {
			key, val, next := nextField(payload, o, &kb)
			if next < 0 {
				break
			}
			o = next
			if string(key) == "url" {
				s = val
			}
		}
	}
	raw, ok := m.stringValue(s, lim)
	if !ok {
		return MediaItem{}, ErrMediaTooLarge
	}
	if len(raw) == 0 {
		return MediaItem{}, nil
	}
	if data, base64Encoded, isData := cutDataURL(raw); isData {
		return hashInline(data, base64Encoded, lim)
	}
	if len(raw) > lim.MaxItemBytes {
		return MediaItem{}, ErrMediaTooLarge
	}
	return MediaItem{ID: xxhash.Sum64(raw), Bytes: len(raw)}, nil
}

// inputAudio reads {"data": "<base64>", "format": "wav"}.
func (m *Media) inputAudio(payload []byte, lim MediaLimits) (MediaItem, *openai.Error) {
	o, isObject := openContainer(payload, 0, '{')
	var kb [maxEscapedKey]byte
	var data []byte
	for isObject {
		key, val, next := nextField(payload, o, &kb)
		if next < 0 {
			break
		}
		o = next
		if string(key) == "data" {
			data = val
		}
	}
	raw, ok := m.stringValue(data, lim)
	if !ok {
		return MediaItem{}, ErrMediaTooLarge
	}
	if len(raw) == 0 {
		return MediaItem{}, nil
	}
	return hashInline(raw, true, lim)
}

// stringValue returns a JSON string's contents, unescaped into m.buf when
// it has escapes (base64 may spell '/' as "\/"), or nil for a value that
// is not a string. It reports false when the string is longer than any
// item lim accepts: its decoded bytes are at least three quarters of it.
func (m *Media) stringValue(v []byte, lim MediaLimits) ([]byte, bool) {
	if len(v) < 2 || v[0] != '"' {
		return nil, true
	}
	end, escaped := jsonscan.ScanString(v, 0)
	if end != len(v) {
		return nil, true
	}
	raw := v[1 : end-1]
	if int64(len(raw))*3/4 > int64(lim.MaxItemBytes)+3 {
		return nil, false
	}
	if escaped {
		m.buf = jsonscan.AppendUnescaped(m.buf[:0], raw)
		raw = m.buf
	}
	return raw, true
}

// cutDataURL splits a data: URL (RFC 2397, data:[<media type>][;base64],<data>)
// into its data and whether it is base64.
func cutDataURL(u []byte) (data []byte, base64Encoded, ok bool) {
	if len(u) < 5 || (u[0]|0x20) != 'd' || (u[1]|0x20) != 'a' || (u[2]|0x20) != 't' || (u[3]|0x20) != 'a' || u[4] != ':' {
		return nil, false, false
	}
	for i := 5; i < len(u); i++ {
		if u[i] == ',' {
			head := u[5:i]
			return u[i+1:], len(head) >= 7 && string(head[len(head)-7:]) == ";base64", true
		}
	}
	return nil, false, false
}

// hashInline hashes an inline item's decoded bytes, decoding base64 in
// chunks on the stack: the decoded item is never held whole. Whitespace
// is skipped, so that base64 wrapped at any width (MIME's 76 columns, PEM's
// 64) is the same item as unwrapped. Data that is not valid base64 is
// hashed as it is: the identity is still its content's, and the engine is
// the one to refuse it.
func hashInline(data []byte, base64Encoded bool, lim MediaLimits) (MediaItem, *openai.Error) {
	if !base64Encoded {
		if len(data) > lim.MaxItemBytes {
			return MediaItem{}, ErrMediaTooLarge
		}
		return MediaItem{ID: xxhash.Sum64(data), Inline: true, Bytes: len(data)}, nil
	}
	var d xxhash.Digest
	d.Reset()
	var text [4 << 10]byte  // base64 without whitespace, a multiple of 4 until the last chunk
	var chunk [3 << 10]byte // its decoding
	n, held := 0, 0
	for i := 0; i <= len(data); i++ {
		if i < len(data) {
			switch c := data[i]; c {
			case '\n', '\r', ' ', '\t':
				continue
			default:
				text[held] = c
				held++
				if held < len(text) {
					continue
				}
			}
		}
		if held == 0 {
			continue
		}
		got, err := base64.StdEncoding.Decode(chunk[:], text[:held])
		if err != nil {
			return MediaItem{ID: xxhash.Sum64(data), Inline: true, Bytes: len(data)}, nil
		}
		held = 0
		n += got
		if n > lim.MaxItemBytes {
			return MediaItem{}, ErrMediaTooLarge
		}
		_, _ = d.Write(chunk[:got])
	}
	return MediaItem{ID: d.Sum64(), Inline: true, Bytes: n}, nil
}
