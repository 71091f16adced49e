package epp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/kvfast/kvfast/dispatch"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/workers"
)

// adapterPoll is how often every endpoint is asked which LoRA adapters it
// serves, as kvfast serve asks its engines: adapters are loaded at engine
// start or, rarely, at run time, so an adapter's first requests after a
// load may go anywhere for a few seconds.
const adapterPoll = 2 * time.Second

// Bounds on what one endpoint's list may make the picker hold: names a
// request's model could be, and no more of them than a deployment loads.
const (
	maxAdapterName     = 256
	maxAdaptersPerPod  = 1024
	modelListByteLimit = 4 << 20
)

// endpointDownAfter is how many polls in a row an endpoint may go
// unanswered (refused, reset, timed out, or a 5xx) before it is routed
// around. A static endpoint has no other health signal (a pool's pods
// have their readiness), and a dead one would otherwise keep its share
// of requests, each failing at the gateway. Its first answer puts it
// back.
const endpointDownAfter = 3

// adapterPoller keeps, for the request path, which endpoints list which
// LoRA adapter of the pool's model (Picker.adapters), and which do not
// answer at all. An endpoint that does not answer keeps what it listed
// last; one that left the pool is forgotten. Only RunAdapters' goroutine
// touches it.
type adapterPoller struct {
	p      *Picker
	client *http.Client
	known  map[string]endpointModels // endpoint address → its adapters
	misses map[string]int            // endpoint address → polls unanswered in a row
	// routedAround: the endpoints health marked unhealthy, for its log
	// lines at each change.
	routedAround map[string]bool
}

// RunAdapters asks the pool's endpoints for their LoRA adapters (GET
// /v1/models) every period until ctx ends, so that a request naming an
// adapter goes to an endpoint that serves it: another would answer 404,
// or load the adapter at the cost of another's slot.
func (p *Picker) RunAdapters(ctx context.Context, period time.Duration) {
	a := &adapterPoller{p: p, known: map[string]endpointModels{}, misses: map[string]int{}, routedAround: map[string]bool{},
		client: dispatch.EngineHTTPClient(2 * time.Second)}
	// Its kept-alive connections go with the poller, not at the idle
	// timeout.
	defer a.client.CloseIdleConnections()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.poll(ctx)
		t.Reset(period)
	}
}

// poll asks every endpoint at once and publishes the result.
func (a *adapterPoller) poll(ctx context.Context) {
	slots := *a.p.slots.Load()
	type answer struct {
		addr     string
		models   endpointModels
		answered bool
		err      error
	}
	answers := make(chan answer, len(slots))
	var wg sync.WaitGroup
	for addr := range slots {
		wg.Go(func() {
			models, answered, err := a.fetch(ctx, addr)
			answers <- answer{addr, models, answered, err}
		})
	}
	wg.Wait()
	close(answers)
	if ctx.Err() != nil {
		return // the shutdown cut the polls short: they tell nothing
	}
	for ans := range answers {
		if ans.answered {
			delete(a.misses, ans.addr)
		} else {
			a.misses[ans.addr]++
		}
		if ans.err != nil {
			if ctx.Err() == nil {
				a.p.throttle.Log(a.p.log, slog.LevelWarn, "adapters/"+ans.addr, "cannot learn an endpoint's LoRA adapters; keeping what it listed last",
					"endpoint", ans.addr, "err", ans.err)
			}
			continue
		}
		a.known[ans.addr] = ans.models
	}
	for addr := range a.known {
		if _, ok := slots[addr]; !ok {
			delete(a.known, addr)
		}
	}
	for addr := range a.misses {
		if _, ok := slots[addr]; !ok {
			delete(a.misses, addr)
		}
	}
	a.health(slots)
	byName := map[string]workers.Set{}
	var sglang workers.Set
	for addr, models := range a.known {
		for n := range models.adapters {
			byName[n] |= workers.SetOf(slots[addr])
		}
		if models.sglang {
			sglang |= workers.SetOf(slots[addr])
		}
	}
	a.p.sglang.Store(uint64(sglang)) // first: a request reading the adapters then finds their engines' kind
	a.p.adapters.Store(&byName)
}

// errModelsAuth is an endpoint that keeps /v1/models behind an API key
// (vLLM's --api-key) the picker does not hold, or refused the one it
// holds: it cannot learn the endpoint's adapters, and requests naming one
// route among all.
var (
	errModelsAuth    = errors.New("the endpoint wants an API key for /v1/models, and the picker holds none (--engine-api-key-file): requests naming an adapter route among every endpoint")
	errModelsRefused = errors.New("the endpoint refused the picker's --engine-api-key-file key for /v1/models: requests naming an adapter route among every endpoint")
)

