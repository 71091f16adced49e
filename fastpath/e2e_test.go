package fastpath_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
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

// TestStreamRelayedByteExact: the client receives exactly the bytes the
// engine sent, for an event stream with every framing an engine may use and
// for a plain JSON body, and the engine receives exactly the body the
// client sent.
func TestStreamRelayedByteExact(t *testing.T) {
	big := strings.Repeat("§ big event ", 3000) // ~39 KB: larger than the relay buffer
	events := [][]byte{
		[]byte(": keep-alive comment\n\n"),
		itemEvent(0, "Hello", ""),
		[]byte("event: message\r\ndata: {\"choices\":[{\"index\":0,\"text\":\" crlf\",\"finish_reason\":null}]}\r\n\r\n"),
		itemEvent(1, " ünïcødé ✓ \"quoted\" \\ back", ""),
		[]byte("id: 7\nretry: 1000\ndata: {\"choices\":[{\"index\":0,\"text\":\" multi\",\n\n"), // data cut short: relayed as is
		itemEvent(2, big, ""),
		itemEvent(3, "!", "length"),
		[]byte(`data: {"id":"cmpl-standin","object":"text_completion","choices":[],"usage":{"prompt_tokens":64,"completion_tokens":4,"total_tokens":68}}` + "\n\n"),
		[]byte(doneEvent),
	}
	want := concat(events)
	eng := startE2EEngine(t, sseHandler(func(w *bufio.Writer) {
		for i, ev := range events {
			if i == 3 {
				// One event split across two flushes, with a pause: the
				// relay must hold the half until the rest arrives.
				_ = writeFlush(w, ev[:10])
				time.Sleep(20 * time.Millisecond)
				_ = writeFlush(w, ev[10:])
				continue
			}
			if writeFlush(w, ev) != nil {
				return
			}
		}
	}))
	plain := []byte(`{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" plain ✓","finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":64,"completion_tokens":2,"total_tokens":66}}` + "\n")
	plainEng := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.Response.Header.Set("X-Engine-Header", "kept")
		ctx.SetBody(plain)
	})
	r := startE2ERouter(t, e2eConfig(
		node.StaticWorker{ID: 11, Endpoint: "http://" + eng.addr(), Model: e2eModel},
		node.StaticWorker{ID: 12, Endpoint: plainEng.addr(), Model: e2eModel},
	))

	// Extra fields, odd spacing and key order: forwarded untouched.
	tokens := e2eTokens(1, 64)
	body := append([]byte("{ \"stream\" : true ,\"temperature\":0.25, \"stream_options\": {\"include_usage\": true},\n \"prompt\":"),
		completionBody(tokens, true, 4)[len(`{"model":"mock","prompt":`):]...)
	body = append(body[:len(body)-1], `, "model":"mock", "echo": false}`...)

	t.Run("stream", func(t *testing.T) {
		resp := r.post(t, fastpath.PathCompletions, body, map[string]string{fastpath.HeaderWorker: "11", fastpath.HeaderRequestID: "client-rid-1"})
		if resp.status != http.StatusOK {
			t.Fatalf("status %d: %s", resp.status, resp.body)
		}
		if !bytes.Equal(resp.body, want) {
			t.Fatalf("relayed stream differs from the engine's\n got %d bytes: %.300q\nwant %d bytes: %.300q",
				len(resp.body), resp.body, len(want), want)
		}
		if ct := resp.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
			t.Errorf("Content-Type %q", ct)
		}
		if got := resp.header.Get("Cache-Control"); got != "no-cache" {
			t.Errorf("engine header Cache-Control not relayed: %q", got)
		}
		if got := resp.header.Get(fastpath.HeaderWorker); got != "11" {
			t.Errorf("%s = %q, want 11", fastpath.HeaderWorker, got)
		}
		if got := resp.header.Get(fastpath.HeaderRequestID); got != "client-rid-1" {
			t.Errorf("request id not echoed: %q", got)
		}
		bodies, rids := eng.received()
		if len(bodies) != 1 || !bytes.Equal(bodies[0], body) {
			t.Fatalf("engine received %q, want the client's body %q", bodies, body)
		}
		if rids[0] != "client-rid-1" {
			t.Errorf("engine saw request id %q", rids[0])
		}
	})
	t.Run("plain", func(t *testing.T) {
		nb := completionBody(tokens, false, 2)
		resp := r.post(t, fastpath.PathCompletions, nb, map[string]string{fastpath.HeaderWorker: "12"})
		if resp.status != http.StatusOK || !bytes.Equal(resp.body, plain) {
			t.Fatalf("status %d body %q, want 200 %q", resp.status, resp.body, plain)
		}
		if resp.header.Get("X-Engine-Header") != "kept" {
			t.Errorf("engine header not relayed: %v", resp.header)
		}
		if rid := resp.header.Get(fastpath.HeaderRequestID); rid == "" {
			t.Error("no request id generated")
		} else if _, rids := plainEng.received(); rids[0] != rid {
			t.Errorf("engine saw request id %q, client %q", rids[0], rid)
		}
	})
	waitReleased(t, r.node)
	m := r.metrics(t)
	wantMetric(t, m, `kvfast_requests_total{endpoint="completions",status="ok"}`, 2)
	wantMetric(t, m, `kvfast_output_sequence_tokens_count`, 1)
}

// TestClientCancelReleasesReservations: a client that leaves mid-stream
// gets its booking released, and the engine's request is cancelled.
func TestClientCancelReleasesReservations(t *testing.T) {
	release := make(chan struct{})
	engineGone := make(chan struct{})
	eng := startE2EEngine(t, sseHandler(func(w *bufio.Writer) {
		defer close(engineGone)
		<-release // prefill: no token yet
		for i := 0; ; i++ {
			if writeFlush(w, itemEvent(i, " tok", "")) != nil {
				return // the router hung up: the request is cancelled
			}
			time.Sleep(15 * time.Millisecond)
		}
	}))
	r := startE2ERouter(t, e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.addr(), Model: e2eModel}))

	type result struct {
		resp *http.Response
		err  error
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opened := make(chan result, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.url+fastpath.PathCompletions,
			bytes.NewReader(completionBody(e2eTokens(2, 64), true, 1000)))
		resp, err := r.client.Do(req)
		opened <- result{resp, err}
	}()

	// Booked before the engine's first token: 4 prompt blocks, 64 prefill tokens.
	waitFor(t, "the request to be booked", func() bool { return workerView(t, r.node, 1, 0).Requests == 1 })
	if w := workerView(t, r.node, 1, 0); w.ActiveBlocks != 4 || w.PrefillTokens != 64 {
		t.Fatalf("during prefill: active blocks %d, prefill tokens %d; want 4 and 64", w.ActiveBlocks, w.PrefillTokens)
	}
	close(release)
	res := <-opened
	if res.err != nil {
		t.Fatal(res.err)
	}
	defer res.resp.Body.Close()
	br := bufio.NewReader(res.resp.Body)
	for i := range 3 {
		ev, err := readEvent(br)
		if err != nil || !bytes.Equal(ev, itemEvent(i, " tok", "")) {
			t.Fatalf("event %d: %q, %v", i, ev, err)
		}
	}
	// The first token released the prefill; the blocks stay booked.
	if w := workerView(t, r.node, 1, 0); w.Requests != 1 || w.ActiveBlocks != 4 || w.PrefillTokens != 0 {
		t.Fatalf("while decoding: %+v", w)
	}
	m := r.metrics(t)
	wantMetric(t, m, `kvfast_worker_active_requests{dp_rank="0",worker="1"}`, 1)
	wantMetric(t, m, `kvfast_requests_in_flight`, 1)

	cancel() // the client goes away
	res.resp.Body.Close()
	select {
	case <-engineGone:
	case <-time.After(e2eWait):
		t.Fatal("the engine's request was not cancelled after the client left")
	}
	waitReleased(t, r.node)
	waitFor(t, "the cancellation to be counted", func() bool {
		v, _ := metricValue(r.metrics(t), `kvfast_requests_total{endpoint="completions",status="cancelled"}`)
		return v == 1
	})
	m = r.metrics(t)
	wantMetric(t, m, `kvfast_worker_active_requests{dp_rank="0",worker="1"}`, 0)
	wantMetric(t, m, `kvfast_requests_in_flight`, 0)
	wantMetric(t, m, `kvfast_worker_active_blocks{dp_rank="0",worker="1"}`, 0)
	wantMetric(t, m, `kvfast_worker_prefill_tokens{dp_rank="0",worker="1"}`, 0)
	wantMetric(t, m, `kvfast_requests_total{endpoint="completions",status="ok"}`, 0)
}

// TestEngineErrorEventCounted: a stream the engine ends with its own
// error event (vLLM's way of failing a generation it has begun) is
// relayed as it came, and counted an engine error, not an ok.
func TestEngineErrorEventCounted(t *testing.T) {
	eng := startE2EEngine(t, sseHandler(func(w *bufio.Writer) {
		_ = writeFlush(w, itemEvent(0, " tok", ""))
		_ = writeFlush(w, []byte(`data: {"object":"error","message":"boom","type":"InternalServerError","param":null,"code":500}`+"\n\n"))
		_ = writeFlush(w, []byte(doneEvent))
	}))
	r := startE2ERouter(t, e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.addr(), Model: e2eModel}))
	resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(80, 32), true, 3), nil)
	if resp.status != http.StatusOK || !bytes.Contains(resp.body, []byte(`"message":"boom"`)) || !bytes.HasSuffix(resp.body, []byte(doneEvent)) {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	waitReleased(t, r.node)
	m := r.metrics(t)
	wantMetric(t, m, `kvfast_requests_total{endpoint="completions",status="engine_error"}`, 1)
	wantMetric(t, m, `kvfast_requests_total{endpoint="completions",status="ok"}`, 0)
}

