package tokenizer

// VocabSize is one more than the largest token id Encode can return.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }
