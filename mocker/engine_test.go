package mocker

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func startEngine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	if cfg.Timing == (Timing{}) {
		cfg.Timing = testTiming
	}
	e, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return e
}

var testClient = &http.Client{Timeout: 20 * time.Second}

func do(t *testing.T, method, url, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type response struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Text    *string `json:"text"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
	Error *struct {
		Message string `json:"message"`
		Type    string `json:"type"`
	} `json:"error"`
}

func decode(t *testing.T, b []byte) response {
	t.Helper()
	var r response
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("cannot decode %s: %v", b, err)
	}
	return r
}

// readSSE reads a whole event stream; it fails unless every event is
// "data: <json>" and the last is "data: [DONE]".
func readSSE(t *testing.T, r io.Reader) []response {
	t.Helper()
	var out []response
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	done := false
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		if done {
			t.Fatalf("event after [DONE]: %q", line)
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("not an SSE data line: %q", line)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		out = append(out, decode(t, []byte(data)))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !done {
		t.Fatal("stream did not end with [DONE]")
	}
	return out
}

func stream(t *testing.T, url, body string) []response {
	t.Helper()
	resp, err := testClient.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return readSSE(t, resp.Body)
}

func idsJSON(ids []uint32) string {
	b, _ := json.Marshal(ids)
	return string(b)
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestHTTPCompletions(t *testing.T) {
	rec := &Recorder{}
	e := startEngine(t, Config{Model: "m", Speedup: math.Inf(1), Publisher: rec})
	prompt := idsJSON(seq(1, 40))

	var plain string
	t.Run("non-streaming", func(t *testing.T) {
		for i, wantCached := range []int{0, 32} {
			status, b := do(t, "POST", e.URL()+"/v1/completions", `{"model":"m","prompt":`+prompt+`,"max_tokens":5}`)
			if status != 200 {
				t.Fatalf("status %d: %s", status, b)
			}
			r := decode(t, b)
			if r.Object != "text_completion" || !strings.HasPrefix(r.ID, "cmpl-") || r.Model != "m" {
				t.Fatalf("envelope: %s", b)
			}
			if len(r.Choices) != 1 || r.Choices[0].Text == nil || *r.Choices[0].FinishReason != "length" {
				t.Fatalf("choices: %s", b)
			}
			if n := len(strings.Fields(*r.Choices[0].Text)); n != 5 {
				t.Fatalf("%d words generated, want 5", n)
			}
			u := r.Usage
			if u == nil || u.PromptTokens != 40 || u.CompletionTokens != 5 || u.TotalTokens != 45 || u.PromptTokensDetails.CachedTokens != wantCached {
				t.Fatalf("request %d usage: %s", i, b)
			}
			plain = *r.Choices[0].Text
		}
	})

	t.Run("streaming", func(t *testing.T) {
		chunks := stream(t, e.URL()+"/v1/completions", `{"prompt":`+prompt+`,"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`)
		if len(chunks) != 6 {
			t.Fatalf("%d events, want 5 tokens and a usage chunk", len(chunks))
		}
		var text string
		for i, c := range chunks[:5] {
			if c.Object != "text_completion" || len(c.Choices) != 1 || c.Usage != nil {
				t.Fatalf("chunk %d: %+v", i, c)
			}
			text += *c.Choices[0].Text
			if last := i == 4; (c.Choices[0].FinishReason != nil) != last {
				t.Fatalf("chunk %d finish reason %v", i, c.Choices[0].FinishReason)
			}
		}
		if text != plain {
			t.Fatalf("streamed %q, non-streamed %q", text, plain)
		}
		u := chunks[5].Usage
		if len(chunks[5].Choices) != 0 || u == nil || u.CompletionTokens != 5 || u.PromptTokensDetails.CachedTokens != 32 {
			t.Fatalf("usage chunk: %+v", chunks[5])
		}
	})

	t.Run("streaming without usage, continuous usage", func(t *testing.T) {
		chunks := stream(t, e.URL()+"/v1/completions", `{"prompt":"a b c","max_tokens":3,"stream":true}`)
		for _, c := range chunks {
			if c.Usage != nil {
				t.Fatal("usage sent without include_usage")
			}
		}
		chunks = stream(t, e.URL()+"/v1/completions", `{"prompt":"a b c","max_tokens":3,"stream":true,"stream_options":{"continuous_usage_stats":true}}`)
		for i, c := range chunks {
			if c.Usage == nil || c.Usage.CompletionTokens != i+1 || c.Usage.PromptTokens != 3 {
				t.Fatalf("chunk %d usage %+v", i, c.Usage)
			}
		}
	})

	t.Run("chat", func(t *testing.T) {
		body := `{"messages":[{"role":"system","content":"you are terse"},{"role":"user","content":"why is the sky blue"}],"max_tokens":4`
		status, b := do(t, "POST", e.URL()+"/v1/chat/completions", body+`}`)
		if status != 200 {
			t.Fatalf("status %d: %s", status, b)
		}
		r := decode(t, b)
		if r.Object != "chat.completion" || !strings.HasPrefix(r.ID, "chatcmpl-") || r.Choices[0].Message == nil ||
			r.Choices[0].Message.Role != "assistant" || r.Usage.CompletionTokens != 4 || r.Usage.PromptTokens != 13 {
			t.Fatalf("chat response: %s", b)
		}
		chunks := stream(t, e.URL()+"/v1/chat/completions", body+`,"stream":true}`)
		var text string
		for i, c := range chunks {
			if c.Object != "chat.completion.chunk" || c.Choices[0].Delta == nil {
				t.Fatalf("chunk %d: %+v", i, c)
			}
			if (c.Choices[0].Delta.Role == "assistant") != (i == 0) {
				t.Fatalf("chunk %d role %q", i, c.Choices[0].Delta.Role)
			}
			text += c.Choices[0].Delta.Content
		}
		if text != r.Choices[0].Message.Content || len(chunks) != 4 {
			t.Fatalf("streamed %q in %d chunks, non-streamed %q", text, len(chunks), r.Choices[0].Message.Content)
		}
	})

	t.Run("errors", func(t *testing.T) {
		long := idsJSON(seq(1, DefaultKVBlocks*16))
		for _, tc := range []struct {
			method, path, body string
			status             int
		}{
			{"POST", "/v1/completions", `{"prompt":[1,2`, 400},
			{"POST", "/v1/completions", `{"prompt":[]}`, 400},
			{"POST", "/v1/completions", `{"model":"other","prompt":[1]}`, 404},
			{"POST", "/v1/completions", `{"prompt":` + long + `}`, 400},
			{"POST", "/v1/completions", `{"prompt":[1],"max_tokens":262144}`, 400},
			{"GET", "/v1/completions", ``, 405},
			{"POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, 400},
			{"POST", "/v1/models", ``, 405},
			{"GET", "/v2/nothing", ``, 404},
		} {
			status, b := do(t, tc.method, e.URL()+tc.path, tc.body)
			if status != tc.status {
				t.Errorf("%s %s %.40s: status %d, want %d: %s", tc.method, tc.path, tc.body, status, tc.status, b)
				continue
			}
			if r := decode(t, b); r.Error == nil || r.Error.Message == "" || r.Error.Type == "" {
				t.Errorf("%s %s: error body %s", tc.method, tc.path, b)
			}
		}
	})

	t.Run("models, health, stats", func(t *testing.T) {
		status, b := do(t, "GET", e.URL()+"/v1/models", "")
		var models struct {
			Data []struct {
				ID          string `json:"id"`
				MaxModelLen int    `json:"max_model_len"`
			} `json:"data"`
		}
		if err := json.Unmarshal(b, &models); status != 200 || err != nil || len(models.Data) != 1 || models.Data[0].ID != "m" ||
			models.Data[0].MaxModelLen != DefaultKVBlocks*16 {
			t.Fatalf("models: %d %s", status, b)
		}
		if status, _ := do(t, "GET", e.URL()+"/health", ""); status != 200 {
			t.Fatalf("health: %d", status)
		}
		status, b = do(t, "GET", e.URL()+"/mock/stats", "")
		var st statsView
		if err := json.Unmarshal(b, &st); status != 200 || err != nil || st.Model != "m" || st.Finished < 6 || st.PrefixHitRate <= 0 {
			t.Fatalf("stats: %d %s", status, b)
		}
	})

	t.Run("events match the cache", func(t *testing.T) {
		eventually(t, "stats to settle", func() bool { return e.Stats().Running == 0 && e.Stats().Waiting == 0 })
		if got, want := len(rec.Cached()), e.Stats().KVCached; got != want {
			t.Fatalf("events say %d blocks cached, engine %d", got, want)
		}
		evs := rec.Events()
		if evs[0].Kind != EventCleared {
			t.Fatalf("first event %v, want cleared", evs[0].Kind)
		}
		l, ok := rec.LastLoad()
		if !ok || l.KVTotal != DefaultKVBlocks || l.Running != 0 {
			t.Fatalf("last load %+v", l)
		}
	})

	t.Run("reset prefix cache", func(t *testing.T) {
		if status, b := do(t, "POST", e.URL()+"/reset_prefix_cache", ""); status != 200 {
			t.Fatalf("reset: %d %s", status, b)
		}
		if len(rec.Cached()) != 0 {
			t.Fatal("blocks survived the reset")
		}
		_, b := do(t, "POST", e.URL()+"/v1/completions", `{"prompt":`+prompt+`,"max_tokens":5}`)
		if r := decode(t, b); r.Usage.PromptTokensDetails.CachedTokens != 0 {
			t.Fatalf("cached tokens after reset: %s", b)
		}
	})
}

