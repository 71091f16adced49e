package fastpath_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/internal/rig"
	"github.com/kvfast/kvfast/internal/testnet"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
	"github.com/kvfast/kvfast/workers"
)

// disaggRig is a router in disaggregated mode over mock engines
// registered in its segment with their roles: one prefill engine (worker
// 1) and two decode engines (workers 2 and 3).
type disaggRig struct {
	r       *e2eRouter
	prefill *mocker.Engine
	decode  []*mocker.Engine
}

func startDisaggRig(t *testing.T, dis fastpath.DisaggConfig, sglang bool) *disaggRig {
	t.Helper()
	cfg := e2eConfig()
	cfg.HTTP.Disagg = dis
	r := startE2ERig(t, rig.Config{Node: cfg})
	engine := func(id uint64, role workers.Role) *mocker.Engine {
		return startMock(t, mocker.Config{WorkerID: id, Role: role, Segment: r.rig.SegmentPath, SGLangBootstrap: sglang, KVBlocks: 2048})
	}
	d := &disaggRig{r: r, prefill: engine(1, workers.RolePrefill)}
	d.decode = []*mocker.Engine{engine(2, workers.RoleDecode), engine(3, workers.RoleDecode)}
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	if err := r.rig.WaitWorkers(ctx, 3); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[uint64]workers.Role{1: workers.RolePrefill, 2: workers.RoleDecode, 3: workers.RoleDecode} {
		slot, _ := r.node.Scheduler().Resolve(id, 0)
		if info, _ := r.node.Scheduler().Worker(slot); info.Role != want {
			t.Fatalf("worker %d registered as %v, want %v", id, info.Role, want)
		}
	}
	return d
}

// streamText reads a whole SSE answer and returns its items' texts, the
// finish reasons and whether it ended with [DONE]; an error event fails
// the test unless allowed.
func readStream(t *testing.T, body []byte) (items int, finish string, done bool, errEvent bool) {
	t.Helper()
	rd := bufio.NewReader(bytes.NewReader(body))
	for {
		ev, err := readEvent(rd)
		if err != nil {
			return
		}
		data := bytes.TrimPrefix(bytes.TrimSpace(ev), []byte("data: "))
		if string(data) == "[DONE]" {
			done = true
			continue
		}
		var chunk struct {
			Choices []struct {
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Error any `json:"error"`
		}
		if err := json.Unmarshal(data, &chunk); err != nil {
			continue // an engine's garbage, relayed as it came
		}
		if chunk.Error != nil {
			errEvent = true
			continue
		}
		if len(chunk.Choices) > 0 {
			items++
			if f := chunk.Choices[0].FinishReason; f != nil {
				finish = *f
			}
		}
	}
}

func decisionCount(t *testing.T, r *e2eRouter, decision string) float64 {
	t.Helper()
	v, _ := metricValue(r.metrics(t), `kvfast_disagg_decisions_total{decision="`+decision+`"}`)
	return v
}

// TestDisaggVLLMTwoStages: a long prompt is prefilled on the prefill
// engine (one token, kv_transfer_params), its KV pulled by a decode
// engine, and the decode engine's stream relayed whole; both stages'
// bookings are released, the stage metrics observed.
func TestDisaggVLLMTwoStages(t *testing.T) {
	d := startDisaggRig(t, fastpath.DisaggConfig{Protocol: fastpath.DisaggVLLM, MinRemoteTokens: 64}, false)
	r := d.r
	for i, stream := range []bool{true, false} {
		resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(uint32(1+i), 300), stream, 12), nil)
		if resp.status != http.StatusOK {
			t.Fatalf("status %d: %s", resp.status, resp.body)
		}
		if got := resp.header.Get(fastpath.HeaderPrefillWorker); got != "1" {
			t.Errorf("prefill worker %q, want 1", got)
		}
		if w := resp.header.Get(fastpath.HeaderWorker); w != "2" && w != "3" {
			t.Errorf("decode worker %q, want 2 or 3", w)
		}
		if stream {
			items, finish, done, errEv := readStream(t, resp.body)
			if items != 12 || finish != "length" || !done || errEv {
				t.Errorf("stream: %d items, finish %q, done %v, error event %v; want 12 items ending in length and [DONE]", items, finish, done, errEv)
			}
		} else if !bytes.Contains(resp.body, []byte(`"finish_reason":"length"`)) || bytes.Contains(resp.body, []byte("kv_transfer_params")) {
			t.Errorf("plain answer: %s", resp.body)
		}
		waitReleased(t, r.node)
	}
	ps := d.prefill.Stats()
	if ps.Finished != 2 || ps.GeneratedTokens != 2 {
		t.Errorf("prefill engine: %d finished, %d tokens; want 2 one-token prefills", ps.Finished, ps.GeneratedTokens)
	}
	var transferred, decoded uint64
	totals := func() bool {
		transferred, decoded = 0, 0
		for _, e := range d.decode {
			s := e.Stats()
			transferred += s.BlocksTransferred
			decoded += s.GeneratedTokens
		}
		return decoded == 24
	}
	waitFor(t, "the decode engines' counters", totals)
	// 300 tokens are 18 full blocks of 16 before the last token.
	if transferred != 36 {
		t.Errorf("decode engines: %d blocks transferred, want 36", transferred)
	}
	// The prefill engine kept the blocks only until they were pulled.
	waitFor(t, "the prefill engine to release the pulled blocks", func() bool { return d.prefill.Stats().KVHeld == 0 })
	m := r.metrics(t)
	wantMetric(t, m, `kvfast_disagg_decisions_total{decision="remote"}`, 2)
	for _, st := range []string{"prefill", "transfer_wait", "first_decode_token"} {
		if v, ok := metricValue(m, `kvfast_disagg_stage_seconds_count{stage="`+st+`"}`); !ok || v < 1 {
			t.Errorf("stage %s observed %v times", st, v)
		}
	}
	if v, ok := metricValue(m, `kvfast_role_workers{role="decode"}`); !ok || v != 2 {
		t.Errorf("kvfast_role_workers{role=decode} = %v", v)
	}
}

// TestDisaggSlowPrefillDoesNotStallDecode: in vLLM's protocol the decode
// stage's request is sent only once the remote prefill is done, so a
// prefill slower than the stall time is not held against the decode
// worker, which has nothing to answer until then.
func TestDisaggSlowPrefillDoesNotStallDecode(t *testing.T) {
	const stallAfter = 50 * time.Millisecond
	cfg := e2eConfig()
	cfg.HTTP.Disagg = fastpath.DisaggConfig{Protocol: fastpath.DisaggVLLM, MinRemoteTokens: 64}
	cost := *cfg.Sched.Cost
	cost.StallAfter = stallAfter
	cfg.Sched.Cost = &cost
	r := startE2ERig(t, rig.Config{Node: cfg})
	// The prefill engine's one step takes eight stall times.
	prefill := startMock(t, mocker.Config{WorkerID: 1, Role: workers.RolePrefill, Segment: r.rig.SegmentPath, KVBlocks: 2048,
		Speedup: 1, Timing: mocker.Timing{StepOverhead: 8 * stallAfter}})
	for id := uint64(2); id <= 3; id++ {
		startMock(t, mocker.Config{WorkerID: id, Role: workers.RoleDecode, Segment: r.rig.SegmentPath, KVBlocks: 2048})
	}
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	if err := r.rig.WaitWorkers(ctx, 3); err != nil {
		t.Fatal(err)
	}
	// Watch the decode workers while the prefill runs: a snapshot taken
	// before the prefill engine has finished is one taken before the
	// decode stage could be sent.
	var stalledEarly atomic.Bool
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			snap := r.node.Snapshot()
			if prefill.Stats().Finished == 0 {
				for _, w := range snap.Workers {
					if w.WorkerID != 1 && w.Stalled {
						stalledEarly.Store(true)
					}
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	start := time.Now()
	resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(5, 300), true, 4), nil)
	took := time.Since(start)
	close(stop)
	<-stopped
	if resp.status != http.StatusOK || resp.header.Get(fastpath.HeaderPrefillWorker) != "1" {
		t.Fatalf("status %d, prefill worker %q: %s", resp.status, resp.header.Get(fastpath.HeaderPrefillWorker), resp.body)
	}
	if took < 8*stallAfter {
		t.Fatalf("the request took %v: the prefill was not slow, so the test proves nothing", took)
	}
	if stalledEarly.Load() {
		t.Fatal("a decode worker counted as stalled while the remote prefill ran")
	}
	waitReleased(t, r.node)
}

