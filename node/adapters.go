package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/kvfast/kvfast/dispatch"
	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
)

// adapterPoll is how often the node asks every engine which LoRA adapters
// it serves. Adapters are loaded at engine start or, rarely, at run time
// (vLLM's /v1/load_lora_adapter): a request naming a model the router
// does not know brings the next poll forward (Node.RefreshModels), and so
// does an engine's 404 to an adapter it listed, whose request then goes to
// another engine listing it.
const adapterPoll = 2 * time.Second

// adapterPoller learns from each engine's GET /v1/models the LoRA
// adapters it serves, and the model of a static worker configured without
// one, and hands them to the scheduler and the front end. Only its own
// goroutine touches it.
type adapterPoller struct {
	client *http.Client
	token  string                         // the engines' bearer token (dispatch.Config.EngineToken); "" for none
	known  [workers.Max]map[string]string // adapter -> base model, by slot
	// of is the registration each slot's known list came from: an engine
	// that takes the slot over (another endpoint, or a restart, which
	// bumps the generation) starts with no adapters until it lists its
	// own, even when it does not answer.
	of [workers.Max]sched.WorkerInfo
	// sglang is the slots whose engines may read SGLang's spellings of an
	// adapter (engineModels.sglang), as they answered last.
	sglang workers.Set
	pushed map[string]fastpath.Adapter
}

func newAdapterPoller(token string) *adapterPoller {
	return &adapterPoller{client: dispatch.EngineHTTPClient(2 * time.Second), token: token}
}

