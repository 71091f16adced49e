package epp_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfast/kvfast/epp"
)

// modelServer is an endpoint's GET /v1/models, as vLLM answers it: the
// base model, and each adapter with the base model as its parent.
func modelServer(t *testing.T, adapters ...string) string {
	t.Helper()
	return keyedModelServer(t, "", "vllm", adapters...)
}

// keyedModelServer is an engine's GET /v1/models (owned_by names the
// engine: vllm, sglang) behind its --api-key: 401 without Authorization:
// Bearer key, unless key is empty.
func keyedModelServer(t *testing.T, key, ownedBy string, adapters ...string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/models" {
			http.NotFound(w, r)
			return
		}
		if key != "" && r.Header.Get("Authorization") != "Bearer "+key {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"Unauthorized"}`))
			return
		}
		var b strings.Builder
		fmt.Fprintf(&b, `{"object":"list","data":[{"id":%q,"object":"model","owned_by":%q,"parent":null}`, testModel, ownedBy)
		for _, a := range adapters {
			fmt.Fprintf(&b, `,{"id":%q,"object":"model","owned_by":%q,"parent":%q}`, a, ownedBy, testModel)
		}
		b.WriteString("]}")
		_, _ = w.Write([]byte(b.String()))
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// TestAdapterRequestsGoWhereTheAdapterIs: a request naming a LoRA adapter
// goes to an endpoint that lists it in /v1/models; another would answer
// 404 (or load it in place of another adapter). SGLang's spellings
// (base:adapter, lora_path beside the base model) do so among SGLang
// engines only: vLLM ignores lora_path, serving the base model, and
// refuses base:adapter, so there they route as the base model does, among
// all. A request for the base model, or for an adapter no endpoint lists,
// routes among all.
func TestAdapterRequestsGoWhereTheAdapterIs(t *testing.T) {
	t.Run("SGLang", func(t *testing.T) {
		adapterRouting(t, "", true, keyedModelServer(t, "", "sglang", "lora-a"), keyedModelServer(t, "", "sglang"))
	})
	t.Run("vLLM", func(t *testing.T) {
		adapterRouting(t, "", false, modelServer(t, "lora-a"), modelServer(t))
	})
	// Engines started with an API key keep /v1/models behind it: the
	// picker asks with --engine-api-key-file's key.
	t.Run("keyed", func(t *testing.T) {
		adapterRouting(t, "engine-key", true, keyedModelServer(t, "engine-key", "sglang", "lora-a"), keyedModelServer(t, "engine-key", "sglang"))
	})
}

func adapterRouting(t *testing.T, key string, sglang bool, with, without string) {
	cfg := epp.DefaultConfig()
	cfg.EngineToken = key
	r := startEPP(t, cfg, epp.Endpoint{Address: with}, epp.Endpoint{Address: without})
	pollAdapters(t, r)
	route := freshRouter(t, r)
	// Until the first poll the adapter routes anywhere; then only there.
	waitFor(t, "the adapter's endpoint to be learned", func() bool { return route("lora-a") == with })
	// SGLang's spellings: base:adapter, and lora_path beside the base
	// model (spliced into the body in model's place).
	spellings := []string{testModel + ":lora-a", testModel + `","lora_path":"lora-a`}
	seen := map[string]int{}
	spelled := map[string]int{}
	for range 32 {
		if dest := route("lora-a"); dest != with {
			t.Fatalf("a request for lora-a went to %s, which does not list it", dest)
		}
		for _, model := range spellings {
			dest := route(model)
			if sglang && dest != with {
				t.Fatalf("a request for lora-a as model %q went to %s, which does not list it", model, dest)
			}
			spelled[dest]++
		}
		seen[route("lora-unknown")]++
	}
	if len(seen) != 2 {
		t.Errorf("requests for an adapter no endpoint lists went to %v; want both endpoints", seen)
	}
	if !sglang && len(spelled) != 2 {
		t.Errorf("SGLang's spellings of an adapter only vLLM engines list went to %v; want both endpoints", spelled)
	}
	settled(t, r)
}

// TestSilentEndpointIsRoutedAround: a static endpoint has no readiness;
// one that stops answering the picker's polls (here 503, as a proxy in
// front of a dead engine answers; refused connections count alike) is
// routed around after a few polls, and routed to again at its first
// answer.
func TestSilentEndpointIsRoutedAround(t *testing.T) {
	var down, wellDown atomic.Bool
	var sickPolls, wellPolls atomic.Int64
	sickAddr, well := silenceableModelServer(t, &down, &sickPolls), silenceableModelServer(t, &wellDown, &wellPolls)
	r := startEPP(t, epp.DefaultConfig(), epp.Endpoint{Address: sickAddr}, epp.Endpoint{Address: well})
	pollAdapters(t, r)
	routeModel := freshRouter(t, r)
	route := func() string { return routeModel(testModel) }
	healthy := func(addr string) bool {
		slot, ok := r.picker.SlotOf(addr)
		if !ok {
			t.Fatalf("no worker for %s", addr)
		}
		return r.picker.Sched().Load(slot).Healthy
	}
	down.Store(true)
	waitFor(t, "the silent endpoint to be routed around", func() bool { return !healthy(sickAddr) })
	for range 16 {
		if dest := route(); dest != well {
			t.Fatalf("a request went to %s, which stopped answering", dest)
		}
	}
	down.Store(false)
	waitFor(t, "the endpoint to be routed to again", func() bool { return healthy(sickAddr) })
	seen := map[string]int{}
	for range 32 {
		seen[route()]++
	}
	if seen[sickAddr] == 0 {
		t.Errorf("no request went to the endpoint once it answered again: %v", seen)
	}
	// None answers: likelier the picker's own network than every engine,
	// so all stay routed rather than every request refused.
	down.Store(true)
	wellDown.Store(true)
	// Polls run one after another: once each endpoint has seen the 8th,
	// the picker has judged the 7th, past its 3 misses.
	sick0, well0 := sickPolls.Load(), wellPolls.Load()
	waitFor(t, "polls to go unanswered", func() bool { return sickPolls.Load()-sick0 >= 8 && wellPolls.Load()-well0 >= 8 })
	if !healthy(sickAddr) || !healthy(well) {
		t.Fatalf("with no endpoint answering, healthy: %v and %v; want both routed", healthy(sickAddr), healthy(well))
	}
	route()
	settled(t, r)
}

// silenceableModelServer is modelServer answering 503 while silent is
// set, counting the requests it gets.
func silenceableModelServer(t *testing.T, silent *atomic.Bool, polls *atomic.Int64) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		polls.Add(1)
		if silent.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","parent":null}]}`, testModel)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// pollAdapters runs the picker's adapter poll, every 10 ms, for the test.
func pollAdapters(t *testing.T, r *eppRig) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.picker.RunAdapters(ctx, 10*time.Millisecond)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// freshRouter returns a function that routes a new prompt for a model and
// returns the endpoint chosen. Each prompt is new: the endpoints publish
// no events, so a prompt seen before would follow the picker's history.
func freshRouter(t *testing.T, r *eppRig) func(model string) string {
	prompts := uint32(0)
	return func(model string) string {
		t.Helper()
		prompts++
		st := r.open(t, duplexMode())
		st.requestHeaders("/v1/completions", false, nil)
		st.requestBody(bytes.Replace(completionBody(t, tokens(prompts*1000, 64), false), []byte(`"`+testModel+`"`), []byte(`"`+model+`"`), 1), true)
		hr := st.recv()
		dest := destinationOf(t, hr, hr.GetRequestHeaders().GetResponse())
		st.cancel()
		return dest
	}
}
