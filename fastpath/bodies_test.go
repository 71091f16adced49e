package fastpath

import "strconv"

// benchTokens returns n deterministic token ids below vocab.
func benchTokens(n int, vocab uint32) []uint32 {
	out := make([]uint32, n)
	x := uint32(2463534242)
	for i := range out {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		out[i] = x % vocab
	}
	return out
}

// tokenBody renders a completions body the way OpenAI client libraries do.
func tokenBody(tokens []uint32, sep string, stream bool) []byte {
	b := []byte(`{"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": [`)
	for i, t := range tokens {
		if i > 0 {
			b = append(b, sep...)
		}
		b = strconv.AppendUint(b, uint64(t), 10)
	}
	b = append(b, `], "max_tokens": 128, "temperature": 0.0, "stream": `...)
	b = strconv.AppendBool(b, stream)
	return append(b, `, "stream_options": {"include_usage": true}}`...)
}
