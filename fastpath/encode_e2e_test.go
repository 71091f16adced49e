package fastpath_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/internal/rig"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/workers"
)

// encodeRig is a router over an aggregated mock engine (worker 1, slot
// 0) and mock encode engines (workers 2, 3, ...), sharing the rig's
// encoder-cache store, plus any static workers.
type encodeRig struct {
	r        *e2eRouter
	agg      *mocker.Engine
	encoders []*mocker.Engine
}

func startEncodeRig(t *testing.T, encoders int, engine mocker.Config, static ...node.StaticWorker) *encodeRig {
	t.Helper()
	return startEncodeRigWith(t, e2eConfig(static...), encoders, engine, len(static))
}

// startEncodeRigWith is startEncodeRig for a router config of the test's
// own, naming static workers of which there are static.
func startEncodeRigWith(t *testing.T, cfg node.Config, encoders int, engine mocker.Config, static int) *encodeRig {
	t.Helper()
	roles := []workers.Role{workers.RoleBoth}
	for range encoders {
		roles = append(roles, workers.RoleEncode)
	}
	if engine.Speedup == 0 {
		engine.Speedup = 20
	}
	engine.WorkerID = 1
	r := startE2ERig(t, rig.Config{Node: cfg, Engines: len(roles), Roles: roles, Engine: engine})
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	if err := r.rig.WaitWorkers(ctx, len(roles)+static); err != nil {
		t.Fatal(err)
	}
	if got := r.node.Scheduler().StageWorkers(sched.StageEncode).Len(); got != encoders+static {
		t.Fatalf("%d encoders in the worker set, want %d", got, encoders+static)
	}
	return &encodeRig{r: r, agg: r.rig.Engines[0], encoders: r.rig.Engines[1:]}
}

// imageURL is a data: URL of an image made of seed's bytes.
func imageURL(seed string) string {
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString([]byte(strings.Repeat(seed, 64)))
}

// imagesChat is a chat request showing the images at urls.
func imagesChat(stream bool, urls ...string) []byte {
	var b strings.Builder
	b.WriteString(`{"max_tokens":4,"stream":`)
	if stream {
		b.WriteString("true")
	} else {
		b.WriteString("false")
	}
	b.WriteString(`,"messages":[{"role":"user","content":[{"type":"text","text":"compare these pictures"}`)
	for _, u := range urls {
		b.WriteString(`,{"type":"image_url","image_url":{"url":"` + u + `"}}`)
	}
	b.WriteString(`]}]}`)
	return []byte(b.String())
}

func encodeTotals(encoders []*mocker.Engine) (encoded, hits int64) {
	for _, e := range encoders {
		s := e.EncodeStats()
		encoded += s.Encoded
		hits += s.CacheHits
	}
	return encoded, hits
}

// TestEncodeFanOut: a request with two images has them encoded on the
// two encoders at once, one each, and then completes on the aggregated
// engine, which finds both handed over and encodes neither; every stage's
// booking is released, and the stage's metrics are observed.
func TestEncodeFanOut(t *testing.T) {
	er := startEncodeRig(t, 2, mocker.Config{})
	r := er.r
	for i, stream := range []bool{false, true} {
		body := imagesChat(stream, imageURL("a"+string(rune('0'+i))), imageURL("b"+string(rune('0'+i))))
		resp := r.post(t, fastpath.PathChatCompletions, body, nil)
		if resp.status != http.StatusOK {
			t.Fatalf("status %d: %s", resp.status, resp.body)
		}
		if w := resp.header.Get(fastpath.HeaderWorker); w != "1" {
			t.Errorf("answered by worker %q, want the aggregated engine, 1", w)
		}
		if stream {
			if items, finish, done, errEv := readStream(t, resp.body); items != 4 || finish != "length" || !done || errEv {
				t.Errorf("stream: %d items, finish %q, done %v, error event %v", items, finish, done, errEv)
			}
		}
		waitReleased(t, r.node)
	}
	for i, e := range er.encoders {
		if s := e.EncodeStats(); s.Encoded != 2 {
			t.Errorf("encoder %d encoded %d items, want one of each request's two", i, s.Encoded)
		}
	}
	if s := er.agg.EncodeStats(); s.HandedOver != 4 || s.Encoded != 0 {
		t.Errorf("aggregated engine: %+v; want the 4 images handed over, none encoded", s)
	}
	m := r.metrics(t)
	wantMetric(t, m, `kvfast_encode_items_total{outcome="encoded"}`, 4)
	wantMetric(t, m, `kvfast_encode_items_per_request_count`, 2)
	wantMetric(t, m, `kvfast_encode_stage_seconds_count`, 2)
	wantMetric(t, m, `kvfast_requests_total{endpoint="chat_completions",status="ok"}`, 2)
}

