package replay

import "fmt"

// DefaultVocab bounds synthesised token ids: they fall in [0, DefaultVocab).
const DefaultVocab = 32000

// maxBlockTokens keeps synthesised prompts within what a router accepts and
// keeps block arithmetic far from overflow.
const maxBlockTokens = 1 << 16

// TokenSynth turns trace records into token-id prompts. Block j of a prompt
// is a pseudo-random sequence keyed by (Seed, hash id) alone, so two prompts
// that share their first k hash ids share exactly their first k blocks of
// tokens, which is what makes an engine's prefix cache see the trace's
// reuse. A prompt's last block is the first tokens of its hash id's block,
// so it may be partial.
//
// The zero value synthesises full-size Mooncake prompts. A TokenSynth is a
// plain value, safe to share between goroutines.
type TokenSynth struct {
	// TraceBlockSize is the trace's tokens per hash id; 0 means
	// DefaultTraceBlockSize.
	TraceBlockSize int
	// BlockTokens is how many tokens to emit per hash id; 0 means
	// TraceBlockSize. Fewer shrink every prompt by the same factor (the
	// partial last block scales too, rounding up), so a demo fits on a
	// small machine while keeping the trace's sharing structure.
	BlockTokens int
	// Vocab bounds token ids to [0, Vocab); 0 means DefaultVocab.
	Vocab uint32
	// Seed selects one of many equally valid token assignments.
	Seed uint64
}

// normalized fills in defaults.
func (s TokenSynth) normalized() TokenSynth {
	if s.TraceBlockSize == 0 {
		s.TraceBlockSize = DefaultTraceBlockSize
	}
	if s.BlockTokens == 0 {
		s.BlockTokens = s.TraceBlockSize
	}
	if s.Vocab == 0 {
		s.Vocab = DefaultVocab
	}
	return s
}

// Validate reports a configuration that cannot synthesise prompts.
func (s TokenSynth) Validate() error {
	s = s.normalized()
	if s.TraceBlockSize < 1 || s.TraceBlockSize > maxBlockTokens {
		return fmt.Errorf("cannot synthesise tokens with trace block size %d: want 1..%d", s.TraceBlockSize, maxBlockTokens)
	}
	if s.BlockTokens < 1 || s.BlockTokens > maxBlockTokens {
		return fmt.Errorf("cannot synthesise tokens with %d tokens per block: want 1..%d", s.BlockTokens, maxBlockTokens)
	}
	return nil
}

// PromptLen returns the number of tokens AppendPrompt emits for r.
func (s TokenSynth) PromptLen(r *Record) int {
	s = s.normalized()
	last := scaledBlockLen(r.lastBlockTokens(s.TraceBlockSize), s.TraceBlockSize, s.BlockTokens)
	return (len(r.HashIDs)-1)*s.BlockTokens + last
}

// AppendPrompt appends r's prompt to dst and returns the extended slice. It
// allocates nothing when dst has room for PromptLen(r) more tokens.
func (s TokenSynth) AppendPrompt(dst []uint32, r *Record) []uint32 {
	s = s.normalized()
	last := len(r.HashIDs) - 1
	for j, id := range r.HashIDs {
		n := s.BlockTokens
		if j == last {
			n = scaledBlockLen(r.lastBlockTokens(s.TraceBlockSize), s.TraceBlockSize, s.BlockTokens)
		}
		dst = s.appendBlock(dst, id, n)
	}
	return dst
}

// appendBlock runs a splitmix64 stream whose start depends on the seed and
// the hash id only. Splitmix64 passes BigCrush, needs one word of state and
// can be keyed by any 64-bit value, which is all a synthetic prompt needs.
func (s TokenSynth) appendBlock(dst []uint32, hashID uint64, n int) []uint32 {
	state := mix64(s.Seed ^ mix64(hashID+0x632be59bd9b4e019))
	vocab := uint64(s.Vocab)
	for range n {
		state += 0x9e3779b97f4a7c15
		// Multiply-shift maps 32 random bits onto [0, vocab) without a
		// division; its bias (< vocab/2^32) is irrelevant here.
		dst = append(dst, uint32((mix64(state)>>32)*vocab>>32))
	}
	return dst
}

func mix64(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}