// TestEngineKilledMidStream: the client gets what the engine sent, then an
// OpenAI error event, and the load is released.
func TestEngineKilledMidStream(t *testing.T) {
	kill := make(chan struct{})
	var eng *e2eEngine
	eng = startE2EEngine(t, sseHandler(func(w *bufio.Writer) {
		for i := range 3 {
			_ = writeFlush(w, itemEvent(i, " tok", ""))
		}
		<-kill
		eng.kill()
	}))
	r := startE2ERouter(t, e2eConfig(node.StaticWorker{ID: 5, Endpoint: eng.addr(), Model: e2eModel}))
	resp, _ := r.openStream(t, fastpath.PathCompletions, completionBody(e2eTokens(3, 40), true, 100), nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	var got []byte
	for range 3 {
		ev, err := readEvent(br)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev...)
	}
	if w := workerView(t, r.node, 5, 0); w.Requests != 1 || w.ActiveBlocks != 2 {
		t.Fatalf("before the kill: %+v", w)
	}
	close(kill)
	rest, err := io.ReadAll(br)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("reading after the kill: %v", err)
	}
	want := concat([][]byte{itemEvent(0, " tok", ""), itemEvent(1, " tok", ""), itemEvent(2, " tok", "")})
	if !bytes.Equal(got, want) {
		t.Fatalf("before the kill got %q", got)
	}
	event, ok := bytes.CutSuffix(rest, []byte("data: [DONE]\n\n"))
	data, isData := bytes.CutPrefix(event, []byte("data: "))
	if !ok || !isData || !bytes.HasSuffix(data, []byte("\n\n")) || bytes.Count(event, []byte("\n\n")) != 1 {
		t.Fatalf("after the kill the client got %q, want one error event and [DONE]", rest)
	}
	if code := checkOpenAIError(t, bytes.TrimSpace(data)); code != "engine_failed" {
		t.Errorf("error code %q, want engine_failed", code)
	}
	waitReleased(t, r.node)
	waitFor(t, "the failure to be counted", func() bool {
		v, _ := metricValue(r.metrics(t), `kvfast_requests_total{endpoint="completions",status="engine_error"}`)
		return v == 1
	})
}

// TestExactTokenRoutingFollowsEvents: mock engines registered in a shm
// segment publish their KV events; the router ingests them and sends a
// repeated prefix to the engine that caches it, which then serves it from
// its cache.
func TestExactTokenRoutingFollowsEvents(t *testing.T) {
	const n = 3
	r := startE2ERig(t, rig.Config{Node: e2eConfig(), Engines: n, Engine: mocker.Config{WorkerID: 1, Speedup: 20}})
	if w := r.node.Snapshot().Workers; len(w) != n {
		t.Fatalf("%d workers registered, want %d: %+v", len(w), n, w)
	}

	const prefixBlocks = 6
	for p := range 4 {
		prefix := e2eTokens(uint32(100+p), prefixBlocks*16)
		first := completionBody(append(append([]uint32{}, prefix...), e2eTokens(uint32(200+p), 8)...), false, 4)
		resp := r.post(t, fastpath.PathCompletions, first, nil)
		if resp.status != http.StatusOK {
			t.Fatalf("prefix %d: status %d: %s", p, resp.status, resp.body)
		}
		owner := resp.header.Get(fastpath.HeaderWorker)
		if resp.header.Get(fastpath.HeaderOverlapBlocks) != "0" {
			t.Errorf("prefix %d: a new prefix had overlap %s", p, resp.header.Get(fastpath.HeaderOverlapBlocks))
		}
		// The engine's Stored events reach the index asynchronously; the
		// route-only endpoint shows when they have.
		again := completionBody(append(append([]uint32{}, prefix...), e2eTokens(uint32(300+p), 8)...), false, 4)
		waitFor(t, "the engine's KV events to reach the index", func() bool {
			var d struct {
				WorkerID      uint64 `json:"worker_id"`
				OverlapBlocks int    `json:"overlap_blocks"`
			}
			decodeJSON(t, r.post(t, fastpath.PathRouteCompletions, again, nil).body, &d)
			return d.OverlapBlocks == prefixBlocks && strconv.FormatUint(d.WorkerID, 10) == owner
		})
		for k := range 2 {
			resp := r.post(t, fastpath.PathCompletions, again, nil)
			if resp.status != http.StatusOK {
				t.Fatalf("prefix %d repeat %d: status %d: %s", p, k, resp.status, resp.body)
			}
			if got := resp.header.Get(fastpath.HeaderWorker); got != owner {
				t.Errorf("prefix %d repeat %d went to worker %s, want %s (which caches it)", p, k, got, owner)
			}
			if got := resp.header.Get(fastpath.HeaderOverlapBlocks); got != strconv.Itoa(prefixBlocks) {
				t.Errorf("prefix %d repeat %d: overlap %s blocks, want %d", p, k, got, prefixBlocks)
			}
			var out struct {
				Usage struct {
					Details struct {
						Cached int `json:"cached_tokens"`
					} `json:"prompt_tokens_details"`
				} `json:"usage"`
			}
			decodeJSON(t, resp.body, &out)
			if out.Usage.Details.Cached != prefixBlocks*16 {
				t.Errorf("prefix %d repeat %d: the engine served %d cached tokens, want %d",
					p, k, out.Usage.Details.Cached, prefixBlocks*16)
			}
		}
	}
	waitReleased(t, r.node)
	v := r.node.Snapshot()
	if v.Feed == nil || v.Feed.StoredBlocks == 0 || v.Index.Entries == 0 {
		t.Errorf("the feed applied nothing: %+v, index %+v", v.Feed, v.Index)
	}
	m := r.metrics(t)
	if hit, _ := metricValue(m, "kvfast_cached_blocks_total"); hit != 4*2*prefixBlocks {
		t.Errorf("kvfast_cached_blocks_total = %v, want %d", hit, 4*2*prefixBlocks)
	}
}

// TestApproxRoutingWithStaticWorkers: without events, policy approx routes
// a repeated text or chat prefix to the worker it chose before.
func TestApproxRoutingWithStaticWorkers(t *testing.T) {
	var static []node.StaticWorker
	for i := range 3 {
		e := startMock(t, mocker.Config{WorkerID: uint64(i + 1)})
		static = append(static, node.StaticWorker{ID: uint64(i + 1), Endpoint: e.URL(), Model: e2eModel})
	}
	cfg := e2eConfig(static...)
	cfg.Policy = "approx"
	r := startE2ERouter(t, cfg)

	// 640 bytes of prompt text: exactly ten 64-byte chunks before the suffix.
	text := func(p int) string {
		s := strings.Repeat("word"+strconv.Itoa(p)+" ", 200)
		return s[:640]
	}
	cases := []struct {
		name, path string
		body       func(p int, suffix string) []byte
		overlap    int
	}{
		{"text", fastpath.PathCompletions, func(p int, suffix string) []byte {
			return []byte(`{"model":"mock","max_tokens":2,"prompt":"` + text(p) + suffix + `"}`)
		}, 10},
		{"chat", fastpath.PathChatCompletions, func(p int, suffix string) []byte {
			// The raw messages array is hashed: the 640 bytes start at '['.
			return []byte(`{"model":"mock","max_tokens":2,"messages":` + `[{"role":"user","content":"` +
				text(p)[len(`[{"role":"user","content":"`):] + suffix + `"}]}`)
		}, 10},
		{"tokens", fastpath.PathCompletions, func(p int, suffix string) []byte {
			tail := e2eTokens(uint32(len(suffix)+7), 8)
			return completionBody(append(e2eTokens(uint32(500+p), 160), tail...), false, 2)
		}, 10},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for p := range 3 {
				resp := r.post(t, tc.path, tc.body(p, "first suffix"), nil)
				if resp.status != http.StatusOK {
					t.Fatalf("status %d: %s", resp.status, resp.body)
				}
				owner := resp.header.Get(fastpath.HeaderWorker)
				for k, suffix := range []string{"another ending", "a third"} {
					resp := r.post(t, tc.path, tc.body(p, suffix), nil)
					if resp.status != http.StatusOK {
						t.Fatalf("status %d: %s", resp.status, resp.body)
					}
					if got := resp.header.Get(fastpath.HeaderWorker); got != owner {
						t.Errorf("prompt %d repeat %d went to worker %s, want %s", p, k, got, owner)
					}
					if got := resp.header.Get(fastpath.HeaderOverlapBlocks); got != strconv.Itoa(tc.overlap) {
						t.Errorf("prompt %d repeat %d: overlap %s, want %d", p, k, got, tc.overlap)
					}
				}
			}
		})
	}
	waitReleased(t, r.node)
}

