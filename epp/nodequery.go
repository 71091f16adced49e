package epp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/workers"
)

// With Config.QueryNodes the endpoints are kvfast routers, one per node,
// each in front of its own engines (docs/epp.md, "kvfast per node"), and
// they publish no events to the picker: what each caches of a prompt is
// asked of it, per request, through its route-only endpoint, which
// answers its own decision without booking anything. The picker then
// weighs those answers against the load it has sent each node, with the
// same scheduler as everywhere else.

// nodeAnswer is what one node's router said of the request.
type nodeAnswer struct {
	OverlapBlocks uint32 `json:"overlap_blocks"` // its chosen engine's cached prefix
	PromptBlocks  uint32 `json:"prompt_blocks"`  // the prompt, in the node's blocks
	Busy          bool   `json:"busy"`           // every engine of the node is over a busy threshold
}

// newNodeClient is the client of the route-only queries: small answers,
// many of them, to a few hosts.
func newNodeClient(timeout time.Duration) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	// Straight to the nodes, in the cluster: a proxy from the environment
	// would be handed the clients' keys (the queries carry them).
	tr.Proxy = nil
	// A redirect is the node's answer, not an address to follow with the
	// picker's request (dispatch.RefuseRedirects says why).
	return &http.Client{Transport: tr, Timeout: timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// queryNodes asks every candidate node, concurrently and within
// QueryTimeout, what it caches of the prompt, and turns the answers into
// the overlaps selection reads: each node's cached fraction of the
// prompt, in the picker's own blocks (its hashes may be text chunks where
// the node counted tokens). Nodes that are busy are left out while any
// other can take the request; a node that does not answer counts as
// caching nothing.
func (x *exchange) queryNodes(ctx context.Context) {
	p := x.s.p
	path := fastpath.PathRouteCompletions
	if x.api == openai.APIChatCompletions {
		path = fastpath.PathRouteChatCompletions
	}
	type result struct {
		slot workers.Slot
		ans  nodeAnswer
		ok   bool
	}
	slots := *p.slots.Load()
	results := make([]result, 0, len(slots))
	for _, slot := range slots {
		if !x.subset || x.allow.Has(slot) {
			results = append(results, result{slot: slot})
		}
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.QueryTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for i := range results {
		info, ok := p.sched.Worker(results[i].slot)
		if !ok {
			continue
		}
		wg.Go(func() {
			ans, err := p.askNode(ctx, "http://"+info.Endpoint+path, x.body, x.auth)
			if err != nil {
				// A fleet whose nodes refuse the picker routes by load
				// alone: said once a minute, and counted.
				x.s.metrics.nodeQueryFails.Inc()
				key, args := "node-query", []any{"endpoint", info.Endpoint, "err", err}
				if errors.Is(err, errNodeRefused) {
					// Its own line, which a timeout elsewhere cannot hide.
					key = "node-query/refused"
					args = append(args, "hint", "the node wants an API key: the picker forwards the client's Authorization, so clients must send a key the node accepts")
				}
				p.throttle.Log(p.log, slog.LevelWarn, key, "a node did not say what it caches; the request routes as if it cached nothing there", args...)
				return
			}
			results[i].ans, results[i].ok = ans, true
		})
	}
	wg.Wait()
	var idle, answered workers.Set
	n := float64(len(x.hashes))
	for _, r := range results {
		if !r.ok {
			continue
		}
		answered |= workers.SetOf(r.slot)
		if !r.ans.Busy {
			idle |= workers.SetOf(r.slot)
		}
		if r.ans.PromptBlocks > 0 {
			frac := min(1, float64(r.ans.OverlapBlocks)/float64(r.ans.PromptBlocks))
			x.overlaps[r.slot] = uint32(frac * n)
		}
	}
	if busy := answered &^ idle; busy != 0 && idle != 0 {
		allow := workers.AllSlots
		if x.sreq.AllowListed {
			allow = x.sreq.Allow
		}
		x.sreq.AllowListed, x.sreq.Allow = true, allow&^busy
	}
}

// errNodeRefused is a node's 401 or 403 to a query.
var errNodeRefused = errors.New("the node refused the query's credentials")

// askNode posts the request's body to one node's route-only endpoint,
// with the client's Authorization header: a node that requires API keys
// (--api-key-file) takes the key the gateway forwards the request with.
func (p *Picker) askNode(ctx context.Context, url string, body []byte, auth string) (nodeAnswer, error) {
	var ans nodeAnswer
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return ans, fmt.Errorf("cannot ask %s: %w", url, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := p.nodes.Do(req)
	if err != nil {
		return ans, fmt.Errorf("cannot ask %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return ans, fmt.Errorf("cannot read %s's answer: %w", url, err)
	}
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		return ans, fmt.Errorf("%s answered %d: %w", url, resp.StatusCode, errNodeRefused)
	}
	if resp.StatusCode != http.StatusOK {
		return ans, fmt.Errorf("%s answered %d", url, resp.StatusCode)
	}
	if err := json.Unmarshal(b, &ans); err != nil {
		return ans, fmt.Errorf("cannot decode %s's answer: %w", url, err)
	}
	return ans, nil
}
