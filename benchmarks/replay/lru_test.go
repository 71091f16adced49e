package replay

import (
	"math"
	"testing"
)

func TestPooledLRUEqualsBoundWhenTheWorkingSetFits(t *testing.T) {
	tr, err := EmbeddedTrace(TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	full := tr.PooledLRU(0, 128, 16)
	if full.Evicted != 0 || full.CapacityBlocks != full.WorkingSetBlocks {
		t.Fatalf("a cache of the working set evicted %d blocks (capacity %d, working set %d)", full.Evicted, full.CapacityBlocks, full.WorkingSetBlocks)
	}
	// The only gap to the bound is the engine's rule of computing the last
	// token: a prompt hit whole loses its last block.
	if b := tr.HitBound(128); full.Tokens > b.Tokens || b.Tokens-full.Tokens > 0.01 {
		t.Fatalf("pooled LRU with ample capacity = %.4f, want just under the bound %.4f", full.Tokens, b.Tokens)
	}
	prev := 0.0
	for _, f := range []float64{0.1, 0.25, 0.5, 0.75} {
		p := tr.PooledLRU(int(f*float64(full.WorkingSetBlocks)), 128, 16)
		if p.Evicted == 0 || p.Tokens <= prev || p.Tokens >= full.Tokens {
			t.Fatalf("at %.2fx: hit %.4f evicted %d; want evictions and a hit rate rising with capacity (%.4f before, %.4f at 1x)",
				f, p.Tokens, p.Evicted, prev, full.Tokens)
		}
		if again := tr.PooledLRU(p.CapacityBlocks, 128, 16); again != p {
			t.Fatalf("at %.2fx the simulation is not deterministic: %+v then %+v", f, p, again)
		}
		prev = p.Tokens
	}
}

// A hand-worked case: blocks of 4 tokens, 4 tokens per hash id.
func TestPooledLRUEvictsTheLeastRecentlyUsedPrefix(t *testing.T) {
	rec := func(ids ...uint64) Record {
		return Record{InputLength: 4*len(ids) + 1, HashIDs: append(ids, 99)}
	}
	tr := &Trace{BlockSize: 4, Records: []Record{
		rec(1, 2), // miss; caches 1 and 1.2 (the one token of id 99 fills no block)
		rec(3, 4), // miss; the 3-block cache holds 3, 3.4 and 1: 1.2 went first, a prefix's tail before its head
		rec(1, 2), // hits 1, held while 1.2 comes back in place of 3.4
		rec(3, 4), // hits 3 only
	}}
	for i := range tr.Records {
		tr.Records[i].InputLength = 4*(len(tr.Records[i].HashIDs)-1) + 1
	}
	p := tr.PooledLRU(3, 4, 4)
	if p.HitBlocks != 2 || p.HitTokens != 8 || p.PromptTokens != 4*9 {
		t.Fatalf("got %d hit blocks, %d of %d tokens; want 2 blocks, 8 of 36 tokens", p.HitBlocks, p.HitTokens, p.PromptTokens)
	}
	if p.WorkingSetBlocks != 4 || p.Evicted == 0 || math.Abs(p.Tokens-8.0/36) > 1e-12 {
		t.Fatalf("got %+v", p)
	}
}
