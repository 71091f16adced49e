package prompt

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kvfast/kvfast/internal/logthrottle"
)

// Options are what a Registry needs besides its configuration.
type Options struct {
	// Engines picks the engine a remote renderer asks.
	Engines Engines
	// MaxTokenID is the largest token id a renderer may return; 0 means
	// any uint32.
	MaxTokenID uint32
	Logger     *slog.Logger
}

// Modes, the mode label of kvfast_tokenizer_info and kvfast_tokenize_total.
const (
	ModeBuiltin = "builtin"
	ModeRemote  = "remote"
	ModeNone    = "none" // approximate routing for text and chat prompts
)

// Registry decides, per model, how text and chat prompts become token ids,
// and keeps each model's renderer and its counters.
type Registry struct {
	cfg  Config
	opts Options
	auto bool

	mu     sync.Mutex
	models map[string]*entry
	// throttle keeps a model's "tokenizer found or not" line to one a
	// minute: Forget drops a model whose workers all left, and a worker
	// re-registering in a loop brought it back each time.
	throttle *logthrottle.Throttle
	// budget is every built-in renderer's: the CPU they share is the
	// router's, whichever model a prompt is for.
	budget *builtinBudget
}

// entry is one model's decision.
type entry struct {
	configured bool        // a spec names the model: kept for good (Forget)
	status     ModelStatus // Model, Mode, Source, Reason
	renderer   Renderer    // nil for ModeNone
	remote     *Remote     // the renderer, when it is remote
	builtin    *Builtin    // the renderer, when it is built in
}

// NewRegistry builds every renderer cfg names explicitly, so that a
// misconfigured model (a missing directory, a tokenizer that does not
// load) stops the router at start-up rather than routing approximately
// unnoticed. Models met later (Renderer) get theirs from auto, or none.
func NewRegistry(cfg Config, opts Options) (*Registry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	r := &Registry{cfg: cfg, opts: opts, models: map[string]*entry{}, throttle: logthrottle.New(time.Minute),
		budget: &builtinBudget{limit: cfg.MaxRenderInFlightBytes}}
	for _, s := range cfg.Specs {
		if s.Auto {
			r.auto = true
			continue
		}
		e, err := r.build(s.Model, s.Source)
		if err != nil {
			return nil, err
		}
		e.configured = true
		r.models[s.Model] = e
		r.opts.Logger.Info("tokenizer configured: text and chat requests route on exact token blocks",
			"model", s.Model, "mode", e.status.Mode, "source", e.status.Source)
	}
	return r, nil
}

// build makes model's renderer from src.
func (r *Registry) build(model string, src Source) (*entry, error) {
	if src.Kind == SourceRemote {
		if r.opts.Engines == nil {
			return nil, fmt.Errorf("cannot render %s's prompts remotely: the registry has no engines to ask", model)
		}
		rm := NewRemote(model, r.opts.Engines, RemoteConfig{Timeout: r.cfg.Timeout,
			MaxResponseBytes: r.cfg.MaxResponseBytes, MaxTokenID: r.opts.MaxTokenID, EngineToken: r.cfg.EngineToken})
		return &entry{status: ModelStatus{Model: model, Mode: ModeRemote, Source: src.String(), Exact: true},
			renderer: rm, remote: rm}, nil
	}
	files, err := ResolveFiles(src)
	if err != nil {
		return nil, fmt.Errorf("cannot configure the tokenizer of model %q: %w", model, err)
	}
	b, err := NewBuiltin(model, files, r.cfg)
	if err != nil {
		return nil, err
	}
	b.budget = r.budget
	st := ModelStatus{Model: model, Mode: ModeBuiltin, Source: files.Dir, Exact: true}
	if calls := b.unimplementedCalls(); len(calls) > 0 {
		st.Reason = "the chat template calls " + strings.Join(calls, ", ") +
			", which kvfast does not render: chat requests whose rendering reaches them route approximately"
		r.opts.Logger.Warn("a chat template calls what kvfast does not render: chat requests whose rendering reaches those calls route approximately, the rest exactly",
			"model", model, "calls", strings.Join(calls, ", "), "source", files.Dir)
	}
	return &entry{status: st, renderer: b, builtin: b}, nil
}

