package fastpath_test

import (
	"bytes"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/internal/testnet"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
)

// TestSickEnginesAreEjected is issue 12's seven engines that answer 500 to
// every request but pass /health, next to one good engine. Requests are
// sent one at a time, so each verdict lands before the next selection and
// the bounds below are exact, whatever order the policy tries workers in:
//   - an engine is ejected at its 3rd failure in a row and not selected
//     again within the test (the ejection lasts a minute), so the sick
//     engines see at most 7 × 3 = 21 requests between them;
//   - a client request fails only when all its 1 + MaxRetries = 3 attempts
//     hit sick engines, so at most 21 / 3 = 7 of them fail, and none once
//     the seven are ejected.
func TestSickEnginesAreEjected(t *testing.T) {
	const sick, consecutive, requests = 7, 3, 60
	var static []node.StaticWorker
	var engines []*e2eEngine
	for i := range sick {
		e := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
			ctx.SetStatusCode(fasthttp.StatusInternalServerError)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"error":{"message":"sick","type":"server_error"}}`)
		})
		engines = append(engines, e)
		static = append(static, node.StaticWorker{ID: uint64(i + 1), Endpoint: e.addr(), Model: e2eModel})
	}
	good := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"c","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`)
	})
	static = append(static, node.StaticWorker{ID: 100, Endpoint: good.addr(), Model: e2eModel})
	cfg := e2eConfig(static...)
	cfg.Policy = "round-robin" // spread the first requests over the sick engines too
	cfg.HTTP.MaxRetries = 2
	cfg.Dispatch.Outlier.Consecutive = consecutive
	cfg.Dispatch.Outlier.FailurePercent = 0
	cfg.Dispatch.Outlier.MaxEjectedPercent = 90 // 7 of 8
	cfg.Dispatch.Outlier.BaseEjection = time.Minute
	r := startE2ERouter(t, cfg)

	body := completionBody(e2eTokens(12, 32), false, 2)
	failed := 0
	for i := range requests {
		resp := r.post(t, fastpath.PathCompletions, body, nil)
		switch {
		case resp.status == http.StatusOK:
		case resp.status == http.StatusInternalServerError:
			failed++
		default:
			t.Fatalf("request %d: status %d: %s", i, resp.status, resp.body)
		}
	}
	sickCalls := int64(0)
	for _, e := range engines {
		sickCalls += e.requests.Load()
	}
	if sickCalls > sick*consecutive || failed > sick {
		t.Errorf("sick engines saw %d requests (at most %d) and %d of %d client requests failed (at most %d)",
			sickCalls, sick*consecutive, failed, requests, sick)
	}
	// Ejected or not, every engine got its chance.
	if sickCalls < sick*consecutive {
		t.Errorf("sick engines saw only %d requests; each should have failed %d times before its ejection", sickCalls, consecutive)
	}
	for i := range sick {
		if v := workerView(t, r.node, uint64(i+1), 0); !v.Ejected || v.Ejections != 1 || v.Healthy || v.EjectedSeconds <= 0 {
			t.Errorf("sick worker %d: ejected %v, %d ejections, healthy %v, %.1fs left; want ejected once", i+1, v.Ejected, v.Ejections, v.Healthy, v.EjectedSeconds)
		}
	}
	if v := workerView(t, r.node, 100, 0); v.Ejected || v.Ejections != 0 || !v.Healthy {
		t.Errorf("the good worker: ejected %v, %d ejections, healthy %v", v.Ejected, v.Ejections, v.Healthy)
	}
	// Once the sick engines are out, everything succeeds.
	for i := range 10 {
		if resp := r.post(t, fastpath.PathCompletions, body, nil); resp.status != http.StatusOK || resp.header.Get(fastpath.HeaderWorker) != "100" {
			t.Fatalf("request %d after the ejections: status %d from worker %s", i, resp.status, resp.header.Get(fastpath.HeaderWorker))
		}
	}
	waitReleased(t, r.node)
	m := r.metrics(t)
	for i := range sick {
		id := strconv.Itoa(i + 1)
		wantMetric(t, m, `kvfast_worker_ejected{dp_rank="0",worker="`+id+`"}`, 1)
		wantMetric(t, m, `kvfast_worker_ejections_total{dp_rank="0",worker="`+id+`"}`, 1)
	}
	wantMetric(t, m, `kvfast_worker_ejected{dp_rank="0",worker="100"}`, 0)
}