func TestHTTPRunsOnScaledTime(t *testing.T) {
	const speedup = 20
	e := startEngine(t, Config{Speedup: speedup})
	start := time.Now()
	chunks := stream(t, e.URL()+"/v1/completions", `{"prompt":`+idsJSON(seq(1, 2000))+`,"max_tokens":30,"stream":true}`)
	elapsed := time.Since(start)
	if len(chunks) != 30 {
		t.Fatalf("%d chunks", len(chunks))
	}
	eventually(t, "the stats snapshot", func() bool { return e.Stats().Finished == 1 })
	busy := e.Stats().BusyTime
	// The loop sleeps each step's share before delivering it, so the wall
	// clock can only run slow, never fast (a 1ms slack for clock reads).
	if min := busy/speedup - time.Millisecond; elapsed < min {
		t.Fatalf("took %v for %v of simulated time at %vx: faster than scaled", elapsed, busy, speedup)
	}
}

func TestHTTPClientDisconnectAborts(t *testing.T) {
	e := startEngine(t, Config{Speedup: 1})
	resp, err := testClient.Post(e.URL()+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":[1,2,3],"max_tokens":100000,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: {") {
		t.Fatalf("first line %q: %v", line, err)
	}
	resp.Body.Close()
	eventually(t, "the request to be aborted", func() bool { s := e.Stats(); return s.Aborted == 1 && s.KVHeld == 0 })
}