// TestDisaggConditional: a short uncached remainder and a prompt the
// decode worker mostly caches are prefilled locally; each decision is
// counted and the prefill engine never sees them.
func TestDisaggConditional(t *testing.T) {
	d := startDisaggRig(t, fastpath.DisaggConfig{Protocol: fastpath.DisaggVLLM, MinRemoteTokens: 64, LocalCachedFraction: 0.5}, false)
	r := d.r
	short := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(2, 40), false, 4), nil)
	if short.status != http.StatusOK || short.header.Get(fastpath.HeaderPrefillWorker) != "" {
		t.Fatalf("short prompt: status %d, prefill worker %q: %s", short.status, short.header.Get(fastpath.HeaderPrefillWorker), short.body)
	}
	if n := decisionCount(t, r, "local_short"); n != 1 {
		t.Errorf("local_short decisions %v, want 1", n)
	}
	long := e2eTokens(3, 320)
	first := r.post(t, fastpath.PathCompletions, completionBody(long, false, 4), nil)
	if first.status != http.StatusOK || first.header.Get(fastpath.HeaderPrefillWorker) != "1" {
		t.Fatalf("long prompt: status %d, prefill worker %q", first.status, first.header.Get(fastpath.HeaderPrefillWorker))
	}
	dw, _ := strconv.ParseUint(first.header.Get(fastpath.HeaderWorker), 10, 64)
	// The decode worker now holds the pulled blocks and says so in its
	// events: a continuation of the prompt is mostly cached there.
	waitFor(t, "the decode worker's blocks in the index", func() bool {
		return workerView(t, r.node, dw, 0).IndexBlocks >= 18
	})
	next := append(append([]uint32(nil), long...), e2eTokens(4, 96)...)
	again := r.post(t, fastpath.PathCompletions, completionBody(next, false, 4), nil)
	if again.status != http.StatusOK || again.header.Get(fastpath.HeaderPrefillWorker) != "" ||
		again.header.Get(fastpath.HeaderWorker) != first.header.Get(fastpath.HeaderWorker) {
		t.Fatalf("cached continuation: status %d, prefill %q, decode %q (first on %q)", again.status,
			again.header.Get(fastpath.HeaderPrefillWorker), again.header.Get(fastpath.HeaderWorker), first.header.Get(fastpath.HeaderWorker))
	}
	if n := decisionCount(t, r, "local_cached"); n != 1 {
		t.Errorf("local_cached decisions %v, want 1", n)
	}
	if n := d.prefill.Stats().Requests; n != 1 {
		t.Errorf("prefill engine saw %d requests, want only the remote one", n)
	}
	waitReleased(t, r.node)

	// The route-only answer names both stages' workers.
	route := r.post(t, fastpath.PathRouteCompletions, completionBody(e2eTokens(5, 300), false, 4), nil)
	var ans struct {
		WorkerID       uint64 `json:"worker_id"`
		Disaggregation string `json:"disaggregation"`
		Prefill        *struct {
			WorkerID uint64 `json:"worker_id"`
		} `json:"prefill"`
	}
	decodeJSON(t, route.body, &ans)
	if ans.Disaggregation != "remote" || ans.Prefill == nil || ans.Prefill.WorkerID != 1 || (ans.WorkerID != 2 && ans.WorkerID != 3) {
		t.Errorf("route-only answer %s", route.body)
	}
}

