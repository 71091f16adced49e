package replay

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/radix"
)

// standIn is a tiny OpenAI-compatible streaming server with an unbounded
// prefix cache of 4-token blocks, standing in for router + engine.
type standIn struct {
	firstToken time.Duration // delay before the first chunk
	tokenGap   time.Duration // delay between chunks
	// hold, when set, keeps every request waiting before its first chunk
	// until hold is closed or the client leaves; arrived then gets a
	// signal per request.
	hold    chan struct{}
	arrived chan struct{}

	mu       sync.Mutex
	cache    map[uint64]bool
	requests []standInRequest
	srv      *httptest.Server
}

type standInRequest struct {
	Model         string   `json:"model"`
	Prompt        []uint32 `json:"prompt"`
	MaxTokens     int      `json:"max_tokens"`
	Stream        bool     `json:"stream"`
	IgnoreEOS     bool     `json:"ignore_eos"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

const standInBlock = 4

// Magic max_tokens values make the stand-in fail in the two ways a router
// can: refusing the request, and breaking off a stream.
const (
	refuseMaxTokens  = 13
	failMidMaxTokens = 14
)

func newStandIn(t *testing.T, firstToken, tokenGap time.Duration) *standIn {
	return startStandIn(t, &standIn{firstToken: firstToken, tokenGap: tokenGap})
}

// newHoldingStandIn returns a stand-in whose requests stay in flight
// until the client leaves (see standIn.hold).
func newHoldingStandIn(t *testing.T) *standIn {
	return startStandIn(t, &standIn{hold: make(chan struct{}), arrived: make(chan struct{}, 16)})
}

func startStandIn(t *testing.T, s *standIn) *standIn {
	s.cache = map[uint64]bool{}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve)) // listens on 127.0.0.1:0
	t.Cleanup(s.srv.Close)
	return s
}

func (s *standIn) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/completions" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	var req standInRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Prompt) == 0 || req.MaxTokens < 1 {
		http.Error(w, fmt.Sprintf("bad request: %v", err), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	n := len(s.requests)
	s.requests = append(s.requests, req)
	if req.MaxTokens == refuseMaxTokens {
		s.mu.Unlock()
		http.Error(w, `{"error":{"message":"overloaded"}}`, http.StatusServiceUnavailable)
		return
	}
	hashes := radix.AppendBlockHashes(nil, 0, req.Prompt, standInBlock)
	cached := 0
	for _, h := range hashes {
		if !s.cache[h] {
			break
		}
		cached += standInBlock
	}
	for _, h := range hashes {
		s.cache[h] = true
	}
	s.mu.Unlock()

	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set(WorkerHeader, fmt.Sprintf("w%d", n%2))
	flusher := w.(http.Flusher)
	if s.hold != nil {
		s.arrived <- struct{}{}
		select {
		case <-s.hold:
		case <-r.Context().Done():
			return
		}
	}
	time.Sleep(s.firstToken)
	fmt.Fprint(w, ": keep-alive comment\n\n")
	for i := range req.MaxTokens {
		if i > 0 {
			time.Sleep(s.tokenGap)
		}
		if req.MaxTokens == failMidMaxTokens && i == 1 {
			fmt.Fprint(w, "data: {\"error\":{\"message\":\"engine died\"}}\n\n")
			flusher.Flush()
			return
		}
		finish := "null"
		if i == req.MaxTokens-1 {
			finish = `"length"`
		}
		fmt.Fprintf(w, "data: {\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\" t%d\",\"finish_reason\":%s}]}\n\n", i, finish)
		flusher.Flush()
	}
	if req.StreamOptions.IncludeUsage {
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n",
			len(req.Prompt), req.MaxTokens, cached)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func (s *standIn) received() []standInRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// tinyTrace has 8-token blocks; the stand-in caches 4-token blocks.
// Expected cached tokens, by record:
//
//	r0 [1 2 3]   24 tokens        cold: 0
//	r1 [1 2 4]   20 (8 8 4)       blocks 1,2: 16
//	r2 [1 2 4]   24               r1 sent only 4 tokens of id 4: 16+4 = 20
//	r3 [9 2 3]   24               new first block: 0
//	r4 [1 2 3 5] 28 (8 8 8 4)     all of r0: 24
//	r5 [7]       8, refused       -
//	r6 [1]       8, fails mid-stream
const tinyTrace = `{"timestamp":0,"input_length":24,"output_length":3,"hash_ids":[1,2,3]}
{"timestamp":5,"input_length":20,"output_length":1,"hash_ids":[1,2,4]}
{"timestamp":10,"input_length":24,"output_length":4,"hash_ids":[1,2,4]}
{"timestamp":15,"input_length":24,"output_length":2,"hash_ids":[9,2,3]}
{"timestamp":20,"input_length":28,"output_length":5,"hash_ids":[1,2,3,5]}
{"timestamp":25,"input_length":8,"output_length":13,"hash_ids":[7]}
{"timestamp":30,"input_length":8,"output_length":14,"hash_ids":[1]}
`

func loadTiny(t *testing.T) *Trace {
	t.Helper()
	tr, err := ReadTrace(strings.NewReader(tinyTrace), "tiny.jsonl", TraceOptions{BlockSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestRunEndToEnd(t *testing.T) {
	const firstToken, tokenGap = 3 * time.Millisecond, time.Millisecond
	s := newStandIn(t, firstToken, tokenGap)
	tr := loadTiny(t)
	var progress strings.Builder
	res, err := Run(context.Background(), Config{
		RouterURL:   s.srv.URL,
		Trace:       tr,
		Concurrency: 1, // one at a time, so the stand-in's cache sees trace order
		Tokens:      TokenSynth{Seed: 3},
		Model:       "m1",
		Timeout:     10 * time.Second,
		Progress:    &progress,
	})
	if err != nil {
		t.Fatal(err)
	}

	got := s.received()
	if len(got) != tr.Len() {
		t.Fatalf("stand-in saw %d requests, want %d", len(got), tr.Len())
	}
	synth := TokenSynth{Seed: 3, TraceBlockSize: 8}
	for i, req := range got {
		rec := &tr.Records[i]
		if want := synth.AppendPrompt(nil, rec); !slices.Equal(req.Prompt, want) {
			t.Errorf("request %d: prompt differs from the synthesised one", i)
		}
		if req.Model != "m1" || !req.Stream || !req.StreamOptions.IncludeUsage || !req.IgnoreEOS || req.MaxTokens != rec.OutputLength {
			t.Errorf("request %d: %+v", i, req)
		}
	}

	wantCached := []int{0, 16, 20, 0, 24}
	for i, want := range wantCached {
		q := res.Requests[i]
		out := tr.Records[i].OutputLength
		switch {
		case !q.OK():
			t.Errorf("request %d failed: %s", i, q.Err)
		case q.UsageCachedTokens != want || q.UsagePromptTokens != q.PromptTokens || q.PromptTokens != tr.Records[i].InputLength:
			t.Errorf("request %d: cached %d of %d (sent %d), want %d of %d", i, q.UsageCachedTokens, q.UsagePromptTokens, q.PromptTokens, want, tr.Records[i].InputLength)
		case q.Chunks != out || q.OutputTokens() != out:
			t.Errorf("request %d: %d chunks, %d output tokens, want %d", i, q.Chunks, q.OutputTokens(), out)
		case q.TTFT < firstToken || q.Latency < firstToken+time.Duration(out-1)*tokenGap:
			// Lower bounds from the request's start only: a client
			// descheduled past the first token sees the rest at once,
			// so the gap between its TTFT and its end says nothing.
			t.Errorf("request %d: TTFT %v, latency %v: faster than the server can answer", i, q.TTFT, q.Latency)
		case q.Worker != fmt.Sprintf("w%d", i%2) || q.Status != 200:
			t.Errorf("request %d: worker %q, status %d", i, q.Worker, q.Status)
		}
	}
	if q := res.Requests[5]; q.OK() || q.Status != 503 || !strings.Contains(q.Err, "HTTP 503") || !strings.Contains(q.Err, "overloaded") {
		t.Errorf("refused request: %+v", q)
	}
	if q := res.Requests[6]; q.OK() || !strings.Contains(q.Err, "engine died") {
		t.Errorf("broken stream: %+v", q)
	}

	sum := res.Summary()
	if sum.Requests != 7 || sum.Succeeded != 5 || sum.Errors != 2 || len(sum.ErrorSamples) != 2 {
		t.Fatalf("summary counts: %+v", sum)
	}
	if want := 60.0 / 120.0; sum.HitRate != want {
		t.Errorf("hit rate %v, want %v", sum.HitRate, want)
	}
	// Bound over all 7 records: hits 16+20+24+8 of 136 tokens (record
	// 2's block 4 is whole, and record 1 had only its first 4 tokens).
	if want := 68.0 / 136.0; res.Bound.Tokens != want || sum.HitRate > res.Bound.Tokens {
		t.Errorf("bound %v, want %v, above the measured %v", res.Bound.Tokens, want, sum.HitRate)
	}
	if wantGaps := 2 + 0 + 3 + 1 + 4; len(res.Gaps) != wantGaps {
		t.Errorf("%d inter-chunk gaps, want %d", len(res.Gaps), wantGaps)
	}
	if sum.ITLMean < tokenGap/2 || sum.TTFTP50 < firstToken || sum.RequestsPerSec <= 0 || sum.OutputTokens != 15 {
		t.Errorf("summary timings: %+v", sum)
	}
	if sum.Workers["w0"]+sum.Workers["w1"] != 5 {
		t.Errorf("workers %v", sum.Workers)
	}
	if res.Mode != ModeConcurrency || !strings.Contains(progress.String(), "7/7") {
		t.Errorf("mode %q, progress output %q", res.Mode, progress.String())
	}
}

func TestRunOptions(t *testing.T) {
	s := newStandIn(t, 0, 0)
	tr := loadTiny(t)
	t.Run("timestamps with speed-up", func(t *testing.T) {
		res, err := Run(context.Background(), Config{RouterURL: s.srv.URL + "/", Trace: tr, Speedup: 2, MaxRequests: 5})
		if err != nil {
			t.Fatal(err)
		}
		if res.Mode != ModeTimestamps || len(res.Requests) != 5 || res.Duration < 10*time.Millisecond {
			t.Fatalf("mode %s, %d requests in %v", res.Mode, len(res.Requests), res.Duration)
		}
		for i, q := range res.Requests {
			if want := tr.Records[i].Timestamp / 2; q.Scheduled != want || q.Sent < q.Scheduled || !q.OK() {
				t.Errorf("request %d: scheduled %v (want %v), sent %v, err %q", i, q.Scheduled, want, q.Sent, q.Err)
			}
		}
		if want := tr.Head(5).HitBound(0); res.Bound != want {
			t.Errorf("bound %+v, want the head's %+v", res.Bound, want)
		}
	})
	t.Run("base URL ending in /v1", func(t *testing.T) {
		// As the OpenAI clients take it: /v1/v1/completions was a 404.
		res, err := Run(context.Background(), Config{RouterURL: s.srv.URL + "/v1/", Trace: tr, Concurrency: 1, MaxRequests: 2})
		if err != nil {
			t.Fatal(err)
		}
		for i, q := range res.Requests {
			if !q.OK() {
				t.Errorf("request %d: %+v", i, q)
			}
		}
	})
	t.Run("output cap and smaller blocks", func(t *testing.T) {
		res, err := Run(context.Background(), Config{RouterURL: s.srv.URL + "/v1/completions", Trace: tr, Concurrency: 3,
			MaxRequests: 5, MaxOutputTokens: 2, Tokens: TokenSynth{BlockTokens: 4}})
		if err != nil {
			t.Fatal(err)
		}
		for i, q := range res.Requests {
			want := min(tr.Records[i].OutputLength, 2)
			if !q.OK() || q.Chunks != want || q.PromptTokens != (TokenSynth{TraceBlockSize: 8, BlockTokens: 4}).PromptLen(&tr.Records[i]) {
				t.Errorf("request %d: %+v", i, q)
			}
		}
		if res.BlockTokens != 4 || res.Bound != tr.Head(5).HitBound(4) {
			t.Errorf("block tokens %d, bound %+v", res.BlockTokens, res.Bound)
		}
	})
	t.Run("bad configs", func(t *testing.T) {
		for name, cfg := range map[string]Config{
			"no trace":          {RouterURL: s.srv.URL},
			"not http":          {RouterURL: "ftp://x", Trace: tr},
			"no host":           {RouterURL: "http://", Trace: tr},
			"negative speedup":  {Trace: tr, Speedup: -1},
			"negative conc":     {Trace: tr, Concurrency: -1},
			"negative requests": {Trace: tr, MaxRequests: -1},
			"huge blocks":       {Trace: tr, Tokens: TokenSynth{BlockTokens: 1 << 20}},
		} {
			if _, err := Run(context.Background(), cfg); !errors.Is(err, ErrBadConfig) {
				t.Errorf("%s: error %v, want ErrBadConfig", name, err)
			}
		}
	})
}

// TestRunBodyLimit: a request larger than the router accepts is refused
// before anything is sent, and before its prompt is built: a record of
// 51M tokens would take gigabytes.
func TestRunBodyLimit(t *testing.T) {
	if DefaultMaxBodyBytes != openai.DefaultMaxBodyBytes {
		t.Fatalf("DefaultMaxBodyBytes %d is not the router's default %d", DefaultMaxBodyBytes, openai.DefaultMaxBodyBytes)
	}
	s := newStandIn(t, 0, 0)
	var huge strings.Builder
	huge.WriteString(`{"timestamp":0,"input_length":8,"output_length":1,"hash_ids":[1]}` + "\n")
	huge.WriteString(`{"timestamp":1,"input_length":51200000,"output_length":4,"hash_ids":[0`)
	for i := 1; i < 100000; i++ {
		fmt.Fprintf(&huge, ",%d", i)
	}
	huge.WriteString("]}\n")
	tr, err := ReadTrace(strings.NewReader(huge.String()), "huge.jsonl", TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, workload := range []string{WorkloadTokens, WorkloadChat} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := Run(context.Background(), Config{RouterURL: s.srv.URL, Trace: tr, Workload: workload})
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "huge.jsonl:2") || !strings.Contains(err.Error(), "at least") {
			t.Fatalf("%s: error %v, want one naming huge.jsonl:2", workload, err)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
			t.Errorf("%s: refusing allocated %d MB", workload, grew>>20)
		}
	}
	if n := len(s.received()); n != 0 {
		t.Fatalf("%d requests sent", n)
	}

	// Near the limit the body is measured exactly: the largest body of the
	// tiny trace fits a limit of its size, not one byte less.
	tiny := loadTiny(t)
	for _, workload := range []string{WorkloadTokens, WorkloadChat} {
		rb, largest, line := newRequestBody(DefaultModel), 0, 0
		synth, chat := TokenSynth{TraceBlockSize: 8}.normalized(), ChatSynth{TraceBlockSize: 8}.normalized()
		for i := range tiny.Records {
			rec := &tiny.Records[i]
			body := rb.appendBody(nil, synth.AppendPrompt(nil, rec), max(rec.OutputLength, 1))
			if workload == WorkloadChat {
				body = rb.appendChat(nil, chat, rec, max(rec.OutputLength, 1))
			}
			if len(body) > largest {
				largest, line = len(body), rec.Line
			}
		}
		if _, err := Run(context.Background(), Config{RouterURL: s.srv.URL, Trace: tiny, Workload: workload, MaxRequests: 5, MaxBodyBytes: largest}); err != nil {
			t.Errorf("%s: limit %d, the largest body: %v", workload, largest, err)
		}
		_, err := Run(context.Background(), Config{RouterURL: s.srv.URL, Trace: tiny, Workload: workload, MaxBodyBytes: largest - 1})
		if want := fmt.Sprintf("tiny.jsonl:%d", line); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), want) ||
			!strings.Contains(err.Error(), fmt.Sprintf("a body of %d bytes", largest)) {
			t.Errorf("%s: limit %d: error %v, want one naming %s", workload, largest-1, err, want)
		}
	}
}

func TestRunFailures(t *testing.T) {
	tr := loadTiny(t)
	t.Run("router down", func(t *testing.T) {
		s := newStandIn(t, 0, 0)
		url := s.srv.URL
		s.srv.Close()
		// A key in the URL's credentials or query stays out of the
		// failures the report prints.
		keyed := strings.Replace(url, "://", "://user:sekrit1@", 1) + "/?key=sekrit2"
		res, err := Run(context.Background(), Config{RouterURL: keyed, Trace: tr, Concurrency: 2})
		if err != nil {
			t.Fatal(err)
		}
		if sum := res.Summary(); sum.Errors != tr.Len() || sum.Succeeded != 0 {
			t.Fatalf("summary %+v", sum)
		}
		for _, r := range res.Requests {
			if r.Err == "" || strings.Contains(r.Err, "sekrit") {
				t.Fatalf("a failure reads %q", r.Err)
			}
		}
		if _, err := Run(context.Background(), Config{RouterURL: "http://user:sekrit3@[::1", Trace: tr}); err == nil || strings.Contains(err.Error(), "sekrit") {
			t.Fatalf("an unparsable URL's error: %v", err)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		s := newStandIn(t, 300*time.Millisecond, 0)
		res, err := Run(context.Background(), Config{RouterURL: s.srv.URL, Trace: tr, MaxRequests: 1, Timeout: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if q := res.Requests[0]; q.OK() || !strings.Contains(q.Err, "deadline") {
			t.Fatalf("request: %+v", q)
		}
	})
	t.Run("refused before the body is read", func(t *testing.T) {
		// A router that answers 429 from the request's header and resets
		// the connection with the body unread, as its edge does past its
		// lingering bound: the request ends, failed, and Run returns. (A
		// 600-request burst against a real router once left requests
		// waiting for ever for the transport to close their bodies; this
		// stand-in does not reproduce that hold, which replay now bounds.)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_, _ = bufio.NewReader(c).ReadString('\n') // the request line: enough to answer
				_, _ = io.WriteString(c, "HTTP/1.1 429 Too Many Requests\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
				_ = c.Close() // unread bytes: a reset
			}
		}()
		ids := make([]string, 1024) // 512K tokens, some MB of body: past the socket buffers
		for i := range ids {
			ids[i] = fmt.Sprint(i)
		}
		big, err := ReadTrace(strings.NewReader(`{"timestamp":0,"input_length":524288,"output_length":1,"hash_ids":[`+
			strings.Join(ids, ",")+`]}`), "big", TraceOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res, err := Run(ctx, Config{RouterURL: "http://" + ln.Addr().String(), Trace: big})
		if err != nil {
			t.Fatalf("Run: %v (it did not end the refused request)", err)
		}
		if q := res.Requests[0]; q.OK() || q.Err == "" {
			t.Fatalf("request: %+v", q)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		s := newHoldingStandIn(t)
		slow, err := ReadTrace(strings.NewReader(`{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":[1]}
{"timestamp":60000,"input_length":1,"output_length":1,"hash_ids":[2]}`), "slow", TraceOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Cancelled while the first request is in flight and the second
		// a minute away.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-s.arrived:
			case <-time.After(10 * time.Second): // the checks below report it
			}
			cancel()
		}()
		start := time.Now()
		res, err := Run(ctx, Config{RouterURL: s.srv.URL, Trace: slow})
		if !errors.Is(err, context.Canceled) || res == nil {
			t.Fatalf("error %v, result %v", err, res)
		}
		if time.Since(start) > 5*time.Second {
			t.Fatal("Run did not stop promptly")
		}
		if a, b := res.Requests[0], res.Requests[1]; !a.Attempted || a.OK() || !a.Interrupted || b.Attempted {
			t.Fatalf("requests after cancel: %+v, %+v", a, b)
		}
		// The request the interrupt cut is neither the router's failure
		// nor a success.
		sum := res.Summary()
		if sum.Requests != 0 || sum.Errors != 0 || sum.Interrupted != 1 {
			t.Fatalf("summary %+v", sum)
		}
		var text strings.Builder
		if err := sum.WriteText(&text); err != nil || !strings.Contains(text.String(), "1 more cut short by the interrupt") {
			t.Errorf("report (%v) does not count the cut request:\n%s", err, text.String())
		}
	})
}

// parseStream runs the SSE reader over a canned body.
func parseStream(body string) (RequestResult, []time.Duration, error) {
	var (
		r  runner
		b  requestBuffers
		rr RequestResult
	)
	err := r.readStream(strings.NewReader(body), &b, time.Now(), &rr)
	return rr, b.gaps, err
}

func TestReadStream(t *testing.T) {
	const tok = `{"choices":[{"text":"a","finish_reason":null}]}`
	const fin = `{"choices":[{"text":"","finish_reason":"stop"}]}`
	const usage = `{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}`
	tests := []struct {
		name             string
		body             string
		chunks, cached   int
		hasUsage         bool
		wantErr          string
		promptFromUsage  int
		completionTokens int
	}{
		{name: "vLLM-style", body: "data: " + tok + "\n\ndata: " + tok + "\n\ndata: " + fin + "\n\ndata: " + usage + "\n\ndata: [DONE]\n\n",
			chunks: 2, cached: 4, hasUsage: true, promptFromUsage: 10, completionTokens: 2},
		{name: "CRLF, comments, no space after colon", body: ": hi\r\n\r\ndata:" + tok + "\r\n\r\nevent: x\r\ndata:[DONE]\r\n\r\n", chunks: 1},
		{name: "empty-text token still counts", body: "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":null}]}\n\ndata: [DONE]\n\n", chunks: 1},
		{name: "chat deltas", body: "data: {\"choices\":[{\"delta\":{\"content\":\"x\"},\"finish_reason\":\"stop\"}]}\n\n", chunks: 1},
		{name: "finish without [DONE] is complete", body: "data: " + tok + "\n\ndata: " + fin, chunks: 1},
		{name: "usage without details", body: "data: " + tok + "\n\ndata: {\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n",
			chunks: 1, hasUsage: true, promptFromUsage: 3, completionTokens: 1},
		{name: "no output", body: "data: " + usage + "\n\ndata: [DONE]\n\n", wantErr: "without output"},
		{name: "truncated", body: "data: " + tok + "\n\n", wantErr: "ended before"},
		{name: "empty body", body: "", wantErr: "without output"},
		{name: "OpenAI error", body: "data: {\"error\":{\"message\":\"boom\"}}\n\n", wantErr: "boom"},
		{name: "vLLM error", body: "data: {\"object\":\"error\",\"message\":\"bad\"}\n\n", wantErr: "bad"},
		{name: "error without message", body: "data: {\"error\":\"plain\"}\n\n", wantErr: "plain"},
		{name: "garbage", body: "data: {nope\n\n", wantErr: "cannot decode stream event"},
		{name: "line longer than the buffer", body: "data: {\"choices\":[{\"text\":\"" + strings.Repeat("x", 200<<10) + "\",\"finish_reason\":\"stop\"}]}\n\n", chunks: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rr, gaps, err := parseStream(tt.body)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if rr.Chunks != tt.chunks || len(gaps) != tt.chunks-1 || rr.HasUsage != tt.hasUsage || rr.UsageCachedTokens != tt.cached ||
				rr.UsagePromptTokens != tt.promptFromUsage || rr.UsageCompletionTokens != tt.completionTokens {
				t.Fatalf("got %+v with %d gaps", rr, len(gaps))
			}
			if rr.TTFT <= 0 || rr.Latency < rr.TTFT {
				t.Fatalf("TTFT %v, latency %v", rr.TTFT, rr.Latency)
			}
		})
	}
}

// FuzzReadStream feeds arbitrary response bodies to the SSE reader: it must
// not panic, and whatever it accepts must have produced output.
func FuzzReadStream(f *testing.F) {
	f.Add("data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":null}]}\n\ndata: [DONE]\n\n")
	f.Add("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":1}}}\n\n")
	f.Add(": c\r\ndata:{\"error\":null,\"choices\":[{\"finish_reason\":\"stop\",\"text\":\"x\"}]}\n")
	f.Add("data: a\ndata: b\n\n")
	f.Add("\n\n\ndata: [DONE]")
	f.Fuzz(func(t *testing.T, body string) {
		rr, gaps, err := parseStream(body)
		if err == nil && (rr.Chunks < 1 || len(gaps) != rr.Chunks-1) {
			t.Fatalf("accepted %q with %d chunks, %d gaps", body, rr.Chunks, len(gaps))
		}
	})
}
