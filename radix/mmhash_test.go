package radix

import "testing"

func TestChainBlockHashExtraWithoutKeysIsChainBlockHash(t *testing.T) {
	tokens := seqTokens(64, 9)
	seed := NamespaceSeed("m", "", "")
	if ChainBlockHashExtra(seed, tokens[:16], 0) != ChainBlockHash(seed, tokens[:16]) {
		t.Fatal("a block without multimodal keys must hash as a text block")
	}
	plain := AppendBlockHashes(nil, seed, tokens, 16)
	mm := AppendBlockHashesMM(nil, seed, tokens, 16, nil)
	if len(plain) != len(mm) {
		t.Fatalf("%d hashes, want %d", len(mm), len(plain))
	}
	for i := range plain {
		if plain[i] != mm[i] {
			t.Fatalf("block %d: %x, want %x", i, mm[i], plain[i])
		}
	}
}

// The keys each block gets, written out by hand from vLLM's
// _gen_mm_extra_hash_keys for block size 4: image a on tokens 2..8, image
// b on 9..10. Block [0,4) holds (a, 2); [4,8) holds (a, -2); [8,12) holds
// (a, -6) then (b, 1); [12,16) holds none.
func TestBlockMMExtraFollowsVLLM(t *testing.T) {
	a, b := []byte("a"), []byte("b")
	items := []MMItem{{ID: a, Offset: 2, Length: 7}, {ID: b, Offset: 9, Length: 2}}
	want := []uint64{
		FoldMMKey(0, a, 2),
		FoldMMKey(0, a, -2),
		FoldMMKey(FoldMMKey(0, a, -6), b, 1),
		0,
	}
	next := 0
	for i, w := range want {
		var got uint64
		got, next = BlockMMExtra(items, next, 4*i, 4*i+4)
		if got != w {
			t.Errorf("block %d: extra %x, want %x", i, got, w)
		}
	}
	if next != len(items) {
		t.Errorf("next = %d after the last item, want %d", next, len(items))
	}
	tokens := seqTokens(16, 1)
	hashes := AppendBlockHashesMM(nil, 5|anchorParent, tokens, 4, items)
	parent := uint64(5 | anchorParent)
	for i, w := range want {
		parent = ChainBlockHashExtra(parent, tokens[4*i:4*i+4], w)
		if hashes[i] != parent {
			t.Errorf("block %d: hash %x, want %x", i, hashes[i], parent)
		}
	}
}

func TestMMKeysSeparateBlocks(t *testing.T) {
	a, b := []byte("image-a"), []byte("image-b")
	if FoldMMKey(0, a, 0) == FoldMMKey(0, b, 0) {
		t.Error("different identifiers fold alike")
	}
	if FoldMMKey(0, a, 0) == FoldMMKey(0, a, 1) {
		t.Error("different offsets fold alike")
	}
	if FoldMMKey(FoldMMKey(0, a, 0), b, 2) == FoldMMKey(FoldMMKey(0, b, 2), a, 0) {
		t.Error("the keys' order is lost")
	}
	// Two prompts with the same tokens and different images share the
	// blocks before the first image, and no block from it on.
	tokens := seqTokens(64, 3)
	seed := NamespaceSeed("m", "", "")
	ha := AppendBlockHashesMM(nil, seed, tokens, 16, []MMItem{{ID: a, Offset: 20, Length: 30}})
	hb := AppendBlockHashesMM(nil, seed, tokens, 16, []MMItem{{ID: b, Offset: 20, Length: 30}})
	if ha[0] != hb[0] {
		t.Error("the block before the image differs")
	}
	for i := 1; i < len(ha); i++ {
		if ha[i] == hb[i] {
			t.Errorf("block %d matches across images", i)
		}
	}
}

// BenchmarkHashBlocksMM: an 8K-token prompt with four images of 576
// placeholder tokens each (a LLaVA-sized image), against
// BenchmarkHashBlocks' text prompt of the same length.
func BenchmarkHashBlocksMM(b *testing.B) {
	tokens := seqTokens(8192, 1)
	var items []MMItem
	for i := range 4 {
		items = append(items, MMItem{ID: []byte("5f2b1c9d7e3a4b6c8d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e"), Offset: 100 + 2000*i, Length: 576})
	}
	dst := make([]uint64, 0, 512)
	seed := NamespaceSeed("llava", "", "")
	b.ReportAllocs()
	b.SetBytes(int64(len(tokens) * 4))
	for b.Loop() {
		dst = AppendBlockHashesMM(dst[:0], seed, tokens, 16, items)
	}
	b.ReportMetric(float64(len(tokens))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}