// TestRefusedRequestsLeaveNoHistory: a request the engine refused cached
// nothing there, so the router's history does not credit the worker with
// its prompt: any client could otherwise steer text prompts, and inflate
// their overlap, with requests it knows will be refused.
func TestRefusedRequestsLeaveNoHistory(t *testing.T) {
	var static []node.StaticWorker
	for i := range 2 {
		e := startMock(t, mocker.Config{WorkerID: uint64(i + 1)})
		static = append(static, node.StaticWorker{ID: uint64(i + 1), Endpoint: e.URL(), Model: e2eModel})
	}
	cfg := e2eConfig(static...)
	cfg.Policy = "approx"
	r := startE2ERouter(t, cfg)
	prompt := strings.Repeat("refused words ", 60)
	// The mock engine generates one choice per request: n 3 is its 400.
	resp := r.post(t, fastpath.PathCompletions, []byte(`{"model":"mock","max_tokens":2,"n":3,"prompt":"`+prompt+`"}`), nil)
	if resp.status != http.StatusBadRequest {
		t.Fatalf("status %d, want the engine's 400: %s", resp.status, resp.body)
	}
	resp = r.post(t, fastpath.PathCompletions, []byte(`{"model":"mock","max_tokens":2,"prompt":"`+prompt+`"}`), nil)
	if resp.status != http.StatusOK {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	if got := resp.header.Get(fastpath.HeaderOverlapBlocks); got != "0" {
		t.Errorf("after the engine refused the prompt, the router credits %s blocks of it", got)
	}
	waitReleased(t, r.node)
}

// TestPinToDPRank: a pin to rank 0 of a two-rank worker reaches rank 0's
// engine, and pins that name no worker are refused, not guessed.
func TestPinToDPRank(t *testing.T) {
	var static []node.StaticWorker
	for rank := range uint32(2) {
		e := startMock(t, mocker.Config{WorkerID: 7, DPRank: rank})
		static = append(static, node.StaticWorker{ID: 7, DPRank: rank, Endpoint: e.Addr(), Model: e2eModel})
	}
	solo := startMock(t, mocker.Config{WorkerID: 9})
	static = append(static, node.StaticWorker{ID: 9, Endpoint: solo.Addr(), Model: e2eModel})
	r := startE2ERouter(t, e2eConfig(static...))
	body := completionBody(e2eTokens(4, 48), false, 2)

	served := func(t *testing.T, resp e2eResponse) string {
		t.Helper()
		if resp.status != http.StatusOK {
			t.Fatalf("status %d: %s", resp.status, resp.body)
		}
		var out struct{ ID string }
		decodeJSON(t, resp.body, &out)
		return out.ID // the mock engine's ids name its worker and rank
	}
	for rank, tag := range []string{"-w7r0-", "-w7r1-"} {
		for range 4 {
			resp := r.post(t, fastpath.PathCompletions, body, map[string]string{fastpath.HeaderWorker: "7", fastpath.HeaderDPRank: strconv.Itoa(rank)})
			if id := served(t, resp); !strings.Contains(id, tag) {
				t.Fatalf("pinned to rank %d, served by %q", rank, id)
			}
			if resp.header.Get(fastpath.HeaderWorker) != "7" || resp.header.Get(fastpath.HeaderDPRank) != strconv.Itoa(rank) {
				t.Errorf("decision headers %s=%s %s=%s", fastpath.HeaderWorker, resp.header.Get(fastpath.HeaderWorker),
					fastpath.HeaderDPRank, resp.header.Get(fastpath.HeaderDPRank))
			}
		}
	}
	// A worker with a single rank needs no rank.
	if id := served(t, r.post(t, fastpath.PathCompletions, body, map[string]string{fastpath.HeaderWorker: "9"})); !strings.Contains(id, "-w9r0-") {
		t.Errorf("pinned to worker 9, served by %q", id)
	}
	refused := []struct {
		name   string
		hdr    map[string]string
		status int
		code   string
	}{
		{"rank out of range", map[string]string{fastpath.HeaderWorker: "7", fastpath.HeaderDPRank: "2"}, 404, "worker_not_found"},
		{"unknown worker", map[string]string{fastpath.HeaderWorker: "8"}, 404, "worker_not_found"},
		{"unknown worker with rank 0", map[string]string{fastpath.HeaderWorker: "8", fastpath.HeaderDPRank: "0"}, 404, "worker_not_found"},
		{"several ranks, none named", map[string]string{fastpath.HeaderWorker: "7"}, 400, "ambiguous_pin"},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			for _, path := range []string{fastpath.PathCompletions, fastpath.PathRouteCompletions} {
				resp := r.post(t, path, body, tc.hdr)
				if resp.status != tc.status {
					t.Fatalf("%s: status %d, want %d: %s", path, resp.status, tc.status, resp.body)
				}
				if code := checkOpenAIError(t, resp.body); code != tc.code {
					t.Errorf("%s: code %q, want %q", path, code, tc.code)
				}
			}
		})
	}
	waitReleased(t, r.node)
}

// TestGracefulShutdownCompletesStreams: Shutdown stops accepting at once
// but lets a stream in flight run to its [DONE].
func TestGracefulShutdownCompletesStreams(t *testing.T) {
	var events [][]byte
	for i := range 10 {
		fin := ""
		if i == 9 {
			fin = "length"
		}
		events = append(events, itemEvent(i, " tok", fin))
	}
	events = append(events, []byte(doneEvent))
	// The engine holds the stream after its first event until the test
	// has seen the listener close, so that the stream is still in flight
	// then however slowly the test runs.
	rest := make(chan struct{})
	eng := startE2EEngine(t, sseHandler(func(w *bufio.Writer) {
		for i, ev := range events {
			if writeFlush(w, ev) != nil {
				return
			}
			if i == 0 {
				select {
				case <-rest:
				case <-time.After(e2eWait):
					return
				}
			}
		}
	}))
	r := startE2ERouter(t, e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.addr(), Model: e2eModel}))
	resp, _ := r.openStream(t, fastpath.PathCompletions, completionBody(e2eTokens(5, 32), true, 10), nil)
	br := bufio.NewReader(resp.Body)
	first, err := readEvent(br)
	if err != nil {
		t.Fatal(err)
	}

	// New connections are refused while the stream drains.
	shutdownDone := r.beginShutdown(t)
	select {
	case err := <-shutdownDone:
		t.Fatalf("Shutdown returned (%v) while a stream was in flight", err)
	default:
	}
	close(rest)
	tail, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("the stream broke during shutdown: %v", err)
	}
	if got := append(first, tail...); !bytes.Equal(got, concat(events)) {
		t.Fatalf("during shutdown the client got %q, want the whole stream", got)
	}
	select {
	case err := <-shutdownDone:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(e2eWait):
		t.Fatal("Shutdown did not return after the stream ended")
	}
	waitReleased(t, r.node)
	// That Serve returned is checked by the rig's teardown.
}

// TestConnectFailureRetriedElsewhere: the worker the router prefers refuses
// connections; the request is re-routed to a live one, unless it is pinned.
func TestConnectFailureRetriedElsewhere(t *testing.T) {
	live := startMock(t, mocker.Config{WorkerID: 2})
	r := startE2ERouter(t, e2eConfig(
		node.StaticWorker{ID: 1, Endpoint: testnet.RefusingAddr(t), Model: e2eModel},
		node.StaticWorker{ID: 2, Endpoint: live.Addr(), Model: e2eModel},
	))
	tokens := e2eTokens(6, 80)
	indexBlocks(t, r.node, 1, 0, tokens) // the dead worker looks best
	body := completionBody(tokens, true, 3)

	var route struct {
		WorkerID      uint64 `json:"worker_id"`
		OverlapBlocks int    `json:"overlap_blocks"`
	}
	decodeJSON(t, r.post(t, fastpath.PathRouteCompletions, body, nil).body, &route)
	if route.WorkerID != 1 || route.OverlapBlocks != 5 {
		t.Fatalf("route-only chose %+v; the test needs the dead worker 1 first", route)
	}
	for i := range 2 {
		// A prompt of its own each time: the worker that served one now
		// holds it in the router's history (it publishes no events), so a
		// repeat would go there first.
		tokens := e2eTokens(uint32(60+i), 80)
		indexBlocks(t, r.node, 1, 0, tokens)
		resp := r.post(t, fastpath.PathCompletions, completionBody(tokens, true, 3), nil)
		if resp.status != http.StatusOK || !bytes.HasSuffix(resp.body, []byte(doneEvent)) {
			t.Fatalf("attempt %d: status %d: %s", i, resp.status, resp.body)
		}
		if got := resp.header.Get(fastpath.HeaderWorker); got != "2" {
			t.Errorf("attempt %d served by worker %s, want the live worker 2", i, got)
		}
	}
	wantMetric(t, r.metrics(t), "kvfast_dispatch_retries_total", 2)

	// A pin is never re-routed: the client learns the engine is down.
	resp := r.post(t, fastpath.PathCompletions, body, map[string]string{fastpath.HeaderWorker: "1"})
	if resp.status != http.StatusBadGateway {
		t.Fatalf("pinned to a dead engine: status %d: %s", resp.status, resp.body)
	}
	if code := checkOpenAIError(t, resp.body); code != "engine_unavailable" {
		t.Errorf("code %q, want engine_unavailable", code)
	}
	waitReleased(t, r.node)
	m := r.metrics(t)
	wantMetric(t, m, "kvfast_dispatch_retries_total", 2)
	wantMetric(t, m, `kvfast_requests_total{endpoint="completions",status="unavailable"}`, 1)
}