// TestPoisonRequestEjectsNoEngine: a prompt every engine answers with a
// 500 (one that crashes the model), sent again and again between
// ordinary requests, is retried on the engines it may go to and answered
// with the last engine's 500, but counts against no engine, since each
// serves the other requests; the 5xx answers are counted as
// unattributed. Without that, it would eject one engine per three
// sends, up to --eject-max-percent of the pool.
func TestPoisonRequestEjectsNoEngine(t *testing.T) {
	const engines, poison = 4, 12
	poisonBody := completionBody(e2eTokens(99, 32), false, 2)
	var static []node.StaticWorker
	for i := range engines {
		e := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
			ctx.SetContentType("application/json")
			if bytes.Equal(ctx.PostBody(), poisonBody) {
				ctx.SetStatusCode(fasthttp.StatusInternalServerError)
				ctx.SetBodyString(`{"error":{"message":"the model crashed","type":"server_error"}}`)
				return
			}
			ctx.SetBodyString(`{"id":"c","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`)
		})
		static = append(static, node.StaticWorker{ID: uint64(i + 1), Endpoint: e.addr(), Model: e2eModel})
	}
	cfg := e2eConfig(static...)
	cfg.Policy = "round-robin"
	cfg.HTTP.MaxRetries = 2
	cfg.Dispatch.Outlier.Consecutive = 2
	cfg.Dispatch.Outlier.FailurePercent = 0
	cfg.Dispatch.Outlier.Window = time.Hour // however slow the machine, the engines served within it
	cfg.Dispatch.Outlier.MaxEjectedPercent = 100
	cfg.Dispatch.Outlier.BaseEjection = time.Minute
	r := startE2ERouter(t, cfg)

	ordinary := func() {
		t.Helper()
		for i := range engines {
			if resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(uint32(i+1), 32), false, 2), nil); resp.status != http.StatusOK {
				t.Fatalf("an ordinary request: status %d: %s", resp.status, resp.body)
			}
		}
	}
	// Three poison requests in a row are nine attempts, at least two in a
	// row on every engine: enough to eject each, were they held against it.
	for i := range poison {
		if i%3 == 0 {
			ordinary()
		}
		if resp := r.post(t, fastpath.PathCompletions, poisonBody, nil); resp.status != http.StatusInternalServerError {
			t.Fatalf("poison request %d: status %d: %s; want the engines' 500", i, resp.status, resp.body)
		}
	}
	for i := range engines {
		if v := workerView(t, r.node, uint64(i+1), 0); v.Ejected || v.Ejections != 0 {
			t.Errorf("worker %d was ejected %d times by a request no engine served", i+1, v.Ejections)
		}
	}
	waitReleased(t, r.node)
	m := r.metrics(t)
	wantMetric(t, m, "kvfast_dispatch_unattributed_5xx_total", poison*3)
	wantMetric(t, m, "kvfast_dispatch_retries_total", poison*2)
}

// TestLoneEngineFailureReachesClient: when no other engine could take a
// retry, the client learns what the one engine did. An engine's 5xx is
// relayed as it came, and asked once, instead of being dropped for a
// retry that finds no worker and answers "no worker available"; an
// engine that refuses connections is reported as unreachable.
func TestLoneEngineFailureReachesClient(t *testing.T) {
	const engineError = `{"error":{"message":"out of memory","type":"server_error","code":500}}`
	sick := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(fasthttp.StatusInternalServerError)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(engineError)
	})
	cfg := e2eConfig(node.StaticWorker{ID: 1, Endpoint: sick.addr(), Model: e2eModel})
	cfg.HTTP.MaxRetries = 2
	r := startE2ERouter(t, cfg)
	resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(13, 32), false, 2), nil)
	if resp.status != http.StatusInternalServerError || string(resp.body) != engineError {
		t.Errorf("a lone engine's 500: client got %d %s; want the engine's answer", resp.status, resp.body)
	}
	if n := sick.requests.Load(); n != 1 {
		t.Errorf("the lone engine was asked %d times, want once", n)
	}
	waitReleased(t, r.node)

	cfg = e2eConfig(node.StaticWorker{ID: 2, Endpoint: testnet.RefusingAddr(t), Model: e2eModel})
	cfg.HTTP.MaxRetries = 2
	r = startE2ERouter(t, cfg)
	resp = r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(14, 32), false, 2), nil)
	if code := checkOpenAIError(t, resp.body); resp.status != http.StatusBadGateway || code != "engine_unavailable" {
		t.Errorf("a lone unreachable engine: client got %d %s; want 502 engine_unavailable", resp.status, resp.body)
	}
	waitReleased(t, r.node)
}