// TestEncodeAffinity: images sent again go to the encoder that encoded
// them, whose encoder cache has them, though load alone would send the
// first of them to the other encoder.
func TestEncodeAffinity(t *testing.T) {
	er := startEncodeRig(t, 2, mocker.Config{})
	r := er.r
	x, y := imageURL("x"), imageURL("y")
	if resp := r.post(t, fastpath.PathChatCompletions, imagesChat(false, x, y), nil); resp.status != http.StatusOK {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	waitReleased(t, r.node)
	for _, order := range [][]string{{y, x}, {x, y}, {y, x}} {
		if resp := r.post(t, fastpath.PathChatCompletions, imagesChat(false, order...), nil); resp.status != http.StatusOK {
			t.Fatalf("status %d: %s", resp.status, resp.body)
		}
		waitReleased(t, r.node)
	}
	if encoded, hits := encodeTotals(er.encoders); encoded != 2 || hits != 6 {
		t.Errorf("encoders encoded %d items and found %d in their caches; want each image encoded once and found there 3 times", encoded, hits)
	}
	for i, e := range er.encoders {
		if s := e.EncodeStats(); s.Encoded != 1 || s.CacheHits != 3 {
			t.Errorf("encoder %d: %+v; want one image, encoded once and then found three times", i, s)
		}
	}
	m := r.metrics(t)
	wantMetric(t, m, `kvfast_encoder_affinity_total{result="hit"}`, 6)
	wantMetric(t, m, `kvfast_encoder_affinity_total{result="miss"}`, 2)
}

// encoderAnswering is an encode worker answering every item with answer,
// and the count of items it was sent.
func encoderAnswering(t *testing.T, answer fasthttp.RequestHandler) (node.StaticWorker, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	e := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		n.Add(1)
		answer(ctx)
	})
	return node.StaticWorker{ID: 9, Endpoint: "http://" + e.addr(), Model: mocker.DefaultModel, Role: workers.RoleEncode}, &n
}

