package replay

// PrefixHits returns, for record i, how many of its leading blocks an
// infinite cache would already hold when it arrives.
func (t *Trace) PrefixHits(i int) int { return int(t.hitBlocks()[i]) }

// AppendBlock appends the first n tokens of hash id's block.
func (s TokenSynth) AppendBlock(dst []uint32, hashID uint64, n int) []uint32 {
	return s.normalized().appendBlock(dst, hashID, n)
}