// TestThrottlingEngineRetriedElsewhere: a request an engine refuses with
// 429 goes to another worker. It had been relayed to its client as a 429,
// and an engine refusing everything at once (its bookings released at
// once, so the least loaded) drew nearly every request. The engine's
// Retry-After then keeps requests off it while another worker can take
// them: without that, each request's first attempt went there and cost a
// round trip. A 429 is load, not sickness: it never ejects the engine,
// not even when pinned requests get it, which would have taken an engine
// shedding load away from everyone.
func TestThrottlingEngineRetriedElsewhere(t *testing.T) {
	var throttled atomic.Int64
	busy := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		throttled.Add(1)
		ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
		ctx.Response.Header.Set("Retry-After", "30") // the longest the router honours: the test is not timed
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"busy","type":"rate_limit_exceeded","code":429}}`)
	})
	live := startMock(t, mocker.Config{WorkerID: 2})
	cfg := e2eConfig(
		node.StaticWorker{ID: 1, Endpoint: busy.addr(), Model: e2eModel},
		node.StaticWorker{ID: 2, Endpoint: live.Addr(), Model: e2eModel},
	)
	cfg.Dispatch.Outlier.Consecutive = 3
	r := startE2ERouter(t, cfg)
	for i := range 4 {
		tokens := e2eTokens(uint32(70+i), 80)
		indexBlocks(t, r.node, 1, 0, tokens) // the throttling worker looks best
		resp := r.post(t, fastpath.PathCompletions, completionBody(tokens, i%2 == 0, 3), nil)
		if resp.status != http.StatusOK || resp.header.Get(fastpath.HeaderWorker) != "2" {
			t.Fatalf("request %d: status %d from worker %q: %s", i, resp.status, resp.header.Get(fastpath.HeaderWorker), resp.body)
		}
		if got := throttled.Load(); got != 1 {
			t.Fatalf("request %d: the throttling engine was asked %d times in all, want only the first request's attempt", i, got)
		}
	}
	if wv := workerView(t, r.node, 1, 0); wv.Throttles != 1 || wv.ThrottledSeconds <= 0 {
		t.Errorf("worker 1 in /admin/workers: %d throttles, throttled for %.1fs; want 1 and its Retry-After", wv.Throttles, wv.ThrottledSeconds)
	}
	for i := range 4 {
		resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(uint32(75+i), 80), false, 3), map[string]string{fastpath.HeaderWorker: "1"})
		if resp.status != http.StatusTooManyRequests || resp.header.Get("Retry-After") != "30" {
			t.Fatalf("pinned request %d: status %d, Retry-After %q: %s; want the engine's 429", i, resp.status, resp.header.Get("Retry-After"), resp.body)
		}
	}
	waitReleased(t, r.node)
	if workerView(t, r.node, 1, 0).Ejected {
		t.Error("an engine answering 429 was ejected by passive health checking")
	}
	m := r.metrics(t)
	wantMetric(t, m, "kvfast_dispatch_retries_total", 1)
	wantMetric(t, m, `kvfast_requests_total{endpoint="completions",status="overloaded"}`, 4)
	wantMetric(t, m, "kvfast_dispatch_unattributed_5xx_total", 0)
	wantMetric(t, m, `kvfast_worker_throttled{dp_rank="0",worker="1"}`, 1)
	wantMetric(t, m, `kvfast_worker_throttled{dp_rank="0",worker="2"}`, 0)
	wantMetric(t, m, `kvfast_worker_throttles_total{dp_rank="0",worker="1"}`, 5)
}

// TestEveryEngineThrottling: when every engine answers 429, a request
// still goes to them (a throttled engine is avoided only while another can
// take the request), and the client gets the last one's 429, which says
// when to come back.
func TestEveryEngineThrottling(t *testing.T) {
	var asked atomic.Int64
	handler := func(ctx *fasthttp.RequestCtx) {
		asked.Add(1)
		ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
		ctx.Response.Header.Set("Retry-After", "20")
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"busy","type":"rate_limit_exceeded","code":429}}`)
	}
	a, b := startE2EEngine(t, handler), startE2EEngine(t, handler)
	r := startE2ERouter(t, e2eConfig(
		node.StaticWorker{ID: 1, Endpoint: a.addr(), Model: e2eModel},
		node.StaticWorker{ID: 2, Endpoint: b.addr(), Model: e2eModel},
	))
	for i := range 2 {
		resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(uint32(90+i), 80), false, 3), nil)
		if resp.status != http.StatusTooManyRequests || !bytes.Contains(resp.body, []byte(`"busy"`)) || resp.header.Get("Retry-After") != "20" {
			t.Fatalf("request %d: status %d, Retry-After %q: %s; want the engine's 429 relayed", i, resp.status, resp.header.Get("Retry-After"), resp.body)
		}
		if got, want := asked.Load(), int64(2*(i+1)); got != want {
			t.Errorf("after request %d the engines were asked %d times, want %d: each request tries both", i, got, want)
		}
	}
	waitReleased(t, r.node)
}

// TestStreamOpeningWithAnErrorRetriedElsewhere: an engine whose
// generation fails at once (a dead engine core) answers 200 and its error
// event first; nothing reached the client, so the request goes to another
// worker. Pinned, the client gets the engine's own error event, relayed.
func TestStreamOpeningWithAnErrorRetriedElsewhere(t *testing.T) {
	live := startMock(t, mocker.Config{WorkerID: 2})
	const failure = `data: {"error":{"message":"engine core died","type":"InternalServerError","code":500}}` + "\n\n"
	failing := startE2EEngine(t, sseHandler(func(w *bufio.Writer) {
		_ = writeFlush(w, []byte(failure+doneEvent))
	}))
	r := startE2ERouter(t, e2eConfig(
		node.StaticWorker{ID: 1, Endpoint: failing.addr(), Model: e2eModel},
		node.StaticWorker{ID: 2, Endpoint: live.Addr(), Model: e2eModel},
	))
	tokens := e2eTokens(73, 80)
	indexBlocks(t, r.node, 1, 0, tokens) // the failing worker looks best
	resp := r.post(t, fastpath.PathCompletions, completionBody(tokens, true, 3), nil)
	if resp.status != http.StatusOK || !bytes.HasSuffix(resp.body, []byte(doneEvent)) || bytes.Contains(resp.body, []byte(`"error"`)) ||
		resp.header.Get(fastpath.HeaderWorker) != "2" {
		t.Fatalf("status %d from worker %q: %s", resp.status, resp.header.Get(fastpath.HeaderWorker), resp.body)
	}
	wantMetric(t, r.metrics(t), "kvfast_dispatch_retries_total", 1)
	resp = r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(74, 80), true, 3), map[string]string{fastpath.HeaderWorker: "1"})
	if resp.status != http.StatusOK || !bytes.Contains(resp.body, []byte("engine core died")) {
		t.Errorf("pinned to the failing engine: status %d: %s; want its error event relayed", resp.status, resp.body)
	}
	waitReleased(t, r.node)
}

// TestStreamOpeningWithARequestErrorIsRelayed: an error event the engine
// codes 4xx (a schema or grammar it refuses) is the request's fault, which
// every engine would find: relayed from the first engine, not retried.
func TestStreamOpeningWithARequestErrorIsRelayed(t *testing.T) {
	var asked atomic.Int64
	const refusal = `data: {"error":{"message":"invalid grammar","type":"BadRequestError","param":null,"code":400}}` + "\n\n"
	handler := sseHandler(func(w *bufio.Writer) {
		asked.Add(1)
		_ = writeFlush(w, []byte(refusal+doneEvent))
	})
	a, b := startE2EEngine(t, handler), startE2EEngine(t, handler)
	r := startE2ERouter(t, e2eConfig(
		node.StaticWorker{ID: 1, Endpoint: a.addr(), Model: e2eModel},
		node.StaticWorker{ID: 2, Endpoint: b.addr(), Model: e2eModel},
	))
	resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(75, 80), true, 3), nil)
	if resp.status != http.StatusOK || !bytes.Contains(resp.body, []byte("invalid grammar")) || asked.Load() != 1 {
		t.Fatalf("status %d after %d engine calls: %s; want the first engine's refusal relayed", resp.status, asked.Load(), resp.body)
	}
	waitReleased(t, r.node)
	wantMetric(t, r.metrics(t), "kvfast_dispatch_retries_total", 0)
}

// TestNoRetryCountedWithNowhereToGo: a failed attempt with no other
// worker to try is not a retry (kvfast_dispatch_retries_total counted one
// for each such failure).
func TestNoRetryCountedWithNowhereToGo(t *testing.T) {
	r := startE2ERouter(t, e2eConfig(node.StaticWorker{ID: 1, Endpoint: testnet.RefusingAddr(t), Model: e2eModel}))
	if resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(6, 32), false, 3), nil); resp.status != http.StatusBadGateway {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	waitReleased(t, r.node)
	wantMetric(t, r.metrics(t), "kvfast_dispatch_retries_total", 0)
}

// eventData is the JSON object a server-sent event carries.
func eventData(ev []byte) []byte {
	return bytes.TrimSuffix(bytes.TrimPrefix(ev, []byte("data: ")), []byte("\n\n"))
}

// TestGarbageSuccessIsTheEnginesFailure: an engine's 200 that is neither
// an event stream nor a whole JSON object (an HTML page, bytes, an object
// cut short), or that is an error object, is a failed attempt, retried elsewhere, not relayed as
// success (an SDK fails to parse it, without retrying: the router counted
// it ok).
func TestGarbageSuccessIsTheEnginesFailure(t *testing.T) {
	for _, answer := range []string{"\x00\xffNOT JSON <html>",
		// vLLM's error shape, and OpenAI's, under a 200.
		`{"object":"error","message":"boom","type":"InternalServerError","param":null,"code":500}`,
		`{"error":{"message":"boom","type":"server_error"}}`,
		// Cut short, with a Content-Length of what was sent.
		`{"id":"x","choices":[{"text":"a"`} {
		t.Run(answer, func(t *testing.T) { testGarbageSuccess(t, answer) })
	}
}

// routerBesideAMock starts a router over two workers: 1, an engine that
// answers with handler, and 2, a mock engine.
func routerBesideAMock(t *testing.T, handler fasthttp.RequestHandler) *e2eRouter {
	t.Helper()
	odd := startSessionEngine(t, handler)
	live := startMock(t, mocker.Config{WorkerID: 2})
	return startE2ERouter(t, e2eConfig(
		node.StaticWorker{ID: 1, Endpoint: odd.addr(), Model: e2eModel},
		node.StaticWorker{ID: 2, Endpoint: live.Addr(), Model: e2eModel},
	))
}

// postCachedOnWorker1 indexes tokens as cached on worker 1, so that it
// looks best, and posts a completion of them.
func (r *e2eRouter) postCachedOnWorker1(t *testing.T, tokens []uint32, stream bool) e2eResponse {
	t.Helper()
	indexBlocks(t, r.node, 1, 0, tokens)
	return r.post(t, fastpath.PathCompletions, completionBody(tokens, stream, 3), nil)
}

func testGarbageSuccess(t *testing.T, answer string) {
	r := routerBesideAMock(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(answer)
	})
	for i, stream := range []bool{false, true} {
		resp := r.postCachedOnWorker1(t, e2eTokens(uint32(70+i), 80), stream) // the junk engine looks best
		if resp.status != http.StatusOK || resp.header.Get(fastpath.HeaderWorker) != "2" {
			t.Fatalf("stream %v: status %d from worker %s: %q", stream, resp.status, resp.header.Get(fastpath.HeaderWorker), resp.body)
		}
	}
	wantMetric(t, r.metrics(t), "kvfast_dispatch_retries_total", 2)
	// Pinned there, the client is told the engine failed.
	resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(72, 32), false, 3), map[string]string{fastpath.HeaderWorker: "1"})
	if resp.status != http.StatusBadGateway {
		t.Fatalf("pinned to the junk engine: status %d: %q", resp.status, resp.body)
	}
	if code := checkOpenAIError(t, resp.body); code != "engine_failed" {
		t.Errorf("code %q, want engine_failed", code)
	}
	waitReleased(t, r.node)
}

