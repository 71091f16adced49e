package fastpath

import (
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
)

// WorkersChanged rebuilds what the request path derives from the worker
// set: the model → namespace-seed table it reads without locks. The node
// calls it after adding or removing workers.
func (s *Server) WorkersChanged() {
	m := map[string]modelNamespace{}
	for w := range s.sched.Workers().All() {
		if info, ok := s.sched.Worker(w); ok {
			m[info.Model] = modelNamespace{name: info.Model, seed: radix.NamespaceSeed(info.Model, "", "")}
		}
	}
	s.seeds.Store(&m)
}

type modelNamespace struct {
	name string
	seed uint64
}

var errUnknownModel = &openai.Error{Status: 404, Type: openai.TypeInvalidRequest, Param: "model", Code: "model_not_found",
	Message: "no worker serves the requested model"}

// namespace resolves the request's model to the name the workers use and to
// the seed of its block hashes. A missing model routes among all workers
// (with the first model's seed only if there is exactly one model).
func (s *Server) namespace(r *openai.ParsedRequest) (model string, seed uint64, _ *openai.Error) {
	seeds := *s.seeds.Load()
	if r.Model == nil {
		if len(seeds) != 1 {
			return "", radix.NamespaceSeed("", "", string(r.CacheSalt)), nil
		}
		for _, ns := range seeds {
			model, seed = ns.name, ns.seed
		}
	} else {
		// The entry carries the name as a string already, so the body's
		// bytes are never converted (which would allocate).
		ns, ok := seeds[string(r.Model)]
		if !ok {
			return "", 0, errUnknownModel
		}
		model, seed = ns.name, ns.seed
	}
	if len(r.CacheSalt) > 0 {
		// Salted requests are rare and get their own namespace; computing
		// it allocates the strings, which is acceptable off the common path.
		seed = radix.NamespaceSeed(model, "", string(r.CacheSalt))
	}
	return model, seed, nil
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
