//go:build !race

package prompt

import (
	"context"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/openai"
)

// TestRemoteAllocations: once its pools are warm, a remote render makes no
// allocation, through either endpoint: the request, the round trip, the
// answer's scan and the ids' validation. The engine is a fasthttp server
// in this process answering a fixed body, which allocates nothing either,
// so that what is counted is the renderer's.
func TestRemoteAllocations(t *testing.T) {
	se := startScripted(t)
	se.set(map[string]scripted{
		pathRenderChat: {status: 200, body: []byte(`{"request_id":"x","token_ids":[1,2,3,4,5,6,7,8,9,10],"features":null,"sampling_params":{"max_tokens":8}}`)},
		pathTokenize:   {status: 200, body: []byte(`{"count":3,"max_model_len":4096,"tokens":[11,12,13],"token_strs":null}`)},
	})
	rm := NewRemote("m", FixedEngine(se.addr), testRemoteConfig)
	chat := []byte(`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"stream":true}`)
	text := []byte(`{"model":"m","prompt":"once upon a time","max_tokens":8,"add_special_tokens":true}`)
	for _, tc := range []struct {
		name string
		api  openai.API
		body []byte
		want int
	}{
		{"chat via render", openai.APIChatCompletions, chat, 10},
		{"completions via tokenize", openai.APICompletions, text, 3}, // the scripted engine has no completions render
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := parse(t, tc.api, string(tc.body))
			dst := make([]uint32, 0, 64)
			var err error
			call := func() {
				if dst, err = rm.Tokens(context.Background(), dst[:0], tc.api, tc.body, req); err != nil || len(dst) != tc.want {
					t.Fatalf("%v, %v", dst, err)
				}
			}
			call() // probe the engine, fill the pools
			if n := testing.AllocsPerRun(200, call); n != 0 {
				t.Fatalf("a remote render made %v allocations", n)
			}
		})
	}
}

// TestRemoteMultimodalAllocations: reading a render answer's multimodal
// inputs allocates nothing once the Multimodal's buffers have grown.
func TestRemoteMultimodalAllocations(t *testing.T) {
	se := startScripted(t)
	se.set(map[string]scripted{pathRenderChat: {status: 200, body: renderAnswer(
		`{"mm_hashes":{"image":["3f2a9c","77b0e1"]},"mm_placeholders":{"image":[{"offset":6,"length":4},{"offset":1,"length":4}]}}`)}})
	rm := NewRemote("m", FixedEngine(se.addr), testRemoteConfig)
	req, body := parse(t, openai.APIChatCompletions, mmChat), []byte(mmChat)
	dst := make([]uint32, 0, 64)
	var mm Multimodal
	var err error
	call := func() {
		if dst, err = rm.TokensMultimodal(context.Background(), dst[:0], &mm, openai.APIChatCompletions, body, req); err != nil || len(mm.Items) != 2 {
			t.Fatalf("%v, %v", mm.Items, err)
		}
	}
	call()
	if n := testing.AllocsPerRun(200, call); n != 0 {
		t.Fatalf("a multimodal render made %v allocations", n)
	}
	msgs := []byte(`[{"role":"user","content":[{"type":"text","text":"x"},{"type":"image_url","image_url":{"url":"u"}}]}]`)
	if n := testing.AllocsPerRun(200, func() { HasMultimodalParts(msgs) }); n != 0 {
		t.Fatalf("HasMultimodalParts made %v allocations", n)
	}
}

// TestPrefixCacheAllocations: a prompt whose segments are all cached is
// copied out without allocating.
func TestPrefixCacheAllocations(t *testing.T) {
	var enc Encoder = toyTokenizer{specials: toySpecials}
	text := []byte("<|im_start|>system\nYou are brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
	cuts := specialCuts(toyTokenizer{specials: toySpecials}, text)
	c := NewPrefixCache(1 << 20)
	dst := c.Encode(nil, enc, 0, text, cuts)
	if n := testing.AllocsPerRun(200, func() { dst = c.Encode(dst[:0], enc, 0, text, cuts) }); n != 0 {
		t.Fatalf("a cached prompt made %v allocations", n)
	}
}

// TestMediaAllocations: reading a request's media, base64 decoding and
// hashing included, allocates nothing once its buffers are warm.
func TestMediaAllocations(t *testing.T) {
	msgs := []byte(`[{"role":"user","content":[{"type":"text","text":"x"},
		{"type":"image_url","image_url":{"url":"data:image/png;base64,` + strings.Repeat("QUJD", 5000) + `"}},
		{"type":"image_url","image_url":{"url":"https:\/\/example.com\/a.png"}}]}]`)
	var m Media
	lim := MediaLimits{MaxItems: 8, MaxItemBytes: 1 << 20}
	if err := m.Parse(msgs, lim); err != nil || len(m.Items) != 2 {
		t.Fatalf("items %+v, %v", m.Items, err)
	}
	if n := testing.AllocsPerRun(100, func() { _ = m.Parse(msgs, lim) }); n != 0 {
		t.Errorf("Media.Parse: %v allocations, want 0", n)
	}
}
