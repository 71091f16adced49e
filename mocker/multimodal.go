package mocker

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"

	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/radix"
)

// Images. A chat message's image_url content part becomes ImageTokens
// placeholder tokens (TokenImage) where it stands, as a vision model's
// processor expands an image into its patch tokens, and the image is
// known by its hash, the mock engine's mm_hash: SHA-256 of its URL (a
// data: URL's bytes included), in hex. As vLLM does, the engine hashes
// every block that overlaps an image's placeholders with the image's
// (hash, offset) keys (radix.BlockMMExtra), its render endpoint returns
// the hashes and placeholder ranges (features.mm_hashes,
// features.mm_placeholders), and its ZMQ publisher lists the keys in each
// block's extra_keys. Only the toy tokenizer reads images; with a
// Config.Renderer, an image part is the renderer's to refuse.

// TokenImage is an image's placeholder token.
const TokenImage uint32 = 8

// ImageTokens is how many placeholder tokens an image becomes: more than
// a block, and not a multiple of one, so that an image spans blocks
// unevenly.
const ImageTokens = 20

// ImageHash is the mock engine's mm_hash of the image at url.
func ImageHash(url string) string {
	sum := sha256.Sum256([]byte(url))
	return hex.EncodeToString(sum[:])
}

// blockMM is what a block needs to list its multimodal keys: the request's
// inputs and where the block starts in the request's tokens.
type blockMM struct {
	items []radix.MMItem
	start int
}

// wireImage is an image_url content part's image.
type wireImage struct {
	URL string `json:"url"`
}

// chatTokensMM is chatTokens for messages that may hold image parts: it
// returns the tokens and the images' placeholder ranges, in order.
// Messages without images tokenize exactly as chatTokens does.
func chatTokensMM(dst []uint32, msgs []wireMessage) ([]uint32, []radix.MMItem, *openai.Error) {
	images := false
	for _, m := range msgs {
		images = images || bytes.Contains(m.Content, []byte(`"image_url"`))
	}
	if !images {
		out, err := chatTokens(dst, msgs)
		return out, nil, err
	}
	var items []radix.MMItem
	for i, m := range msgs {
		rt, ok := RoleToken(m.Role)
		if !ok {
			return dst, nil, badRequest("messages", "message %d has unknown role %q", i, m.Role)
		}
		dst = append(dst, rt)
		raw := bytes.TrimSpace(m.Content)
		switch {
		case len(raw) == 0 || string(raw) == "null":
		case raw[0] == '"':
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return dst, nil, badRequest("messages", "cannot parse message %d content: %v", i, err)
			}
			dst = AppendTextTokens(dst, s)
		case raw[0] == '[':
			var parts []wirePart
			if err := json.Unmarshal(raw, &parts); err != nil {
				return dst, nil, badRequest("messages", "cannot parse message %d content: %v", i, err)
			}
			for j, p := range parts {
				switch {
				case p.Type == "text" && p.Text != nil:
					dst = AppendTextTokens(dst, *p.Text)
				case p.Type == "image_url" && p.ImageURL != nil && p.ImageURL.URL != "":
					items = append(items, radix.MMItem{ID: []byte(ImageHash(p.ImageURL.URL)), Offset: len(dst), Length: ImageTokens})
					for range ImageTokens {
						dst = append(dst, TokenImage)
					}
				default:
					return dst, nil, badRequest("messages", "message %d part %d: only text and image_url parts are supported, got type %q", i, j, p.Type)
				}
			}
		default:
			return dst, nil, badRequest("messages", "message %d content must be a string or an array of parts", i)
		}
		dst = append(dst, TokenEndOfTurn)
	}
	return append(dst, TokenAssistant), items, nil
}

// appendFeatures appends vLLM's MultiModalFeatures for items, every one an
// image, or null without any.
func appendFeatures(b []byte, items []radix.MMItem) []byte {
	if len(items) == 0 {
		return append(b, "null"...)
	}
	b = append(b, `{"mm_hashes":{"image":[`...)
	for i, it := range items {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(append(append(b, '"'), it.ID...), '"') // hex: nothing to escape
	}
	b = append(b, `]},"mm_placeholders":{"image":[`...)
	for i, it := range items {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"offset":`...)
		b = strconv.AppendInt(b, int64(it.Offset), 10)
		b = append(b, `,"length":`...)
		b = strconv.AppendInt(b, int64(it.Length), 10)
		b = append(b, '}')
	}
	return append(b, `]},"kwargs_data":null}`...)
}

// mmKeys returns how many multimodal extra keys block b has: one per
// input of its request whose placeholders it overlaps.
func (b *BlockEvent) mmKeys() int {
	n := 0
	for _, it := range b.MM {
		if b.overlaps(it) {
			n++
		}
	}
	return n
}

func (b *BlockEvent) overlaps(it radix.MMItem) bool {
	return it.Offset < b.Start+len(b.Tokens) && it.Offset+it.Length > b.Start
}

// appendMMKeys appends block b's multimodal extra keys as vLLM's msgpack
// lays out its (identifier, offset) tuples: [identifier, offset relative
// to the block], in the inputs' order.
func (b *BlockEvent) appendMMKeys(dst []byte) []byte {
	for _, it := range b.MM {
		if b.overlaps(it) {
			dst = mpArray(dst, 2)
			dst = mpStr(dst, string(it.ID))
			dst = mpInt(dst, int64(it.Offset-b.Start))
		}
	}
	return dst
}