// TestDisaggVLLMFaults: a prefill engine that refuses is retried on
// another, one that never answers right falls back to a local prefill, a
// decode failure after the first byte ends the stream with an error
// event, and a client that leaves during the prefill aborts both stages;
// every path frees every booking.
func TestDisaggVLLMFaults(t *testing.T) {
	decode := startMock(t, mocker.Config{Role: workers.RoleDecode})
	realPrefill := startMock(t, mocker.Config{Role: workers.RolePrefill})
	broken := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"overloaded","type":"server_error"}}`)
	})
	release := make(chan struct{})
	stuck := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		<-release
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
	})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	run := func(t *testing.T, prefill []node.StaticWorker, dec node.StaticWorker) *e2eRouter {
		cfg := e2eConfig(append(prefill, dec)...)
		cfg.HTTP.Disagg = fastpath.DisaggConfig{Protocol: fastpath.DisaggVLLM}
		cfg.HTTP.MaxRetries = 2
		cfg.Dispatch.Outlier.Consecutive = 0
		return startE2ERouter(t, cfg)
	}
	decodeWorker := node.StaticWorker{ID: 10, Endpoint: decode.Addr(), Model: e2eModel, Role: workers.RoleDecode}
	prefillOf := func(id uint64, addr string) node.StaticWorker {
		return node.StaticWorker{ID: id, Endpoint: addr, Model: e2eModel, Role: workers.RolePrefill}
	}
	body := completionBody(e2eTokens(7, 200), true, 6)

	t.Run("retried on another prefill worker", func(t *testing.T) {
		r := run(t, []node.StaticWorker{prefillOf(1, broken.addr()), prefillOf(2, testnet.RefusingAddr(t)), prefillOf(3, realPrefill.Addr())}, decodeWorker)
		for range 3 {
			resp := r.post(t, fastpath.PathCompletions, body, nil)
			if items, _, done, errEv := readStream(t, resp.body); resp.status != 200 || items != 6 || !done || errEv ||
				resp.header.Get(fastpath.HeaderPrefillWorker) != "3" {
				t.Fatalf("status %d, prefill %q, %d items: %s", resp.status, resp.header.Get(fastpath.HeaderPrefillWorker), items, resp.body)
			}
		}
		waitReleased(t, r.node)
		if n := decisionCount(t, r, "remote"); n != 3 {
			t.Errorf("remote decisions %v, want 3", n)
		}
	})
	t.Run("a retried decode computes the prompt itself", func(t *testing.T) {
		// The first decode engine may have pulled the KV before failing,
		// and the prefill engine freed it: a second pull is refused
		// (vLLM's 409, relayed as the client's own 400). Each of these
		// decode engines fails a request naming remote KV, as such a
		// pull does, and answers one that does not.
		var local atomic.Int64
		pulling := func(ctx *fasthttp.RequestCtx) {
			ctx.SetContentType("application/json")
			if bytes.Contains(ctx.PostBody(), []byte(`"kv_transfer_params"`)) {
				ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
				ctx.SetBodyString(`{"error":{"message":"the KV pull failed","type":"server_error"}}`)
				return
			}
			local.Add(1)
			ctx.SetBodyString(`{"id":"x","object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":"length"}]}`)
		}
		a, b := startE2EEngine(t, pulling), startE2EEngine(t, pulling)
		cfg := e2eConfig(prefillOf(3, realPrefill.Addr()),
			node.StaticWorker{ID: 11, Endpoint: a.addr(), Model: e2eModel, Role: workers.RoleDecode},
			node.StaticWorker{ID: 12, Endpoint: b.addr(), Model: e2eModel, Role: workers.RoleDecode})
		cfg.HTTP.Disagg = fastpath.DisaggConfig{Protocol: fastpath.DisaggVLLM}
		cfg.HTTP.MaxRetries = 2
		cfg.Dispatch.Outlier.Consecutive = 0
		r := startE2ERouter(t, cfg)
		resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(7, 200), false, 6), nil)
		if resp.status != 200 || local.Load() != 1 {
			t.Fatalf("status %d, %d local decodes: %s", resp.status, local.Load(), resp.body)
		}
		if p := resp.header.Get(fastpath.HeaderPrefillWorker); p != "" {
			t.Errorf("the answer names prefill worker %s, though the decode worker computed the prompt", p)
		}
		waitReleased(t, r.node)
	})
	t.Run("falls back to a local prefill", func(t *testing.T) {
		r := run(t, []node.StaticWorker{prefillOf(1, broken.addr()), prefillOf(2, testnet.RefusingAddr(t))}, decodeWorker)
		resp := r.post(t, fastpath.PathCompletions, body, nil)
		if items, _, done, _ := readStream(t, resp.body); resp.status != 200 || items != 6 || !done || resp.header.Get(fastpath.HeaderPrefillWorker) != "" {
			t.Fatalf("status %d, prefill %q: %s", resp.status, resp.header.Get(fastpath.HeaderPrefillWorker), resp.body)
		}
		waitReleased(t, r.node)
		if n := decisionCount(t, r, "fallback_local"); n != 1 {
			t.Errorf("fallback decisions %v, want 1", n)
		}
	})
	t.Run("no kv_transfer_params: the decode computes the prompt", func(t *testing.T) {
		// vLLM answers "kv_transfer_params": null when the request ended
		// at its one token; its own proxy then sends the decode as it is.
		var prefills atomic.Int64
		ended := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
			prefills.Add(1)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"id":"x","choices":[{"text":"","finish_reason":"stop"}],"kv_transfer_params":null}`)
		})
		r := run(t, []node.StaticWorker{prefillOf(5, ended.addr()), prefillOf(3, realPrefill.Addr())}, decodeWorker)
		resp := r.post(t, fastpath.PathCompletions, body, map[string]string{fastpath.HeaderAllow: "5,10"})
		if items, _, done, _ := readStream(t, resp.body); resp.status != 200 || items != 6 || !done {
			t.Fatalf("status %d: %s", resp.status, resp.body)
		}
		waitReleased(t, r.node)
		if prefills.Load() != 1 || decisionCount(t, r, "remote") != 1 {
			t.Errorf("%d prefill requests and %v remote decisions, want one each: no retry", prefills.Load(), decisionCount(t, r, "remote"))
		}
		if v, _ := metricValue(r.metrics(t), "kvfast_dispatch_retries_total"); v != 0 {
			t.Errorf("%v retries, want none", v)
		}
	})
	t.Run("an unusable 2xx answer is a failure: nothing forwarded", func(t *testing.T) {
		// Each answers 200 but is no prefill a decode engine can use: an
		// error object, no JSON, a stream, kv_transfer_params that are
		// not an object or too large. None of it goes to the decode
		// engine: with no other prefill worker, the decode computes the
		// prompt itself.
		for i, answer := range []func(ctx *fasthttp.RequestCtx){
			func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(`{"error":{"message":"oom","code":500}}`) },
			func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(`<html>busy</html>`) },
			func(ctx *fasthttp.RequestCtx) {
				ctx.SetContentType("text/event-stream")
				ctx.SetBodyString("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n")
			},
			func(ctx *fasthttp.RequestCtx) {
				ctx.SetBodyString(`{"choices":[{"text":"","finish_reason":"length"}],"kv_transfer_params":"169.254.169.254"}`)
			},
			func(ctx *fasthttp.RequestCtx) {
				ctx.SetBodyString(`{"choices":[{"text":"","finish_reason":"length"}],"kv_transfer_params":{"x":"` +
					strings.Repeat("y", 2<<20) + `"}}`)
			},
			func(ctx *fasthttp.RequestCtx) {
				// Cut short inside the params, with a length that says it
				// is whole: it read as an answer without them.
				ctx.SetBodyString(`{"choices":[{"text":"","finish_reason":"length"}],"kv_transfer_params":{"do_remote_decode":fal`)
			},
		} {
			bad := startE2EEngine(t, answer)
			r := run(t, []node.StaticWorker{prefillOf(uint64(20+i), bad.addr())}, decodeWorker)
			resp := r.post(t, fastpath.PathCompletions, body, nil)
			if items, _, done, _ := readStream(t, resp.body); resp.status != 200 || items != 6 || !done ||
				resp.header.Get(fastpath.HeaderPrefillWorker) != "" {
				t.Fatalf("answer %d: status %d, prefill worker %q: %s", i, resp.status, resp.header.Get(fastpath.HeaderPrefillWorker), resp.body)
			}
			waitReleased(t, r.node)
			if n := decisionCount(t, r, "fallback_local"); n != 1 {
				t.Errorf("answer %d: fallback decisions %v, want 1 (the answer is no prefill)", i, n)
			}
		}
	})
	t.Run("a throttle is retried on another prefill worker", func(t *testing.T) {
		var throttled atomic.Int64
		busy := func(ctx *fasthttp.RequestCtx) {
			throttled.Add(1)
			ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"error":{"message":"busy","type":"rate_limit_exceeded"}}`)
		}
		a := startE2EEngine(t, busy)
		r := run(t, []node.StaticWorker{prefillOf(30, a.addr()), prefillOf(31, realPrefill.Addr())}, decodeWorker)
		indexBlocks(t, r.node, 30, 0, e2eTokens(7, 200)) // the throttled worker looks best
		resp := r.post(t, fastpath.PathCompletions, body, nil)
		if resp.status != 200 || resp.header.Get(fastpath.HeaderPrefillWorker) != "31" || throttled.Load() != 1 {
			t.Fatalf("status %d, prefill worker %q after %d throttled attempts: %s", resp.status,
				resp.header.Get(fastpath.HeaderPrefillWorker), throttled.Load(), resp.body)
		}
		waitReleased(t, r.node)
	})
	t.Run("a 4xx is not retried on another prefill worker", func(t *testing.T) {
		var refusals atomic.Int64
		invalid := func(ctx *fasthttp.RequestCtx) {
			refusals.Add(1)
			ctx.SetStatusCode(fasthttp.StatusBadRequest)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"error":{"message":"too long","type":"invalid_request_error"}}`)
		}
		a, b := startE2EEngine(t, invalid), startE2EEngine(t, invalid)
		r := run(t, []node.StaticWorker{prefillOf(6, a.addr()), prefillOf(7, b.addr())}, decodeWorker)
		r.post(t, fastpath.PathCompletions, body, nil)
		waitReleased(t, r.node)
		if refusals.Load() != 1 {
			t.Errorf("the request was sent to %d prefill workers that found it invalid, want 1", refusals.Load())
		}
	})
	t.Run("a prefill pool that is down: local from the start", func(t *testing.T) {
		r := run(t, []node.StaticWorker{prefillOf(8, realPrefill.Addr())}, decodeWorker)
		slot, ok := r.node.Scheduler().Resolve(8, 0)
		if !ok {
			t.Fatal("the prefill worker is not in the worker set")
		}
		r.node.Scheduler().SetHealthy(slot, false)
		resp := r.post(t, fastpath.PathCompletions, body, nil)
		if items, _, done, _ := readStream(t, resp.body); resp.status != 200 || items != 6 || !done {
			t.Fatalf("status %d: %s", resp.status, resp.body)
		}
		waitReleased(t, r.node)
		if n := decisionCount(t, r, "local_no_prefill_worker"); n != 1 {
			t.Errorf("local_no_prefill_worker decisions %v, want 1 (not a remote decision that falls back)", n)
		}
	})
	t.Run("decode fails after the first byte", func(t *testing.T) {
		dying := startE2EEngine(t, sseHandler(func(w *bufio.Writer) {
			_ = writeFlush(w, itemEvent(0, "a", ""))
			_ = writeFlush(w, []byte("data: {garbage\n\n"))
		}))
		r := run(t, []node.StaticWorker{prefillOf(3, realPrefill.Addr())},
			node.StaticWorker{ID: 11, Endpoint: dying.addr(), Model: e2eModel, Role: workers.RoleDecode})
		resp := r.post(t, fastpath.PathCompletions, body, nil)
		items, _, _, errEv := readStream(t, resp.body)
		if resp.status != 200 || items != 1 || !errEv {
			t.Errorf("status %d, %d items, error event %v: %s", resp.status, items, errEv, resp.body)
		}
		waitReleased(t, r.node)
	})
	t.Run("a hung prefill is given up on", func(t *testing.T) {
		// Past --disagg-prefill-timeout, not the first-byte timeout (10
		// minutes by default, per attempt): the decode worker prefills.
		hold := make(chan struct{})
		defer close(hold)
		hung := startE2EEngine(t, func(*fasthttp.RequestCtx) { <-hold })
		cfg := e2eConfig(prefillOf(12, hung.addr()), decodeWorker)
		cfg.HTTP.Disagg = fastpath.DisaggConfig{Protocol: fastpath.DisaggVLLM, PrefillTimeout: 200 * time.Millisecond}
		cfg.Dispatch.Outlier.Consecutive = 0
		r := startE2ERouter(t, cfg)
		resp := r.post(t, fastpath.PathCompletions, body, nil)
		if items, _, done, _ := readStream(t, resp.body); resp.status != 200 || items != 6 || !done {
			t.Fatalf("status %d: %s", resp.status, resp.body)
		}
		waitReleased(t, r.node)
		if n := decisionCount(t, r, "fallback_local"); n != 1 {
			t.Errorf("fallback decisions %v, want 1", n)
		}
	})
	t.Run("client leaves during the prefill", func(t *testing.T) {
		r := run(t, []node.StaticWorker{prefillOf(4, stuck.addr())}, decodeWorker)
		before := decode.Stats().Requests
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.url+fastpath.PathCompletions, bytes.NewReader(body))
		errc := make(chan error, 1)
		go func() {
			resp, err := r.client.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		waitFor(t, "the prefill request", func() bool { return stuck.requests.Load() == 1 })
		waitFor(t, "both stages booked", func() bool {
			v := r.node.Snapshot()
			return v.Queue.Booked-v.Queue.Released == 2
		})
		cancel()
		<-errc
		waitReleased(t, r.node) // both bookings freed while the prefill engine still computes
		close(release)
		waitFor(t, "the cancelled request's end", func() bool {
			v, _ := metricValue(r.metrics(t), `kvfast_requests_total{endpoint="completions",status="cancelled"}`)
			return v == 1
		})
		if got := decode.Stats().Requests; got != before {
			t.Errorf("the decode engine got %d requests after the client left", got-before)
		}
		if n := decisionCount(t, r, "remote"); n != 1 {
			t.Errorf("remote decisions %v, want 1: a request cancelled in its prefill was decided all the same", n)
		}
	})
}

