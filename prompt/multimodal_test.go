package prompt

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/openai"
)

const mmChat = `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/a.png"}},{"type":"text","text":"what is it"}]}]}`

// renderAnswer is a chat render answer of 12 ids with features.
func renderAnswer(features string) []byte {
	return []byte(`{"request_id":"chatcmpl-1","token_ids":[1,2,3,4,5,6,7,8,9,10,11,12],"features":` + features +
		`,"sampling_params":{"max_tokens":8},"model":"m","stream":false}`)
}

// TestRemoteMultimodal: the render endpoint's mm_hashes and
// mm_placeholders become the prompt's inputs, paired by modality and
// index, ordered by offset, hashes decoded; the completions endpoint's
// list answer carries them too.
func TestRemoteMultimodal(t *testing.T) {
	se := startScripted(t)
	features := `{"mm_hashes":{"image":["img-b","img\u002Da"],"audio":["aud"]},` +
		`"mm_placeholders":{"audio":[{"offset":0,"length":2}],"image":[{"offset":9,"length":3,"is_embed":null},{"offset":3,"length":4}]},` +
		`"kwargs_data":null}`
	se.set(map[string]scripted{
		pathRenderChat:        {status: 200, body: renderAnswer(features)},
		pathRenderCompletions: {status: 200, body: []byte(`[` + string(renderAnswer(features)) + `]`)},
	})
	rm := NewRemote("m", FixedEngine(se.addr), testRemoteConfig)
	for _, tc := range []struct {
		api  openai.API
		body string
	}{{openai.APIChatCompletions, mmChat}, {openai.APICompletions, `{"model":"m","prompt":"x"}`}} {
		var mm Multimodal
		ids, err := rm.TokensMultimodal(context.Background(), nil, &mm, tc.api, []byte(tc.body), parse(t, tc.api, tc.body))
		if err != nil || len(ids) != 12 {
			t.Fatalf("%v: %v, %v", tc.api, ids, err)
		}
		var got []string
		for _, it := range mm.Items {
			got = append(got, fmt.Sprintf("%s@%d+%d", it.ID, it.Offset, it.Length))
		}
		if want := "aud@0+2 img-a@3+4 img-b@9+3"; strings.Join(got, " ") != want {
			t.Errorf("%v: items %v, want %s", tc.api, got, want)
		}
		// Tokens, the plain Renderer, reads the same answer.
		if ids, err := rm.Tokens(context.Background(), nil, tc.api, []byte(tc.body), parse(t, tc.api, tc.body)); err != nil || len(ids) != 12 {
			t.Fatalf("%v: Tokens: %v, %v", tc.api, ids, err)
		}
	}
}

// TestRemoteMultimodalNone: a text prompt's null features, an answer
// without them and the /tokenize fallback all leave no inputs, and reset
// what a previous render left.
func TestRemoteMultimodalNone(t *testing.T) {
	se := startScripted(t)
	rm := NewRemote("m", FixedEngine(se.addr), testRemoteConfig)
	for _, answers := range []map[string]scripted{
		{pathRenderChat: {status: 200, body: renderAnswer("null")}},
		{pathRenderChat: {status: 200, body: []byte(`{"token_ids":[1,2,3,4,5,6,7,8,9,10,11,12]}`)}},
	} {
		se.set(answers)
		mm := Multimodal{}
		mm.parseFeatures([]byte(`{"mm_hashes":{"image":["x"]},"mm_placeholders":{"image":[{"offset":0,"length":1}]}}`), 4)
		if len(mm.Items) != 1 {
			t.Fatal("the setup did not leave an input")
		}
		if _, err := rm.TokensMultimodal(context.Background(), nil, &mm, openai.APIChatCompletions, []byte(mmChat),
			parse(t, openai.APIChatCompletions, mmChat)); err != nil || len(mm.Items) != 0 {
			t.Fatalf("%v, %v", mm.Items, err)
		}
	}
	rm2 := NewRemote("m", FixedEngine(se.addr), testRemoteConfig)
	se.set(map[string]scripted{pathTokenize: {status: 200, body: []byte(`{"count":2,"max_model_len":9,"tokens":[1,2]}`)}})
	var mm Multimodal
	if ids, err := rm2.TokensMultimodal(context.Background(), nil, &mm, openai.APIChatCompletions, []byte(mmChat),
		parse(t, openai.APIChatCompletions, mmChat)); err != nil || len(ids) != 2 || len(mm.Items) != 0 {
		t.Fatalf("tokenize: %v %v, %v", ids, mm.Items, err)
	}
}

