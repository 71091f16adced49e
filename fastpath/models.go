package fastpath

import (
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/prompt"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
)

// WorkersChanged rebuilds what the request path derives from the worker
// set: the model table it reads without locks, each model with the seed of
// its block hashes and its prompt renderer. The node calls it after adding
// or removing workers.
func (s *Server) WorkersChanged() {
	m := map[string]modelNamespace{}
	for w := range s.sched.Workers().All() {
		if info, ok := s.sched.Worker(w); ok {
			if _, seen := m[info.Model]; seen {
				continue
			}
			ns := modelNamespace{name: info.Model, seed: radix.NamespaceSeed(info.Model, "", "")}
			if s.renderers != nil {
				ns.render = s.renderers.Renderer(info.Model)
			}
			m[info.Model] = ns
		}
	}
	s.seeds.Store(&m)
}

type modelNamespace struct {
	name   string
	seed   uint64
	render prompt.Renderer // nil: text and chat prompts route approximately
}

var errUnknownModel = &openai.Error{Status: 404, Type: openai.TypeInvalidRequest, Param: "model", Code: "model_not_found",
	Message: "no worker serves the requested model"}

// namespace resolves the request's model to the name the workers use, the
// seed of its block hashes and its prompt renderer. A missing model routes
// among all workers (with the first model's seed and renderer only if
// there is exactly one model).
func (s *Server) namespace(r *openai.ParsedRequest) (model string, seed uint64, render prompt.Renderer, _ *openai.Error) {
	seeds := *s.seeds.Load()
	if r.Model == nil {
		if len(seeds) != 1 {
			return "", radix.NamespaceSeed("", "", string(r.CacheSalt)), nil, nil
		}
		for _, ns := range seeds {
			model, seed, render = ns.name, ns.seed, ns.render
		}
	} else {
		// The entry carries the name as a string already, so the body's
		// bytes are never converted (which would allocate).
		ns, ok := seeds[string(r.Model)]
		if !ok {
			return "", 0, nil, errUnknownModel
		}
		model, seed, render = ns.name, ns.seed, ns.render
	}
	if len(r.CacheSalt) > 0 {
		// Salted requests are rare and get their own namespace; computing
		// it allocates the strings, which is acceptable off the common path.
		seed = radix.NamespaceSeed(model, "", string(r.CacheSalt))
	}
	return model, seed, render, nil
}

// eligible is the set of workers selection may use right now.
func (s *Server) eligible() workers.Set {
	var set workers.Set
	for w := range s.sched.Workers().All() {
		if s.sched.Load(w).Healthy {
			set |= workers.SetOf(w)
		}
	}
	return set
}
