package node

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"time"

	"github.com/kvfast/kvfast/workers"
)

// adapterPoll is how often the node asks every engine which LoRA adapters
// it serves. Adapters are loaded at engine start or, rarely, at run time
// (vLLM's /v1/load_lora_adapter), so a few seconds' delay only routes an
// adapter's first requests without cache credit.
const adapterPoll = 2 * time.Second

// adapterPoller learns from each engine's GET /v1/models the LoRA
// adapters it serves and hands the union to the front end. Only its own
// goroutine touches it.
type adapterPoller struct {
	client *http.Client
	known  [workers.Max]map[string]string // adapter -> base model, by slot
	pushed map[string]string
}

func newAdapterPoller() *adapterPoller {
	return &adapterPoller{client: &http.Client{Timeout: 2 * time.Second}}
}

// poll refreshes every worker's adapters and tells the front end when
// the union changed. An engine that does not answer keeps what it listed
// last; a worker that left loses its entry.
func (p *adapterPoller) poll(ctx context.Context, n *Node) {
	live := n.sched.Workers()
	union := map[string]string{}
	for i := range workers.Max {
		slot := workers.Slot(i)
		info, ok := n.sched.Worker(slot)
		if !live.Has(slot) || !ok {
			p.known[slot] = nil
			continue
		}
		if got, err := p.fetch(ctx, info.Endpoint, info.Model); err == nil {
			p.known[slot] = got
		} else {
			n.log.Debug("cannot learn an engine's LoRA adapters", "slot", slot, "endpoint", info.Endpoint, "err", err)
		}
		maps.Copy(union, p.known[slot])
	}
	if !maps.Equal(union, p.pushed) {
		p.pushed = union
		n.front.SetAdapters(union)
	}
}

// fetch reads one engine's model list. vLLM lists each LoRA adapter with
// parent set to its base model (vllm/entrypoints/openai/serving_models.py,
// show_available_models); only adapters of the model the worker serves
// are kept.
func (p *adapterPoller) fetch(ctx context.Context, endpoint, model string) (map[string]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+endpoint+"/v1/models", nil)
	if err != nil {
		return nil, fmt.Errorf("cannot ask %s for its models: %w", endpoint, err)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot ask %s for its models: %w", endpoint, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("cannot ask %s for its models: status %d", endpoint, resp.StatusCode)
	}
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&list); err != nil {
		return nil, fmt.Errorf("cannot read %s's model list: %w", endpoint, err)
	}
	var got map[string]string
	for _, m := range list.Data {
		if m.Parent != nil && *m.Parent == model && m.ID != "" && m.ID != model {
			if got == nil {
				got = map[string]string{}
			}
			got[m.ID] = model
		}
	}
	return got, nil
}
