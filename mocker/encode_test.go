package mocker

import (
	"math"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/workers"
)

// TestEncodeHandOver: an encode engine encodes an image once and then
// finds it in its encoder cache; it saves the image to the store, where
// an aggregated engine finds it and skips encoding it, while an image
// nobody encoded is encoded by the engine that gets it.
func TestEncodeHandOver(t *testing.T) {
	store := NewECStore()
	timing := testTiming
	timing.EncodePerItem = 1
	enc := startEngine(t, Config{Model: "m", Role: workers.RoleEncode, ECStore: store, Speedup: math.Inf(1), Timing: timing})
	agg := startEngine(t, Config{Model: "m", ECStore: store, Speedup: math.Inf(1), Timing: timing})
	cat := imageChat("http://pictures/cat.png")
	for range 2 {
		if status, body := do(t, "POST", enc.URL()+"/v1/chat/completions", cat); status != 200 || !strings.Contains(string(body), `"completion_tokens":1`) {
			t.Fatalf("encode: %d %s", status, body)
		}
	}
	if s := enc.EncodeStats(); s.Encoded != 1 || s.CacheHits != 1 {
		t.Errorf("encoder: %+v; want one encoding, then one encoder-cache hit", s)
	}
	if !store.Has(ImageHash("http://pictures/cat.png")) {
		t.Fatal("the encoder saved nothing under the image's mm_hash")
	}
	if status, body := do(t, "POST", agg.URL()+"/v1/chat/completions", cat); status != 200 {
		t.Fatalf("aggregated: %d %s", status, body)
	}
	if s := agg.EncodeStats(); s.HandedOver != 1 || s.Encoded != 0 {
		t.Errorf("aggregated engine after a handed-over image: %+v", s)
	}
	if status, body := do(t, "POST", agg.URL()+"/v1/chat/completions", imageChat("http://pictures/dog.png")); status != 200 {
		t.Fatalf("aggregated: %d %s", status, body)
	}
	if s := agg.EncodeStats(); s.HandedOver != 1 || s.Encoded != 1 {
		t.Errorf("aggregated engine after an image nobody encoded: %+v", s)
	}
	if status, _ := do(t, "POST", enc.URL()+"/v1/completions", `{"model":"m","prompt":"hi"}`); status != 400 {
		t.Errorf("an encode engine answered a completions request: %d", status)
	}
	if _, err := Start(Config{Role: workers.RoleEncode}); err == nil {
		t.Error("an encode engine started without a store")
	}
}

// TestECStoreDirectory: engines in different processes share a store
// through a directory; names that are not mm_hashes are refused.
func TestECStoreDirectory(t *testing.T) {
	dir := t.TempDir()
	a, err := OpenECStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := OpenECStore(dir)
	h := ImageHash("x")
	if b.Has(h) {
		t.Fatal("an empty store has an item")
	}
	if err := a.Put(h); err != nil {
		t.Fatal(err)
	}
	if !b.Has(h) {
		t.Error("the other store does not see the item")
	}
	if err := a.Put("../escape"); err == nil || b.Has("../escape") {
		t.Error("a path was accepted as an mm_hash")
	}
}

// TestEncoderCacheBounded: the encoder cache keeps its capacity, least
// recently used out first.
func TestEncoderCacheBounded(t *testing.T) {
	c := encoder{capacity: 2}
	for _, id := range []string{"a", "b", "a", "c"} { // c evicts b, the least recently used
		c.cached(id)
	}
	if !c.cached("a") || !c.cached("c") {
		t.Error("a recently used item was evicted")
	}
	if c.cached("b") {
		t.Error("the least recently used item stayed")
	}
}