// TestDisaggSGLang: both stages get bootstrap_host, bootstrap_port and
// the same bootstrap_room, at once; the decode engine pairs with the
// prefill engine by room and its stream is relayed.
func TestDisaggSGLang(t *testing.T) {
	d := startDisaggRig(t, fastpath.DisaggConfig{Protocol: fastpath.DisaggSGLang, BootstrapPort: fastpath.BootstrapHTTPPort, MinRemoteTokens: 64}, true)
	r := d.r
	for i, stream := range []bool{true, false} {
		text := strings.Repeat("a long system prompt number "+strconv.Itoa(i)+" ", 40)
		resp := r.post(t, fastpath.PathChatCompletions, chatBody(text, stream), nil)
		if resp.status != http.StatusOK || resp.header.Get(fastpath.HeaderPrefillWorker) != "1" {
			t.Fatalf("status %d, prefill %q: %s", resp.status, resp.header.Get(fastpath.HeaderPrefillWorker), resp.body)
		}
		if stream {
			if items, finish, done, errEv := readStream(t, resp.body); items != 8 || finish != "length" || !done || errEv {
				t.Errorf("stream: %d items, finish %q, done %v, error %v", items, finish, done, errEv)
			}
		}
		waitReleased(t, r.node)
	}
	var transferred uint64
	for _, e := range d.decode {
		transferred += e.Stats().BlocksTransferred
	}
	if transferred == 0 || d.prefill.Stats().Finished != 2 {
		t.Errorf("%d blocks transferred, %d prefills finished", transferred, d.prefill.Stats().Finished)
	}
	waitFor(t, "the prefill engine to release the rooms' blocks", func() bool { return d.prefill.Stats().KVHeld == 0 })
	// An allow-list of the prefill worker alone has no worker to decode
	// on, whatever the load: a client error, not a 503 to retry.
	resp := r.post(t, fastpath.PathChatCompletions, chatBody("hi", false), map[string]string{fastpath.HeaderAllow: "1"})
	if resp.status != http.StatusBadRequest || checkOpenAIError(t, resp.body) != "allow_excluded" {
		t.Errorf("allow-list of the prefill worker: %d %s, want 400 allow_excluded", resp.status, resp.body)
	}
}