// TestRemoteMultimodalRefusesBadShapes: features that do not pair every
// hash with one range inside the prompt, or exceed a limit, refuse the
// answer (bad_response), so the request routes approximately instead of
// hashing an image under a wrong key.
func TestRemoteMultimodalRefusesBadShapes(t *testing.T) {
	many := func(n int, id string) string {
		var h, r []string
		for i := range n {
			h = append(h, `"`+id+`"`)
			r = append(r, fmt.Sprintf(`{"offset":%d,"length":1}`, i))
		}
		return `{"mm_hashes":{"image":[` + strings.Join(h, ",") + `]},"mm_placeholders":{"image":[` + strings.Join(r, ",") + `]}}`
	}
	for name, features := range map[string]string{
		"not an object":         `[1]`,
		"no placeholders":       `{"mm_hashes":{"image":["a"]}}`,
		"no hashes":             `{"mm_placeholders":{"image":[{"offset":0,"length":1}]}}`,
		"hash without range":    `{"mm_hashes":{"image":["a","b"]},"mm_placeholders":{"image":[{"offset":0,"length":1}]}}`,
		"range without hash":    `{"mm_hashes":{"image":["a"]},"mm_placeholders":{"image":[{"offset":0,"length":1},{"offset":2,"length":1}]}}`,
		"other modality":        `{"mm_hashes":{"image":["a"]},"mm_placeholders":{"video":[{"offset":0,"length":1}]}}`,
		"past the prompt":       `{"mm_hashes":{"image":["a"]},"mm_placeholders":{"image":[{"offset":10,"length":3}]}}`,
		"empty range":           `{"mm_hashes":{"image":["a"]},"mm_placeholders":{"image":[{"offset":1,"length":0}]}}`,
		"negative offset":       `{"mm_hashes":{"image":["a"]},"mm_placeholders":{"image":[{"offset":-1,"length":2}]}}`,
		"fractional length":     `{"mm_hashes":{"image":["a"]},"mm_placeholders":{"image":[{"offset":1,"length":1.5}]}}`,
		"missing length":        `{"mm_hashes":{"image":["a"]},"mm_placeholders":{"image":[{"offset":1}]}}`,
		"overlapping":           `{"mm_hashes":{"image":["a","b"]},"mm_placeholders":{"image":[{"offset":0,"length":4},{"offset":3,"length":2}]}}`,
		"hash not a string":     `{"mm_hashes":{"image":[7]},"mm_placeholders":{"image":[{"offset":0,"length":1}]}}`,
		"empty hash":            `{"mm_hashes":{"image":[""]},"mm_placeholders":{"image":[{"offset":0,"length":1}]}}`,
		"hash too long":         many(1, strings.Repeat("h", MaxMultimodalIDBytes+1)),
		"modality twice":        `{"mm_hashes":{"image":["a"],"image":["b"]},"mm_placeholders":{"image":[{"offset":0,"length":1},{"offset":1,"length":1}]}}`,
		"placeholders not list": `{"mm_hashes":{"image":["a"]},"mm_placeholders":{"image":{"offset":0,"length":1}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			se := startScripted(t)
			se.set(map[string]scripted{pathRenderChat: {status: 200, body: renderAnswer(features)}})
			rm := NewRemote("m", FixedEngine(se.addr), testRemoteConfig)
			var mm Multimodal
			_, err := rm.TokensMultimodal(context.Background(), nil, &mm, openai.APIChatCompletions, []byte(mmChat),
				parse(t, openai.APIChatCompletions, mmChat))
			if !errors.Is(err, ErrBadResponse) || len(mm.Items) != 0 {
				t.Fatalf("%v, %v: want a bad response and no inputs", err, mm.Items)
			}
		})
	}
	// The limits themselves pass, and one more input does not.
	var mm Multimodal
	if err := mm.parseFeatures([]byte(many(1, strings.Repeat("h", MaxMultimodalIDBytes))), 12); err != nil {
		t.Errorf("a hash of the longest length: %v", err)
	}
	if err := mm.parseFeatures([]byte(many(MaxMultimodalItems, "a")), 1000); err != nil || len(mm.Items) != MaxMultimodalItems {
		t.Errorf("the most inputs: %v", err)
	}
	if err := mm.parseFeatures([]byte(many(MaxMultimodalItems+1, "a")), 1000); err == nil || len(mm.Items) != 0 {
		t.Errorf("one input too many was accepted")
	}
}

func TestHasMultimodalParts(t *testing.T) {
	for msgs, want := range map[string]bool{
		`[{"role":"user","content":"an image_url, in words"}]`:                                                  false,
		`[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"refusal","refusal":"no"}]}]`:           false,
		`[{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"f"}}]}]`:      false,
		`[{"role":"user","content":[{"type":"text","text":"x"},{"type":"image_url","image_url":{"url":"u"}}]}]`: true,
		`[{"role":"system","content":"s"},{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]`: true,
		`[{"role":"user","content":[{"type":"video_url","video_url":{"url":"u"}}]}]`:                            true,
		`[{"role":"user","content":[{"text":"no type","type":"image\u005furl"}]}]`:                              true,
		`[]`: false,
	} {
		if got := HasMultimodalParts([]byte(msgs)); got != want {
			t.Errorf("%s: %v, want %v", msgs, got, want)
		}
	}
}