// TestEncodeFailureRecovers: an item whose encoder fails is encoded on
// another encoder; with no encoder left that works, the aggregated engine
// encodes it itself. Either way the request completes and every booking
// is released.
func TestEncodeFailureRecovers(t *testing.T) {
	// Two items, booked one after the other, go to the two encoders: the
	// bad one gets one of them. A 5xx or a 404 is retried on the other
	// encoder; another 4xx judges the item, which every encoder would judge alike: it is
	// not retried, and the engine gets it as sent.
	for _, tc := range []struct {
		name                    string
		status                  int
		goodEncoded, aggEncoded int64 // aggEncoded: by the engine, refused by the bad encoder
	}{
		{"retry on another encoder", fasthttp.StatusInternalServerError, 2, 0},
		{"a 404 is the encoder's (it does not serve the model): retried", fasthttp.StatusNotFound, 2, 0},
		{"a 4xx is not retried", fasthttp.StatusBadRequest, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad, sent := encoderAnswering(t, func(ctx *fasthttp.RequestCtx) {
				ctx.SetStatusCode(tc.status)
				ctx.SetBodyString(`{"error":{"message":"cannot encode the item","type":"BadRequestError"}}`)
			})
			er := startEncodeRig(t, 1, mocker.Config{}, bad)
			r := er.r
			resp := r.post(t, fastpath.PathChatCompletions, imagesChat(false, imageURL("p"), imageURL("q")), nil)
			if resp.status != http.StatusOK {
				t.Fatalf("status %d: %s", resp.status, resp.body)
			}
			waitReleased(t, r.node)
			if sent.Load() != 1 {
				t.Errorf("the bad encoder got %d items, want 1", sent.Load())
			}
			if s := er.encoders[0].EncodeStats(); s.Encoded != tc.goodEncoded {
				t.Errorf("the working encoder encoded %d items, want %d", s.Encoded, tc.goodEncoded)
			}
			if s := er.agg.EncodeStats(); s.HandedOver != 2-tc.aggEncoded || s.Encoded != tc.aggEncoded {
				t.Errorf("aggregated engine: %+v; want %d images handed over, %d encoded", s, 2-tc.aggEncoded, tc.aggEncoded)
			}
			m := r.metrics(t)
			wantMetric(t, m, `kvfast_encode_items_total{outcome="encoded"}`, float64(tc.goodEncoded))
			wantMetric(t, m, `kvfast_encode_items_total{outcome="refused"}`, float64(tc.aggEncoded))
			wantMetric(t, m, `kvfast_encode_items_total{outcome="fallback_local"}`, 0)
		})
	}
	// With no encoder that works, the aggregated engine encodes the items
	// itself: the encoder answers each with an error status, or with a
	// success status that is no encoding (an error object, a stream
	// where JSON was asked for), which is as much a failure.
	for name, answer := range map[string]fasthttp.RequestHandler{
		"fall back to the engine": func(ctx *fasthttp.RequestCtx) {
			ctx.SetStatusCode(fasthttp.StatusInternalServerError)
			ctx.SetBodyString(`{"error":{"message":"encoder out of memory","type":"server_error"}}`)
		},
		"fall back after an error under a 2xx": func(ctx *fasthttp.RequestCtx) {
			ctx.SetBodyString(`{"error":{"message":"oom","code":500}}`)
		},
		"fall back after a stream": func(ctx *fasthttp.RequestCtx) {
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyString("data: [DONE]\n\n")
		},
	} {
		t.Run(name, func(t *testing.T) {
			bad, sent := encoderAnswering(t, answer)
			er := startEncodeRig(t, 0, mocker.Config{}, bad)
			r := er.r
			resp := r.post(t, fastpath.PathChatCompletions, imagesChat(false, imageURL("p"), imageURL("q")), nil)
			if resp.status != http.StatusOK {
				t.Fatalf("status %d: %s", resp.status, resp.body)
			}
			waitReleased(t, r.node)
			if sent.Load() != 2 {
				t.Errorf("the failing encoder got %d items, want each once (no other encoder to retry on)", sent.Load())
			}
			if s := er.agg.EncodeStats(); s.Encoded != 2 || s.HandedOver != 0 {
				t.Errorf("aggregated engine: %+v; want both images encoded locally", s)
			}
			m := r.metrics(t)
			wantMetric(t, m, `kvfast_encode_items_total{outcome="fallback_local"}`, 2)
			wantMetric(t, m, `kvfast_encode_items_total{outcome="encoded"}`, 0)
		})
	}
}