// Renderer returns model's renderer, or nil when the model's text and chat
// prompts route approximately. The first call for a model that no spec
// names decides for good: with auto, the model gets the built-in tokenizer
// if its files are in the local Hugging Face cache; otherwise it gets none,
// and the log says so once. The front end calls it whenever the worker set
// changes, never per request.
func (r *Registry) Renderer(model string) Renderer {
	if model == "" {
		return nil // workers that name no model: nothing to look up
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.models[model]; ok {
		return e.renderer
	}
	e := &entry{status: ModelStatus{Model: model, Mode: ModeNone,
		Reason: "no --tokenizer names this model"}}
	if r.auto {
		e.status.Reason = "no --tokenizer names this model, and auto found no tokenizer for it in the Hugging Face cache"
		if files, err := findInHFCache(model, hfCacheRoots()); err == nil {
			if built, err := r.build(model, Source{Kind: SourceDir, Path: files.Dir}); err == nil {
				e = built
			} else {
				e.status.Reason = err.Error()
			}
		}
	}
	r.models[model] = e
	if e.renderer == nil {
		r.throttle.Log(r.opts.Logger, slog.LevelInfo, "none/"+model, "model has no tokenizer: its text and chat requests route approximately (token-id prompts stay exact)",
			"model", model, "reason", e.status.Reason)
	} else {
		r.throttle.Log(r.opts.Logger, slog.LevelInfo, "found/"+model, "tokenizer found: text and chat requests route on exact token blocks",
			"model", model, "mode", e.status.Mode, "source", e.status.Source)
	}
	return e.renderer
}

// Forget drops what Renderer decided for the models that no spec names and
// keep does not hold (the front end keeps the models its workers serve):
// a model met again is decided again. Without it, engines that come and
// go under ever new names would grow the registry, and the label sets of
// the metrics it feeds, for as long as the router runs.
func (r *Registry) Forget(keep func(model string) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for model, e := range r.models {
		if e.configured || keep(model) {
			continue
		}
		if e.remote != nil {
			e.remote.closeIdle()
		}
		delete(r.models, model)
	}
}

// Close closes the remote renderers' idle connections to the engines. The
// renderers keep working (a later call dials again); the node calls it
// when it stops, so that no connection outlives the router.
func (r *Registry) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.models {
		if e.remote != nil {
			e.remote.closeIdle()
		}
	}
}

// ModelStatus is one model's tokenization, as /admin/workers shows it and
// kvfast_tokenizer_info and kvfast_tokenize_total export it.
type ModelStatus struct {
	Model  string `json:"model"`
	Mode   string `json:"mode"`             // ModeBuiltin, ModeRemote or ModeNone
	Source string `json:"source,omitempty"` // the tokenizer's directory, or "remote"
	// Exact is true when text and chat requests route on token blocks.
	Exact bool `json:"exact"`
	// Reason is why not, when not exact, or what a built-in renderer
	// cannot render exactly.
	Reason string `json:"reason,omitempty"`
	// Outcomes counts the renderer's calls (nil without one).
	Outcomes *Outcomes     `json:"outcomes,omitempty"`
	Remote   *RemoteStatus `json:"remote,omitempty"`
	// PrefixCache is the built-in renderer's cache of tokenized prefixes.
	PrefixCache *CacheStats `json:"prefix_cache,omitempty"`
}

// Status reports every model configured or met so far, sorted by name.
func (r *Registry) Status() []ModelStatus {
	r.mu.Lock()
	entries := make([]*entry, 0, len(r.models))
	for _, e := range r.models {
		entries = append(entries, e)
	}
	r.mu.Unlock()
	out := make([]ModelStatus, 0, len(entries))
	for _, e := range entries {
		st := e.status
		if e.remote != nil {
			o := e.remote.outcomes.load()
			rs := e.remote.status()
			st.Outcomes, st.Remote = &o, &rs
		}
		if e.builtin != nil {
			e.builtin.status(&st)
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out
}

// Open builds a renderer from a source as kvfast tokenize names it: the URL
// of an engine (http://host:port), "hf:ORG/NAME" or a directory. model is
// the name the engine serves (it may be empty for engines that serve one).
func Open(model, source string, cfg Config, maxTokenID uint32) (Renderer, error) {
	if addr, ok := engineAddr(source); ok {
		return NewRemote(model, FixedEngine(addr), RemoteConfig{Timeout: cfg.Timeout,
			MaxResponseBytes: cfg.MaxResponseBytes, MaxTokenID: maxTokenID, EngineToken: cfg.EngineToken}), nil
	}
	src, err := ParseSource(source)
	if err != nil {
		return nil, err
	}
	if src.Kind == SourceRemote {
		return nil, errors.New(`cannot ask "remote" without an engine: give the engine's URL, http://host:port`)
	}
	files, err := ResolveFiles(src)
	if err != nil {
		return nil, err
	}
	return NewBuiltin(model, files, cfg)
}