// poll refreshes every worker's adapters and tells the front end when
// the union changed. An engine that does not answer keeps what it listed
// last; a worker that left, or whose slot another engine took, loses its
// entry. A static worker whose model is
// still unknown takes the first base model its engine lists. poll reports
// whether every static worker's model is known.
func (p *adapterPoller) poll(ctx context.Context, n *Node) (discovered bool) {
	live := n.sched.Workers()
	union := map[string]fastpath.Adapter{}
	learned := false
	var unlisted, keyRefused workers.Set
	// The engines are asked at once: a request naming an unknown model
	// waits for the whole poll (RefreshModels), and one slow engine
	// must not make it wait for every other one's answer too.
	var infos [workers.Max]sched.WorkerInfo
	var answers [workers.Max]struct {
		got engineModels
		err error
	}
	var fetched sync.WaitGroup
	var asked workers.Set
	for i := range workers.Max {
		slot := workers.Slot(i)
		info, ok := n.sched.Worker(slot)
		if !live.Has(slot) || !ok {
			p.known[slot], p.of[slot] = nil, sched.WorkerInfo{}
			p.sglang &^= workers.SetOf(slot)
			continue
		}
		if !sameEngine(info, p.of[slot]) {
			p.known[slot], p.of[slot] = nil, info
			p.sglang &^= workers.SetOf(slot)
		}
		infos[slot], asked = info, asked|workers.SetOf(slot)
		fetched.Go(func() { answers[slot].got, answers[slot].err = p.fetch(ctx, info.Endpoint, info.Model) })
	}
	fetched.Wait()
	for slot := range asked.All() {
		info := infos[slot]
		unknown := workers.Set(n.unknownModel.Load()).Has(slot)
		got, err := answers[slot].got, answers[slot].err
		base := got.base
		if err == nil {
			p.sglang &^= workers.SetOf(slot)
			if got.sglang {
				p.sglang |= workers.SetOf(slot)
			}
		}
		if got.dropped > 0 {
			// Their requests get 404 from the router: say why.
			n.throttle.Log(n.log, slog.LevelWarn, "adapters-dropped/"+strconv.Itoa(int(slot)),
				"an engine lists LoRA adapters the router does not route: names over 192 bytes or with control characters, or beyond 1024 per engine; requests naming them get 404",
				"slot", slot, "worker", info.ID, "endpoint", info.Endpoint, "dropped", got.dropped)
		}
		switch {
		case errors.Is(err, errEngineAuth):
			// It will refuse the requests routed to it too.
			n.throttle.Log(n.log, slog.LevelWarn, "auth/"+strconv.Itoa(int(slot)),
				"an engine refuses the router's credentials: give kvfast serve --engine-api-key-file holding the key the engine was started with (none is given, or another)",
				"slot", slot, "worker", info.ID, "endpoint", info.Endpoint, "err", err)
			if p.token != "" && errors.Is(err, errKeyRefused) {
				// Without a key of the router's own, clients' keys are
				// forwarded as they came, and the engine may take theirs.
				// A 403 may be a proxy's rule for this one path (vLLM and
				// SGLang refuse a key with 401): only logged.
				keyRefused |= workers.SetOf(slot)
			}
		case err != nil:
			n.log.Debug("cannot learn an engine's models", "slot", slot, "endpoint", info.Endpoint, "err", err)
			unlisted |= workers.Set(n.unlisted.Load()) & workers.SetOf(slot)     // as it listed last
			keyRefused |= workers.Set(n.keyRefused.Load()) & workers.SetOf(slot) // as it answered last
		case !unknown && base != "" && !got.listed:
			// A typo in a static worker's model= (or an engine started
			// with another --served-model-name): every request the router
			// sends there is refused by the engine, and the model seeds
			// the block hashes, so its events would never match either.
			n.throttle.Log(n.log, slog.LevelWarn, "model/"+strconv.Itoa(int(slot)),
				"a worker's model is not one its engine lists in /v1/models: the engine refuses the model's requests, which go to other workers while one serves it",
				"slot", slot, "worker", info.ID, "endpoint", info.Endpoint, "model", info.Model, "engine_model", base)
			p.known[slot] = got.adapters
			unlisted |= workers.SetOf(slot)
		case unknown && base != "":
			if err := n.learnModel(info, base); err != nil {
				n.throttle.Log(n.log, slog.LevelError, "learn/"+strconv.Itoa(int(slot)),
					"cannot route to a static worker under the model its engine serves", "slot", slot,
					"worker", info.ID, "endpoint", info.Endpoint, "model", base, "err", err)
				break
			}
			learned = true
			p.known[slot] = got.adapters
		default:
			p.known[slot] = got.adapters
		}
		for adapter, base := range p.known[slot] {
			if checkModelName(adapter) != nil { // a name no client could send is not listed
				continue
			}
			a := union[adapter]
			if a.Base != "" && a.Base != base {
				// Engines disagree on the adapter's base model: the
				// first slot's stands, the others do not serve it here.
				continue
			}
			a.Base, a.Workers = base, a.Workers|workers.SetOf(slot)
			a.SGLang |= p.sglang & workers.SetOf(slot)
			union[adapter] = a
		}
	}
	if learned {
		n.front.WorkersChanged()
	}
	n.unlisted.Store(uint64(unlisted))
	n.front.SetModelUnlisted(unlisted)
	n.front.SetKeyRefused(keyRefused) // first: /admin/workers showing it means /ready counts it
	n.keyRefused.Store(uint64(keyRefused))
	n.sglang.Store(uint64(p.sglang))
	if !maps.Equal(union, p.pushed) {
		p.pushed = union
		n.adapters.Store(&union)
		n.front.SetAdapters(union)
	}
	return n.unknownModel.Load() == 0
}

// sameEngine reports whether two registrations of a slot are one engine.
// A static worker's learned model changes its info, not its engine.
func sameEngine(a, b sched.WorkerInfo) bool {
	return a.ID == b.ID && a.DPRank == b.DPRank && a.Endpoint == b.Endpoint && a.Generation == b.Generation
}

// learnModel routes the static worker info under the model its engine
// serves.
func (n *Node) learnModel(info sched.WorkerInfo, model string) error {
	if err := checkModelName(model); err != nil {
		return err
	}
	info.Model = model
	if err := n.sched.Upsert(info); err != nil {
		return err
	}
	n.unknownModel.And(^uint64(workers.SetOf(info.Slot)))
	n.log.Info("static worker serves model", "slot", info.Slot, "worker", info.ID, "endpoint", info.Endpoint, "model", model)
	return nil
}

