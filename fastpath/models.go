package fastpath

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/kvfast/kvfast/internal/clock"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/prompt"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
)

// WorkersChanged rebuilds what the request path derives from the worker
// set: the model table it reads without locks, each model with the seed of
// its block hashes and its prompt renderer. The node calls it after adding
// or removing workers.
func (s *Server) WorkersChanged() {
	s.modelsMu.Lock()
	defer s.modelsMu.Unlock()
	s.rebuildModels()
}

// SetModelUnlisted tells the request path which workers' engines do not
// list their worker's model in GET /v1/models: an engine restarted with
// another --served-model-name, or a static worker's model= mistyped. The
// engine refuses that model's requests (vLLM answers 404), so while
// another worker can serve a request, these are not routed it. The node
// calls it after every poll of the engines' models.
func (s *Server) SetModelUnlisted(set workers.Set) { s.unlisted.Store(uint64(set)) }

// SetKeyRefused tells the request path which workers' engines refuse the
// router's own engine key (--engine-api-key-file) with a 401:
// they would refuse every request, so they are avoided as workers whose
// engines do not list their model are, and /ready does not count them.
// The node calls it after every poll of the engines' models.
func (s *Server) SetKeyRefused(set workers.Set) { s.keyRefused.Store(uint64(set)) }

// SetDown tells the request path which registrations the node presumes
// dead (Snapshot.Down). The node calls it whenever that list changes.
func (s *Server) SetDown(down []RegistrationView) {
	ids := make([]uint64, 0, len(down))
	for _, d := range down {
		ids = append(ids, d.WorkerID)
	}
	s.downIDs.Store(&ids)
}

// pinnedDown reports whether a pin to id, a worker the scheduler does not
// know, names an engine presumed dead rather than no engine at all.
func (s *Server) pinnedDown(id uint64) bool {
	if ids := s.downIDs.Load(); ids != nil {
		return slices.Contains(*ids, id)
	}
	return false
}

// avoidUnlisted keeps the request off workers whose engines do not list
// its model or refuse the router's key, unless no other worker could take
// it (the client then hears the engine's refusal) or it pins one.
func (s *Server) avoidUnlisted(req *sched.Request) {
	s.avoid(req, workers.Set(s.unlisted.Load())|workers.Set(s.keyRefused.Load()))
}

// avoidThrottled keeps the request off workers whose engines answered 429
// and asked for a while without requests (dispatch.Pool.Throttled), unless
// no other worker could take it or it pins one: a session's binding too,
// which moves only if its engine answers this request 429 again. Without
// it every request's first attempt would go to an engine shedding load,
// which answers fast and so looks the least loaded, and cost a round
// trip before the retry elsewhere. Only workers that generate are taken
// off: the allow-list also bounds the prefill stage's candidates, and a
// prefill pool taken off whole would turn every request away (SGLang) or
// prefill it locally (vLLM); a prefill engine's or an encoder's 429 is
// retried by its own stage.
func (s *Server) avoidThrottled(req *sched.Request) {
	if t := s.engines.Throttled(); t != 0 {
		s.avoid(req, t&s.sched.StageWorkers(s.generatingStage()))
	}
}

// avoid takes bad off req's allow-list when another worker could still
// generate it and req pins none.
func (s *Server) avoid(req *sched.Request, bad workers.Set) {
	if bad == 0 || req.Pinned {
		return
	}
	// Another worker must be able to generate it: disaggregated, a
	// prefill worker is no alternative to a decode worker.
	q := *req
	q.Stage = s.generatingStage()
	if s.sched.Eligible(&q, bad) == 0 {
		return
	}
	if !req.AllowListed {
		req.AllowListed, req.Allow = true, workers.AllSlots
	}
	req.Allow &^= bad
}

