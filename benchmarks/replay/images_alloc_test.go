//go:build !race

package replay

import "testing"

// TestImagesZeroAllocs: the multimodal workload's bodies are synthesised
// without allocating, as the chat workload's are.
func TestImagesZeroAllocs(t *testing.T) {
	rec := &Record{InputLength: 40160, HashIDs: make([]uint64, 79)}
	for i := range rec.HashIDs {
		rec.HashIDs[i] = uint64(i)
	}
	set, err := NewImageSet(ImageSynth{TurnRate: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	chat := ChatSynth{Images: set}.normalized()
	body := newRequestBody("mock")
	buf := make([]byte, 0, 1<<20)
	ranks := make([]int, 0, len(rec.HashIDs))
	for name, fn := range map[string]func(){
		"appendChat":   func() { buf = body.appendChat(buf[:0], chat, rec, 92) },
		"AppendImages": func() { ranks = set.AppendImages(ranks[:0], chat, rec) },
	} {
		if n := testing.AllocsPerRun(20, fn); n != 0 {
			t.Errorf("%s: %v allocations per run, want 0", name, n)
		}
	}
	if len(ranks) == 0 {
		t.Fatal("no images in 78 user turns at rate 0.5")
	}
}