// TestUnaskedShapeIsTheEnginesFailure: an engine that answers in the
// other shape than asked fails that attempt, retried elsewhere: a stream
// to a request for one JSON object (its client got server-sent events),
// or one object to a request for a stream (relayed, the client's SDK read
// a stream of no events, an empty completion, and reported nothing). A
// request asking for the shape the engine sends takes it.
func TestUnaskedShapeIsTheEnginesFailure(t *testing.T) {
	for _, tc := range []struct {
		name    string
		streams bool // the odd engine's one shape
		engine  fasthttp.RequestHandler
	}{
		{"stream", true, sseHandler(func(w *bufio.Writer) {
			_ = writeFlush(w, []byte(`data: {"choices":[{"index":0,"text":"x","finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n"))
		})},
		{"object", false, func(ctx *fasthttp.RequestCtx) {
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"id":"x","object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":"stop"}]}`)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := routerBesideAMock(t, tc.engine)
			for i, stream := range []bool{false, true} {
				resp := r.postCachedOnWorker1(t, e2eTokens(uint32(80+i), 80), stream) // the odd engine looks best
				want := "2"
				if stream == tc.streams {
					want = "1"
				}
				if resp.status != http.StatusOK || resp.header.Get(fastpath.HeaderWorker) != want {
					t.Fatalf("stream %v: status %d from worker %s, want 200 from %s: %q", stream, resp.status, resp.header.Get(fastpath.HeaderWorker), want, resp.body)
				}
				if ct := resp.header.Get("Content-Type"); stream != strings.HasPrefix(ct, "text/event-stream") {
					t.Errorf("stream %v: Content-Type %q", stream, ct)
				}
			}
			wantMetric(t, r.metrics(t), "kvfast_dispatch_retries_total", 1)
			waitReleased(t, r.node)
		})
	}
}

// TestDirectModeRequiresWorker: in direct mode a request must name its
// worker.
func TestDirectModeRequiresWorker(t *testing.T) {
	eng := startMock(t, mocker.Config{WorkerID: 3})
	cfg := e2eConfig(node.StaticWorker{ID: 3, Endpoint: eng.Addr(), Model: e2eModel})
	cfg.HTTP.Direct = true
	r := startE2ERouter(t, cfg)
	body := completionBody(e2eTokens(7, 32), false, 2)
	for _, path := range []string{fastpath.PathCompletions, fastpath.PathChatCompletions, fastpath.PathRouteCompletions} {
		b := body
		if path == fastpath.PathChatCompletions {
			b = []byte(`{"model":"mock","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`)
		}
		resp := r.post(t, path, b, nil)
		if resp.status != http.StatusBadRequest {
			t.Fatalf("%s without a worker: status %d: %s", path, resp.status, resp.body)
		}
		if code := checkOpenAIError(t, resp.body); code != "worker_required" {
			t.Errorf("%s: code %q, want worker_required", path, code)
		}
		if !bytes.Contains(resp.body, []byte(fastpath.HeaderWorker)) {
			t.Errorf("%s: the error does not say which header is needed: %s", path, resp.body)
		}
	}
	resp := r.post(t, fastpath.PathCompletions, body, map[string]string{fastpath.HeaderWorker: "3"})
	if resp.status != http.StatusOK || resp.header.Get(fastpath.HeaderWorker) != "3" {
		t.Fatalf("with a worker: status %d, worker %q: %s", resp.status, resp.header.Get(fastpath.HeaderWorker), resp.body)
	}
	waitFor(t, "the engine's counters", func() bool { return eng.Stats().Finished >= 1 })
	if st := eng.Stats(); st.Requests != 1 {
		t.Errorf("the engine was sent %d requests, want 1", st.Requests)
	}
	waitReleased(t, r.node)
}

// routeDecision is the route-only endpoint's answer.
type routeDecision struct {
	WorkerID      uint64  `json:"worker_id"`
	DPRank        *uint32 `json:"dp_rank"`
	Endpoint      string  `json:"endpoint"`
	OverlapBlocks uint32  `json:"overlap_blocks"`
	CachedTokens  *int    `json:"cached_tokens"`
	PromptBlocks  int     `json:"prompt_blocks"`
	Exact         bool    `json:"exact"`
	Busy          bool    `json:"busy"`
	Workers       []struct {
		WorkerID      uint64   `json:"worker_id"`
		DPRank        uint32   `json:"dp_rank"`
		OverlapBlocks uint32   `json:"overlap_blocks"`
		HostBlocks    uint32   `json:"host_blocks"`
		DiskBlocks    uint32   `json:"disk_blocks"`
		PrefillBlocks float64  `json:"prefill_blocks"`
		DecodeBlocks  float64  `json:"decode_blocks"`
		Cost          *float64 `json:"cost"`
		Busy          bool     `json:"busy"`
	} `json:"workers"`
}

// TestRouteOnlyReturnsDecision: the route-only endpoint and the query-only
// header answer with the decision and every worker's cost terms, and
// neither book load nor reach an engine.
func TestRouteOnlyReturnsDecision(t *testing.T) {
	e1 := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(500) })
	e2 := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(500) })
	cfg := e2eConfig(
		node.StaticWorker{ID: 1, Endpoint: e1.addr(), Model: e2eModel},
		node.StaticWorker{ID: 2, Endpoint: e2.addr(), Model: e2eModel},
	)
	cfg.Sched.Cost.AutoPrefillLoadScale = false // the costs below are at scale 1
	r := startE2ERouter(t, cfg)
	tokens := e2eTokens(8, 80) // 5 blocks
	indexBlocks(t, r.node, 2, 0, tokens[:48])
	body := completionBody(tokens, true, 16)

	check := func(t *testing.T, resp e2eResponse) {
		t.Helper()
		if resp.status != http.StatusOK {
			t.Fatalf("status %d: %s", resp.status, resp.body)
		}
		var d routeDecision
		decodeJSON(t, resp.body, &d)
		if d.WorkerID != 2 || d.DPRank == nil || *d.DPRank != 0 || d.Endpoint != e2.addr() {
			t.Errorf("decision %s, want worker 2 rank 0 at %s", resp.body, e2.addr())
		}
		if d.OverlapBlocks != 3 || d.CachedTokens == nil || *d.CachedTokens != 48 || d.PromptBlocks != 5 || !d.Exact || d.Busy {
			t.Errorf("decision %s: want 3 overlap blocks, 48 cached tokens, 5 prompt blocks, exact", resp.body)
		}
		if len(d.Workers) != 2 {
			t.Fatalf("per-worker costs: %s", resp.body)
		}
		// cost = (prompt blocks − overlap) + prompt blocks, on idle workers.
		want := map[uint64][4]float64{1: {0, 5, 5, 10}, 2: {3, 2, 5, 7}}
		for _, w := range d.Workers {
			exp, ok := want[w.WorkerID]
			if !ok || w.Cost == nil {
				t.Fatalf("per-worker costs: %s", resp.body)
			}
			if got := [4]float64{float64(w.OverlapBlocks), w.PrefillBlocks, w.DecodeBlocks, *w.Cost}; got != exp {
				t.Errorf("worker %d: overlap, prefill, decode, cost = %v, want %v", w.WorkerID, got, exp)
			}
		}
		if resp.header.Get(fastpath.HeaderWorker) != "2" || resp.header.Get(fastpath.HeaderOverlapBlocks) != "3" {
			t.Errorf("decision headers: %v", resp.header)
		}
	}
	t.Run("route endpoint", func(t *testing.T) { check(t, r.post(t, fastpath.PathRouteCompletions, body, nil)) })
	t.Run("query-only header", func(t *testing.T) {
		check(t, r.post(t, fastpath.PathCompletions, body, map[string]string{fastpath.HeaderQueryOnly: "true"}))
	})
	t.Run("chat", func(t *testing.T) {
		resp := r.post(t, fastpath.PathRouteChatCompletions, []byte(`{"model":"mock","messages":[{"role":"user","content":"hello"}]}`), nil)
		if resp.status != http.StatusOK {
			t.Fatalf("status %d: %s", resp.status, resp.body)
		}
		var d routeDecision
		decodeJSON(t, resp.body, &d)
		if d.Exact || d.CachedTokens != nil || len(d.Workers) != 2 {
			t.Errorf("a chat decision is approximate, with no cached token count: %s", resp.body)
		}
	})
	t.Run("cached whole", func(t *testing.T) {
		// The engine computes a prompt's last token whatever it caches: a
		// prompt of whole blocks cached whole reuses all but its last.
		whole := e2eTokens(900, 64) // 4 blocks
		indexBlocks(t, r.node, 2, 0, whole)
		resp := r.post(t, fastpath.PathRouteCompletions, completionBody(whole, false, 4), nil)
		var d routeDecision
		decodeJSON(t, resp.body, &d)
		if d.WorkerID != 2 || d.OverlapBlocks != 4 || d.CachedTokens == nil || *d.CachedTokens != 48 {
			t.Errorf("a prompt of 4 blocks cached whole on worker 2: %s; want 4 overlap blocks, 48 cached tokens", resp.body)
		}
	})
	t.Run("allow-list", func(t *testing.T) {
		resp := r.post(t, fastpath.PathRouteCompletions, body, map[string]string{fastpath.HeaderAllow: "1"})
		var d routeDecision
		decodeJSON(t, resp.body, &d)
		if d.WorkerID != 1 || len(d.Workers) != 1 {
			t.Errorf("allow-listed to worker 1: %s", resp.body)
		}
	})
	v := r.node.Snapshot()
	if v.Queue.Booked != 0 || !reservationsReleased(v) {
		t.Errorf("route-only booked load: %+v %+v", v.Queue, v.Workers)
	}
	if n := e1.requests.Load() + e2.requests.Load(); n != 0 {
		t.Errorf("route-only reached the engines %d times", n)
	}
	wantMetric(t, r.metrics(t), `kvfast_requests_total{endpoint="completions",status="route_only"}`, 4)
}