// Adapter is a LoRA adapter the engines list: its base model (the
// parent an engine's GET /v1/models gives it), the workers whose
// engines list it, and those of them that read SGLang's spellings.
type Adapter struct {
	Base    string
	Workers workers.Set
	// SGLang is the workers of Workers whose engines may take the adapter
	// in SGLang's spellings, lora_path beside the base model or
	// "base:adapter": those not known to ignore them (openai.
	// ReadsAdapterSpellings). vLLM (and the mock) ignore lora_path,
	// answering from the base model, and refuse "base:adapter" with 404.
	SGLang workers.Set
}

// SetAdapters tells the request path which model names are LoRA adapters.
// A request naming an adapter routes among the workers that list it (an
// engine without the adapter refuses the request: vLLM answers 404), in
// the adapter's namespace NamespaceSeed(base, adapter, salt), where the
// feed puts the blocks an engine reports under that lora_name. An adapter
// whose base model no worker serves is ignored; one that names a served
// base model stays the base model. The node calls it when the adapters
// its engines list change.
func (s *Server) SetAdapters(adapters map[string]Adapter) {
	s.modelsMu.Lock()
	defer s.modelsMu.Unlock()
	s.adapters = adapters
	s.rebuildModels()
}

func (s *Server) rebuildModels() {
	m := map[string]modelNamespace{}
	pending := false
	for w := range s.sched.Workers().All() {
		if info, ok := s.sched.Worker(w); ok {
			if info.Model == "" {
				// A static worker whose engine has not told its model yet
				// (GET /v1/models): no model to list or look up.
				pending = true
				continue
			}
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
	if s.renderers != nil {
		s.renderers.Forget(func(model string) bool { _, served := m[model]; return served })
	}
	for adapter, a := range s.adapters {
		ns, served := m[a.Base]
		if _, clash := m[adapter]; !served || clash || ns.lora != "" || a.Workers == 0 {
			continue
		}
		ns.lora, ns.seed, ns.only, ns.sglang = adapter, radix.NamespaceSeed(a.Base, adapter, ""), a.Workers, a.Workers&a.SGLang
		m[adapter] = ns
	}
	for adapter, a := range s.adapters {
		// SGLang also takes an adapter as "base:adapter" in model (it
		// lists the adapter by its own name, its base as parent). The
		// body goes on as the client wrote it, so such a request reaches
		// the adapter's workers that read the spelling (Adapter.SGLang),
		// in the same namespace as one naming the adapter alone; GET
		// /v1/models lists only the adapter's name. Without such a worker
		// the name is unknown (vLLM answers such a model with 404 too). A
		// model or adapter really named so keeps its name: the aliases
		// come after every real name.
		ns, listed := m[adapter]
		alias := a.Base + ":" + adapter
		if _, taken := m[alias]; listed && ns.lora == adapter && ns.sglang != 0 && !taken {
			ns.alias, ns.only = true, ns.sglang
			m[alias] = ns
		}
	}
	now := clock.Now()
	gone := map[string]departure{}
	if old := s.departed.Load(); old != nil {
		maps.Copy(gone, *old)
	}
	if old := s.seeds.Load(); old != nil {
		for name, ns := range *old {
			if _, still := m[name]; !still {
				gone[name] = departure{adapterOf: ns.name, lora: ns.lora != "", workers: ns.only}
			}
		}
	}
	for name, d := range gone {
		// An adapter's engines are back when a worker that listed it
		// serves its base model again: the slot's engine restarted, or
		// the adapter was unloaded from it. Another engine serving the
		// base model says nothing of the adapter's.
		baseServed := d.lora && s.sched.ModelWorkers(d.adapterOf)&d.workers != 0
		switch {
		case m[name].name != "":
			delete(gone, name) // served again
		case d.lora && baseServed && d.baseBack == 0:
			d.baseBack = now
			gone[name] = d
		case d.lora && baseServed && !d.unavailable(now):
			delete(gone, name) // unloaded for good: a 404 like any unknown name
		case d.lora && !baseServed:
			d.baseBack = 0
			gone[name] = d
		}
	}
	if len(gone) > maxDeparted {
		// Models come and go only with the operator's engines; this is a
		// bound against a deployment that churns adapters for months.
		for name := range gone {
			delete(gone, name)
			if len(gone) <= maxDeparted {
				break
			}
		}
	}
	s.seeds.Store(&m)
	s.departed.Store(&gone)
	s.modelsPending.Store(pending)
}

// RememberModels tells the request path of models that engines served
// before this router started (the segment's registry keeps the model of a
// slot whose engine closed or went down): a request naming one while its
// engines are away gets 503 model_unavailable, which clients retry, as it
// would had this router seen them leave, not a 404. Names served now, and
// any beyond maxDeparted, are ignored.
func (s *Server) RememberModels(names []string) {
	s.modelsMu.Lock()
	defer s.modelsMu.Unlock()
	gone := map[string]departure{}
	if old := s.departed.Load(); old != nil {
		maps.Copy(gone, *old)
	}
	served := *s.seeds.Load()
	for _, name := range names {
		if _, ok := served[name]; !ok && name != "" && len(gone) < maxDeparted {
			gone[name] = departure{}
		}
	}
	s.departed.Store(&gone)
}

// departure is a model no worker serves any more. A LoRA adapter departs
// with its engines (restarting: 503, retry) or alone, unloaded from
// engines that still serve its base model: then it is gone for good, a
// 404 as GET /v1/models/{id} says, once the workers that listed it have
// served its base model for adapterReturnGrace without it, time for their
// adapters to be polled again. Kept a 503 for the router's life, a client
// retried it for ever.
type departure struct {
	adapterOf string // the base model of an adapter (lora), or the model itself
	lora      bool
	workers   workers.Set // the workers that listed the adapter
	baseBack  int64       // clock reading when one of them served the base model again; 0 while none does
}

// adapterReturnGrace is how long a departed adapter stays a 503 after its
// base model is served again: a few adapter polls (node's adapterPoll, 2
// s), for a restarted engine to list the adapters it loaded.
const adapterReturnGrace = 10 * time.Second

// unavailable reports whether a request naming a departed model gets 503
// (its engines may come back) rather than 404, at now.
func (d departure) unavailable(now int64) bool {
	return !d.lora || d.baseBack == 0 || time.Duration(now-d.baseBack) < adapterReturnGrace
}

// modelsUnknown reports whether some worker's model is still to be learned
// (Deps.ModelsPending).
func (s *Server) modelsUnknown() bool {
	if s.pendingModels != nil {
		return s.pendingModels()
	}
	return s.modelsPending.Load()
}

// maxDeparted bounds the models remembered as once served.
const maxDeparted = 4096

type modelNamespace struct {
	name string // the base model's, which its workers register with
	lora string // the LoRA adapter a request names, "" for the base model
	// only, for an adapter, is the workers whose engines list it; a base
	// model's requests go to any worker serving it (0).
	only workers.Set
	// sglang, for an adapter, is the workers of only whose engines may
	// read its SGLang spellings (Adapter.SGLang).
	sglang workers.Set
	seed   uint64
	render prompt.Renderer // nil: text and chat prompts route approximately
	// alias marks an adapter's "base:adapter" spelling (SGLang's), which
	// GET /v1/models does not list.
	alias bool
}

var (
	errUnknownModel = &openai.Error{Status: 404, Type: openai.TypeInvalidRequest, Param: "model", Code: "model_not_found",
		Message: "no worker serves the requested model: GET /v1/models lists the models served (names are case-sensitive)"}
	errNoEnginesYet = &openai.Error{Status: 503, Type: openai.TypeServerError, Param: "model", Code: "model_unavailable",
		Message: "no engine has registered with the router yet (still starting, or refused: the router's log and refused_registrations in /admin/workers say why), so no model is known; retry later"}
	errModelUnavailable = &openai.Error{Status: 503, Type: openai.TypeServerError, Param: "model", Code: "model_unavailable",
		Message: "every worker that served the requested model is down; retry later"}
	// errAdapterUnlisted is an adapter whose engines serve its base model
	// again without listing it: restarted and not yet listing it, or the
	// adapter was unloaded (a 404 once adapterReturnGrace has passed).
	errAdapterUnlisted = &openai.Error{Status: 503, Type: openai.TypeServerError, Param: "model", Code: "model_unavailable",
		Message: "the engines that served this LoRA adapter no longer list it: restarted (they may list it again within seconds) or the adapter was unloaded; retry later"}
	errModelRequired = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: "model", Code: "model_required",
		Message: "the router serves several models: name one in model (GET /v1/models lists them)"}
	errModelsPending = &openai.Error{Status: 503, Type: openai.TypeServerError, Param: "model", Code: "model_unavailable",
		Message: "no worker is known to serve the requested model, and some workers' models are not known yet: their engines have not answered GET /v1/models (down, or refusing the router's key: see the router's log)"}
)

// namespace resolves the request's model to the name the workers use (an
// adapter's base model), the seed of its block hashes (in the namespace of
// the adapter it names and of its cache_salt), its prompt renderer and,
// for an adapter, the workers that list it (0: no restriction). A
// missing model is the one base model served; with several it is
// refused (each engine would answer with its own, whichever the request
// reached), and with none yet it routes among all. A model no worker
// serves waits, while the node is still starting, for its discovery to
// settle (see awaitSettled).
func (s *Server) namespace(ctx context.Context, r *openai.ParsedRequest) (model string, seed uint64, render prompt.Renderer, only workers.Set, _ *openai.Error) {
	seeds := *s.seeds.Load()
	var lora string
	if len(r.Model) == 0 {
		// No model, or "" (which vLLM serves as its default model).
		// Adapters are not models of their own here: only the base
		// models count.
		bases := 0
		for _, ns := range seeds {
			if ns.lora == "" {
				bases++
				model, seed, render = ns.name, ns.seed, ns.render
			}
		}
		switch {
		case bases > 1:
			return "", 0, nil, 0, errModelRequired
		case bases == 0:
			return "", radix.NamespaceSeed("", "", string(r.CacheSalt)), nil, 0, nil
		}
	} else {
		// The entry carries the name as a string already, so the body's
		// bytes are never converted (which would allocate).
		ns, ok := seeds[string(r.Model)]
		if !ok && s.sched.Serves(r.Model) {
			// A worker joined and is routable, but the node has not yet
			// told the request path (WorkersChanged follows its scan):
			// rebuild now rather than answer 404 for a served model. Only
			// a served model gets here, so a client naming unknown models
			// cannot make the router rebuild.
			s.WorkersChanged()
			ns, ok = (*s.seeds.Load())[string(r.Model)]
		}
		if !ok && s.awaitSettled(ctx) {
			ns, ok = (*s.seeds.Load())[string(r.Model)]
		}
		if !ok && s.refreshWorthy(r.Model) && s.refresh(ctx) {
			// Perhaps an adapter loaded since the engines were last asked.
			ns, ok = (*s.seeds.Load())[string(r.Model)]
		}
		if !ok {
			if d := s.departed.Load(); d != nil {
				if dep, was := (*d)[string(r.Model)]; was && dep.unavailable(clock.Now()) {
					if dep.lora && dep.baseBack != 0 {
						return "", 0, nil, 0, errAdapterUnlisted
					}
					return "", 0, nil, 0, errModelUnavailable
				}
			}
			if s.modelsUnknown() {
				// It may be the model of a worker not heard from yet (an
				// engine still loading, or down): the router cannot tell
				// a client's mistake from it.
				return "", 0, nil, 0, errModelsPending
			}
			if len(*s.seeds.Load()) == 0 && (s.departed.Load() == nil || len(*s.departed.Load()) == 0) {
				// No model ever known, in this process or in the
				// segment's registry (RememberModels): the router started
				// before its engines, which clients should wait for
				// rather than take a 404 they do not retry.
				return "", 0, nil, 0, errNoEnginesYet
			}
			return "", 0, nil, 0, errUnknownModel
		}
		model, seed, render, lora, only = ns.name, ns.seed, ns.render, ns.lora, ns.only
	}
	if lora == "" && len(r.LoRAPath) > 0 {
		// SGLang's lora_path asks the base model for an adapter: route
		// as a request naming it would, among the engines listing it that
		// may read the field. vLLM ignores it and answers from the base
		// model, so where no such engine lists the adapter the request is
		// the base model's (crediting the adapter's blocks would claim a
		// cache the engine does not use). One no engine lists is the
		// engine's to refuse.
		if a, ok := (*s.seeds.Load())[string(r.LoRAPath)]; ok && a.lora != "" && !a.alias && a.name == model && a.sglang != 0 {
			seed, lora, only = a.seed, a.lora, a.sglang
		}
	}
	if len(r.CacheSalt) > 0 {
		// Salted requests are rare and get their own namespace; computing
		// it allocates the strings, which is acceptable off the common path.
		seed = radix.NamespaceSeed(model, lora, string(r.CacheSalt))
	}
	return model, seed, render, only, nil
}

// refreshWorthy reports whether a request naming model, which no worker
// is known to serve, should have the engines asked again before it is
// answered: a name an adapter could have, not one of a model known to
// have left (answered at once as such).
func (s *Server) refreshWorthy(model []byte) bool {
	if s.refreshModels == nil || len(model) > shm.MaxModelLen {
		return false
	}
	if d := s.departed.Load(); d != nil {
		if _, gone := (*d)[string(model)]; gone {
			return false
		}
	}
	return true
}

// refresh waits for the engines to be asked for their models again
// (Deps.RefreshModels), unless maxRefreshWaiters requests wait already:
// then the request is answered at once, and a flood of unknown names
// holds no more than that many requests.
func (s *Server) refresh(ctx context.Context) bool {
	defer s.refreshWaiters.Add(-1)
	if s.refreshWaiters.Add(1) > maxRefreshWaiters {
		return false
	}
	return s.refreshModels(ctx)
}

// maxRefreshWaiters bounds the requests waiting at once for a model poll.
const maxRefreshWaiters = 64

// doneContext is a context already done: Deps.RefreshModels given it
// brings the next poll forward without waiting for it.
var doneContext = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// isSettled reports whether the node's start-up has settled (Deps.Settled).
func (s *Server) isSettled() bool {
	if s.settled == nil {
		return true
	}
	select {
	case <-s.settled:
		return true
	default:
		return false
	}
}

// awaitSettled holds a request that names a model no worker serves while
// the node is still discovering its workers: an engine that already
// answers its health check may not be routable for a moment yet, and a
// 404 then would be wrong. It waits at most the queue timeout, and not
// past the request's context, and reports whether the node settled
// meanwhile (so that the model is worth looking up again).
func (s *Server) awaitSettled(ctx context.Context) bool {
	if s.isSettled() {
		return false
	}
	t := time.NewTimer(s.cfg.QueueTimeout)
	defer t.Stop()
	select {
	case <-s.settled:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// routable is the healthy workers that can answer a request whole: those
// that generate (never an encoder; under disaggregation, those that can
// decode), and under SGLang's protocol, where a decode engine cannot
// compute a prompt, decode engines only while a prefill engine is healthy
// too (an aggregated engine, role both, is no prefill there).
// /ready and kvfast_routable_workers count them: workers healthy in a
// role that serves no request alone (an encoder, a prefill engine) left
// the router ready while every request was refused. An engine that
// refuses the router's key answers its health check (neither vLLM nor
// SGLang keeps /health behind it) and nothing else, so it does not count.
func (s *Server) routable() workers.Set {
	healthy := s.eligible() &^ workers.Set(s.keyRefused.Load())
	gen := healthy & s.sched.StageWorkers(s.generatingStage())
	if s.cfg.Disagg.Protocol == DisaggSGLang && healthy&s.prefillPool() == 0 {
		gen &^= s.sched.RoleWorkers(workers.RoleDecode)
	}
	return gen
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
