package prompt

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvfast/kvfast/internal/syncbuf"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/openai"
)

func specs(t *testing.T, vs ...string) []Spec {
	t.Helper()
	var out []Spec
	for _, v := range vs {
		s, err := ParseSpec(v)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

func TestRegistry(t *testing.T) {
	e := startMock(t, mocker.Config{})
	hub := t.TempDir()
	t.Setenv("HF_HUB_CACHE", hub)
	t.Setenv("HF_HOME", "")
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("HOME", t.TempDir())
	writeTokenizerDir(t, filepath.Join(hub, "models--Org--Cached", "snapshots", "r1"), true)

	var logs syncbuf.Buffer
	cfg := DefaultConfig()
	cfg.Specs = specs(t, "mock=remote", "auto")
	reg, err := NewRegistry(cfg, Options{Engines: FixedEngine(e.Addr()), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}

	rd := reg.Renderer("mock")
	if rd == nil {
		t.Fatal("the remote model has no renderer")
	}
	body := `{"prompt":"a b c"}`
	got, err := rd.Tokens(context.Background(), nil, openai.APICompletions, []byte(body), parse(t, openai.APICompletions, body))
	if err != nil || !slices.Equal(got, mocker.AppendTextTokens(nil, "a b c")) {
		t.Fatalf("%v, %v", got, err)
	}
	// Models no spec names: auto finds one in the cache, but this build
	// cannot load it; the other is not there. Both route approximately,
	// and each is logged once however often it is asked about.
	for range 3 {
		if reg.Renderer("Org/Cached") != nil || reg.Renderer("Org/Elsewhere") != nil || reg.Renderer("") != nil {
			t.Fatal("a model without a usable tokenizer got a renderer")
		}
	}
	out := logs.String()
	for _, m := range []string{"Org/Cached", "Org/Elsewhere"} {
		if n := strings.Count(out, "model="+m); n != 1 {
			t.Errorf("%s logged %d times:\n%s", m, n, out)
		}
	}
	if !strings.Contains(out, "route approximately") {
		t.Errorf("the log does not say the models route approximately:\n%s", out)
	}

	st := reg.Status()
	if len(st) != 3 || st[0].Model != "Org/Cached" || st[1].Model != "Org/Elsewhere" || st[2].Model != "mock" {
		t.Fatalf("status %+v", st)
	}
	if s := st[0]; s.Mode != ModeNone || s.Exact || !strings.Contains(s.Reason, "cannot load") || s.Outcomes != nil {
		t.Errorf("cached model %+v", s)
	}
	if s := st[1]; s.Mode != ModeNone || !strings.Contains(s.Reason, "auto found no tokenizer") {
		t.Errorf("missing model %+v", s)
	}
	if s := st[2]; s.Mode != ModeRemote || !s.Exact || s.Source != "remote" || s.Outcomes == nil || s.Outcomes.OK != 1 ||
		s.Remote == nil || len(s.Remote.Engines) != 1 || s.Remote.Engines[0].Completions != "render" {
		t.Errorf("remote model %+v", s)
	}

	// Models whose workers left are forgotten, unless a spec names them;
	// one met again is decided again, and logged at most once a minute
	// (a worker re-registering in a loop brought its model back each time).
	reg.Forget(func(model string) bool { return model == "Org/Elsewhere" })
	if st := reg.Status(); len(st) != 2 || st[0].Model != "Org/Elsewhere" || st[1].Model != "mock" {
		t.Fatalf("after Forget: %+v", st)
	}
	reg.Forget(func(string) bool { return false })
	if st := reg.Status(); len(st) != 1 || st[0].Model != "mock" {
		t.Fatalf("a configured model was forgotten: %+v", st)
	}
	if reg.Renderer("mock") != rd {
		t.Fatal("the configured renderer was rebuilt")
	}
	_ = reg.Renderer("Org/Cached")
	if n := strings.Count(logs.String(), "model=Org/Cached"); n != 1 {
		t.Errorf("a model met again within a minute was logged %d times in all, want once", n)
	}
}

func TestRegistryRefuses(t *testing.T) {
	dir := t.TempDir()
	writeTokenizerDir(t, dir, true)
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	cases := []struct {
		name  string
		specs []string
		opts  Options
		want  error
	}{
		{"a directory without tokenizer.json", []string{"m=" + t.TempDir()}, Options{}, nil},
		{"a cache without the model", []string{"m=hf:Org/Name"}, Options{}, nil},
		{"a tokenizer that does not load", []string{"m=" + dir}, Options{}, nil},
		{"remote without engines", []string{"m=remote"}, Options{}, nil},
		{"a model twice", []string{"m=remote", "m=remote"}, Options{Engines: noEngines{}}, nil},
	}
	for _, tc := range cases {
		cfg := DefaultConfig()
		cfg.Specs = specs(t, tc.specs...)
		_, err := NewRegistry(cfg, tc.opts)
		if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func TestOpen(t *testing.T) {
	e := startMock(t, mocker.Config{})
	rd, err := Open("", "http://"+e.Addr(), DefaultConfig(), 0)
	if err != nil {
		t.Fatal(err)
	}
	body := `{"messages":[{"role":"user","content":"hi"}]}`
	got, err := rd.Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(body), parse(t, openai.APIChatCompletions, body))
	want, _ := mocker.AppendChatTokens(nil, []mocker.ChatMessage{{Role: "user", Content: "hi"}})
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("%v, %v; want %v", got, err, want)
	}
	dir := t.TempDir()
	writeTokenizerDir(t, dir, true)
	if _, err := Open("m", dir, DefaultConfig(), 0); err == nil {
		t.Error("a directory whose tokenizer does not load opened")
	}
	if _, err := Open("m", tinyDir, DefaultConfig(), 0); err != nil {
		t.Errorf("a real tokenizer directory: %v", err)
	}
	for _, src := range []string{"remote", "", t.TempDir(), "hf:a/b/c"} {
		if _, err := Open("m", src, DefaultConfig(), 0); err == nil {
			t.Errorf("%q: opened", src)
		}
	}
}

// TestRegistryClose: closing the registry closes the remote renderers'
// connections to the engines, and a renderer used afterwards dials again.
func TestRegistryClose(t *testing.T) {
	se := startScripted(t)
	se.set(map[string]scripted{pathRenderChat: {status: 200, body: []byte(`{"token_ids":[1]}`)}})
	cfg := DefaultConfig()
	cfg.Specs = specs(t, "m=remote")
	reg, err := NewRegistry(cfg, Options{Engines: FixedEngine(se.addr), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"messages":[{"role":"user","content":"x"}]}`
	call := func() {
		if _, err := reg.Renderer("m").Tokens(context.Background(), nil, openai.APIChatCompletions, []byte(body), parse(t, openai.APIChatCompletions, body)); err != nil {
			t.Fatal(err)
		}
	}
	call()
	if n := se.conns.Load(); n != 1 {
		t.Fatalf("%d connections open, want 1", n)
	}
	reg.Close()
	deadline := time.Now().Add(10 * time.Second)
	for se.conns.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still open after Close", se.conns.Load())
		}
		time.Sleep(time.Millisecond)
	}
	call()
}
