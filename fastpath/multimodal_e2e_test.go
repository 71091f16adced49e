package fastpath_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
	"github.com/kvfast/kvfast/prompt"
)

// imageChatJSON is a chat body whose user message shows the image at url
// after a long shared system prompt, then asks the same question.
func imageChatJSON(url string) []byte {
	words := make([]string, 40)
	for i := range words {
		words[i] = "look" + strconv.Itoa(i)
	}
	return []byte(`{"model":"` + e2eModel + `","max_tokens":2,"messages":[` +
		`{"role":"system","content":"` + strings.Join(words, " ") + `"},` +
		`{"role":"user","content":[{"type":"text","text":"what is in"},{"type":"image_url","image_url":{"url":"` + url + `"}},` +
		`{"type":"text","text":"this picture, in detail, please, with colours and shapes and every object named"}]}]}`)
}

// TestMultimodalRoutesByImage runs a router with --tokenizer mock=remote
// in front of three mock engines publishing vLLM's ZMQ events. With the
// render endpoint, the router learns each image's hash and placeholders
// and hashes the image's blocks as the engine does: a request showing the
// image another request showed reaches that engine and is credited with
// every block, which the engine then serves from its cache; a request
// with the same text and another image is credited only with the blocks
// before the image, and the engine serves exactly those. Both count as
// exact. Without the render endpoint (/tokenize), the router cannot name
// the image: the token ids hold the same placeholders for every image,
// and hashed as text they matched another image's blocks booked in
// flight, an over-claim. Such a request routes approximately, on its
// text up to the image, and counts as approximate.
func TestMultimodalRoutesByImage(t *testing.T) {
	for _, tc := range []struct {
		name     string
		noRender bool
		routing  string
	}{{"render", false, "exact"}, {"tokenize", true, "approximate"}} {
		t.Run(tc.name, func(t *testing.T) {
			var engines []*mocker.Engine
			var static []node.StaticWorker
			for i := range 3 {
				e := startMock(t, mocker.Config{Listen: "127.0.0.1:0", Model: e2eModel, KVBlocks: 1024, DisableRender: tc.noRender,
					ZMQ: mocker.ZMQConfig{Listen: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", Topic: "kv-events"}})
				engines = append(engines, e)
				static = append(static, node.StaticWorker{ID: uint64(i + 1), Endpoint: e.Addr(), Model: e2eModel,
					Events: e.ZMQEndpoint(), Replay: e.ZMQReplayEndpoint(), Topic: "kv-events"})
			}
			cfg := e2eConfig(static...)
			cfg.Tokenizers.Specs = []prompt.Spec{{Model: e2eModel, Source: prompt.Source{Kind: prompt.SourceRemote}}}
			r := startE2ERouter(t, cfg)

			cat, dog := imageChatJSON("http://pictures/cat.png"), imageChatJSON("http://pictures/dog.png")
			// The engines' own view of the prompts: ids and the image's place.
			var rendered struct {
				TokenIDs []uint32 `json:"token_ids"`
				Features struct {
					MMPlaceholders map[string][]struct{ Offset int } `json:"mm_placeholders"`
				} `json:"features"`
			}
			probe := startMock(t, mocker.Config{Listen: "127.0.0.1:0", Model: e2eModel})
			resp, err := http.Post(probe.URL()+"/v1/chat/completions/render", "application/json", bytes.NewReader(cat))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.NewDecoder(resp.Body).Decode(&rendered); err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			const bs = 16
			full := len(rendered.TokenIDs) / bs
			before := rendered.Features.MMPlaceholders["image"][0].Offset / bs
			if before < 2 || full < before+3 {
				t.Fatalf("the test prompt has %d blocks, %d before the image: too few to tell", full, before)
			}

			type outcome struct {
				worker          string
				overlap, cached int
			}
			send := func(body []byte) outcome {
				resp := r.post(t, fastpath.PathChatCompletions, body, nil)
				if resp.status != http.StatusOK {
					t.Fatalf("status %d: %s", resp.status, resp.body)
				}
				var u struct {
					Usage struct {
						Details struct {
							Cached int `json:"cached_tokens"`
						} `json:"prompt_tokens_details"`
					} `json:"usage"`
				}
				decodeJSON(t, resp.body, &u)
				overlap, _ := strconv.Atoi(resp.header.Get(fastpath.HeaderOverlapBlocks))
				return outcome{resp.header.Get(fastpath.HeaderWorker), overlap, u.Usage.Details.Cached}
			}
			overlapOn := func(body []byte, worker string) int {
				var d routeDecision
				decodeJSON(t, r.post(t, fastpath.PathRouteChatCompletions, body, nil).body, &d)
				for _, w := range d.Workers {
					if strconv.FormatUint(w.WorkerID, 10) == worker {
						return int(w.OverlapBlocks)
					}
				}
				return 0
			}

			first := send(cat)
			id, err := strconv.Atoi(first.worker)
			if err != nil || id < 1 || id > len(engines) {
				t.Fatalf("the first request went to worker %q", first.worker)
			}
			owner := engines[id-1]
			if tc.noRender {
				var d routeDecision
				decodeJSON(t, r.post(t, fastpath.PathRouteChatCompletions, dog, nil).body, &d)
				if d.Exact {
					t.Errorf("an image prompt without its image's identity routed exactly: %+v", d)
				}
				sameImage, otherImage := overlapOn(cat, first.worker), overlapOn(dog, first.worker)
				if otherImage >= sameImage {
					t.Errorf("on the first image's worker another image is credited %d, the same image %d; want less: the text before the image only",
						otherImage, sameImage)
				}
				if again := send(cat); again.worker != first.worker {
					t.Errorf("the same image went to worker %s, not %s, which has its prompt", again.worker, first.worker)
				}
				send(dog)
				waitReleased(t, r.node)
				m := r.metrics(t)
				if n, _ := metricValue(m, `kvfast_multimodal_requests_total{routing="approximate"}`); n < 3 {
					t.Errorf("kvfast_multimodal_requests_total{routing=\"approximate\"} = %v, want at least 3", n)
				}
				if n, _ := metricValue(m, `kvfast_multimodal_requests_total{routing="exact"}`); n != 0 {
					t.Errorf("kvfast_multimodal_requests_total{routing=\"exact\"} = %v, want 0", n)
				}
				return
			}
			// The owner's subscriber may have missed the first batch; it
			// catches up from the replay socket on a later live one.
			want := full
			for n := 0; overlapOn(cat, first.worker) != want; n++ {
				if n > 500 {
					t.Fatalf("the router never held the image prompt's blocks on worker %s: %d of %d",
						first.worker, overlapOn(cat, first.worker), want)
				}
				resp, err := http.Post(owner.URL()+"/v1/completions", "application/json",
					bytes.NewReader(completionBody(e2eTokens(uint32(9000+n), bs+1), false, 1)))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}

			again := send(cat)
			if again.worker != first.worker || again.overlap != want || again.cached < want*bs {
				t.Errorf("the same image: worker %s, overlap %d, engine cached %d tokens; want worker %s, overlap %d, at least %d cached",
					again.worker, again.overlap, again.cached, first.worker, want, want*bs)
			}
			if again.cached != again.overlap*bs {
				t.Errorf("the router credited %d blocks, the engine served %d cached tokens", again.overlap, again.cached)
			}
			// Another image after the same text: never credited beyond the
			// blocks before the image, which the engine indeed has.
			if got := overlapOn(dog, first.worker); got != before {
				t.Errorf("another image is credited with %d blocks on the cat's engine, want the %d before the image", got, before)
			}
			other := send(dog)
			if other.cached > 0 && other.cached < other.overlap*bs {
				t.Errorf("another image: the router credited %d blocks, the engine served %d cached tokens", other.overlap, other.cached)
			}

			waitReleased(t, r.node)
			m := r.metrics(t)
			if n, _ := metricValue(m, `kvfast_multimodal_requests_total{routing="`+tc.routing+`"}`); n < 3 {
				t.Errorf("kvfast_multimodal_requests_total{routing=%q} = %v, want at least 3", tc.routing, n)
			}
			if n, _ := metricValue(m, `kvfast_multimodal_requests_total{routing="approximate"}`); n != 0 {
				t.Errorf("kvfast_multimodal_requests_total{routing=\"approximate\"} = %v, want 0", n)
			}
			if wv := workerView(t, r.node, uint64(id), 0); wv.ZMQ == nil || wv.ZMQ.MultimodalBlocks == 0 ||
				wv.ZMQ.SkippedExtraKeys != 0 {
				t.Errorf("worker %d's feed: %+v", id, wv.ZMQ)
			}
		})
	}
}
