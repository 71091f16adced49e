package replay

// PrefixHits returns, for record i, how many of its leading blocks an
// infinite cache would already hold whole when it arrives, and how many
// tokens of the next one.
func (t *Trace) PrefixHits(i int) (blocks, partial int) {
	h := t.prefixHits()[i]
	return int(h.blocks), int(h.partial)
}

// AppendBlock appends the first n tokens of hash id's block.
func (s TokenSynth) AppendBlock(dst []uint32, hashID uint64, n int) []uint32 {
	return s.normalized().appendBlock(dst, hashID, n)
}