// TestOperationalEndpoints covers /health, /ready, /v1/models, /metrics and
// /admin/workers.
func TestOperationalEndpoints(t *testing.T) {
	t.Run("no workers", func(t *testing.T) {
		r := startE2ERouter(t, e2eConfig())
		if resp := r.get(t, fastpath.PathHealth); resp.status != 200 || string(resp.body) != `{"status":"ok"}` {
			t.Errorf("/health: %d %s", resp.status, resp.body)
		}
		resp := r.get(t, fastpath.PathReady)
		if resp.status != http.StatusServiceUnavailable {
			t.Errorf("/ready with no workers: %d %s", resp.status, resp.body)
		}
		var ready struct {
			Status  string `json:"status"`
			Healthy *int   `json:"healthy_workers"`
		}
		decodeJSON(t, resp.body, &ready)
		if ready.Status != "not_ready" || ready.Healthy == nil || *ready.Healthy != 0 {
			t.Errorf("/ready body %s", resp.body)
		}
		// Started before any engine: no model is known yet, which
		// clients should retry rather than take for a 404.
		resp = r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(9, 16), false, 1), nil)
		if resp.status != http.StatusServiceUnavailable || checkOpenAIError(t, resp.body) != "model_unavailable" ||
			resp.header.Get("Retry-After") == "" {
			t.Errorf("a request before any engine registered: %d %v %s", resp.status, resp.header, resp.body)
		}
		resp = r.post(t, fastpath.PathCompletions, []byte(`{"prompt":[1,2,3]}`), nil)
		if resp.status != http.StatusServiceUnavailable || checkOpenAIError(t, resp.body) != "no_worker_available" ||
			resp.header.Get("Retry-After") == "" {
			t.Errorf("a request with no workers and no model: %d %v %s", resp.status, resp.header, resp.body)
		}
		var models struct {
			Object string `json:"object"`
			Data   []any  `json:"data"`
		}
		decodeJSON(t, r.get(t, fastpath.PathModels).body, &models)
		if models.Object != "list" || models.Data == nil || len(models.Data) != 0 {
			t.Errorf("/v1/models with no workers: %+v", models)
		}
		var admin fastpath.Snapshot
		decodeJSON(t, r.get(t, fastpath.PathAdminWorkers).body, &admin)
		if admin.Workers == nil || len(admin.Workers) != 0 || admin.Policy != "kv" {
			t.Errorf("/admin/workers: %+v", admin)
		}
		if resp := r.get(t, "/v2/nothing"); resp.status != 404 || checkOpenAIError(t, resp.body) != "not_found" {
			t.Errorf("unknown path: %d %s", resp.status, resp.body)
		}
	})
	t.Run("with workers", func(t *testing.T) {
		a := startMock(t, mocker.Config{WorkerID: 1})
		b := startMock(t, mocker.Config{WorkerID: 2, Model: "other-model"})
		r := startE2ERouter(t, e2eConfig(
			node.StaticWorker{ID: 1, Endpoint: a.Addr(), Model: e2eModel, KVBlocks: 1000},
			node.StaticWorker{ID: 2, Endpoint: b.Addr(), Model: "other-model"},
		))
		resp := r.get(t, fastpath.PathReady)
		if resp.status != 200 || string(resp.body) != `{"status":"ready","healthy_workers":2}` {
			t.Errorf("/ready: %d %s", resp.status, resp.body)
		}
		var models struct {
			Object string `json:"object"`
			Data   []struct {
				ID, Object string
			} `json:"data"`
		}
		decodeJSON(t, r.get(t, fastpath.PathModels).body, &models)
		if len(models.Data) != 2 || models.Data[0].ID != e2eModel || models.Data[1].ID != "other-model" ||
			models.Data[0].Object != "model" {
			t.Errorf("/v1/models: %+v", models)
		}
		// A request for each model reaches the engine serving it.
		for _, tc := range []struct{ model, worker string }{{e2eModel, "1"}, {"other-model", "2"}} {
			resp := r.post(t, fastpath.PathCompletions, []byte(`{"model":"`+tc.model+`","prompt":"hello there","max_tokens":2}`), nil)
			if resp.status != 200 || resp.header.Get(fastpath.HeaderWorker) != tc.worker {
				t.Errorf("model %s: status %d worker %q: %s", tc.model, resp.status, resp.header.Get(fastpath.HeaderWorker), resp.body)
			}
		}
		waitReleased(t, r.node)

		var admin fastpath.Snapshot
		resp = r.get(t, fastpath.PathAdminWorkers)
		if ct := resp.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("/admin/workers Content-Type %q", ct)
		}
		decodeJSON(t, resp.body, &admin)
		if len(admin.Workers) != 2 {
			t.Fatalf("/admin/workers: %s", resp.body)
		}
		w := admin.Workers[1] // static workers take slots from the top down: worker 1 sorts last
		if w.WorkerID != 1 || w.Model != e2eModel || w.Endpoint != a.Addr() || w.Source != "static" || !w.Healthy ||
			w.KVCapacityBlocks != 1000 || w.Slot != workers.Max-1 {
			t.Errorf("/admin/workers worker 1: %+v", w)
		}
		if admin.Index.Capacity == 0 || admin.Feed != nil || admin.Queue.Booked != 2 || admin.Queue.Released != 2 {
			t.Errorf("/admin/workers summary: %s", resp.body)
		}

		m := r.metrics(t)
		for _, series := range []string{
			`kvfast_requests_total{endpoint="completions",status="ok"} 2`,
			`kvfast_requests_total{endpoint="chat_completions",status="client_error"} 0`,
			`kvfast_time_to_first_token_seconds_bucket{le=`,
			`kvfast_inter_token_latency_seconds_count`,
			`kvfast_input_sequence_tokens_count`,
			`kvfast_output_sequence_tokens_count`,
			`kvfast_routing_duration_seconds_count{stage="hash"} 2`,
			`kvfast_routing_duration_seconds_count{stage="lookup"} 2`,
			`kvfast_routing_duration_seconds_count{stage="schedule"} 2`,
			`kvfast_routing_duration_seconds_count{stage="total"} 2`,
			`kvfast_prompt_blocks_total`,
			`kvfast_cached_blocks_total`,
			`kvfast_worker_active_blocks{dp_rank="0",worker="1"} 0`,
			`kvfast_worker_prefill_tokens{dp_rank="0",worker="2"} 0`,
			`kvfast_worker_active_requests{dp_rank="0",worker="1"} 0`,
			`kvfast_worker_healthy{dp_rank="0",worker="2"} 1`,
			`kvfast_worker_index_blocks{dp_rank="0",worker="1"} 0`,
			`kvfast_feed_ring_lag_bytes{dp_rank="0",worker="1"} 0`,
			`kvfast_index_entries 0`,
			`kvfast_index_capacity `,
			`kvfast_admission_waiting 0`,
			`kvfast_requests_in_flight 0`,
			`kvfast_admission_refused_total 0`,
			`kvfast_dispatch_retries_total 0`,
			`go_goroutines `,
		} {
			if !strings.Contains(m, "\n"+series) {
				t.Errorf("/metrics lacks %q", series)
			}
		}
	})
	t.Run("with a feed", func(t *testing.T) {
		r := startE2ERig(t, rig.Config{Node: e2eConfig(), Engines: 1, Engine: mocker.Config{WorkerID: 4, Speedup: 20}})
		waitFor(t, "the feed to start", func() bool { a := r.node.Snapshot(); return a.Feed != nil && a.Feed.Ingesting && a.Feed.Records > 0 })
		var admin fastpath.Snapshot
		decodeJSON(t, r.get(t, fastpath.PathAdminWorkers).body, &admin)
		w := admin.Workers[0]
		if w.WorkerID != 4 || w.Source != "registry" || w.Generation == 0 || w.Slot != 0 || admin.Feed == nil {
			t.Errorf("/admin/workers with a registered engine: %+v %+v", w, admin.Feed)
		}
		if !strings.Contains(r.metrics(t), "\n"+`kvfast_feed_events_total{status="records_applied"} `) {
			t.Error("/metrics lacks the feed's counters")
		}
	})
}

// TestChatStreamThroughMock: a chat stream from a real mock engine arrives
// whole, ends with [DONE], and counts its items.
func TestChatStreamThroughMock(t *testing.T) {
	eng := startMock(t, mocker.Config{WorkerID: 1})
	r := startE2ERouter(t, e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.Addr(), Model: e2eModel}))
	body := []byte(`{"model":"mock","stream":true,"max_tokens":5,"stream_options":{"include_usage":true},` +
		`"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"say something"}]}`)
	resp := r.post(t, fastpath.PathChatCompletions, body, nil)
	if resp.status != 200 || !bytes.HasSuffix(resp.body, []byte(doneEvent)) {
		t.Fatalf("status %d: %s", resp.status, resp.body)
	}
	var content strings.Builder
	items := 0
	for ev := range bytes.SplitSeq(bytes.TrimSuffix(resp.body, []byte(doneEvent)), []byte("\n\n")) {
		if len(ev) == 0 {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct{ Content string }
			}
		}
		decodeJSON(t, bytes.TrimPrefix(ev, []byte("data: ")), &chunk)
		if len(chunk.Choices) > 0 {
			items++
			content.WriteString(chunk.Choices[0].Delta.Content)
		}
	}
	if items != 5 || content.Len() == 0 {
		t.Errorf("%d items, content %q", items, content.String())
	}
	waitReleased(t, r.node)
	m := r.metrics(t)
	wantMetric(t, m, `kvfast_requests_total{endpoint="chat_completions",status="ok"}`, 1)
	wantMetric(t, m, `kvfast_output_sequence_tokens_sum`, 5)
}

