package mocker

import (
	"encoding/json"
	"math"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/kvfast/kvfast/feed"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
)

// imageChat is a chat body whose user message shows the image at url
// between two texts.
func imageChat(url string) string {
	return `{"model":"m","max_tokens":1,"messages":[` +
		`{"role":"system","content":"you describe pictures in one short and careful sentence for the visually impaired reader"},` +
		`{"role":"user","content":[{"type":"text","text":"look at this"},{"type":"image_url","image_url":{"url":"` + url + `"}},` +
		`{"type":"text","text":"and say what it shows"}]}]}`
}

type renderedMM struct {
	TokenIDs []uint32 `json:"token_ids"`
	Features *struct {
		MMHashes       map[string][]string `json:"mm_hashes"`
		MMPlaceholders map[string][]struct {
			Offset, Length int
		} `json:"mm_placeholders"`
	} `json:"features"`
}

// TestHTTPRenderImages: an image part becomes ImageTokens placeholders
// where it stands, and the render endpoint names its hash and range in
// vLLM's features; /tokenize returns the same ids.
func TestHTTPRenderImages(t *testing.T) {
	e := startEngine(t, Config{Model: "m", Speedup: math.Inf(1)})
	body := imageChat("http://pictures/cat.png")
	code, b := do(t, http.MethodPost, e.URL()+"/v1/chat/completions/render", body)
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, b)
	}
	var g renderedMM
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatalf("cannot decode %s: %v", b, err)
	}
	sys := AppendTextTokens([]uint32{TokenSystem}, "you describe pictures in one short and careful sentence for the visually impaired reader")
	off := len(sys) + 1 + 1 + len(AppendTextTokens(nil, "look at this"))
	if g.Features == nil || !slices.Equal(g.Features.MMHashes["image"], []string{ImageHash("http://pictures/cat.png")}) ||
		len(g.Features.MMPlaceholders["image"]) != 1 || g.Features.MMPlaceholders["image"][0].Offset != off ||
		g.Features.MMPlaceholders["image"][0].Length != ImageTokens {
		t.Fatalf("features %s, want the image's hash at offset %d", b, off)
	}
	for i := range ImageTokens {
		if g.TokenIDs[off+i] != TokenImage {
			t.Fatalf("token %d is %d, want the image placeholder", off+i, g.TokenIDs[off+i])
		}
	}
	code, b = do(t, http.MethodPost, e.URL()+"/tokenize", body)
	var tk struct{ Tokens []uint32 }
	if code != http.StatusOK || json.Unmarshal(b, &tk) != nil || !slices.Equal(tk.Tokens, g.TokenIDs) {
		t.Fatalf("tokenize: %d %s, want %v", code, b, g.TokenIDs)
	}
	if code, b := do(t, http.MethodPost, e.URL()+"/v1/chat/completions/render",
		`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]}`); code != http.StatusBadRequest {
		t.Fatalf("an audio part: status %d: %s, want 400", code, b)
	}
}

// TestImageBlocksCacheByImage: the engine caches an image's blocks under
// the image: the same image and text hit every full block, another image
// with the same text only the blocks before it.
func TestImageBlocksCacheByImage(t *testing.T) {
	e := startEngine(t, Config{Model: "m", Speedup: math.Inf(1), KVBlocks: 1024})
	bs := e.Config().BlockSize
	cached := func(url string) (prompt, cached int) {
		code, b := do(t, http.MethodPost, e.URL()+"/v1/chat/completions", imageChat(url))
		if code != http.StatusOK {
			t.Fatalf("status %d: %s", code, b)
		}
		u := decode(t, b).Usage
		return u.PromptTokens, u.PromptTokensDetails.CachedTokens
	}
	n, c := cached("http://pictures/cat.png")
	if c != 0 {
		t.Fatalf("a cold cache reported %d cached tokens", c)
	}
	if _, c := cached("http://pictures/cat.png"); c != n/bs*bs {
		t.Errorf("the same image: %d cached tokens, want every full block's %d", c, n/bs*bs)
	}
	var g renderedMM
	_, b := do(t, http.MethodPost, e.URL()+"/v1/chat/completions/render", imageChat("http://pictures/dog.png"))
	if err := json.Unmarshal(b, &g); err != nil || g.Features == nil {
		t.Fatalf("render: %s %v", b, err)
	}
	before := g.Features.MMPlaceholders["image"][0].Offset / bs * bs
	if _, c := cached("http://pictures/dog.png"); c != before {
		t.Errorf("another image: %d cached tokens, want the %d before the image", c, before)
	}
}

