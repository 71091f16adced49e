package fastpath_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/internal/rig"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/prompt"
)

// TestRemoteTokenizerRoutesChatExactly runs a router with --tokenizer
// mock=remote in front of mock engines that tokenize for themselves and
// publish the blocks they compute. A chat request and a completions
// request that share a system prompt both reach the engine that cached
// it, and so does the conversation's next turn; each time the prefix the
// router expected is exactly the prefix the engine then served from its
// cache. Against engines with vLLM's render endpoints and against engines
// without them (the router falls back to /tokenize).
func TestRemoteTokenizerRoutesChatExactly(t *testing.T) {
	for _, tc := range []struct {
		name     string
		noRender bool
		endpoint string
	}{{"render", false, "render"}, {"tokenize", true, "tokenize"}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := e2eConfig()
			cfg.Tokenizers.Specs = []prompt.Spec{{Model: e2eModel, Source: prompt.Source{Kind: prompt.SourceRemote}}}
			const firstID = 1
			r := startE2ERig(t, rig.Config{Node: cfg, Engines: 3,
				Engine: mocker.Config{WorkerID: firstID, Speedup: 50, DisableRender: tc.noRender}})

			words := make([]string, 96) // six blocks of 16 tokens, one word each
			for i := range words {
				words[i] = "sys" + strconv.Itoa(i)
			}
			system := strings.Join(words, " ")
			turn1 := []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": "what is a block"}}

			resp := r.post(t, fastpath.PathChatCompletions, chatJSON(t, turn1), nil)
			if resp.status != http.StatusOK {
				t.Fatalf("turn 1: status %d: %s", resp.status, resp.body)
			}
			owner := resp.header.Get(fastpath.HeaderWorker)
			var out struct {
				Choices []struct {
					Message struct{ Content string } `json:"message"`
				} `json:"choices"`
			}
			decodeJSON(t, resp.body, &out)
			if len(out.Choices) != 1 || out.Choices[0].Message.Content == "" {
				t.Fatalf("turn 1: no reply in %s", resp.body)
			}
			id, err := strconv.Atoi(owner)
			if err != nil || id < firstID || id >= firstID+len(r.rig.Engines) {
				t.Fatalf("turn 1 went to worker %q", owner)
			}
			engine := r.rig.Engines[id-firstID]
			waitFor(t, "the owner's KV events to reach the index", func() bool {
				st := engine.Stats()
				return st.Running == 0 && st.BlocksStored > 0 &&
					workerView(t, r.node, uint64(id), 0).IndexBlocks == st.BlocksStored-st.BlocksEvicted
			})

			// A completions request holding the template written out shares
			// the system prompt's blocks; then the next turn shares turn 1's.
			text := mocker.TextSystem + " " + system + " " + mocker.TextEndOfTurn + " " + mocker.TextUser + " something else entirely"
			completion, err := json.Marshal(map[string]any{"model": e2eModel, "prompt": text, "max_tokens": 4})
			if err != nil {
				t.Fatal(err)
			}
			turn2 := append(turn1, map[string]string{"role": "assistant", "content": out.Choices[0].Message.Content},
				map[string]string{"role": "user", "content": "and a page"})
			for _, step := range []struct {
				name      string
				path      string
				body      []byte
				minBlocks int
			}{
				{"completions sharing the system prompt", fastpath.PathCompletions, completion, 6},
				{"the next turn", fastpath.PathChatCompletions, chatJSON(t, turn2), 6},
			} {
				resp := r.post(t, step.path, step.body, nil)
				if resp.status != http.StatusOK {
					t.Fatalf("%s: status %d: %s", step.name, resp.status, resp.body)
				}
				if got := resp.header.Get(fastpath.HeaderWorker); got != owner {
					t.Errorf("%s went to worker %s, want %s, which caches its prefix", step.name, got, owner)
				}
				overlap, _ := strconv.Atoi(resp.header.Get(fastpath.HeaderOverlapBlocks))
				var usage struct {
					Usage struct {
						Details struct {
							Cached int `json:"cached_tokens"`
						} `json:"prompt_tokens_details"`
					} `json:"usage"`
				}
				decodeJSON(t, resp.body, &usage)
				if overlap < step.minBlocks || overlap*16 != usage.Usage.Details.Cached {
					t.Errorf("%s: the router expected %d cached blocks, the engine served %d cached tokens (want at least %d blocks, and the same)",
						step.name, overlap, usage.Usage.Details.Cached, step.minBlocks)
				}
			}

			// The route-only answer says the decision was exact.
			var d struct {
				Exact bool `json:"exact"`
			}
			decodeJSON(t, r.post(t, fastpath.PathRouteChatCompletions, chatJSON(t, turn2), nil).body, &d)
			if !d.Exact {
				t.Error("a chat request of a model with a tokenizer routed approximately")
			}

			waitReleased(t, r.node)
			var mock *prompt.ModelStatus
			for _, st := range r.node.Snapshot().Tokenizers {
				if st.Model == e2eModel {
					mock = &st
				}
			}
			if mock == nil || mock.Mode != prompt.ModeRemote || !mock.Exact || mock.Outcomes == nil ||
				mock.Outcomes.OK < 4 || *mock.Outcomes != (prompt.Outcomes{OK: mock.Outcomes.OK}) {
				t.Fatalf("the admin view's tokenizer: %+v", mock)
			}
			// Renders are spread over the model's engines; each answered
			// (if it was asked) through the endpoint it has.
			asked := 0
			for _, e := range mock.Remote.Engines {
				for _, got := range []string{e.Chat, e.Completions} {
					switch got {
					case tc.endpoint:
						asked++
					case "unknown":
					default:
						t.Errorf("engine %s answered through %q, want %q", e.Addr, got, tc.endpoint)
					}
				}
			}
			if asked == 0 {
				t.Errorf("no engine was asked: %+v", mock.Remote)
			}
			m := r.metrics(t)
			wantMetric(t, m, `kvfast_tokenizer_info{mode="remote",model="mock"}`, 1)
			wantMetric(t, m, `kvfast_tokenize_total{mode="remote",model="mock",outcome="ok"}`, float64(mock.Outcomes.OK))
			if n, ok := metricValue(m, `kvfast_routing_duration_seconds_count{stage="tokenize"}`); !ok || n < 4 {
				t.Errorf("tokenize stage observed %v times", n)
			}
		})
	}
}

// chatJSON is a chat-completions body for msgs.
func chatJSON(t *testing.T, msgs []map[string]string) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"model": e2eModel, "messages": msgs, "max_tokens": 8})
	if err != nil {
		t.Fatal(err)
	}
	return b
}
