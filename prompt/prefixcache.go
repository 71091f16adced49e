package prompt

import (
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
)

// Encoder is what the prefix cache needs of a tokenizer: package
// tokenizer's Encode, with added special tokens matched in text and, when
// addSpecial, the post-processor's BOS/EOS added.
type Encoder interface {
	Encode(dst []uint32, text []byte, addSpecial bool) []uint32
}

// PrefixCache remembers tokenized segments of prompts, so that a prompt
// whose beginning was seen before is encoded only from where it differs.
//
// The prompt is cut into segments at byte offsets the caller names. A cut
// must be a safe boundary: one across which the tokenizer cannot merge,
// so that tokens(text) = tokens(text[:cut]) ++ tokens(text[cut:]). The
// boundary of an added special token in rendered template text is one:
// Hugging Face tokenizers split the input on added tokens before
// normalizing, pre-tokenizing and applying the model, each piece on its
// own. Two kinds of tokenizer break that, and their cuts must not be made
// there: added tokens with lstrip or rstrip (the stripped whitespace
// belongs to the token's match, so cut outside it), and pieces whose
// processing depends on their position in the whole input, such as a
// Metaspace pre-tokenizer with prepend_scheme "first", which marks only
// the piece at offset 0. Segments are encoded without special tokens
// (addSpecial false), which is how a rendered chat prompt is encoded
// unless the request asks otherwise; callers encode prompts that need the
// post-processor's tokens directly.
//
// A segment is keyed by a chained hash of every byte before its end (the
// caller's seed, then XXH64 of each segment seeded with the key before
// it), so one key names a whole prefix, as block hashes do, and segments
// of shared prefixes are stored once. The cache is bounded in bytes (ids
// plus a fixed overhead per segment) and evicts the least recently used
// segment; a segment whose parent was evicted is no longer reached and
// ages out in turn.
//
// Safe for concurrent use: lookups and inserts take one mutex briefly;
// hashing and encoding run outside it. A hit copies ids and allocates
// nothing; a miss allocates the stored copy of each new segment.
type PrefixCache struct {
	mu      sync.Mutex
	budget  int64
	bytes   int64
	entries map[uint64]*segment
	lru     segment // sentinel: lru.next is the most recently used

	hits, misses, evictions atomic.Uint64
}

// segment is one cached piece of a prompt: its ids, and its length in
// bytes, which guards against a key collision between segments of
// different lengths at no cost.
type segment struct {
	key        uint64
	textLen    int
	tokens     []uint32
	prev, next *segment
}

// segmentOverhead approximates a segment's memory besides its ids: the
// struct and its map entry.
const segmentOverhead = 96

// NewPrefixCache returns an empty cache holding at most maxBytes.
func NewPrefixCache(maxBytes int64) *PrefixCache {
	c := &PrefixCache{budget: maxBytes, entries: map[uint64]*segment{}}
	c.lru.next, c.lru.prev = &c.lru, &c.lru
	return c
}

// Encode appends tokens(text) to dst, as enc.Encode(dst, text, false)
// would, cutting text at cuts (ascending byte offsets, each a safe
// boundary; see PrefixCache). seed separates tokenizers and anything else
// that changes the ids of the same text. The leading segments whose whole
// prefix was seen before are copied; the first unseen one and all after it
// are encoded and remembered.
func (c *PrefixCache) Encode(dst []uint32, enc Encoder, seed uint64, text []byte, cuts []int) []uint32 {
	key, start, ci := seed, 0, 0
	var d xxhash.Digest
	// Copy the cached prefix.
	for start < len(text) {
		end := len(text)
		for ci < len(cuts) && (cuts[ci] <= start || cuts[ci] > len(text)) {
			ci++
		}
		if ci < len(cuts) {
			end = cuts[ci]
		}
		d.ResetWithSeed(key)
		_, _ = d.Write(text[start:end])
		next := d.Sum64()
		c.mu.Lock()
		s, ok := c.entries[next]
		if ok && s.textLen == end-start {
			dst = append(dst, s.tokens...)
			c.touch(s)
		}
		c.mu.Unlock()
		if !ok || s.textLen != end-start {
			break
		}
		c.hits.Add(1)
		key, start = next, end
	}
	// Encode the rest, segment by segment, remembering each.
	for start < len(text) {
		end := len(text)
		for ci < len(cuts) && (cuts[ci] <= start || cuts[ci] > len(text)) {
			ci++
		}
		if ci < len(cuts) {
			end = cuts[ci]
		}
		d.ResetWithSeed(key)
		_, _ = d.Write(text[start:end])
		next := d.Sum64()
		n := len(dst)
		dst = enc.Encode(dst, text[start:end], false)
		c.misses.Add(1)
		c.insert(next, end-start, dst[n:])
		key, start = next, end
	}
	return dst
}

// touch makes s the most recently used. c.mu must be held.
func (c *PrefixCache) touch(s *segment) {
	s.prev.next, s.next.prev = s.next, s.prev
	s.prev, s.next = &c.lru, c.lru.next
	c.lru.next.prev = s
	c.lru.next = s
}

// insert remembers a segment's ids, evicting the least recently used
// segments until the cache fits its budget again.
func (c *PrefixCache) insert(key uint64, textLen int, tokens []uint32) {
	size := int64(4*len(tokens) + segmentOverhead)
	if size > c.budget {
		return
	}
	s := &segment{key: key, textLen: textLen, tokens: append([]uint32(nil), tokens...)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.entries[key]; ok { // a concurrent miss on the same segment got here first
		c.touch(old)
		return
	}
	c.entries[key] = s
	s.prev, s.next = &c.lru, c.lru.next
	c.lru.next.prev = s
	c.lru.next = s
	c.bytes += size
	for c.bytes > c.budget {
		old := c.lru.prev
		old.prev.next, old.next.prev = old.next, old.prev
		delete(c.entries, old.key)
		c.bytes -= int64(4*len(old.tokens) + segmentOverhead)
		c.evictions.Add(1)
	}
}

// CacheStats is a PrefixCache's state: segments reused and encoded, what
// it holds, and what it dropped.
type CacheStats struct {
	Hits      uint64 `json:"hits"`   // segments copied from the cache
	Misses    uint64 `json:"misses"` // segments encoded
	Evictions uint64 `json:"evictions"`
	Segments  int    `json:"segments"`
	Bytes     int64  `json:"bytes"`
	MaxBytes  int64  `json:"max_bytes"`
}

// Stats reports the cache's counters and occupancy.
func (c *PrefixCache) Stats() CacheStats {
	c.mu.Lock()
	n, b := len(c.entries), c.bytes
	c.mu.Unlock()
	return CacheStats{Hits: c.hits.Load(), Misses: c.misses.Load(), Evictions: c.evictions.Load(),
		Segments: n, Bytes: b, MaxBytes: c.budget}
}