// TestEngineAPIKey: engines started with an API key of their own (vLLM's
// --api-key) serve the router's requests when it holds that key
// (--engine-api-key-file), whatever key the client sent, and the router
// learns a static worker's model from the engine's guarded /v1/models.
// Without the key the engine's 401 reaches the client as it came; with a
// wrong one, the client gets a 502 that names the router's key, not a 401
// that blames its own.
func TestEngineAPIKey(t *testing.T) {
	eng := startMock(t, mocker.Config{APIKey: "engine-key", Speedup: math.Inf(1)})
	body := []byte(`{"model":"` + mocker.DefaultModel + `","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17],"max_tokens":2}`)
	client := map[string]string{"Authorization": "Bearer client-key"}

	cfg := e2eConfig(node.StaticWorker{ID: 1, Endpoint: "http://" + eng.Addr()}) // its model comes from /v1/models
	cfg.Dispatch.EngineToken = "engine-key"
	r := startE2ERouter(t, cfg)
	if resp := r.post(t, fastpath.PathCompletions, body, client); resp.status != http.StatusOK {
		t.Fatalf("with the engine key: status %d: %s", resp.status, resp.body)
	}
	waitReleased(t, r.node)

	cfg = e2eConfig(node.StaticWorker{ID: 1, Endpoint: "http://" + eng.Addr(), Model: mocker.DefaultModel})
	r = startE2ERouter(t, cfg)
	if resp := r.post(t, fastpath.PathCompletions, body, client); resp.status != http.StatusUnauthorized {
		t.Errorf("without the engine key: status %d: %s; want the engine's 401", resp.status, resp.body)
	}
	waitReleased(t, r.node)

	cfg.Dispatch.EngineToken = "stale-key"
	r = startE2ERouter(t, cfg)
	if resp := r.post(t, fastpath.PathCompletions, body, client); resp.status != http.StatusBadGateway || !strings.Contains(string(resp.body), `"code":"engine_auth_failed"`) {
		t.Errorf("with a key the engine refuses: status %d: %s; want a 502 engine_auth_failed", resp.status, resp.body)
	}
	waitReleased(t, r.node)
}

// TestEngineWithAnotherKeyIsRoutedAround: one of two engines was
// restarted with another key. With the router holding the engines' key,
// its 401 is the engine's failure: each request it refuses is retried on
// the other engine and every client request succeeds, and the engine is
// ejected as any failing engine is, or, once the poll of the engines'
// models has heard it refuse the key, not routed to at all.
func TestEngineWithAnotherKeyIsRoutedAround(t *testing.T) {
	good := startMock(t, mocker.Config{APIKey: "engine-key", Speedup: math.Inf(1)})
	other := startMock(t, mocker.Config{APIKey: "rotated-key", Speedup: math.Inf(1)})
	cfg := e2eConfig(
		node.StaticWorker{ID: 1, Endpoint: "http://" + good.Addr(), Model: mocker.DefaultModel},
		node.StaticWorker{ID: 2, Endpoint: "http://" + other.Addr(), Model: mocker.DefaultModel})
	cfg.Dispatch.EngineToken = "engine-key"
	cfg.Policy = "round-robin" // the refusing engine gets its turns
	cfg.HTTP.MaxRetries = 1
	cfg.Dispatch.Outlier.Consecutive = 2
	cfg.Dispatch.Outlier.FailurePercent = 0
	cfg.Dispatch.Outlier.MaxEjectedPercent = 50
	cfg.Dispatch.Outlier.BaseEjection = time.Minute
	r := startE2ERouter(t, cfg)
	for i := range 8 {
		body := completionBody(e2eTokens(uint32(40+i), 32), false, 2)
		body = bytes.Replace(body, []byte(`"model":"`+e2eModel+`"`), []byte(`"model":"`+mocker.DefaultModel+`"`), 1)
		if resp := r.post(t, fastpath.PathCompletions, body, nil); resp.status != http.StatusOK || resp.header.Get(fastpath.HeaderWorker) != "1" {
			t.Fatalf("request %d: status %d from worker %s: %s", i, resp.status, resp.header.Get(fastpath.HeaderWorker), resp.body)
		}
	}
	if v := workerView(t, r.node, 2, 0); !v.Ejected && !v.KeyRefused {
		t.Errorf("the engine refusing the router's key: ejected %v, %d ejections, key_refused %v; want ejected or key_refused", v.Ejected, v.Ejections, v.KeyRefused)
	}
	waitReleased(t, r.node)
}
