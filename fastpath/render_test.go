package fastpath

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/prompt"
	"github.com/kvfast/kvfast/radix"
)

// fakeRenderer answers every text and chat prompt with ids, or err, and
// counts its calls.
type fakeRenderer struct {
	ids   []uint32
	err   error
	calls atomic.Int64
}

func (f *fakeRenderer) Tokens(_ context.Context, dst []uint32, api openai.API, body []byte, r *openai.ParsedRequest) ([]uint32, error) {
	f.calls.Add(1)
	if r.Prompt != openai.PromptText && r.Prompt != openai.PromptMessages {
		return dst, fmt.Errorf("called for prompt kind %d", r.Prompt)
	}
	if f.err != nil {
		return dst, f.err
	}
	return append(dst, f.ids...), nil
}

// rendererMap is the registry a front end test gives: a renderer per model.
type rendererMap map[string]prompt.Renderer

func (m rendererMap) Renderer(model string) prompt.Renderer { return m[model] }
func (rendererMap) Forget(func(string) bool)                {}

// newRenderTestServer is newRouteTestServer with rd as benchModel's renderer.
func newRenderTestServer(tb testing.TB, n int, policy string, rd prompt.Renderer) *Server {
	tb.Helper()
	s := newRouteTestServer(tb, n, policy)
	s.renderers = rendererMap{benchModel: rd}
	s.WorkersChanged()
	return s
}

// routeAnswer is the route-only answer's fields these tests read.
type routeAnswer struct {
	WorkerID      uint64 `json:"worker_id"`
	OverlapBlocks uint32 `json:"overlap_blocks"`
	CachedTokens  *int   `json:"cached_tokens"`
	PromptBlocks  int    `json:"prompt_blocks"`
	Exact         bool   `json:"exact"`
}

func routeOnce(tb testing.TB, s *Server, path string, body []byte) (int, routeAnswer, []byte) {
	tb.Helper()
	ctx := newRouteCtx(path, body, nil)
	s.handle(ctx)
	var a routeAnswer
	if ctx.Response.StatusCode() == fasthttp.StatusOK {
		if err := json.Unmarshal(ctx.Response.Body(), &a); err != nil {
			tb.Fatalf("cannot decode %s: %v", ctx.Response.Body(), err)
		}
	}
	return ctx.Response.StatusCode(), a, append([]byte(nil), ctx.Response.Body()...)
}

// TestRenderedPrompts: a text or chat prompt whose model has a renderer is
// hashed as the token blocks of the ids it renders, so it meets the exact
// index like a token-id prompt; a failed render routes approximately, and
// a client-caused one is refused with 400.
func TestRenderedPrompts(t *testing.T) {
	ids := benchTokens(160, 151935) // 10 blocks
	chat := []byte(`{"model":"` + benchModel + `","messages":[{"role":"user","content":"hello"}]}`)
	text := []byte(`{"model":"` + benchModel + `","prompt":"hello","max_tokens":4}`)
	tokens := tokenBody(ids, ",", false)

	t.Run("exact", func(t *testing.T) {
		rd := &fakeRenderer{ids: ids}
		s := newRenderTestServer(t, 3, "", rd)
		fillRouteIndex(t, s, tokens, 1, 6)
		for _, tc := range []struct {
			path string
			body []byte
		}{{PathRouteChatCompletions, chat}, {PathRouteCompletions, text}} {
			code, a, raw := routeOnce(t, s, tc.path, tc.body)
			if code != fasthttp.StatusOK || !a.Exact || a.WorkerID != 2 || a.OverlapBlocks != 6 || a.PromptBlocks != 10 ||
				a.CachedTokens == nil || *a.CachedTokens != 96 {
				t.Fatalf("%s: status %d: %s", tc.path, code, raw)
			}
		}
		// Token-id prompts are not rendered: they are the ids already.
		if code, a, raw := routeOnce(t, s, PathRouteCompletions, tokens); code != fasthttp.StatusOK || !a.Exact || a.OverlapBlocks != 6 {
			t.Fatalf("tokens: status %d: %s", code, raw)
		}
		if n := rd.calls.Load(); n != 2 {
			t.Fatalf("the renderer was called %d times, want 2", n)
		}
		if got := histogramCount(t, s, stageTokenize); got != 2 {
			t.Fatalf("tokenize stage observed %d times, want 2", got)
		}
	})
	t.Run("a failed render routes approximately", func(t *testing.T) {
		rd := &fakeRenderer{err: prompt.ErrTimeout}
		s := newRenderTestServer(t, 3, "", rd)
		code, a, raw := routeOnce(t, s, PathRouteChatCompletions, chat)
		if code != fasthttp.StatusOK || a.Exact || a.CachedTokens != nil {
			t.Fatalf("status %d: %s", code, raw)
		}
		// The approximate path hashes the prompt in text chunks, as without a renderer.
		if want := len(radix.AppendApproxHashes(nil, 0, []byte(`[{"role":"user","content":"hello"}]`), s.cfg.ApproxChunkBytes)); a.PromptBlocks != want {
			t.Fatalf("prompt blocks %d, want %d", a.PromptBlocks, want)
		}
	})
	t.Run("the client's fault is a 400", func(t *testing.T) {
		rd := &fakeRenderer{err: fmt.Errorf("template says: %w", prompt.ErrInvalidRequest)}
		s := newRenderTestServer(t, 3, "", rd)
		code, _, raw := routeOnce(t, s, PathRouteChatCompletions, chat)
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if err := json.Unmarshal(raw, &e); err != nil || code != fasthttp.StatusBadRequest || e.Error.Code != "invalid_prompt" ||
			!strings.Contains(e.Error.Message, "template says") {
			t.Fatalf("status %d: %s", code, raw)
		}
	})
	t.Run("another model's requests are not rendered", func(t *testing.T) {
		rd := &fakeRenderer{ids: ids}
		s := newRouteTestServer(t, 2, "")
		s.renderers = rendererMap{"other": rd}
		s.WorkersChanged()
		if code, a, raw := routeOnce(t, s, PathRouteChatCompletions, chat); code != fasthttp.StatusOK || a.Exact || rd.calls.Load() != 0 {
			t.Fatalf("status %d: %s", code, raw)
		}
	})
	t.Run("the approx policy looks rendered blocks up in the approximate index", func(t *testing.T) {
		s := newRenderTestServer(t, 2, "approx", &fakeRenderer{ids: ids})
		if code, a, raw := routeOnce(t, s, PathRouteChatCompletions, chat); code != fasthttp.StatusOK || a.Exact || a.PromptBlocks != 10 {
			t.Fatalf("status %d: %s", code, raw)
		}
	})
}

