package prompt

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseSpec(t *testing.T) {
	good := []struct {
		in   string
		want Spec
	}{
		{"auto", Spec{Auto: true}},
		{" auto ", Spec{Auto: true}},
		{"Qwen/Qwen3-8B=remote", Spec{Model: "Qwen/Qwen3-8B", Source: Source{Kind: SourceRemote}}},
		{"m=hf:Qwen/Qwen3-8B", Spec{Model: "m", Source: Source{Kind: SourceHF, Path: "Qwen/Qwen3-8B"}}},
		{"m=hf:gpt2", Spec{Model: "m", Source: Source{Kind: SourceHF, Path: "gpt2"}}},
		{"m=/models/qwen", Spec{Model: "m", Source: Source{Kind: SourceDir, Path: "/models/qwen"}}},
		{"m=./a=b", Spec{Model: "m", Source: Source{Kind: SourceDir, Path: "./a=b"}}},
	}
	for _, tc := range good {
		got, err := ParseSpec(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseSpec(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "remote", "=remote", "m=", "m=hf:", "m=hf:/x", "m=hf:org/", "m=hf:a/b/c", "/models/qwen"} {
		if s, err := ParseSpec(in); err == nil {
			t.Errorf("ParseSpec(%q) = %+v, want an error", in, s)
		}
	}
	// A URL is no directory: refused, its credentials unquoted (a review
	// saw them in the error that no such directory exists).
	for _, in := range []string{"m=http://u:HUNTER2@127.0.0.1:8000", "m=https://u:HUNTER2@h:1", "m=http://u:HUNTER2?x@h:1"} {
		if s, err := ParseSpec(in); err == nil || strings.Contains(err.Error(), "HUNTER2") || !strings.Contains(err.Error(), "URL") {
			t.Errorf("ParseSpec(%q) = %+v, %v; want an error naming no secret", in, s, err)
		}
	}
	for _, src := range []string{"http://u:HUNTER2@127.0.0.1:8000", "http://127.0.0.1:8000/?token=HUNTER2", "https://u:HUNTER2@h:1"} {
		if r, err := Open("m", src, DefaultConfig(), 0); err == nil || strings.Contains(err.Error(), "HUNTER2") {
			t.Errorf("Open(%q) = %v, %v; want an error naming no secret", src, r, err)
		}
	}
	if got := (Source{Kind: SourceHF, Path: "a/b"}).String(); got != "hf:a/b" {
		t.Errorf("String = %q", got)
	}
}

func TestConfigValidate(t *testing.T) {
	cfg := DefaultConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the default config: %v", err)
	}
	for name, mod := range map[string]func(*Config){
		"zero timeout":   func(c *Config) { c.Timeout = 0 },
		"zero max bytes": func(c *Config) { c.MaxResponseBytes = 0 },
		"a model twice": func(c *Config) {
			c.Specs = []Spec{{Model: "m", Source: Source{Kind: SourceRemote}}, {Auto: true}, {Model: "m", Source: Source{Kind: SourceDir, Path: "d"}}}
		},
	} {
		c := DefaultConfig()
		mod(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	c := DefaultConfig()
	c.Specs = []Spec{{Auto: true}, {Auto: true}, {Model: "m", Source: Source{Kind: SourceRemote}}}
	if err := c.Validate(); err != nil {
		t.Errorf("auto twice: %v", err)
	}
}

// writeTokenizerDir makes dir hold tokenizer.json and, if withConfig,
// tokenizer_config.json.
func writeTokenizerDir(t *testing.T, dir string, withConfig bool) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(`{"model":{}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if withConfig {
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{}`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestResolveFilesDir(t *testing.T) {
	dir := t.TempDir()
	if _, err := ResolveFiles(Source{Kind: SourceDir, Path: dir}); err == nil {
		t.Fatal("a directory without tokenizer.json resolved")
	}
	writeTokenizerDir(t, dir, false)
	f, err := ResolveFiles(Source{Kind: SourceDir, Path: dir})
	if err != nil || f.Dir != dir || f.Tokenizer != filepath.Join(dir, "tokenizer.json") || f.Config != "" {
		t.Fatalf("got %+v, %v", f, err)
	}
	writeTokenizerDir(t, dir, true)
	if f, err = ResolveFiles(Source{Kind: SourceDir, Path: dir}); err != nil || f.Config != filepath.Join(dir, "tokenizer_config.json") {
		t.Fatalf("got %+v, %v", f, err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub", "tokenizer.json"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := ResolveFiles(Source{Kind: SourceDir, Path: filepath.Join(dir, "sub")}); err == nil {
		t.Fatal("a directory named tokenizer.json resolved")
	}
}

// TestFindInHFCache lays out a hub cache as huggingface_hub does
// (models--ORG--NAME/{refs/main, snapshots/REV/, blobs/} with symlinks
// into blobs) and checks which snapshot is picked.
func TestFindInHFCache(t *testing.T) {
	root := t.TempDir()
	model := filepath.Join(root, "models--Org--Name")
	snap := func(rev string, mod time.Time) string {
		d := filepath.Join(model, "snapshots", rev)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		// tokenizer.json is a symlink into blobs/, as in a real cache.
		blobs := filepath.Join(model, "blobs")
		if err := os.MkdirAll(blobs, 0o755); err != nil {
			t.Fatal(err)
		}
		blob := filepath.Join(blobs, rev)
		if err := os.WriteFile(blob, []byte(`{}`), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(blob, filepath.Join(d, "tokenizer.json")); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(d, mod, mod); err != nil {
			t.Fatal(err)
		}
		return d
	}
	if _, err := findInHFCache("Org/Name", []string{root}); err == nil {
		t.Fatal("found a model the cache does not hold")
	}
	now := time.Now()
	old := snap("aaa", now.Add(-time.Hour))
	newer := snap("bbb", now)
	// An empty snapshot (a download in progress) is passed over.
	if err := os.MkdirAll(filepath.Join(model, "snapshots", "ccc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if f, err := findInHFCache("Org/Name", []string{filepath.Join(root, "elsewhere"), root}); err != nil || f.Dir != newer {
		t.Fatalf("without refs/main: got %+v, %v; want the newest snapshot %s", f, err, newer)
	}
	if err := os.MkdirAll(filepath.Join(model, "refs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(model, "refs", "main"), []byte("aaa\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if f, err := findInHFCache("Org/Name", []string{root}); err != nil || f.Dir != old {
		t.Fatalf("with refs/main: got %+v, %v; want %s", f, err, old)
	}
	// refs/main naming a snapshot without the files falls back to the newest.
	if err := os.WriteFile(filepath.Join(model, "refs", "main"), []byte("ccc"), 0o644); err != nil {
		t.Fatal(err)
	}
	if f, err := findInHFCache("Org/Name", []string{root}); err != nil || f.Dir != newer {
		t.Fatalf("with refs/main on an empty snapshot: got %+v, %v; want %s", f, err, newer)
	}
	// A name without an organisation.
	writeTokenizerDir(t, filepath.Join(root, "models--gpt2", "snapshots", "r"), true)
	if f, err := findInHFCache("gpt2", []string{root}); err != nil || !strings.HasSuffix(f.Dir, "r") || f.Config == "" {
		t.Fatalf("gpt2: got %+v, %v", f, err)
	}
}

func TestHFCacheRoots(t *testing.T) {
	t.Setenv("HF_HUB_CACHE", "/a/hub")
	t.Setenv("HF_HOME", "/b")
	t.Setenv("XDG_CACHE_HOME", "/c")
	t.Setenv("HOME", "/d")
	got := strings.Join(hfCacheRoots(), " ")
	if want := "/a/hub /b/hub /c/huggingface/hub /d/.cache/huggingface/hub"; got != want {
		t.Fatalf("roots %q, want %q", got, want)
	}
	t.Setenv("HF_HUB_CACHE", "")
	t.Setenv("HF_HOME", "/d/.cache/huggingface")
	t.Setenv("XDG_CACHE_HOME", "")
	if got, want := strings.Join(hfCacheRoots(), " "), "/d/.cache/huggingface/hub"; got != want {
		t.Fatalf("roots %q, want %q (once)", got, want)
	}
	// ResolveFiles searches them.
	root := t.TempDir()
	writeTokenizerDir(t, filepath.Join(root, "models--o--n", "snapshots", "r"), false)
	t.Setenv("HF_HUB_CACHE", root)
	if _, err := ResolveFiles(Source{Kind: SourceHF, Path: "o/n"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ResolveFiles(Source{Kind: SourceRemote}); err == nil {
		t.Fatalf("resolving a remote source: %v", err)
	}
}
