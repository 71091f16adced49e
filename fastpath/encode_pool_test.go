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

// TestEncodeBodyCarriesTheItemsOptions: the encoder is sent the options
// that decide an item's identity as the prefill engine will see it:
// mm_processor_kwargs, which vLLM folds into the mm_hash, and
// media_io_kwargs, which decides how the item is decoded (a video's
// frames) before it is hashed. Without the second, an item encoded under
// another decoding was not found by the engine.
func TestEncodeBodyCarriesTheItemsOptions(t *testing.T) {
	ex := &exchange{body: []byte(`{"model":"m","media_io_kwargs":{"video":{"num_frames":8}},"messages":[],` +
		`"mm_processor_kwargs":{"fps":2},"max_tokens":9}`)}
	ex.req.Model = []byte("m")
	part := `{"type":"video_url","video_url":{"url":"http://x/v.mp4"}}`
	got := string(appendEncodeBody(nil, ex, []byte(part)))
	want := `{"model":"m","mm_processor_kwargs":{"fps":2},"media_io_kwargs":{"video":{"num_frames":8}},` +
		`"messages":[{"role":"user","content":[` + part + `]}],"max_tokens":1,"stream":false}`
	if got != want {
		t.Errorf("encoder body:\n got %s\nwant %s", got, want)
	}
}