// TestDisaggSGLangStageBodies pins what real SGLang engines need of the
// two bodies: no bootstrap_port unless one is configured (each engine
// then takes its own --disaggregation-bootstrap-port; the prefill's HTTP
// port, sent before, is never its bootstrap server), a worker's own
// bootstrap-port= before the router's; a room that names the prefill's
// data-parallel rank as room % dp, and disagg_prefill_dp_rank to the
// decode alone (the prefill of rank 3 of a DP engine otherwise computed
// the KV where the decode did not look); a client's own of those fields
// dropped. An aggregated SGLang engine (role both) is never a prefill
// (it ignores the bootstrap fields and generates the whole answer), and
// as the decode worker it computes the prompt itself.
func TestDisaggSGLangStageBodies(t *testing.T) {
	bodies := make(chan string, 16)
	recording := func(stage string) fasthttp.RequestHandler {
		return func(ctx *fasthttp.RequestCtx) {
			bodies <- stage + " " + string(ctx.PostBody())
			plainAnswer(ctx)
		}
	}
	prefill, decode, both := startE2EEngine(t, recording("prefill")), startE2EEngine(t, recording("decode")), startE2EEngine(t, recording("both"))
	for _, c := range []struct {
		name           string
		global, worker int
		wantPort       string
	}{
		{"no port configured", 0, 0, ""},
		{"the router's port", 8998, 0, "8998"},
		{"the worker's own port", 8998, 9001, "9001"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := e2eConfig(
				node.StaticWorker{ID: 1, DPRank: 3, Endpoint: prefill.addr(), Model: e2eModel, Role: workers.RolePrefill, BootstrapPort: c.worker},
				node.StaticWorker{ID: 2, Endpoint: decode.addr(), Model: e2eModel, Role: workers.RoleDecode},
				node.StaticWorker{ID: 3, Endpoint: both.addr(), Model: e2eModel, Role: workers.RoleBoth})
			cfg.HTTP.Disagg = fastpath.DisaggConfig{Protocol: fastpath.DisaggSGLang, BootstrapPort: c.global}
			r := startE2ERouter(t, cfg)
			body := bytes.Replace(completionBody(e2eTokens(9, 200), false, 4), []byte("{"),
				[]byte(`{"bootstrap_room":7,"disagg_prefill_dp_rank":0,`), 1)
			resp := r.post(t, fastpath.PathCompletions, body, map[string]string{fastpath.HeaderWorker: "2"})
			if resp.status != http.StatusOK || resp.header.Get(fastpath.HeaderPrefillWorker) != "1" {
				t.Fatalf("status %d, prefill worker %q: %s", resp.status, resp.header.Get(fastpath.HeaderPrefillWorker), resp.body)
			}
			got := map[string]map[string]any{}
			for range 2 {
				stage, raw, _ := strings.Cut(<-bodies, " ")
				var m map[string]any
				dec := json.NewDecoder(strings.NewReader(raw))
				dec.UseNumber() // a room is 63 bits: not a float64
				if err := dec.Decode(&m); err != nil {
					t.Fatal(err)
				}
				got[stage] = m
			}
			pre, dec := got["prefill"], got["decode"]
			if pre == nil || dec == nil {
				t.Fatalf("stages seen: %v", got)
			}
			for stage, m := range got {
				port, sent := m["bootstrap_port"]
				if c.wantPort == "" && sent || c.wantPort != "" && fmt.Sprint(port) != c.wantPort {
					t.Errorf("%s: bootstrap_port %v (sent %v), want %q", stage, port, sent, c.wantPort)
				}
				if fmt.Sprint(m["bootstrap_room"]) != fmt.Sprint(pre["bootstrap_room"]) || m["bootstrap_host"] != "127.0.0.1" {
					t.Errorf("%s: bootstrap %v %v, prefill's room %v", stage, m["bootstrap_host"], m["bootstrap_room"], pre["bootstrap_room"])
				}
			}
			room, err := strconv.ParseUint(fmt.Sprint(pre["bootstrap_room"]), 10, 64)
			if err != nil || room == 7 || room >= 1<<63 {
				t.Fatalf("room %v: %v", pre["bootstrap_room"], err)
			}
			for _, dp := range []uint64{4, 8, 12, 16, 32, 64} {
				if room%dp != 3 {
					t.Errorf("room %d %% %d = %d, want the prefill's rank 3", room, dp, room%dp)
				}
			}
			if _, sent := pre["disagg_prefill_dp_rank"]; sent || fmt.Sprint(dec["disagg_prefill_dp_rank"]) != "3" {
				t.Errorf("disagg_prefill_dp_rank: prefill %v, decode %v; want none and 3", pre["disagg_prefill_dp_rank"], dec["disagg_prefill_dp_rank"])
			}
			waitReleased(t, r.node)

			// The aggregated engine, chosen to answer, computes the prompt;
			// with only it and the decode engine allowed, no prefill is left.
			resp = r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(10, 200), false, 4), map[string]string{fastpath.HeaderWorker: "3"})
			if resp.status != http.StatusOK || resp.header.Get(fastpath.HeaderPrefillWorker) != "" {
				t.Fatalf("on the aggregated engine: status %d, prefill worker %q: %s", resp.status, resp.header.Get(fastpath.HeaderPrefillWorker), resp.body)
			}
			if stage, raw, _ := strings.Cut(<-bodies, " "); stage != "both" || strings.Contains(raw, "bootstrap") {
				t.Errorf("the aggregated engine's request: %s %s", stage, raw)
			}
			resp = r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(11, 200), false, 4),
				map[string]string{fastpath.HeaderWorker: "2", fastpath.HeaderAllow: "2,3"})
			if resp.status != http.StatusBadRequest || checkOpenAIError(t, resp.body) != "allow_excluded" {
				t.Errorf("decode engine without a prefill engine allowed: %d %s, want 400 allow_excluded", resp.status, resp.body)
			}
			if n := decisionCount(t, r, "local_aggregated"); n != 1 {
				t.Errorf("local_aggregated decisions %v, want 1", n)
			}
			waitReleased(t, r.node)
			select {
			case b := <-bodies:
				t.Errorf("an engine got a request it should not have: %s", b)
			default:
			}
		})
	}
}

// TestDisaggVLLMClientTransferParamsAreDropped: kv_transfer_params are
// the router's to set. A client's own, on a request the decode worker
// prefills itself, would have the engine pull KV from whatever host they
// name (here a port nothing listens on, which fails the request).
func TestDisaggVLLMClientTransferParamsAreDropped(t *testing.T) {
	d := startDisaggRig(t, fastpath.DisaggConfig{Protocol: fastpath.DisaggVLLM, MinRemoteTokens: 64}, false)
	r := d.r
	host, port, _ := net.SplitHostPort(testnet.RefusingAddr(t))
	// Spelled plainly, and with an escape the engine's JSON decodes.
	for i, name := range []string{"kv_transfer_params", `kv_transfer_param\u0073`} {
		params := `"` + name + `":{"do_remote_prefill":true,"remote_engine_id":"x","remote_block_ids":[1],` +
			`"remote_request_id":"r","remote_host":"` + host + `","remote_port":` + port + `},`
		body := bytes.Replace(completionBody(e2eTokens(uint32(9+i), 20), false, 4), []byte("{"), []byte("{"+params), 1)
		resp := r.post(t, fastpath.PathCompletions, body, nil)
		if resp.status != http.StatusOK {
			t.Fatalf("%s: status %d: %s", name, resp.status, resp.body)
		}
		waitReleased(t, r.node)
	}
	if n := decisionCount(t, r, "local_short"); n != 2 {
		t.Errorf("local_short decisions %v, want 2", n)
	}
}

// TestDisaggSGLangDecodeEnginesNeverPrefill: an SGLang engine in decode
// mode computes no prompt itself; sent one without bootstrap fields it
// waits for a transfer that never comes. A prompt short enough, or cached
// enough, to prefill locally on a decode worker that could (vLLM's, or a
// both-role engine) is paired with a prefill all the same, and the
// client's own bootstrap fields never reach an engine. With no prefill
// worker allowed the request is refused, not sent.
func TestDisaggSGLangDecodeEnginesNeverPrefill(t *testing.T) {
	d := startDisaggRig(t, fastpath.DisaggConfig{Protocol: fastpath.DisaggSGLang, BootstrapPort: fastpath.BootstrapHTTPPort, MinRemoteTokens: 64, LocalCachedFraction: 0.9}, true)
	r := d.r
	body := []byte(`{"model":"` + e2eModel + `","messages":[{"role":"user","content":"hi"}],"max_tokens":4,` +
		`"bootstrap_host":"10.6.6.6","bootstrap_port":1,"bootstrap_room":7}`)
	for range 2 { // the second is cached on its decode worker
		resp := r.post(t, fastpath.PathChatCompletions, body, nil)
		if resp.status != http.StatusOK || resp.header.Get(fastpath.HeaderPrefillWorker) != "1" {
			t.Fatalf("a short prompt: status %d, prefill worker %q: %s", resp.status, resp.header.Get(fastpath.HeaderPrefillWorker), resp.body)
		}
		waitReleased(t, r.node)
	}
	if n := decisionCount(t, r, "remote"); n != 2 {
		t.Errorf("remote decisions %v, want 2", n)
	}
	resp := r.post(t, fastpath.PathChatCompletions, body, map[string]string{fastpath.HeaderAllow: "2,3"})
	if resp.status != http.StatusBadRequest || checkOpenAIError(t, resp.body) != "allow_excluded" {
		t.Errorf("an allow-list of decode workers: %d %s, want 400 allow_excluded", resp.status, resp.body)
	}
	if n := decisionCount(t, r, "no_prefill_worker"); n != 1 {
		t.Errorf("no_prefill_worker decisions %v, want 1", n)
	}
	waitReleased(t, r.node)
}

