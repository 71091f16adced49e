package replay

// Bound is the prefix hit rate of an infinite cache shared by every worker:
// a block counts as a hit when the whole chain of hash ids up to and
// including it appeared in an earlier request, for as many of its tokens
// as an earlier request had of it (a short last block caches only its
// own tokens, and nothing after it can hit). No router can beat it, so a
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
	hits := t.prefixHits()
	var b Bound
	for i := range t.Records {
		r := &t.Records[i]
		n := len(r.HashIDs)
		h := hits[i]
		last := scaledBlockLen(r.lastBlockTokens(tbs), tbs, blockTokens)
		b.PromptTokens += int64((n-1)*blockTokens + last)
		b.TotalBlocks += int64(n)
		b.HitBlocks += int64(h.blocks)
		switch {
		case int(h.blocks) == n:
			b.HitTokens += int64((n-1)*blockTokens + last)
		case h.partial > 0:
			b.HitTokens += int64(int(h.blocks)*blockTokens + scaledBlockLen(int(h.partial), tbs, blockTokens))
		default:
			b.HitTokens += int64(int(h.blocks) * blockTokens)
		}
	}
	if b.PromptTokens > 0 {
		b.Tokens = float64(b.HitTokens) / float64(b.PromptTokens)
		b.Blocks = float64(b.HitBlocks) / float64(b.TotalBlocks)
	}
	return b
}

// prefixHit is how much of one record an infinite cache already holds when
// it arrives: its leading blocks held whole, then the tokens held of the
// next one (a block an earlier request had only the first tokens of, as
// its short last block).
type prefixHit struct {
	blocks  int32
	partial int32 // trace tokens of block number blocks; 0: none
}

func (t *Trace) prefixHits() []prefixHit {
	a := t.analysis
	if a == nil { // a Trace built by hand rather than loaded
		return countPrefixHits(t.Records, t.blockSize())
	}
	a.once.Do(func() { a.hits = countPrefixHits(a.records, t.blockSize()) })
	return a.hits[:len(t.Records)]
}

// prefixEdge is one edge of the trie of hash-id chains: a node id (0 is the
// empty prefix) extended by one hash id. Keying by node rather than by the
// hash id alone keeps the bound exact for traces that reuse an id after a
// different prefix.
type prefixEdge struct {
	parent uint32
	id     uint64
}

// countPrefixHits walks the records in order through a trie of their
// hash-id chains, each node remembering the most tokens of its block any
// record had: a request whose short last block was id 7 cached only those
// tokens of it, so a later request with id 7 whole finds them and no more,
// and nothing after them.
func countPrefixHits(records []Record, traceBlockSize int) []prefixHit {
	hits := make([]prefixHit, len(records))
	trie := make(map[prefixEdge]uint32)
	held := []int32{0} // by node: tokens of its block seen so far
	for i := range records {
		r := &records[i]
		node, matching := uint32(0), true
		for j, id := range r.HashIDs {
			tokens := int32(traceBlockSize)
			if j == len(r.HashIDs)-1 {
				tokens = int32(r.lastBlockTokens(traceBlockSize))
			}
			e := prefixEdge{node, id}
			child, seen := trie[e]
			if !seen {
				child = uint32(len(held))
				held = append(held, 0)
				trie[e] = child
			}
			if matching {
				switch have := held[child]; {
				case have >= tokens:
					hits[i].blocks++
				case have > 0:
					hits[i].partial = have
					matching = false
				default:
					matching = false
				}
			}
			held[child] = max(held[child], tokens)
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