// TestHTTPClientDisconnectAbortsPlain: a non-streaming request whose
// client closes its connection is aborted too, as vLLM aborts one, not
// run to its end (Linux: the engine watches the connection).
func TestHTTPClientDisconnectAbortsPlain(t *testing.T) {
	e := startEngine(t, Config{Speedup: 1})
	if e.hangups == nil {
		t.Skip("connections cannot be watched here")
	}
	c, err := net.Dial("tcp", e.Addr())
	if err != nil {
		t.Fatal(err)
	}
	body := `{"prompt":[1,2,3],"max_tokens":100000}`
	if _, err := io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: mock\r\nContent-Type: application/json\r\nContent-Length: "+
		strconv.Itoa(len(body))+"\r\n\r\n"+body); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the request to run", func() bool { return e.Stats().Running == 1 })
	_ = c.Close()
	eventually(t, "the request to be aborted", func() bool { s := e.Stats(); return s.Aborted == 1 && s.KVHeld == 0 })
	// Its handler returned: the engine's server has no connection left
	// open to wait for at Close.
	eventually(t, "the handler to return", func() bool { return e.srv.GetOpenConnectionsCount() == 0 })
}

func TestHTTPCloseEndsRequests(t *testing.T) {
	e, err := Start(Config{Speedup: 1, Timing: testTiming})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := testClient.Post(e.URL()+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":[1,2,3],"max_tokens":100000,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	result := make(chan []byte, 1)
	go func() {
		status, b := func() (int, []byte) {
			r, err := testClient.Post(e.URL()+"/v1/completions", "application/json", strings.NewReader(`{"prompt":[1],"max_tokens":100000}`))
			if err != nil {
				return 0, []byte(err.Error())
			}
			defer r.Body.Close()
			b, _ := io.ReadAll(r.Body)
			return r.StatusCode, b
		}()
		result <- fmt.Appendf(nil, "%d %s", status, b)
	}()
	eventually(t, "both requests running", func() bool { return e.Stats().Running == 2 })
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(resp.Body)
	if !bytes.Contains(rest, []byte(`"error"`)) || !bytes.HasSuffix(rest, []byte(sseDone)) {
		t.Fatalf("stream tail after close: %.200q", rest)
	}
	if got := <-result; !bytes.HasPrefix(got, []byte("503 ")) {
		t.Fatalf("non-streaming request after close: %s", got)
	}
	if e.Close() != nil {
		t.Fatal("second Close failed")
	}
}

// TestCloseCutsUnusedConnections: a connection that never carried a
// request (an HTTP client's spare dial) must not hold Close: fasthttp counts
// it as busy for its first five seconds, longer than Close used to wait.
func TestCloseCutsUnusedConnections(t *testing.T) {
	e, err := Start(Config{Speedup: 1, Timing: testTiming})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", e.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	eventually(t, "the connection accepted", func() bool {
		n := 0
		e.unused.Range(func(_, _ any) bool { n++; return true })
		return n == 1
	})
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := conn.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the unused connection is still open after Close: read %d, %v", n, err)
	}
}