// TestDisaggSGLangBusyPrefillPoolIsNoFallback: when no prefill worker can
// be booked (the only one busy, no queue), a request whose decode worker
// is an SGLang decode engine is refused with the selection's answer (429),
// not sent to that engine without bootstrap fields to compute itself,
// which it cannot.
func TestDisaggSGLangBusyPrefillPoolIsNoFallback(t *testing.T) {
	release := make(chan struct{})
	reached := make(chan struct{}, 1)
	prefill := startE2EEngine(t, func(*fasthttp.RequestCtx) {
		reached <- struct{}{}
		<-release
	})
	var unpaired atomic.Int64
	decode := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		if !bytes.Contains(ctx.PostBody(), []byte(`"bootstrap_room"`)) {
			unpaired.Add(1)
		}
		<-release
	})
	cfg := e2eConfig(
		node.StaticWorker{ID: 1, Endpoint: prefill.addr(), Model: e2eModel, Role: workers.RolePrefill},
		node.StaticWorker{ID: 2, Endpoint: decode.addr(), Model: e2eModel, Role: workers.RoleDecode})
	cfg.HTTP.Disagg = fastpath.DisaggConfig{Protocol: fastpath.DisaggSGLang, BootstrapPort: fastpath.BootstrapHTTPPort}
	cfg.Sched.QueueCapacity = 0
	cfg.Sched.Busy.PrefillTokens = 1 // one booked prefill makes its worker busy
	cfg.Dispatch.Outlier.Consecutive = 0
	r := startE2ERouter(t, cfg)
	first := make(chan struct{})
	go func() {
		defer close(first)
		r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(1, 200), false, 4), nil)
	}()
	select {
	case <-reached:
	case <-time.After(e2eWait):
		t.Fatal("the first request's prefill never reached its engine")
	}
	resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(2, 200), false, 4), nil)
	close(release)
	<-first
	if resp.status != http.StatusTooManyRequests {
		t.Errorf("with the prefill pool busy: status %d: %s; want 429", resp.status, resp.body)
	}
	if n := unpaired.Load(); n != 0 {
		t.Errorf("%d requests reached the decode engine without bootstrap fields", n)
	}
	waitReleased(t, r.node)
}

// TestDisaggSGLangPrefillFails: an SGLang decode engine waits for its
// room's KV until SGLang's bootstrap timeout, minutes; when the prefill
// request fails (an error status, or an engine that cannot be reached),
// the router fails the decode at once: a 502 prefill_failed, or an error
// event on a stream the decode engine had begun, and the decode engine's
// connection is closed. Nothing stays booked.
func TestDisaggSGLangPrefillFails(t *testing.T) {
	refuse := func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(fasthttp.StatusInternalServerError)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"prefill failed","type":"server_error"}}`)
	}
	refusing := startE2EEngine(t, refuse)
	// Decode engines that wait for KV that never comes, as SGLang's do:
	// one before answering at all (a plain response), one after sending a
	// stream's headers (SGLang sends them before the first token).
	release := make(chan struct{})
	var closedByRouter atomic.Int64
	silent := startE2EEngine(t, func(*fasthttp.RequestCtx) { <-release })
	streaming := startE2EEngine(t, sseHandler(func(w *bufio.Writer) {
		_ = writeFlush(w, []byte(": waiting for the room's KV\n\n"))
		for {
			select {
			case <-release:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if writeFlush(w, []byte(": still waiting\n\n")) != nil {
				closedByRouter.Add(1) // the router closed the connection
				return
			}
		}
	}))
	// A prefill engine that fails once the client holds the decode's
	// stream: the test says when (failNow), after the response's headers
	// reached it. Failing once the decode engine had only written them
	// raced the router's reading them, and under load the router could
	// still answer 502.
	failNow := make(chan struct{}, 1)
	refusingLate := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		select {
		case <-failNow:
		case <-release:
		}
		refuse(ctx)
	})
	// A prefill engine whose stream (headers first, as SGLang's) ends
	// before the prefill's token: it died computing the prompt.
	breaking := startE2EEngine(t, sseHandler(func(w *bufio.Writer) {
		_ = writeFlush(w, []byte(": computing\n\n"))
	}))
	// A prefill engine that never answers (stopped, or wedged): past
	// --disagg-prefill-timeout, not the first-byte timeout (10 minutes),
	// the request fails.
	hung := startE2EEngine(t, func(*fasthttp.RequestCtx) { <-release })
	// A prefill engine that aborts the request after its stream began: an
	// error event under the 200, as SGLang ends a stream it failed.
	aborting := startE2EEngine(t, sseHandler(func(w *bufio.Writer) {
		_ = writeFlush(w, []byte(`data: {"error":{"message":"Prefill aborted","type":"InternalServerError","code":500}}`+"\n\n"))
		_ = writeFlush(w, []byte("data: [DONE]\n\n"))
	}))
	t.Cleanup(func() { close(release) })

	for _, c := range []struct {
		name            string
		prefill, decode string
		stream          bool // the client asks for a stream
		begun           bool // the decode's stream begins before the prefill fails
		prefillTimeout  time.Duration
	}{
		{"error status, plain", refusing.addr(), silent.addr(), false, false, 0},
		{"error status, stream begun", refusingLate.addr(), streaming.addr(), true, true, 0},
		{"unreachable, plain", testnet.RefusingAddr(t), silent.addr(), false, false, 0},
		// Here the prefill may fail before the decode is sent, or after
		// its stream began: either way the client hears prefill_failed.
		{"unreachable, stream", testnet.RefusingAddr(t), streaming.addr(), true, false, 0},
		{"prefill stream breaks", breaking.addr(), streaming.addr(), true, false, 0},
		{"prefill stream aborts", aborting.addr(), streaming.addr(), true, false, 0},
		{"prefill hangs, plain", hung.addr(), silent.addr(), false, false, 200 * time.Millisecond},
		{"prefill hangs, stream", hung.addr(), streaming.addr(), true, false, 200 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := e2eConfig(
				node.StaticWorker{ID: 1, Endpoint: c.prefill, Model: e2eModel, Role: workers.RolePrefill},
				node.StaticWorker{ID: 2, Endpoint: c.decode, Model: e2eModel, Role: workers.RoleDecode})
			cfg.HTTP.Disagg = fastpath.DisaggConfig{Protocol: fastpath.DisaggSGLang, BootstrapPort: fastpath.BootstrapHTTPPort, PrefillTimeout: c.prefillTimeout}
			cfg.Dispatch.Outlier.Consecutive = 0
			r := startE2ERouter(t, cfg)
			before := closedByRouter.Load()
			body := completionBody(e2eTokens(9, 200), c.stream, 6)
			var resp e2eResponse
			if c.begun {
				stream, _ := r.openStream(t, fastpath.PathCompletions, body, nil)
				failNow <- struct{}{}
				got, err := io.ReadAll(stream.Body)
				if err != nil {
					t.Fatal(err)
				}
				resp = e2eResponse{status: stream.StatusCode, header: stream.Header, body: got}
			} else {
				resp = r.post(t, fastpath.PathCompletions, body, nil)
			}
			if !bytes.Contains(resp.body, []byte(`"code":"prefill_failed"`)) {
				t.Fatalf("status %d, no prefill_failed error: %s", resp.status, resp.body)
			}
			switch {
			case resp.status == http.StatusOK && c.stream:
				if _, _, done, errEv := readStream(t, resp.body); !errEv || !done {
					t.Errorf("error event %v, [DONE] %v: %s", errEv, done, resp.body)
				}
				waitFor(t, "the decode engine's connection closed", func() bool { return closedByRouter.Load() > before })
			case resp.status != http.StatusBadGateway || c.begun:
				t.Errorf("status %d: %s", resp.status, resp.body)
			}
			waitReleased(t, r.node)
			if v, _ := metricValue(r.metrics(t), "kvfast_disagg_prefill_failures_total"); v != 1 {
				t.Errorf("kvfast_disagg_prefill_failures_total %v, want 1", v)
			}
		})
	}
}

// TestDisaggSGLangPrefillRefusalReachesClient: an SGLang prefill engine
// that refuses the request itself (a 4xx: a prompt too long) while the
// decode engine still waits for the room's KV: the decode is failed at
// once, and the client gets the prefill engine's own 4xx, its words on
// what is wrong, not a 502 prefill_failed to retry for ever.
func TestDisaggSGLangPrefillRefusalReachesClient(t *testing.T) {
	const refusal = `{"error":{"message":"the prompt is 9000 tokens, over max_model_len 8192","type":"BadRequestError","code":400}}`
	prefill := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(fasthttp.StatusBadRequest)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(refusal)
	})
	release := make(chan struct{})
	decode := startE2EEngine(t, func(*fasthttp.RequestCtx) { <-release })
	t.Cleanup(func() { close(release) })
	cfg := e2eConfig(
		node.StaticWorker{ID: 1, Endpoint: prefill.addr(), Model: e2eModel, Role: workers.RolePrefill},
		node.StaticWorker{ID: 2, Endpoint: decode.addr(), Model: e2eModel, Role: workers.RoleDecode})
	cfg.HTTP.Disagg = fastpath.DisaggConfig{Protocol: fastpath.DisaggSGLang, BootstrapPort: fastpath.BootstrapHTTPPort}
	cfg.Dispatch.Outlier.Consecutive = 0
	r := startE2ERouter(t, cfg)
	resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(31, 200), false, 4), nil)
	if resp.status != http.StatusBadRequest || string(resp.body) != refusal {
		t.Fatalf("status %d %s; want the prefill engine's 400 %s", resp.status, resp.body, refusal)
	}
	waitReleased(t, r.node)
	if v, _ := metricValue(r.metrics(t), `kvfast_requests_total{endpoint="completions",status="engine_rejected"}`); v != 1 {
		t.Errorf(`kvfast_requests_total{status="engine_rejected"} %v, want 1`, v)
	}
}

// TestDisaggSGLangDribblingPrefillIsCut: a prefill engine that keeps
// answering, a byte at a time, after the decode has ended (each byte
// resets the idle timeout) cannot hold the client's answer, or the
// bookings, for as long as it dribbles: the router cuts it shortly after
// the decode is done.
func TestDisaggSGLangDribblingPrefillIsCut(t *testing.T) {
	var dribbled atomic.Bool // the prefill engine sent its whole answer
	cut := make(chan struct{})
	dribbling := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for range 600 { // a minute of one byte every 100 ms
				if writeFlush(w, []byte(" ")) != nil {
					close(cut)
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
			dribbled.Store(true)
		})
	})
	decode := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"x","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"length"}]}`)
	})
	cfg := e2eConfig(
		node.StaticWorker{ID: 1, Endpoint: dribbling.addr(), Model: e2eModel, Role: workers.RolePrefill},
		node.StaticWorker{ID: 2, Endpoint: decode.addr(), Model: e2eModel, Role: workers.RoleDecode})
	cfg.HTTP.Disagg = fastpath.DisaggConfig{Protocol: fastpath.DisaggSGLang, BootstrapPort: fastpath.BootstrapHTTPPort}
	r := startE2ERouter(t, cfg)
	resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(9, 200), false, 1), nil)
	if resp.status != http.StatusOK {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	if dribbled.Load() {
		t.Fatal("the client's answer waited for the prefill engine's whole dribble")
	}
	waitFor(t, "the prefill engine's connection cut", func() bool {
		select {
		case <-cut:
			return true
		default:
			return false
		}
	})
	waitReleased(t, r.node)
}