// health routes around the endpoints that have not answered
// endpointDownAfter polls in a row, and back to each at its first answer.
// When none answers, the fault is likelier the picker's own (a network
// policy that lets only the gateway reach the engines) than every
// engine's: all stay routed, rather than refusing every request.
func (a *adapterPoller) health(slots map[string]workers.Slot) {
	silent := 0
	for addr := range slots {
		if a.misses[addr] >= endpointDownAfter {
			silent++
		}
	}
	failOpen := silent == len(slots)
	if failOpen && silent > 0 {
		a.p.throttle.Log(a.p.log, slog.LevelWarn, "endpoints/silent",
			"no endpoint answers the picker's polls of /v1/models: all stay routed (is the picker kept from reaching them?)",
			"endpoints", silent)
	}
	current := *a.p.slots.Load()
	for addr, slot := range slots {
		if now, ok := current[addr]; !ok || now != slot {
			// It left, or its slot went to another endpoint (Sync ran
			// while the polls were out): its misses are not the slot's.
			continue
		}
		down := !failOpen && a.misses[addr] >= endpointDownAfter
		switch {
		case down && !a.routedAround[addr]:
			a.p.log.Warn("an endpoint has not answered its last polls: routed around until it answers",
				"endpoint", addr, "polls", endpointDownAfter)
		case !down && a.routedAround[addr]:
			a.p.log.Info("an endpoint is routed to again", "endpoint", addr)
		}
		// At every poll: a pod that re-joined the slot meanwhile came
		// back healthy.
		a.p.sched.SetHealthy(slot, !down)
		if down {
			a.routedAround[addr] = true
		} else {
			delete(a.routedAround, addr)
		}
	}
	for addr := range a.routedAround {
		if _, ok := slots[addr]; !ok {
			delete(a.routedAround, addr)
		}
	}
}

// endpointModels is what one endpoint's GET /v1/models says.
type endpointModels struct {
	adapters map[string]bool // the adapters of the pool's model it lists
	// sglang: its engine may read an adapter in lora_path or as
	// "base:adapter", SGLang's spellings: it does not say it is vLLM or
	// the mock (openai.ReadsAdapterSpellings); vLLM ignores lora_path and
	// answers "base:adapter" with 404.
	sglang bool
}

// fetch returns the adapters of the pool's model that the endpoint at
// addr lists, and whether it answered at all: a failed connection or a
// 5xx is no answer, a 4xx is one. An adapter whose parent is another name
// the endpoint serves its model under is the pool model's too (vLLM gives
// its adapters the first of its --served-model-name names as parent).
func (a *adapterPoller) fetch(ctx context.Context, addr string) (endpointModels, bool, error) {
	var got endpointModels
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v1/models", nil)
	if err != nil {
		return got, false, fmt.Errorf("cannot ask %s for its models: %w", addr, err)
	}
	if a.p.cfg.EngineToken != "" {
		req.Header.Set("Authorization", "Bearer "+a.p.cfg.EngineToken)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return got, false, fmt.Errorf("cannot ask %s for its models: %w", addr, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK:
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		if a.p.cfg.EngineToken != "" {
			return got, true, errModelsRefused
		}
		return got, true, errModelsAuth
	default:
		return got, resp.StatusCode < 500, fmt.Errorf("cannot ask %s for its models: status %d", addr, resp.StatusCode)
	}
	list, err := openai.ReadModelList(resp.Body, modelListByteLimit)
	if err != nil {
		return got, true, fmt.Errorf("cannot ask %s for its models: %w", addr, err)
	}
	bases := map[string]bool{}
	for _, m := range list {
		if m.Parent == "" && m.ID != "" {
			if len(bases) == 0 {
				got.sglang = openai.ReadsAdapterSpellings(m.OwnedBy) // the first base's word, as kvfast serve takes it
			}
			bases[m.ID] = true
		}
	}
	got.adapters = map[string]bool{}
	for _, m := range list {
		if !bases[a.p.cfg.Model] || !bases[m.Parent] || m.ID == "" || bases[m.ID] || len(m.ID) > maxAdapterName ||
			strings.IndexFunc(m.ID, unicode.IsControl) >= 0 {
			continue
		}
		if len(got.adapters) == maxAdaptersPerPod {
			break
		}
		got.adapters[m.ID] = true
	}
	return got, true, nil
}

// adapterOf is the LoRA adapter the request names, nil for the pool's
// model: a model other than the pool's, or SGLang's spellings, the pool's
// model with ":adapter" after it, or beside it an adapter in lora_path.
// sglangOnly says the adapter was named in one of SGLang's spellings,
// which only SGLang endpoints read: lora_path counts only while an SGLang
// endpoint lists the adapter (vLLM ignores the field and serves the base
// model, so the adapter's namespace would claim a cache it does not use).
func (x *exchange) adapterOf() (adapter []byte, sglangOnly bool) {
	m, base := x.req.Model, x.s.p.cfg.Model
	switch {
	case m == nil || string(m) == base:
		a := x.req.LoRAPath
		if len(a) > 0 && (*x.s.p.adapters.Load())[string(a)]&workers.Set(x.s.p.sglang.Load()) != 0 {
			return a, true
		}
		return nil, false
	case len(m) > len(base)+1 && m[len(base)] == ':' && string(m[:len(base)]) == base:
		return m[len(base)+1:], true
	}
	return m, false
}

// adapterEndpoints narrows x's candidates to the endpoints that list the
// adapter the request names (the SGLang ones, for its spellings), when any does and the gateway's subset
// leaves one of them; otherwise the request routes among all, and an
// endpoint that cannot serve it answers as its engine does.
func (x *exchange) adapterEndpoints(adapter []byte, sglangOnly bool) {
	set := (*x.s.p.adapters.Load())[string(adapter)]
	if sglangOnly {
		set &= workers.Set(x.s.p.sglang.Load())
	}
	switch {
	case set == 0:
	case !x.sreq.AllowListed:
		x.sreq.AllowListed, x.sreq.Allow = true, set
	case x.sreq.Allow&set != 0:
		x.sreq.Allow &= set
	}
}