// histogramCount is how many observations the routing-duration histogram
// has for stage.
func histogramCount(t *testing.T, s *Server, stage string) uint64 {
	t.Helper()
	mfs, err := s.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvfast_routing_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "stage" && l.GetValue() == stage {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}

// tokenizerState is a node view with a tokenizer section.
type tokenizerState struct{ tokenizers []prompt.ModelStatus }

func (s tokenizerState) Snapshot() Snapshot {
	return Snapshot{Policy: "kv", Workers: []WorkerView{}, Tokenizers: s.tokenizers}
}

// TestTokenizerMetrics: /metrics exports each model's tokenizer mode, its
// renderer's outcomes and its prefix cache from the snapshot.
func TestTokenizerMetrics(t *testing.T) {
	s := newRouteTestServer(t, 1, "")
	s.state = tokenizerState{[]prompt.ModelStatus{
		{Model: "a", Mode: prompt.ModeRemote, Exact: true, Outcomes: &prompt.Outcomes{OK: 7, Timeout: 2}},
		{Model: "b", Mode: prompt.ModeNone},
		{Model: "c", Mode: prompt.ModeBuiltin, Exact: true, Outcomes: &prompt.Outcomes{OK: 1},
			PrefixCache: &prompt.CacheStats{Hits: 5, Misses: 3, Evictions: 1, Bytes: 4096}},
	}}
	got := map[string]float64{}
	mfs, err := s.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "kvfast_tokenize") && !strings.HasPrefix(mf.GetName(), "kvfast_prefix_cache") {
			continue
		}
		for _, m := range mf.GetMetric() {
			key := []string{mf.GetName()}
			for _, l := range m.GetLabel() {
				key = append(key, l.GetValue())
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			got[strings.Join(key, "/")] = v
		}
	}
	want := map[string]float64{
		// label values in label-name order: mode, model, outcome
		"kvfast_tokenizer_info/remote/a": 1, "kvfast_tokenizer_info/none/b": 1, "kvfast_tokenizer_info/builtin/c": 1,
		"kvfast_tokenize_total/remote/a/ok": 7, "kvfast_tokenize_total/remote/a/timeout": 2, "kvfast_tokenize_total/remote/a/no_engine": 0,
		"kvfast_tokenize_total/builtin/c/ok":       1,
		"kvfast_prefix_cache_segments_total/c/hit": 5, "kvfast_prefix_cache_segments_total/c/miss": 3,
		"kvfast_prefix_cache_evictions_total/c": 1, "kvfast_prefix_cache_bytes/c": 4096,
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	// Besides these, only the other outcomes of a and c, all zero: b, which
	// has no tokenizer, has no counters.
	if n := len(got); n != 3+2*10+4 {
		t.Errorf("%d series: %v", n, got)
	}
}
