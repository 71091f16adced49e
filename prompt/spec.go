package prompt

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/kvfast/kvfast/internal/redact"
)

// Config is a router's tokenizer configuration. Start from DefaultConfig;
// a zero field means zero, and Validate refuses the zeros that make no
// sense.
type Config struct {
	// Specs are the --tokenizer values, in the order given.
	Specs []Spec
	// Timeout bounds one remote render or tokenize round trip, connecting
	// included. Past it the request routes approximately.
	Timeout time.Duration
	// MaxResponseBytes bounds an engine's render or tokenize answer. A
	// 128K-token prompt is about 1 MiB of ids; an answer carrying
	// multimodal tensors may be far larger and is refused.
	MaxResponseBytes int
	// PrefixCacheBytes bounds each built-in tokenizer's cache of tokenized
	// prompt prefixes (0: no cache).
	PrefixCacheBytes int64
	// MaxRenderBytes bounds the request body, and the rendered prompt, the
	// built-in path tokenizes; larger requests route approximately.
	MaxRenderBytes int
	// MaxRenderInFlightBytes bounds the request bodies all built-in
	// renderers work on at once; past it a request routes approximately
	// rather than add its rendering to the router's CPU queue (one request
	// at a time is always admitted). See builtinBudget.
	MaxRenderInFlightBytes int64
	// EngineToken is the bearer token remote renderers send the engines
	// (RemoteConfig.EngineToken); "" for none. kvfast serve sets it from
	// --engine-api-key-file.
	EngineToken string
}

// DefaultConfig is no tokenizer (every text and chat request routes
// approximately) with the limits kvfast serve runs with.
func DefaultConfig() Config {
	return Config{Timeout: 200 * time.Millisecond, MaxResponseBytes: 4 << 20, PrefixCacheBytes: 64 << 20,
		// About 256K tokens of text: past the context of the models
		// routed today, and a few milliseconds of tokenizing.
		MaxRenderBytes: 1 << 20,
		// Two of the largest prompts per CPU: a few tenths of a second of
		// work queued per core at worst, which a health check's goroutine
		// waits out well within its timeout.
		MaxRenderInFlightBytes: int64(runtime.GOMAXPROCS(0)) * 2 << 20}
}

// Validate reports the first setting the registry cannot run with.
func (c *Config) Validate() error {
	if c.Timeout <= 0 {
		return fmt.Errorf("cannot use --tokenize-timeout %v: must be positive", c.Timeout)
	}
	if c.MaxResponseBytes <= 0 {
		return fmt.Errorf("cannot use --tokenize-max-response-bytes %d: must be positive", c.MaxResponseBytes)
	}
	if c.MaxRenderBytes <= 0 {
		return fmt.Errorf("cannot use --tokenize-max-bytes %d: must be positive", c.MaxRenderBytes)
	}
	if c.MaxRenderInFlightBytes <= 0 {
		return fmt.Errorf("cannot use --tokenize-inflight-bytes %d: must be positive", c.MaxRenderInFlightBytes)
	}
	if c.PrefixCacheBytes < 0 {
		return fmt.Errorf("cannot use --tokenize-cache-bytes %d: must not be negative (0: no cache)", c.PrefixCacheBytes)
	}
	seen := map[string]bool{}
	for _, s := range c.Specs {
		if s.Auto {
			continue
		}
		if seen[s.Model] {
			return fmt.Errorf("cannot configure model %q's tokenizer twice", s.Model)
		}
		seen[s.Model] = true
	}
	return nil
}

// SourceKind says where a model's token ids come from.
type SourceKind uint8

const (
	// SourceRemote asks an engine serving the model, per request.
	SourceRemote SourceKind = iota + 1
	// SourceDir loads tokenizer.json and tokenizer_config.json from a
	// directory (the built-in path).
	SourceDir
	// SourceHF finds those files in the local Hugging Face cache (the
	// built-in path).
	SourceHF
)

// Source is the right-hand side of a --tokenizer MODEL=SOURCE value.
type Source struct {
	Kind SourceKind
	Path string // SourceDir: the directory; SourceHF: the repository id, ORG/NAME or NAME
}

// String is the source as written on the command line.
func (s Source) String() string {
	switch s.Kind {
	case SourceRemote:
		return "remote"
	case SourceHF:
		return "hf:" + s.Path
	}
	return s.Path
}

// Spec is one --tokenizer value: a model and where its token ids come
// from, or Auto, which gives every served model whose files are in the
// local Hugging Face cache the built-in tokenizer.
type Spec struct {
	Auto   bool
	Model  string
	Source Source
}

// ParseSpec reads the --tokenizer syntax: "MODEL=DIR", "MODEL=hf:ORG/NAME",
// "MODEL=remote" or "auto". The model is everything before the first "=":
// served model names do not contain one. A directory or cache entry is
// checked when the registry is built, not here.
func ParseSpec(v string) (Spec, error) {
	v = strings.TrimSpace(v)
	if v == "auto" {
		return Spec{Auto: true}, nil
	}
	model, src, ok := strings.Cut(v, "=")
	if !ok || model == "" || src == "" {
		return Spec{}, fmt.Errorf("cannot parse tokenizer %q: want MODEL=DIR, MODEL=hf:ORG/NAME, MODEL=remote, MODEL=demo (kvfast serve and mock: the demo tokenizer) or auto", v)
	}
	s, err := ParseSource(src)
	if err != nil {
		return Spec{}, fmt.Errorf("cannot parse tokenizer for model %q: %w", model, err)
	}
	return Spec{Model: model, Source: s}, nil
}