// TestHungEncoderIsGivenUp: an encoder that takes items and never answers
// is given up on after --encode-timeout, not the first-byte timeout (10
// minutes by default, per attempt), and the engine encodes the items.
func TestHungEncoderIsGivenUp(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	hung, sent := encoderAnswering(t, func(*fasthttp.RequestCtx) { <-release })
	cfg := e2eConfig(hung)
	cfg.HTTP.Encode.Timeout = 200 * time.Millisecond
	er := startEncodeRigWith(t, cfg, 0, mocker.Config{}, 1)
	r := er.r
	resp := r.post(t, fastpath.PathChatCompletions, imagesChat(false, imageURL("p")), nil)
	if resp.status != http.StatusOK {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	waitReleased(t, r.node)
	if sent.Load() != 1 {
		t.Errorf("the hung encoder got %d items, want 1", sent.Load())
	}
	if s := er.agg.EncodeStats(); s.Encoded != 1 {
		t.Errorf("aggregated engine: %+v; want the image encoded locally", s)
	}
	wantMetric(t, r.metrics(t), `kvfast_encode_items_total{outcome="fallback_local"}`, 1)
}

// TestEncodeCancel: a client that leaves while its items are being
// encoded has every encode stage's booking released at once, though the
// encoders are still busy, and the request reaches no other engine.
func TestEncodeCancel(t *testing.T) {
	timing := mocker.DefaultTiming
	timing.EncodePerItem = time.Hour // until the client leaves
	er := startEncodeRig(t, 2, mocker.Config{Speedup: 1, Timing: timing})
	r := er.r
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.url+fastpath.PathChatCompletions,
			bytes.NewReader(imagesChat(true, imageURL("slow1"), imageURL("slow2"))))
		req.Header.Set("Content-Type", "application/json")
		resp, err := r.client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	waitFor(t, "both items being encoded", func() bool {
		n := int64(0)
		for _, e := range er.encoders {
			n += e.EncodeStats().Encoding
		}
		return n == 2
	})
	if reservationsReleased(r.node.Snapshot()) {
		t.Fatal("no booking while the items are being encoded")
	}
	cancel()
	if err := <-done; err == nil {
		t.Error("the cancelled request was answered")
	}
	waitReleased(t, r.node)
	waitFor(t, "the cancelled request to be counted", func() bool {
		v, _ := metricValue(r.metrics(t), `kvfast_requests_total{endpoint="chat_completions",status="cancelled"}`)
		return v == 1
	})
	if s := er.agg.Stats(); s.Finished != 0 {
		t.Errorf("the aggregated engine got the cancelled request: %+v", s)
	}
}

// TestEncodeMediaLimits: a request with more images than the router
// accepts, or a larger one, is refused with a clear client error before
// any encoder is asked.
func TestEncodeMediaLimits(t *testing.T) {
	cfg := e2eConfig()
	cfg.HTTP.Encode.MaxItemBytes = 1 << 10
	er := startEncodeRigWith(t, cfg, 1, mocker.Config{}, 0)
	r := er.r
	urls := make([]string, 65)
	for i := range urls {
		urls[i] = "https://example.com/" + strings.Repeat("i", i+1) + ".png"
	}
	resp := r.post(t, fastpath.PathChatCompletions, imagesChat(false, urls...), nil)
	if resp.status != http.StatusBadRequest || checkOpenAIError(t, resp.body) != "too_many_media_items" ||
		!bytes.Contains(resp.body, []byte("at most 64 (the router's --encode-max-items)")) {
		t.Errorf("65 images: %d %s", resp.status, resp.body)
	}
	huge := "data:image/png;base64," + strings.Repeat("QUFB", 1<<10)
	resp = r.post(t, fastpath.PathChatCompletions, imagesChat(false, huge), nil)
	if resp.status != http.StatusRequestEntityTooLarge || checkOpenAIError(t, resp.body) != "media_item_too_large" ||
		!bytes.Contains(resp.body, []byte("at most 1024 bytes (the router's --encode-max-item-bytes)")) {
		t.Errorf("an image of 3 KiB: %d %s", resp.status, resp.body)
	}
	if s := er.encoders[0].EncodeStats(); s.Encoded != 0 {
		t.Errorf("an encoder was asked: %+v", s)
	}
}

