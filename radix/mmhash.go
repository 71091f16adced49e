package radix

import "github.com/cespare/xxhash/v2"

// Multimodal blocks. vLLM hashes a block that holds placeholder tokens of
// an image (or audio, video) with extra keys: one (identifier, offset)
// pair per multimodal input the block overlaps, the identifier being the
// input's mm_hash and the offset where its placeholders start relative to
// the block's first token, negative when they began in an earlier block
// (vllm/v1/core/kv_cache_utils.py, _gen_mm_extra_hash_keys). Placeholder
// tokens are the same for every image, so a block hashed from its tokens
// alone would name every image's block alike. kvfast folds the same pairs
// into a 64-bit digest per block (FoldMMKey) and the digest into the
// block's hash (ChainBlockHashExtra), so the router, which learns the
// pairs from the engine's render endpoint, and the feed, which reads them
// from the engine's events, name the block alike, and different images
// never.

// MMItem is one multimodal input of a prompt: the engine's identifier for
// it (vLLM's mm_hash) and the range of its placeholder tokens in the
// prompt.
type MMItem struct {
	ID     []byte
	Offset int // index of its first placeholder token
	Length int // number of placeholder tokens, at least 1
}

// mmDomain and extraDomain keep the digest of a key list and its fold into
// a block's sum apart from every other use of mix64.
const (
	mmDomain    = 0x6b76662f6d6d3031 // "kvf/mm01"
	extraDomain = 0x6b76662f78747231 // "kvf/xtr1"
	offsetMul   = 0x9e3779b97f4a7c15
)

// FoldMMKey returns the digest of a block's multimodal keys so far, extra
// (0 for none yet), extended by one (identifier, offset) key. The digest
// depends on the keys' order, as vLLM's hash does, and is never 0, which
// stands for a block without keys.
func FoldMMKey(extra uint64, id []byte, offset int64) uint64 {
	e := mix64(extra+mmDomain) ^ xxhash.Sum64(id)
	e = mix64(e ^ uint64(offset)*offsetMul)
	if e == 0 {
		return 1
	}
	return e
}

// ChainBlockHashExtra is ChainBlockHash for a block whose engine hash also
// covers multimodal keys, folded into extra by FoldMMKey. With extra 0 it
// is ChainBlockHash, so blocks without images hash as text blocks do and
// an image prompt shares its text prefix with text prompts.
func ChainBlockHashExtra(parent uint64, tokens []uint32, extra uint64) uint64 {
	return link(parent, blockSum(xxhash.Sum64(tokenBytes(tokens)), extra))
}

func blockSum(sum, extra uint64) uint64 {
	if extra == 0 {
		return sum
	}
	return sum ^ mix64(extra^extraDomain)
}

// BlockMMExtra returns the multimodal digest of the block of tokens
// [start, end) of a prompt whose inputs are items, sorted by Offset, and
// the index of the first item a later block may still overlap, from which
// the next block's call may start (from is where this one starts; 0 for a
// prompt's first block). It mirrors _gen_mm_extra_hash_keys: every item
// whose placeholders overlap the block contributes (ID, Offset-start), in
// order.
func BlockMMExtra(items []MMItem, from, start, end int) (extra uint64, next int) {
	i := from
	for i < len(items) {
		it := &items[i]
		if it.Offset >= end {
			break // this block has not reached the item
		}
		if it.Offset+it.Length <= start {
			i++ // the block is past the item
			continue
		}
		extra = FoldMMKey(extra, it.ID, int64(it.Offset-start))
		if it.Offset+it.Length > end {
			break // the item goes on into the next block
		}
		i++
	}
	return extra, i
}

// AppendBlockHashesMM is AppendBlockHashes for a prompt with multimodal
// inputs, items, sorted by Offset: each block's hash also covers the keys
// of the items it overlaps. With no items it equals AppendBlockHashes. It
// makes no allocation when dst has room.
func AppendBlockHashesMM(dst []uint64, seed uint64, tokens []uint32, blockSize int, items []MMItem) []uint64 {
	if len(items) == 0 {
		return AppendBlockHashes(dst, seed, tokens, blockSize)
	}
	if blockSize <= 0 {
		panic("BUG: radix: block size must be positive")
	}
	parent, next := seed, 0
	for start := 0; start+blockSize <= len(tokens); start += blockSize {
		var extra uint64
		extra, next = BlockMMExtra(items, next, start, start+blockSize)
		parent = ChainBlockHashExtra(parent, tokens[start:start+blockSize], extra)
		dst = append(dst, parent)
	}
	return dst
}