func chatBody(text string, stream bool) []byte {
	b, _ := json.Marshal(map[string]any{"model": e2eModel, "stream": stream, "max_tokens": 8,
		"messages": []map[string]string{{"role": "user", "content": text}}})
	return b
}

// TestDisaggStickySessionBindsDecodeWorker: in disaggregated mode a
// session binds to its decode worker, where the conversation's KV lives,
// and its later requests decode there whatever their prefill worker.
func TestDisaggStickySessionBindsDecodeWorker(t *testing.T) {
	d := startDisaggRig(t, fastpath.DisaggConfig{Protocol: fastpath.DisaggVLLM, MinRemoteTokens: 64}, false)
	r := d.r
	hdr := map[string]string{fastpath.HeaderSession: "conversation-1"}
	var bound string
	for i := range 6 {
		// Each turn a different prompt, so that the cost model alone
		// would spread them over both decode workers.
		resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(uint32(100+i), 300), false, 4), hdr)
		if resp.status != http.StatusOK {
			t.Fatalf("turn %d: status %d: %s", i, resp.status, resp.body)
		}
		w := resp.header.Get(fastpath.HeaderWorker)
		if w != "2" && w != "3" {
			t.Fatalf("turn %d decoded on worker %q, want a decode worker", i, w)
		}
		if i == 0 {
			bound = w
		} else if w != bound {
			t.Fatalf("turn %d decoded on worker %s, the session is bound to %s", i, w, bound)
		}
		waitReleased(t, r.node)
	}
}

