package replay

// Bound is the prefix hit rate of an infinite cache shared by every worker:
// a block counts as a hit when the whole chain of hash ids up to and
// including it appeared in an earlier request. No router can beat it, so a
// measured hit rate is judged against it.
type Bound struct {
	// Tokens is HitTokens/PromptTokens. It is the figure to compare with a
	// measured cached_tokens/prompt_tokens.
	Tokens float64 `json:"tokens"`
	// Blocks is HitBlocks/TotalBlocks, the figure a trace is usually quoted
	// with (0.640 for the shipped Mooncake trace). It differs from Tokens
	// because short last blocks weigh less in tokens than in blocks.
	Blocks       float64 `json:"blocks"`
	PromptTokens int64   `json:"prompt_tokens"`
	HitTokens    int64   `json:"hit_tokens"`
	TotalBlocks  int64   `json:"total_blocks"`
	HitBlocks    int64   `json:"hit_blocks"`
}

// HitBound computes the bound for prompts synthesised with blockTokens
// tokens per hash id (0 means the trace's own block size), exactly as
// TokenSynth builds them.
func (t *Trace) HitBound(blockTokens int) Bound {
	tbs := t.blockSize()
	if blockTokens <= 0 {
		blockTokens = tbs
	}
	hits := t.hitBlocks()
	var b Bound
	for i := range t.Records {
		r := &t.Records[i]
		n := len(r.HashIDs)
		h := int(hits[i])
		last := scaledBlockLen(r.lastBlockTokens(tbs), tbs, blockTokens)
		b.PromptTokens += int64((n-1)*blockTokens + last)
		b.TotalBlocks += int64(n)
		b.HitBlocks += int64(h)
		if h == n {
			b.HitTokens += int64((n-1)*blockTokens + last)
		} else {
			b.HitTokens += int64(h * blockTokens)
		}
	}
	if b.PromptTokens > 0 {
		b.Tokens = float64(b.HitTokens) / float64(b.PromptTokens)
		b.Blocks = float64(b.HitBlocks) / float64(b.TotalBlocks)
	}
	return b
}

func (t *Trace) hitBlocks() []int32 {
	a := t.analysis
	if a == nil { // a Trace built by hand rather than loaded
		return countPrefixHits(t.Records)
	}
	a.once.Do(func() { a.hitBlocks = countPrefixHits(a.records) })
	return a.hitBlocks[:len(t.Records)]
}

// prefixEdge is one edge of the trie of hash-id chains: a node id (0 is the
// empty prefix) extended by one hash id. Keying by node rather than by the
// hash id alone keeps the bound exact for traces that reuse an id after a
// different prefix.
type prefixEdge struct {
	parent uint32
	id     uint64
}

func countPrefixHits(records []Record) []int32 {
	hits := make([]int32, len(records))
	trie := make(map[prefixEdge]uint32)
	next := uint32(1)
	for i := range records {
		node, matching := uint32(0), true
		for _, id := range records[i].HashIDs {
			e := prefixEdge{node, id}
			child, seen := trie[e]
			if !seen {
				child = next
				next++
				trie[e] = child
				matching = false
			}
			if matching {
				hits[i]++
			}
			node = child
		}
	}
	return hits
}

// scaledBlockLen maps the token count of a trace's partial last block to the
// synthesised block size, rounding up so that a non-empty block stays
// non-empty.
func scaledBlockLen(tokens, traceBlockSize, blockTokens int) int {
	if traceBlockSize == blockTokens {
		return tokens
	}
	n := (tokens*blockTokens + traceBlockSize - 1) / traceBlockSize
	return min(max(n, 1), blockTokens)
}
