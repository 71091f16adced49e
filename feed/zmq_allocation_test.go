//go:build !race

package feed

import "testing"

// TestZMQApplyZeroAllocs: once its buffers have grown, the subscriber
// decodes and applies batches without allocating (zmq4 itself allocates
// each received frame).
func TestZMQApplyZeroAllocs(t *testing.T) {
	ix := newZMQIndex(t)
	s, err := NewZMQSubscriber(ix, ZMQConfig{Endpoint: "tcp://127.0.0.1:1", Slot: zmqTestSlot, Model: testModel,
		BlockSize: testBlockSize})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []wireFormat{vllmMap, vllmArray} {
		for _, k := range []hashKind{intHashes, bytesHashes} {
			ops := genOps(uint64(40+f)*2+uint64(k), 1)
			ops[0].Parent = nil
			var removed op
			removed.Op, removed.Hashes = "removed", ops[0].Hashes
			stored := encodeBatch(t, f, wireOps(k, ops))
			gone := encodeBatch(t, f, wireOps(k, []op{removed, {Op: "cleared"}}))
			seq := s.lastSeq
			allocs := testing.AllocsPerRun(200, func() {
				seq++
				s.offer(seq, stored)
				seq++
				s.offer(seq, gone)
			})
			if allocs != 0 {
				t.Errorf("%v hashes %d: %v allocs per stored+removed pair", f, k, allocs)
			}
		}
	}
	if st := s.Stats(); st.StoredBlocks == 0 || st.RemovedBlocks != st.StoredBlocks || st.Garbage != 0 {
		t.Fatalf("nothing was applied: %+v", st)
	}
}