// TestZMQPublisherImageKeys: the ZMQ publisher lists each block's
// (mm_hash, offset) keys as vLLM does, and the feed hashes the blocks with
// them exactly as the router hashes the render endpoint's answer.
func TestZMQPublisherImageKeys(t *testing.T) {
	e := startEngine(t, Config{Model: "m", Speedup: math.Inf(1), KVBlocks: 1024,
		ZMQ: ZMQConfig{Listen: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", Topic: "kv"}})
	ix, err := radix.NewHeap(radix.Config{Capacity: 1 << 14})
	if err != nil {
		t.Fatal(err)
	}
	const slot = workers.Slot(1)
	sub, err := feed.NewZMQSubscriber(ix, feed.ZMQConfig{Endpoint: e.ZMQEndpoint(), Replay: e.ZMQReplayEndpoint(), Topic: "kv",
		Slot: slot, Model: "m", BlockSize: e.Config().BlockSize, RedialMin: 5 * time.Millisecond, RedialMax: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runSub(t, sub)
	bs := e.Config().BlockSize
	hashesOf := func(url string) []uint64 {
		var g renderedMM
		_, b := do(t, http.MethodPost, e.URL()+"/v1/chat/completions/render", imageChat(url))
		if err := json.Unmarshal(b, &g); err != nil || g.Features == nil {
			t.Fatalf("render: %s %v", b, err)
		}
		p := g.Features.MMPlaceholders["image"][0]
		items := []radix.MMItem{{ID: []byte(g.Features.MMHashes["image"][0]), Offset: p.Offset, Length: p.Length}}
		return radix.AppendBlockHashesMM(nil, radix.NamespaceSeed("m", "", ""), g.TokenIDs, bs, items)
	}
	cat, dog := hashesOf("http://pictures/cat.png"), hashesOf("http://pictures/dog.png")
	var ov workers.Overlaps
	// The subscription may miss the first batches, and the subscriber
	// catches up on its first live batch: send other prompts until the
	// image prompt's blocks are in.
	for i := 0; ; i++ {
		body := imageChat("http://pictures/cat.png")
		if i > 0 {
			body = `{"prompt":` + idsJSON(seq(5000+100*i, 2*bs)) + `,"max_tokens":1}`
		}
		path := "/v1/chat/completions"
		if i > 0 {
			path = "/v1/completions"
		}
		if code, b := do(t, http.MethodPost, e.URL()+path, body); code != http.StatusOK {
			t.Fatalf("status %d: %s", code, b)
		}
		ix.FindMatches(cat, &ov)
		if ov[slot] == uint32(len(cat)) {
			break
		}
		if i > 500 {
			t.Fatalf("the router never held the image prompt: overlap %d of %d, %+v", ov[slot], len(cat), sub.Stats())
		}
	}
	ix.FindMatches(dog, &ov)
	if want := firstDiff(cat, dog); ov[slot] != uint32(want) {
		t.Errorf("another image matched %d blocks, want the %d before the image", ov[slot], want)
	}
	if st := sub.Stats(); st.MultimodalBlocks == 0 || st.SkippedExtraKeys != 0 || st.BadEvents != 0 {
		t.Errorf("stats %+v: want multimodal blocks, none skipped", st)
	}
}

func firstDiff(a, b []uint64) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
