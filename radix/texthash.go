package radix

import "github.com/cespare/xxhash/v2"

// DefaultApproxChunkBytes is the chunk size of approximate hashing. At about
// four bytes per token, 64 bytes is close to one 16-token KV block, so
// overlaps counted in chunks weigh like overlaps counted in blocks.
const DefaultApproxChunkBytes = 64

// approxDomain separates text-chunk hashes from token-block hashes of the same
// namespace: the two hash different things and must never meet in an index.
const approxDomain = "kvfast/approx-text/v1"

// ApproxSeed derives the seed of approximate text hashing from the token
// namespace seed, NamespaceSeed(model, lora, salt), so that text chunks
// keep the same model, adapter and salt isolation as token blocks while
// living in a namespace of their own.
//
// It is XXH64 of "kvfast/approx-text/v1" seeded with nsSeed.
func ApproxSeed(nsSeed uint64) uint64 {
	var d xxhash.Digest
	d.ResetWithSeed(nsSeed)
	d.WriteString(approxDomain)
	return d.Sum64()
}

// AppendApproxHashes appends the chained hash of every full chunkBytes-sized
// chunk of text to dst, as a plain seeded XXH64 chain (not the grouped
// layout of token blocks, since text chunks go to the approximate index,
// whose layout is its own): chunk i is
// XXH64 of its bytes seeded with chunk i-1's hash, chunk 0 with seed. A
// trailing partial chunk is not hashed, so a prompt that extends another
// shares all of its full chunks.
//
// text is the raw prompt or messages bytes of an openai.ParsedRequest
// (ApproxText), hashed as they appear in the body; identical client
// encodings therefore share prefixes, which is what approximate mode can
// promise.
//
// It makes no allocation when dst has room for len(text)/chunkBytes more
// hashes. chunkBytes must be positive.
func AppendApproxHashes(dst []uint64, seed uint64, text []byte, chunkBytes int) []uint64 {
	if chunkBytes <= 0 {
		panic("BUG: radix: approximate chunk size must be positive")
	}
	var d xxhash.Digest
	parent := seed
	for len(text) >= chunkBytes {
		d.ResetWithSeed(parent)
		d.Write(text[:chunkBytes])
		parent = d.Sum64()
		dst = append(dst, parent)
		text = text[chunkBytes:]
	}
	return dst
}

// A prompt_embeds tensor is torch.save's bytes in base64: a hidden size of
// 2,048 to 8,192 values of 2 or 4 bytes makes 5 to 44 KiB of base64 per
// token. EmbedsBytesPerToken errs toward more tokens for small models and
// fewer for large ones. Only its first EmbedsHashedBytes are hashed: the
// same embeddings sent again match there, and different ones differ early
// (the serialized header holds their shape).
const (
	EmbedsBytesPerToken = 8 << 10
	EmbedsHashedBytes   = 4 << 10
)

// AppendEmbedsHashes appends the approximate hashes of a prompt_embeds
// tensor (its base64 text) to dst, at most one per block of the prompt's
// estimated length, and returns them with that estimate, in tokens, for
// load accounting: at least one block of blockSize tokens.
func AppendEmbedsHashes(dst []uint64, seed uint64, embeds []byte, chunkBytes, blockSize int) ([]uint64, int) {
	tokens := max(len(embeds)/EmbedsBytesPerToken, blockSize)
	n := len(dst)
	dst = AppendApproxHashes(dst, seed, embeds[:min(len(embeds), EmbedsHashedBytes)], chunkBytes)
	return dst[:n+min(len(dst)-n, tokens/max(blockSize, 1))], tokens
}