func TestHeartbeatAndLoadArePeriodic(t *testing.T) {
	rec := &Recorder{}
	startEngine(t, Config{Publisher: rec, HeartbeatInterval: 2 * time.Millisecond, KVBlocks: 100})
	eventually(t, "five heartbeats", func() bool {
		n := 0
		for _, e := range rec.Events() {
			if e.Kind == EventHeartbeat {
				n++
			}
		}
		return n >= 5
	})
	l, ok := rec.LastLoad()
	if !ok || l.KVTotal != 100 {
		t.Fatalf("load %+v", l)
	}
}

func TestStartRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{BlockSize: -1},
		{KVBlocks: -5},
		{Speedup: -1},
		{Speedup: math.NaN()},
		{MaxModelLen: 1 << 30},
		{Timing: Timing{PrefillPerToken: -1}},
		{Listen: "256.0.0.1:0"},
		{Publisher: &Recorder{}, Segment: "/nonexistent"},
	} {
		if e, err := Start(cfg); err == nil {
			e.Close()
			t.Errorf("accepted %+v", cfg)
		}
	}
}

// TestEnginesHammer runs several engines in one process under concurrent
// clients and checks every answer's invariants; with -race it also checks
// the loop/handler hand-off.
func TestEnginesHammer(t *testing.T) {
	engines := make([]*Engine, 3)
	recs := make([]*Recorder, len(engines))
	for i := range engines {
		recs[i] = &Recorder{}
		engines[i] = startEngine(t, Config{Speedup: 200, KVBlocks: 64, MaxBatchedTokens: 128, WorkerID: uint64(i), Publisher: recs[i]})
	}
	perClient := 15
	if testing.Short() {
		perClient = 5
	}
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for c := range 6 {
		wg.Go(func() {
			for i := range perClient {
				e := engines[(c+i)%len(engines)]
				n := 20 + (c*7+i*13)%300
				prompt := idsJSON(seq((c%2)*1000, n)) // two families of shared prefixes
				maxTokens := 1 + (c+i)%12
				body := fmt.Sprintf(`{"prompt":%s,"max_tokens":%d,"stream":%v,"stream_options":%s}`, prompt, maxTokens, i%2 == 0,
					map[bool]string{true: `{"include_usage":true}`, false: `null`}[i%2 == 0])
				resp, err := testClient.Post(e.URL()+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					errs <- err
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				var u *usage
				if i%2 == 0 {
					events := bytes.Split(bytes.TrimSpace(b), []byte("\n\n"))
					if len(events) != maxTokens+2 {
						errs <- fmt.Errorf("%d events for %d tokens", len(events), maxTokens)
						return
					}
					var r response
					if err := json.Unmarshal(bytes.TrimPrefix(events[maxTokens], []byte("data: ")), &r); err != nil {
						errs <- err
						return
					}
					u = r.Usage
				} else {
					var r response
					if err := json.Unmarshal(b, &r); err != nil {
						errs <- fmt.Errorf("%v: %s", err, b)
						return
					}
					u = r.Usage
				}
				if u == nil || u.PromptTokens != n || u.CompletionTokens != maxTokens || u.PromptTokensDetails.CachedTokens > n-1 ||
					u.PromptTokensDetails.CachedTokens%16 != 0 {
					errs <- fmt.Errorf("bad usage %+v for %d/%d", u, n, maxTokens)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i, e := range engines {
		eventually(t, "engine to settle", func() bool { s := e.Stats(); return s.Running+s.Waiting == 0 && s.KVHeld == 0 })
		if got, want := len(recs[i].Cached()), e.Stats().KVCached; got != want {
			t.Errorf("engine %d: events say %d blocks, cache %d", i, got, want)
		}
	}
}

// TestModelsListAdapters: LoRA adapters are listed as vLLM lists them,
// with the base model as their parent.
func TestModelsListAdapters(t *testing.T) {
	e := startEngine(t, Config{Model: "base", Speedup: math.Inf(1), LoRAAdapters: []string{"sql", "chat-\"x\""}})
	status, b := do(t, "GET", e.URL()+"/v1/models", "")
	var models struct {
		Data []struct {
			ID     string  `json:"id"`
			Root   string  `json:"root"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &models); status != 200 || err != nil || len(models.Data) != 3 {
		t.Fatalf("models: %d %s %v", status, b, err)
	}
	if d := models.Data[0]; d.ID != "base" || d.Parent != nil {
		t.Fatalf("base model card %s", b)
	}
	for i, want := range []string{"sql", "chat-\"x\""} {
		if d := models.Data[i+1]; d.ID != want || d.Parent == nil || *d.Parent != "base" || d.Root != "/adapters/"+want {
			t.Fatalf("adapter card %d: %s", i, b)
		}
	}
	// An answer names the model the request named, adapter or base, as
	// vLLM's do.
	for _, model := range []string{"base", "sql", "chat-\"x\""} {
		q, _ := json.Marshal(model)
		status, b := do(t, "POST", e.URL()+"/v1/completions", `{"model":`+string(q)+`,"prompt":[1,2,3],"max_tokens":1}`)
		var resp struct{ Model string }
		if err := json.Unmarshal(b, &resp); status != 200 || err != nil || resp.Model != model {
			t.Errorf("a request for %q answered %d, model %q: %s", model, status, resp.Model, b)
		}
	}
}

// TestNamespacesDoNotShareCache: an adapter's and a salted request's
// blocks are cached in their own namespace, as vLLM's are, and published
// with it.
func TestNamespacesDoNotShareCache(t *testing.T) {
	rec := &Recorder{}
	e := startEngine(t, Config{Model: "m", Speedup: math.Inf(1), Publisher: rec, LoRAAdapters: []string{"sql"}})
	prompt := idsJSON(seq(1, 40))
	for i, tc := range []struct {
		model, salt string
		cached      int
	}{
		{"m", "", 0}, {"m", "", 32},
		{"m", "a", 0}, {"m", "a", 32}, {"", "b", 0},
		{"sql", "", 0}, {"sql", "", 32}, {"sql", "a", 0}, {"sql", "a", 32},
		{"m", "", 32},
	} {
		body := `{"model":"` + tc.model + `","prompt":` + prompt + `,"max_tokens":1`
		if tc.salt != "" {
			body += `,"cache_salt":"` + tc.salt + `"`
		}
		status, b := do(t, "POST", e.URL()+"/v1/completions", body+"}")
		if status != 200 {
			t.Fatalf("request %d: status %d: %s", i, status, b)
		}
		if got := decode(t, b).Usage.PromptTokensDetails.CachedTokens; got != tc.cached {
			t.Errorf("request %d (model %q salt %q): %d tokens cached, want %d", i, tc.model, tc.salt, got, tc.cached)
		}
	}
	if status, b := do(t, "POST", e.URL()+"/v1/completions", `{"model":"other","prompt":[1]}`); status != 404 {
		t.Fatalf("an unknown model: %d %s", status, b)
	}
	namespaces := map[[2]string]int{}
	for _, ev := range rec.Events() {
		if ev.Kind == EventStored {
			for _, b := range ev.Blocks {
				namespaces[[2]string{b.LoRA, b.Salt}]++
			}
		}
	}
	want := map[[2]string]int{{"", ""}: 2, {"", "a"}: 2, {"", "b"}: 2, {"sql", ""}: 2, {"sql", "a"}: 2}
	if !reflect.DeepEqual(namespaces, want) {
		t.Fatalf("blocks stored by namespace %v, want %v", namespaces, want)
	}
}