// ParseSource reads the source of a model's token ids: "remote",
// "hf:ORG/NAME" (or "hf:NAME") or a directory.
func ParseSource(v string) (Source, error) {
	switch {
	case v == "remote":
		return Source{Kind: SourceRemote}, nil
	case strings.HasPrefix(v, "hf:"):
		repo := strings.TrimPrefix(v, "hf:")
		org, name, hasOrg := strings.Cut(repo, "/")
		if repo == "" || (hasOrg && (org == "" || name == "" || strings.Contains(name, "/"))) {
			return Source{}, fmt.Errorf("cannot use Hugging Face repository %q: want hf:ORG/NAME or hf:NAME", repo)
		}
		return Source{Kind: SourceHF, Path: repo}, nil
	case v == "":
		return Source{}, errors.New("cannot use an empty tokenizer source")
	case strings.Contains(v, "://"):
		// Not a directory: quoted whole, a URL's credentials would reach
		// the log in the error that no such directory exists.
		return Source{}, fmt.Errorf("cannot use tokenizer source %q: a URL is taken only as an engine's http://host:port, by kvfast tokenize and kvfast mock, "+
			"with no credentials or query (the engines' key goes in --engine-api-key-file)", redact.Endpoint(v))
	}
	return Source{Kind: SourceDir, Path: v}, nil
}

// Files are a model's tokenizer files, as the built-in path loads them.
type Files struct {
	Dir string // the directory holding them (a cache snapshot for hf:)
	// Tokenizer is Dir/tokenizer.json. Config is Dir/tokenizer_config.json,
	// "" when the directory has none (then there is no chat template).
	Tokenizer, Config string
}

// ResolveFiles finds a SourceDir or SourceHF source's files, or says why
// it cannot.
func ResolveFiles(s Source) (Files, error) {
	switch s.Kind {
	case SourceDir:
		return filesIn(s.Path)
	case SourceHF:
		return findInHFCache(s.Path, hfCacheRoots())
	}
	return Files{}, fmt.Errorf("cannot resolve tokenizer files for source %q", s)
}

// filesIn checks dir for tokenizer.json (required) and
// tokenizer_config.json (optional).
func filesIn(dir string) (Files, error) {
	f := Files{Dir: dir, Tokenizer: filepath.Join(dir, "tokenizer.json")}
	if err := regularFile(f.Tokenizer); err != nil {
		return Files{}, fmt.Errorf("cannot use tokenizer directory %s: %w", dir, err)
	}
	if c := filepath.Join(dir, "tokenizer_config.json"); regularFile(c) == nil {
		f.Config = c
	}
	return f, nil
}

func regularFile(path string) error {
	fi, err := os.Stat(path) // follows the cache's symlinks into blobs/
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	return nil
}

// hfCacheRoots lists the Hugging Face hub caches to search, in the order
// huggingface_hub itself picks its cache: HF_HUB_CACHE, then HF_HOME/hub,
// then $XDG_CACHE_HOME/huggingface/hub, then ~/.cache/huggingface/hub.
// Every one that is set is searched, so that a router started with a
// different environment than the engine still finds the engine's files.
func hfCacheRoots() []string {
	var roots []string
	add := func(p string) {
		for _, r := range roots {
			if r == p {
				return
			}
		}
		roots = append(roots, p)
	}
	if v := os.Getenv("HF_HUB_CACHE"); v != "" {
		add(v)
	}
	if v := os.Getenv("HF_HOME"); v != "" {
		add(filepath.Join(v, "hub"))
	}
	if v := os.Getenv("XDG_CACHE_HOME"); v != "" {
		add(filepath.Join(v, "huggingface", "hub"))
	}
	if home, err := os.UserHomeDir(); err == nil {
		add(filepath.Join(home, ".cache", "huggingface", "hub"))
	}
	return roots
}

// findInHFCache finds repo's tokenizer files in the first root that has
// them: the snapshot refs/main names, else the newest snapshot holding a
// tokenizer.json. The hub cache lays a model out as
// models--ORG--NAME/{refs/main, snapshots/<revision>/, blobs/}.
func findInHFCache(repo string, roots []string) (Files, error) {
	entry := "models--" + strings.ReplaceAll(repo, "/", "--")
	for _, root := range roots {
		dir := filepath.Join(root, entry)
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		if rev, err := os.ReadFile(filepath.Join(dir, "refs", "main")); err == nil {
			if f, err := filesIn(filepath.Join(dir, "snapshots", strings.TrimSpace(string(rev)))); err == nil {
				return f, nil
			}
		}
		snaps, err := os.ReadDir(filepath.Join(dir, "snapshots"))
		if err != nil {
			continue
		}
		type snap struct {
			files Files
			mod   time.Time
		}
		var found []snap
		for _, s := range snaps {
			p := filepath.Join(dir, "snapshots", s.Name())
			fi, err := os.Stat(p)
			if err != nil || !fi.IsDir() {
				continue
			}
			if f, err := filesIn(p); err == nil {
				found = append(found, snap{f, fi.ModTime()})
			}
		}
		if len(found) > 0 {
			sort.Slice(found, func(i, j int) bool { return found[i].mod.After(found[j].mod) })
			return found[0].files, nil
		}
	}
	return Files{}, fmt.Errorf("cannot find %s's tokenizer.json in the Hugging Face cache (searched %s)", repo, strings.Join(roots, ", "))
}