// errEngineAuth is an engine refusing the router's credentials: no key
// (--engine-api-key-file) or another than the engine's.
var errEngineAuth = errors.New("the engine refuses the router's credentials: it wants an API key the router does not send, or another")

// errKeyRefused is errEngineAuth from a 401, the status vLLM and SGLang
// refuse a key with.
var errKeyRefused = fmt.Errorf("%w", errEngineAuth)

// engineModels is what one engine's GET /v1/models says.
type engineModels struct {
	base     string            // the first base model listed
	adapters map[string]string // adapter -> the worker's model, its base
	listed   bool              // whether the worker's model is listed at all
	dropped  int               // adapters not kept: over the bounds
	// sglang: the engine may read the spellings of an adapter that name
	// its base model as well (lora_path, "base:adapter"), SGLang's: it
	// does not say it is vLLM or the mock (openai.ReadsAdapterSpellings),
	// which ignore lora_path and refuse "base:adapter" as a model they do
	// not serve.
	sglang bool
}

// fetch reads one engine's model list (openai.ReadModelList): the first
// base model it lists, the adapters of model, and whether model is listed
// at all. With model "" (not known yet), the base model found is the one whose
// adapters are kept. An adapter whose parent is another of the engine's
// base models is the worker's too: an engine serving one model under
// several names (vLLM's --served-model-name a b) gives its adapters the
// first name as parent, whichever name the worker was registered with.
func (p *adapterPoller) fetch(ctx context.Context, endpoint, model string) (engineModels, error) {
	var got engineModels
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+endpoint+"/v1/models", nil)
	if err != nil {
		return got, fmt.Errorf("cannot ask %s for its models: %w", endpoint, err)
	}
	if p.token != "" {
		// vLLM keeps everything under /v1 behind its --api-key, SGLang
		// everything but /health.
		req.Header.Set("Authorization", "Bearer "+p.token)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return got, fmt.Errorf("cannot ask %s for its models: %w", endpoint, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized:
		return got, fmt.Errorf("cannot ask %s for its models: status %d: %w", endpoint, resp.StatusCode, errKeyRefused)
	case http.StatusForbidden:
		return got, fmt.Errorf("cannot ask %s for its models: status %d: %w", endpoint, resp.StatusCode, errEngineAuth)
	default:
		return got, fmt.Errorf("cannot ask %s for its models: status %d", endpoint, resp.StatusCode)
	}
	list, err := openai.ReadModelList(resp.Body, 4<<20)
	if err != nil {
		return got, fmt.Errorf("cannot read %s's model list: %w", endpoint, err)
	}
	bases := map[string]bool{}
	for _, m := range list {
		if m.Parent == "" && m.ID != "" && len(m.ID) <= shm.MaxModelLen &&
			strings.IndexFunc(m.ID, unicode.IsControl) < 0 { // the decoder made it UTF-8; a name is also a metric label
			if got.base == "" {
				got.base, got.sglang = m.ID, openai.ReadsAdapterSpellings(m.OwnedBy)
			}
			bases[m.ID] = true
		}
	}
	if model == "" {
		model = got.base
	}
	got.listed = bases[model]
	for _, m := range list {
		// A name longer than a registered model's could be, or more
		// adapters than maxAdapters, is not kept: the front end keeps
		// every adapter's name, and those of adapters gone, for as long
		// as the router runs.
		if !got.listed || m.Parent == "" || !bases[m.Parent] || m.ID == "" || bases[m.ID] {
			continue
		}
		if len(m.ID) > shm.MaxModelLen || strings.IndexFunc(m.ID, unicode.IsControl) >= 0 || len(got.adapters) >= maxAdapters {
			got.dropped++
			continue
		}
		if got.adapters == nil {
			got.adapters = map[string]string{}
		}
		got.adapters[m.ID] = model
	}
	return got, nil
}

// maxAdapters bounds the LoRA adapters kept per engine, far more than a
// deployment registers with one engine.
const maxAdapters = 1024
