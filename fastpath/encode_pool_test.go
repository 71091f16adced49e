package fastpath

import "testing"

// TestPooledExchangeDropsLargeEncodeBodies: an exchange goes back to the
// pool without the encoder-stage bodies of a large image, which would
// otherwise stay pinned there for as long as the router runs.
func TestPooledExchangeDropsLargeEncodeBodies(t *testing.T) {
	s := &Server{}
	ex := newExchange(s).(*exchange)
	ex.setEncodeStages(2)
	ex.enc[0].body = make([]byte, 0, 1<<20)
	ex.enc[1].body = make([]byte, 0, 1<<10)
	ex.setEncodeStages(1) // a later request with one item: the second stage is past len
	s.releaseExchange(ex)
	stages := ex.enc[:cap(ex.enc)]
	if len(stages) < 2 || cap(stages[0].body) != 0 || cap(stages[1].body) != 1<<10 {
		t.Fatalf("pooled stage bodies of capacity %d and %d, want 0 and %d", cap(stages[0].body), cap(stages[1].body), 1<<10)
	}
}