// TestConcurrentStreamsHammer: many clients at once, streaming and not,
// some leaving mid-stream; each gets exactly its own response, and every
// booking is released.
func TestConcurrentStreamsHammer(t *testing.T) {
	respond := func(ctx *fasthttp.RequestCtx) {
		var req struct {
			Prompt    []uint32 `json:"prompt"`
			MaxTokens int      `json:"max_tokens"`
			Stream    bool     `json:"stream"`
		}
		if err := json.Unmarshal(ctx.PostBody(), &req); err != nil || len(req.Prompt) == 0 {
			ctx.SetStatusCode(400)
			return
		}
		events := hammerEvents(req.Prompt[0], req.MaxTokens)
		if !req.Stream {
			ctx.SetContentType("application/json")
			ctx.SetBody(eventData(events[len(events)-2])) // the terminal item, as a body
			return
		}
		sseHandler(func(w *bufio.Writer) {
			for _, ev := range events {
				if writeFlush(w, ev) != nil {
					return
				}
				time.Sleep(time.Millisecond)
			}
		})(ctx)
	}
	var static []node.StaticWorker
	for i := range 3 {
		e := startE2EEngine(t, respond)
		static = append(static, node.StaticWorker{ID: uint64(i + 1), Endpoint: e.addr(), Model: e2eModel})
	}
	r := startE2ERouter(t, e2eConfig(static...))

	const clients, perClient = 6, 12
	var completed, cancelled atomic.Int64
	errs := make(chan error, clients*perClient)
	done := make(chan struct{})
	for c := range clients {
		go func() {
			defer func() { done <- struct{}{} }()
			for k := range perClient {
				id := uint32(c*1000 + k)
				stream, leave := k%3 != 2, k%5 == 4
				n := 4 + k%5
				tokens := append([]uint32{id}, e2eTokens(id, 47)...)
				if err := hammerOne(r, tokens, n, stream, leave); err != nil {
					errs <- err
					return
				}
				if leave {
					cancelled.Add(1)
				} else {
					completed.Add(1)
				}
			}
		}()
	}
	for range clients {
		<-done
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	waitReleased(t, r.node)
	v := r.node.Snapshot()
	if v.Queue.Booked != clients*perClient {
		t.Errorf("booked %d requests, want %d", v.Queue.Booked, clients*perClient)
	}
	m := r.metrics(t)
	if ok, _ := metricValue(m, `kvfast_requests_total{endpoint="completions",status="ok"}`); ok < float64(completed.Load()) {
		t.Errorf("%v requests counted ok, %d completed", ok, completed.Load())
	}
}

// hammerEvents is the stream the hammer's engines send for a prompt that
// starts with id.
func hammerEvents(id uint32, n int) [][]byte {
	var evs [][]byte
	for k := range n {
		fin := ""
		if k == n-1 {
			fin = "length"
		}
		evs = append(evs, itemEvent(k, " r"+strconv.FormatUint(uint64(id), 10)+"-"+strconv.Itoa(k), fin))
	}
	return append(evs, []byte(doneEvent))
}

// hammerOne sends one request and checks its answer; leave abandons a
// stream after its first event.
func hammerOne(r *e2eRouter, tokens []uint32, n int, stream, leave bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url+fastpath.PathCompletions,
		bytes.NewReader(completionBody(tokens, stream, n)))
	if err != nil {
		return err
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	want := hammerEvents(tokens[0], n)
	if leave && stream {
		ev, err := readEvent(bufio.NewReader(resp.Body))
		if err != nil || !bytes.Equal(ev, want[0]) {
			return fmt.Errorf("request %d: first event %q, %v", tokens[0], ev, err)
		}
		cancel()
		return nil
	}
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("request %d: %v", tokens[0], err)
	}
	if !stream {
		want = [][]byte{eventData(want[len(want)-2])}
	}
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got, concat(want)) {
		return fmt.Errorf("request %d (stream %v): status %d, got %q, want %q", tokens[0], stream, resp.StatusCode, got, concat(want))
	}
	return nil
}

// TestShutdownDeadlineCutsStreams: a stream that outlives the shutdown
// deadline is cut, Shutdown returns soon after its deadline with an error,
// and the stream's booking is released. Its client is told: the stream
// ends, properly framed, with a shutting_down error event and
// [DONE], not with a connection torn mid-chunk.
func TestShutdownDeadlineCutsStreams(t *testing.T) {
	eng := startE2EEngine(t, sseHandler(func(w *bufio.Writer) {
		for i := 0; ; i++ {
			if writeFlush(w, itemEvent(i, " tok", "")) != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}))
	r := startE2ERouter(t, e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.addr(), Model: e2eModel}))
	resp, _ := r.openStream(t, fastpath.PathCompletions, completionBody(e2eTokens(11, 32), true, 100000), nil)
	br := bufio.NewReader(resp.Body)
	if _, err := readEvent(br); err != nil {
		t.Fatal(err)
	}
	read := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(br)
		read <- b
	}()
	const deadline = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	shut := make(chan error, 1)
	go func() { shut <- r.node.Shutdown(ctx) }()
	select {
	case err := <-shut:
		if err == nil || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Shutdown cut a stream but returned %v", err)
		}
		if took := time.Since(start); took < deadline {
			t.Errorf("Shutdown returned after %v, before its deadline", took)
		}
	case <-time.After(deadline + 5*time.Second):
		t.Fatal("Shutdown did not return after its deadline: the endless stream was never cut")
	}
	select {
	case rest := <-read:
		event, ok := bytes.CutSuffix(rest, []byte(doneEvent))
		_, last, _ := bytes.Cut(event, []byte("data: {\"error\""))
		if !ok || last == nil || checkOpenAIError(t, bytes.TrimSpace(append([]byte(`{"error"`), last...))) != "shutting_down" {
			t.Errorf("a cut stream ended with %q, want a shutting_down error event and [DONE]", rest[max(0, len(rest)-300):])
		}
	case <-time.After(e2eWait):
		t.Fatal("the client's stream was not cut")
	}
	waitReleased(t, r.node)
}

// openTwoChoiceStream asks r for a stream of n=2 completions and returns
// its body, its status checked.
func openTwoChoiceStream(t *testing.T, r *e2eRouter) *bufio.Reader {
	t.Helper()
	body := bytes.Replace(completionBody(e2eTokens(3, 40), true, 2), []byte(`"stream"`), []byte(`"n":2,"stream"`), 1)
	resp, _ := r.openStream(t, fastpath.PathCompletions, body, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	return bufio.NewReader(resp.Body)
}

// TestSeveralChoicesEndWithTheLast: a streamed request for n=2
// completions keeps its booking until the second choice finishes, and a
// stream that breaks after only the first finished is a failure the
// client hears of (an error event, then [DONE]), not a success.
func TestSeveralChoicesEndWithTheLast(t *testing.T) {
	second := func(text, finish string) []byte {
		return bytes.Replace(itemEvent(1, text, finish), []byte(`"index":0`), []byte(`"index":1`), 1)
	}
	for _, broken := range []bool{false, true} {
		t.Run(map[bool]string{false: "whole", true: "broken"}[broken], func(t *testing.T) {
			next := make(chan struct{})
			var eng *e2eEngine
			eng = startE2EEngine(t, sseHandler(func(w *bufio.Writer) {
				_ = writeFlush(w, itemEvent(0, " a", "stop"))
				<-next
				_ = writeFlush(w, second(" b", ""))
				if broken {
					eng.kill()
					return
				}
				_ = writeFlush(w, second(" c", "length"))
				_ = writeFlush(w, []byte(doneEvent))
			}))
			r := startE2ERouter(t, e2eConfig(node.StaticWorker{ID: 5, Endpoint: eng.addr(), Model: e2eModel}))
			br := openTwoChoiceStream(t, r)
			if ev, err := readEvent(br); err != nil || !bytes.Contains(ev, []byte(`"finish_reason":"stop"`)) {
				t.Fatalf("first event %q, %v", ev, err)
			}
			if w := workerView(t, r.node, 5, 0); w.Requests != 1 {
				t.Fatalf("after the first choice finished: %d requests booked, want 1", w.Requests)
			}
			close(next)
			rest, err := io.ReadAll(br)
			if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("reading the rest: %v", err)
			}
			events, ok := bytes.CutSuffix(rest, []byte(doneEvent))
			if !ok {
				t.Fatalf("the stream did not end with [DONE]: %q", rest)
			}
			status := "ok"
			if broken {
				status = "engine_error"
				all := bytes.Split(bytes.TrimSpace(events), []byte("\n\n"))
				data, _ := bytes.CutPrefix(all[len(all)-1], []byte("data: "))
				if code := checkOpenAIError(t, data); code != "engine_failed" {
					t.Errorf("error code %q, want engine_failed", code)
				}
			} else if bytes.Contains(events, []byte(`"error"`)) || !bytes.Contains(events, []byte(`"finish_reason":"length"`)) {
				t.Errorf("after the first choice: %q", events)
			}
			waitReleased(t, r.node)
			waitFor(t, "the request to be counted", func() bool {
				v, _ := metricValue(r.metrics(t), `kvfast_requests_total{endpoint="completions",status="`+status+`"}`)
				return v == 1
			})
		})
	}
}