// TestDisaggRefusesSessionControl: SGLang's session_control opens a
// session on the one worker that serves a request; with prefill and
// decode apart there is none, so it is refused, not silently dropped.
func TestDisaggRefusesSessionControl(t *testing.T) {
	d := startDisaggRig(t, fastpath.DisaggConfig{Protocol: fastpath.DisaggVLLM, MinRemoteTokens: 64}, false)
	body := []byte(`{"model":"mock","prompt":[1,2,3],"max_tokens":2,"session_control":{"open":true}}`)
	resp := d.r.post(t, fastpath.PathCompletions, body, map[string]string{fastpath.HeaderSession: "s"})
	if resp.status != http.StatusBadRequest || !bytes.Contains(resp.body, []byte("session_control_disaggregated")) {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	waitReleased(t, d.r.node)
}

// TestDisaggSGLangDecodeFailureIsNotRetried: a decode engine of an
// SGLang pair that fails before its first byte is not retried on another
// decode engine with the same bootstrap room: the prefill engine hands
// the room's KV to the engine that claimed it, and the other waited for
// it until the client gave up (10 minutes at --first-byte-timeout).
func TestDisaggSGLangDecodeFailureIsNotRetried(t *testing.T) {
	prefill := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"choices":[{"index":0,"text":"x","finish_reason":"length"}]}`)
	})
	failing := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(fasthttp.StatusInternalServerError)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"decode failed","type":"server_error"}}`)
	})
	healthy := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`)
	})
	cfg := e2eConfig(
		node.StaticWorker{ID: 1, Endpoint: prefill.addr(), Model: e2eModel, Role: workers.RolePrefill},
		node.StaticWorker{ID: 2, Endpoint: failing.addr(), Model: e2eModel, Role: workers.RoleDecode},
		node.StaticWorker{ID: 3, Endpoint: healthy.addr(), Model: e2eModel, Role: workers.RoleDecode})
	cfg.HTTP.Disagg = fastpath.DisaggConfig{Protocol: fastpath.DisaggSGLang, BootstrapPort: fastpath.BootstrapHTTPPort}
	cfg.Policy = "round-robin" // both decode engines are tried in two requests
	cfg.Dispatch.Outlier.Consecutive = 0
	r := startE2ERouter(t, cfg)
	statuses := map[int]int{}
	for i := range 2 {
		resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(uint32(20+i), 200), false, 4), nil)
		statuses[resp.status]++
	}
	if statuses[http.StatusOK] != 1 || statuses[http.StatusInternalServerError] != 1 {
		t.Errorf("statuses %v, want one 200 (the healthy decode engine) and the failed one's 500", statuses)
	}
	rooms := map[string]int{}
	for _, e := range []*e2eEngine{failing, healthy} {
		e.mu.Lock()
		for _, b := range e.bodies {
			var v struct {
				Room json.RawMessage `json:"bootstrap_room"`
			}
			if err := json.Unmarshal(b, &v); err != nil || len(v.Room) == 0 {
				t.Errorf("decode request without a bootstrap_room: %s", b)
			}
			rooms[string(v.Room)]++
		}
		e.mu.Unlock()
	}
	for room, n := range rooms {
		if n > 1 {
			t.Errorf("bootstrap_room %s sent to %d decode engines", room, n)
		}
	}
	if v, _ := metricValue(r.metrics(t), "kvfast_dispatch_retries_total"); v != 0 {
		t.Errorf("kvfast_dispatch_retries_total %v, want 0", v)
	}
	waitReleased(t, r.node)
}

// TestDisaggSGLangDecodeRefusalAfterPrefillFailure: an SGLang decode
// engine whose KV pull the failing prefill engine refused answers with
// its own 4xx about the transfer, which could reach the client before
// the router heard the prefill fail: a 400 the client must not retry,
// about a field it never sent. The client is told prefill_failed.
func TestDisaggSGLangDecodeRefusalAfterPrefillFailure(t *testing.T) {
	// A prefill that refuses the request itself (a 4xx: too long, say)
	// judges it as the decode engine does: the client gets the decode's
	// 4xx, not a 502 to retry for ever.
	for _, tc := range []struct {
		prefillStatus int
		status        int
		code          string
	}{{fasthttp.StatusInternalServerError, http.StatusBadGateway, "prefill_failed"}, {fasthttp.StatusBadRequest, http.StatusBadRequest, ""}} {
		t.Run(strconv.Itoa(tc.prefillStatus), func(t *testing.T) {
			testDecodeRefusalAfterPrefill(t, tc.prefillStatus, tc.status, tc.code)
		})
	}
}

func testDecodeRefusalAfterPrefill(t *testing.T, prefillStatus, status int, code string) {
	release := make(chan struct{})
	prefill := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		<-release
		ctx.SetStatusCode(prefillStatus)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"prefill failed","type":"server_error"}}`)
	})
	decode := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(fasthttp.StatusBadRequest)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"the prefill engine refused the KV pull","type":"invalid_request_error","param":"kv_transfer_params"}}`)
	})
	cfg := e2eConfig(
		node.StaticWorker{ID: 1, Endpoint: prefill.addr(), Model: e2eModel, Role: workers.RolePrefill},
		node.StaticWorker{ID: 2, Endpoint: decode.addr(), Model: e2eModel, Role: workers.RoleDecode})
	cfg.HTTP.Disagg = fastpath.DisaggConfig{Protocol: fastpath.DisaggSGLang, BootstrapPort: fastpath.BootstrapHTTPPort}
	cfg.Dispatch.Outlier.Consecutive = 0
	r := startE2ERouter(t, cfg)
	answered := make(chan e2eResponse, 1)
	go func() {
		answered <- r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(30, 200), false, 4), nil)
	}()
	// The prefill fails only once the router holds the decode's refusal.
	waitFor(t, "the decode engine's answer", func() bool {
		v, _ := metricValue(r.metrics(t), `kvfast_disagg_stage_seconds_count{stage="transfer_wait"}`)
		return v >= 1
	})
	close(release)
	resp := <-answered
	if resp.status != status || code != "" && checkOpenAIError(t, resp.body) != code {
		t.Errorf("status %d %s, want %d %s", resp.status, resp.body, status, code)
	}
	waitReleased(t, r.node)
}

// TestDisaggSGLangPrefillRefusingTheKey: under --disagg sglang, the one
// prefill engine refuses the router's engine key (restarted with a new
// one), so no request can be served. The client, which sent no allow-list,
// is told to retry (503), not that its allow-list named no prefill worker
// (a 400 SDKs do not retry): the router's own narrowing is not the
// client's.
func TestDisaggSGLangPrefillRefusingTheKey(t *testing.T) {
	prefill := startMock(t, mocker.Config{WorkerID: 1, Role: workers.RolePrefill, SGLangBootstrap: true, APIKey: "rotated-key"})
	decode := startMock(t, mocker.Config{WorkerID: 2, Role: workers.RoleDecode, SGLangBootstrap: true, APIKey: "engine-key"})
	cfg := e2eConfig(
		node.StaticWorker{ID: 1, Endpoint: prefill.Addr(), Model: e2eModel, Role: workers.RolePrefill},
		node.StaticWorker{ID: 2, Endpoint: decode.Addr(), Model: e2eModel, Role: workers.RoleDecode})
	cfg.HTTP.Disagg = fastpath.DisaggConfig{Protocol: fastpath.DisaggSGLang, BootstrapPort: fastpath.BootstrapHTTPPort}
	cfg.Dispatch.EngineToken = "engine-key"
	r := startE2ERouter(t, cfg)
	waitFor(t, "the prefill worker reported as refusing the router's key", func() bool {
		return workerView(t, r.node, 1, 0).KeyRefused
	})
	resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(3, 200), false, 4), nil)
	if resp.status != http.StatusServiceUnavailable || checkOpenAIError(t, resp.body) == "allow_excluded" {
		t.Errorf("no allow-list, the prefill engine refusing the key: %d %s, want a 503", resp.status, resp.body)
	}
	if ready := r.get(t, fastpath.PathReady); ready.status != http.StatusServiceUnavailable {
		t.Errorf("/ready: %d %s, want 503", ready.status, ready.body)
	}
	waitReleased(t, r.node)
}

// TestDisaggMalformedPrefillAnswerIsNamed: a prefill worker's URL naming
// some other service answers 200 with a page. The decode engine computes
// the prompt itself, and the router warns, naming the prefill worker, as
// it does for a worker answering a whole request so.
func TestDisaggMalformedPrefillAnswerIsNamed(t *testing.T) {
	page := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/html")
		ctx.SetBodyString("<html>a dashboard</html>")
	})
	decode := startMock(t, mocker.Config{WorkerID: 2, Role: workers.RoleDecode})
	logs := newLogCapture()
	cfg := e2eConfig(
		node.StaticWorker{ID: 1, Endpoint: page.addr(), Model: e2eModel, Role: workers.RolePrefill},
		node.StaticWorker{ID: 2, Endpoint: decode.Addr(), Model: e2eModel, Role: workers.RoleDecode})
	cfg.HTTP.Disagg = fastpath.DisaggConfig{Protocol: fastpath.DisaggVLLM, MinRemoteTokens: 1}
	cfg.Logger = slog.New(logs)
	r := startE2ERouter(t, cfg)
	if resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(6, 128), false, 4), nil); resp.status != http.StatusOK {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	line, ok := logs.find("no OpenAI-compatible engine sends")
	if !ok || !strings.Contains(line, "worker=1") || !strings.Contains(line, "endpoint="+page.addr()) {
		t.Fatalf("the prefill worker that answered so is not named: %q", line)
	}
	waitReleased(t, r.node)
}

// TestDisaggThrottledPrefillStillAsked: a prefill engine's 429 does not
// take the prefill pool off later requests' allow-lists (which also bound
// the prefill stage's candidates): with SGLang's protocol every request
// after one 429 was refused 503 no_prefill_worker for the whole
// Retry-After, the prefill engine never asked again.
func TestDisaggThrottledPrefillStillAsked(t *testing.T) {
	var asked atomic.Int64
	prefill := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		asked.Add(1)
		ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
		ctx.Response.Header.Set("Retry-After", "30")
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"busy","type":"rate_limit_exceeded","code":429}}`)
	})
	decode := startE2EEngine(t, plainAnswer)
	cfg := e2eConfig(
		node.StaticWorker{ID: 1, Endpoint: prefill.addr(), Model: e2eModel, Role: workers.RolePrefill},
		node.StaticWorker{ID: 2, Endpoint: decode.addr(), Model: e2eModel, Role: workers.RoleDecode})
	cfg.HTTP.Disagg = fastpath.DisaggConfig{Protocol: fastpath.DisaggSGLang, BootstrapPort: fastpath.BootstrapHTTPPort}
	r := startE2ERouter(t, cfg)
	for i := range 2 {
		resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(uint32(20+i), 200), false, 4), nil)
		if bytes.Contains(resp.body, []byte("no_prefill_worker")) {
			t.Fatalf("request %d: %d %s; the throttled prefill engine was taken out of the pool", i, resp.status, resp.body)
		}
		if got := asked.Load(); got != int64(i+1) {
			t.Fatalf("after request %d the prefill engine was asked %d times, want %d", i, got, i+1)
		}
		waitReleased(t, r.node)
	}
}