// TestEncodeThenDisagg: under --disagg vllm, the items are encoded
// first; the prefill engine finds them handed over, computes the prompt
// and hands its KV to the decode engine, which encodes nothing.
func TestEncodeThenDisagg(t *testing.T) {
	cfg := e2eConfig()
	cfg.HTTP.Disagg = fastpath.DisaggConfig{Protocol: fastpath.DisaggVLLM, MinRemoteTokens: 1}
	roles := []workers.Role{workers.RolePrefill, workers.RoleDecode, workers.RoleEncode}
	r := startE2ERig(t, rig.Config{Node: cfg, Engines: len(roles), Roles: roles, Engine: mocker.Config{WorkerID: 1, Speedup: 20}})
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	if err := r.rig.WaitWorkers(ctx, len(roles)); err != nil {
		t.Fatal(err)
	}
	pre, dec, enc := r.rig.Engines[0], r.rig.Engines[1], r.rig.Engines[2]
	resp := r.post(t, fastpath.PathChatCompletions, imagesChat(true, imageURL("e"), imageURL("f")), nil)
	if resp.status != http.StatusOK {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	if p, d := resp.header.Get(fastpath.HeaderPrefillWorker), resp.header.Get(fastpath.HeaderWorker); p != "1" || d != "2" {
		t.Errorf("prefill worker %q, decode worker %q; want 1 and 2", p, d)
	}
	if items, finish, done, errEv := readStream(t, resp.body); items != 4 || finish != "length" || !done || errEv {
		t.Errorf("stream: %d items, finish %q, done %v, error event %v", items, finish, done, errEv)
	}
	waitReleased(t, r.node)
	if s := enc.EncodeStats(); s.Encoded != 2 {
		t.Errorf("encoder: %+v; want both images encoded", s)
	}
	if s := pre.EncodeStats(); s.HandedOver != 2 || s.Encoded != 0 {
		t.Errorf("prefill engine: %+v; want both images handed over", s)
	}
	if s := dec.EncodeStats(); s.HandedOver != 0 || s.Encoded != 0 {
		t.Errorf("decode engine: %+v; want no image looked at: it gets the KV", s)
	}
	if s := dec.Stats(); s.BlocksTransferred == 0 {
		t.Error("the decode engine pulled no KV")
	}
}

// TestEncodeNotRunForARefusedRequest: a request that selection refuses
// whatever the load (pinned to an encoder, or to a worker its allow-list
// excludes) is refused before any of its items is encoded.
func TestEncodeNotRunForARefusedRequest(t *testing.T) {
	enc, asked := encoderAnswering(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(fasthttp.StatusInternalServerError)
	})
	er := startEncodeRig(t, 0, mocker.Config{}, enc)
	r := er.r
	for _, tc := range []struct {
		hdr  map[string]string
		code string
	}{
		{map[string]string{fastpath.HeaderWorker: "9"}, "pin_excluded"},
		// An allow-list of encoders alone has no worker to generate on.
		{map[string]string{fastpath.HeaderWorker: "1", fastpath.HeaderAllow: "9"}, "allow_excluded"},
	} {
		resp := r.post(t, fastpath.PathChatCompletions, imagesChat(false, imageURL("x")), tc.hdr)
		if resp.status != http.StatusBadRequest || checkOpenAIError(t, resp.body) != tc.code {
			t.Errorf("%v: %d %s, want 400 %s", tc.hdr, resp.status, resp.body, tc.code)
		}
	}
	// So does one without a pin, with or without images: whatever the
	// load, a client error.
	for path, body := range map[string][]byte{fastpath.PathChatCompletions: imagesChat(false, imageURL("x")), fastpath.PathCompletions: []byte(`{"prompt":[1,2,3],"max_tokens":1}`)} {
		resp := r.post(t, path, body, map[string]string{fastpath.HeaderAllow: "9"})
		if resp.status != http.StatusBadRequest || checkOpenAIError(t, resp.body) != "allow_excluded" {
			t.Errorf("allow-list of the encoder alone: %d %s, want 400 allow_excluded", resp.status, resp.body)
		}
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("the encoder was sent %d items of requests refused anyway", n)
	}
	waitReleased(t, r.node)
}