// TestSeveralChoicesEndingInOneEvent: an engine that ends two of a
// request's n=2 choices in one event has ended the request: its booking
// is released there, and a stream that then ends without [DONE] is whole.
// The two finishes had counted as one: the booking was held until the
// stream ended, and the client got engine_stream_truncated after a
// complete answer.
func TestSeveralChoicesEndingInOneEvent(t *testing.T) {
	both := []byte(`data: {"id":"cmpl-standin","object":"text_completion","created":1,"model":"` + e2eModel +
		`","choices":[{"index":0,"text":" a","finish_reason":"stop"},{"index":1,"text":" b","finish_reason":"length"}]}` + "\n\n")
	end := make(chan struct{})
	eng := startE2EEngine(t, sseHandler(func(w *bufio.Writer) {
		_ = writeFlush(w, itemEvent(0, " x", ""))
		_ = writeFlush(w, both)
		<-end // the engine holds the stream open after the last finish
	}))
	r := startE2ERouter(t, e2eConfig(node.StaticWorker{ID: 5, Endpoint: eng.addr(), Model: e2eModel}))
	br := openTwoChoiceStream(t, r)
	for range 2 {
		if _, err := readEvent(br); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the booking released at the last choice's finish", func() bool { return workerView(t, r.node, 5, 0).Requests == 0 })
	close(end)
	rest, err := io.ReadAll(br)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("reading the rest: %v", err)
	}
	if bytes.Contains(rest, []byte(`"error"`)) {
		t.Errorf("after both choices finished: %q", rest)
	}
	waitFor(t, "the request to be counted ok", func() bool {
		v, _ := metricValue(r.metrics(t), `kvfast_requests_total{endpoint="completions",status="ok"}`)
		return v == 1
	})
}

// TestModelWithNoLiveWorkerIs503: once every engine serving a model has
// left (down or restarting), a request naming it gets 503
// model_unavailable with Retry-After, which clients retry, not the 404
// of a model the router never served; an unknown model still gets 404.
func TestModelWithNoLiveWorkerIs503(t *testing.T) {
	r := startE2ERig(t, rig.Config{Node: e2eConfig(), Engines: 1})
	body := completionBody(e2eTokens(3, 32), false, 2)
	if res := r.post(t, "/v1/completions", body, nil); res.status != http.StatusOK {
		t.Fatalf("with its engine up: %d %s", res.status, res.body)
	}
	if err := r.rig.Engines[0].Close(); err != nil {
		t.Fatal(err)
	}
	// The worker leaves the scheduler first and the front end's model
	// table at the end of the node's scan; in between a request finds the
	// model but no worker (503 no_worker_available).
	waitFor(t, "the engine and its model to leave", func() bool {
		return len(r.node.Snapshot().Workers) == 0 && !bytes.Contains(r.get(t, fastpath.PathModels).body, []byte(`"id":"mock"`))
	})
	res := r.post(t, "/v1/completions", body, nil)
	if res.status != http.StatusServiceUnavailable || checkOpenAIError(t, res.body) != "model_unavailable" || res.header.Get("Retry-After") == "" {
		t.Fatalf("a model whose engines all left: %d %s (Retry-After %q)", res.status, res.body, res.header.Get("Retry-After"))
	}
	other := bytes.Replace(body, []byte(`"model":"mock"`), []byte(`"model":"never-served"`), 1)
	if res := r.post(t, "/v1/completions", other, nil); res.status != http.StatusNotFound || checkOpenAIError(t, res.body) != "model_not_found" {
		t.Fatalf("a model never served: %d %s", res.status, res.body)
	}
}

// TestRequestDurationCountsEveryRequest: the time to first token and
// the gaps between tokens exist only for streams; every request, streamed
// or not, is timed end to end (a dashboard of a router whose clients do
// not stream had no latency at all).
func TestRequestDurationCountsEveryRequest(t *testing.T) {
	eng := startMock(t, mocker.Config{WorkerID: 1})
	r := startE2ERouter(t, e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.Addr(), Model: e2eModel}))
	for i, stream := range []bool{false, false, true} {
		if resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(uint32(90+i), 32), stream, 2), nil); resp.status != http.StatusOK {
			t.Fatalf("status %d: %s", resp.status, resp.body)
		}
	}
	waitReleased(t, r.node)
	m := r.metrics(t)
	wantMetric(t, m, `kvfast_request_duration_seconds_count{endpoint="completions"}`, 3)
	wantMetric(t, m, "kvfast_time_to_first_token_seconds_count", 1)
}

// TestReadyNeedsAWorkerThatAnswers: /ready and kvfast_routable_workers
// count the healthy workers that can answer a request whole. An encoder
// or a prefill engine healthy alone, or SGLang's decode engines with no
// prefill engine (an aggregated engine is none), leave the router not ready (every request got 503
// while /ready said ready); a vLLM decode engine is ready alone, as it
// computes the prompt itself when no prefill engine is up.
func TestReadyNeedsAWorkerThatAnswers(t *testing.T) {
	live := func(id uint64, role workers.Role) node.StaticWorker {
		eng := startMock(t, mocker.Config{WorkerID: id, Role: role, ECStore: mocker.NewECStore()})
		return node.StaticWorker{ID: id, Endpoint: eng.Addr(), Model: e2eModel, Role: role}
	}
	const deadID = 9
	dead := func(role workers.Role) node.StaticWorker {
		return node.StaticWorker{ID: deadID, Endpoint: testnet.RefusingAddr(t), Model: e2eModel, Role: role}
	}
	for _, tc := range []struct {
		name    string
		disagg  string
		workers []node.StaticWorker
		ready   int
	}{
		{"an encoder alone", fastpath.DisaggOff, []node.StaticWorker{live(1, workers.RoleEncode), dead(workers.RoleBoth)}, 0},
		{"an encoder and an engine", fastpath.DisaggOff, []node.StaticWorker{live(1, workers.RoleEncode), live(2, workers.RoleBoth)}, 1},
		{"vLLM, a prefill engine alone", fastpath.DisaggVLLM, []node.StaticWorker{live(1, workers.RolePrefill), dead(workers.RoleDecode)}, 0},
		{"vLLM, a decode engine alone", fastpath.DisaggVLLM, []node.StaticWorker{dead(workers.RolePrefill), live(2, workers.RoleDecode)}, 1},
		{"SGLang, a decode engine alone", fastpath.DisaggSGLang, []node.StaticWorker{dead(workers.RolePrefill), live(2, workers.RoleDecode)}, 0},
		{"SGLang, both stages", fastpath.DisaggSGLang, []node.StaticWorker{live(1, workers.RolePrefill), live(2, workers.RoleDecode)}, 1},
		// An aggregated SGLang engine answers alone but is no prefill: the
		// decode engine beside it cannot answer.
		{"SGLang, an aggregated and a decode engine", fastpath.DisaggSGLang, []node.StaticWorker{live(1, workers.RoleBoth), live(2, workers.RoleDecode), dead(workers.RolePrefill)}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := e2eConfig(tc.workers...)
			cfg.HTTP.Disagg.Protocol = tc.disagg
			cfg.Dispatch.Health.Interval = 100 * time.Millisecond // the dead engine found out
			r := startE2ERouter(t, cfg)
			// The live engines healthy and the dead one not, as their
			// health checks find them.
			var seen []string
			defer func() {
				if t.Failed() {
					t.Logf("workers last seen (id, healthy, ejected, endpoint): %v", seen)
				}
			}()
			waitFor(t, "every worker's health checked", func() bool {
				snap := r.node.Snapshot()
				seen = seen[:0]
				for _, w := range snap.Workers {
					seen = append(seen, fmt.Sprintf("%d %v %v %s", w.WorkerID, w.Healthy, w.Ejected, w.Endpoint))
				}
				for _, w := range snap.Workers {
					if w.Healthy != (w.WorkerID != deadID) {
						return false
					}
				}
				return len(snap.Workers) == len(tc.workers)
			})
			resp := r.get(t, fastpath.PathReady)
			if wantStatus := map[bool]int{true: 200, false: 503}[tc.ready > 0]; resp.status != wantStatus ||
				!strings.Contains(string(resp.body), fmt.Sprintf(`"healthy_workers":%d`, tc.ready)) {
				t.Errorf("/ready: %d %s, want %d with %d workers", resp.status, resp.body, wantStatus, tc.ready)
			}
			wantMetric(t, r.metrics(t), "kvfast_routable_workers", float64(tc.ready))
		})
	}
}

// TestPromptEmbedsRouted: vLLM's prompt_embeds with an empty prompt, as
// vLLM's own example sends it through the OpenAI client, reaches the
// engine unchanged (it was refused with 400 empty_prompt), and the same
// embeddings sent again go where they went before.
func TestPromptEmbedsRouted(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	answer := func(ctx *fasthttp.RequestCtx) {
		mu.Lock()
		bodies = append(bodies, string(ctx.PostBody()))
		mu.Unlock()
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"x","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`)
	}
	a, b := startE2EEngine(t, answer), startE2EEngine(t, answer)
	r := startE2ERouter(t, e2eConfig(
		node.StaticWorker{ID: 1, Endpoint: a.addr(), Model: e2eModel},
		node.StaticWorker{ID: 2, Endpoint: b.addr(), Model: e2eModel},
	))
	embeds := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("tensor bytes "), 4000))
	body := []byte(`{"model":"` + e2eModel + `","prompt":"","prompt_embeds":"` + embeds + `","max_tokens":4}`)
	first := r.post(t, fastpath.PathCompletions, body, nil)
	if first.status != http.StatusOK {
		t.Fatalf("status %d: %s", first.status, first.body)
	}
	again := r.post(t, fastpath.PathCompletions, body, nil)
	if again.status != http.StatusOK || again.header.Get(fastpath.HeaderWorker) != first.header.Get(fastpath.HeaderWorker) ||
		again.header.Get(fastpath.HeaderOverlapBlocks) == "0" {
		t.Errorf("the same embeddings again: status %d, worker %q (first %q), overlap %q blocks", again.status,
			again.header.Get(fastpath.HeaderWorker), first.header.Get(fastpath.HeaderWorker), again.header.Get(fastpath.HeaderOverlapBlocks))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 2 || bodies[0] != string(body) {
		t.Errorf("the engines got %d bodies, the first %d bytes; want the client's %d bytes unchanged", len(bodies), len(bodies[0]), len(body))
	}
	if resp := r.post(t, fastpath.PathCompletions, []byte(`{"model":"`+e2eModel+`","prompt_embeds":["AAAA","BBBB"]}`), nil); resp.status != http.StatusBadRequest {
		t.Errorf("a batch of embeddings: status %d, want 400", resp.status)
	}
}
