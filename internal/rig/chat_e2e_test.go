package rig_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"testing"

	"github.com/kvfast/kvfast/benchmarks/demo/demotok"
	"github.com/kvfast/kvfast/benchmarks/replay"
	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/internal/rig"
	"github.com/kvfast/kvfast/internal/rig/rigtest"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/prompt"
)

// chatE2EModel is the model the engines serve and the router tokenizes.
const chatE2EModel = "mock"

type chatE2EMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatE2EResponse is what the test reads from a non-streaming reply.
type chatE2EResponse struct {
	status  int
	worker  string
	overlap int // the router's expected cached blocks
	cached  int // the engine's cached prompt tokens
	reply   string
	body    []byte
}

func postJSON(t *testing.T, url string, body any) chatE2EResponse {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := chatE2EResponse{status: resp.StatusCode, worker: resp.Header.Get(fastpath.HeaderWorker)}
	if out.body, err = io.ReadAll(resp.Body); err != nil {
		t.Fatal(err)
	}
	out.overlap, _ = strconv.Atoi(resp.Header.Get(fastpath.HeaderOverlapBlocks))
	var r struct {
		Choices []struct {
			Text    string                   `json:"text"`
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if out.status == http.StatusOK {
		if err := json.Unmarshal(out.body, &r); err != nil || len(r.Choices) != 1 {
			t.Fatalf("cannot read the reply %s: %v", out.body, err)
		}
		out.cached = r.Usage.Details.Cached
		out.reply = r.Choices[0].Message.Content + r.Choices[0].Text
	}
	return out
}

// TestChatRoutesExactlyWithARealTokenizer runs mock engines that tokenize
// for themselves with a real Hugging Face tokenizer and chat template (the
// demo's: byte-level BPE, ChatML, a BOS token) behind a router that
// tokenizes text and chat requests with its built-in tokenizer on the same
// files, or by asking the engines to render them. A chat request and a
// completions request that share a system prompt both reach the engine
// that cached it, and so does the conversation's next turn; each time the
// router expected exactly the blocks the engine then served from its
// cache.
func TestChatRoutesExactlyWithARealTokenizer(t *testing.T) {
	engineTok, err := demotok.Open(chatE2EModel)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := demotok.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	// 190 words of the demo's text, a token each.
	system := string(replay.ChatSynth{}.AppendText(nil, 42, 190))
	for _, tc := range []struct {
		mode   string
		source prompt.Source
	}{
		{prompt.ModeBuiltin, prompt.Source{Kind: prompt.SourceDir, Path: dir}},
		{prompt.ModeRemote, prompt.Source{Kind: prompt.SourceRemote}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			cfg := rigtest.Config()
			cfg.Tokenizers.Specs = []prompt.Spec{{Model: chatE2EModel, Source: tc.source}}
			const firstID = 1
			r := rigtest.Start(t, rig.Config{Node: cfg, Engines: 3,
				Engine: mocker.Config{Model: chatE2EModel, WorkerID: firstID, Speedup: 50, Renderer: engineTok}})

			turn1 := []chatE2EMessage{{"system", system}, {"user", "what is a block"}}
			first := postJSON(t, r.URL+fastpath.PathChatCompletions, map[string]any{"model": chatE2EModel, "messages": turn1, "max_tokens": 4})
			if first.status != http.StatusOK || first.reply == "" {
				t.Fatalf("turn 1: status %d: %s", first.status, first.body)
			}
			id, err := strconv.Atoi(first.worker)
			if err != nil || id < firstID || id >= firstID+len(r.Engines) {
				t.Fatalf("turn 1 went to worker %q", first.worker)
			}
			owner := r.Engines[id-firstID]
			err = rig.WaitFor(context.Background(), 0, "the owner's KV events in the index", func() bool {
				st := owner.Stats()
				if st.Running != 0 || st.BlocksStored == 0 {
					return false
				}
				for _, w := range r.Node.Snapshot().Workers {
					if w.WorkerID == uint64(id) {
						return w.IndexBlocks == st.BlocksStored-st.BlocksEvicted
					}
				}
				return false
			})
			if err != nil {
				t.Fatal(err)
			}

			// The template written out, after the BOS token that the
			// tokenizer's post-processor adds to a completions prompt:
			// the same tokens up to the user's words.
			completion := "<|im_start|>system\n" + system + "<|im_end|>\n<|im_start|>user\nsomething else entirely"
			turn2 := append(turn1, chatE2EMessage{"assistant", first.reply}, chatE2EMessage{"user", "and a page"})
			// The system prompt with its template tokens is 199 tokens: 12
			// blocks; the next turn shares turn 1's question too.
			for _, step := range []struct {
				name      string
				path      string
				body      map[string]any
				minBlocks int
			}{
				{"completions sharing the system prompt", fastpath.PathCompletions,
					map[string]any{"model": chatE2EModel, "prompt": completion, "max_tokens": 4}, 12},
				{"the next turn", fastpath.PathChatCompletions,
					map[string]any{"model": chatE2EModel, "messages": turn2, "max_tokens": 4}, 13},
			} {
				got := postJSON(t, r.URL+step.path, step.body)
				if got.status != http.StatusOK {
					t.Fatalf("%s: status %d: %s", step.name, got.status, got.body)
				}
				if got.worker != first.worker {
					t.Errorf("%s went to worker %s, want %s, which caches its prefix", step.name, got.worker, first.worker)
				}
				if got.overlap < step.minBlocks || got.overlap*16 != got.cached {
					t.Errorf("%s: the router expected %d cached blocks, the engine served %d cached tokens (want at least %d blocks, and the same)",
						step.name, got.overlap, got.cached, step.minBlocks)
				}
			}

			var st *prompt.ModelStatus
			for _, s := range r.Node.Snapshot().Tokenizers {
				if s.Model == chatE2EModel {
					st = &s
				}
			}
			if st == nil || st.Mode != tc.mode || !st.Exact {
				t.Fatalf("the router's tokenizer: %+v", st)
			}
			if o := st.Outcomes; o != nil && (o.OK < 3 || *o != (prompt.Outcomes{OK: o.OK})) {
				t.Errorf("the renderer's outcomes: %+v", *o)
			}
			if tc.mode == prompt.ModeRemote && st.Outcomes == nil {
				t.Error("the remote renderer counted no outcomes")
			}
		})
	}
}
