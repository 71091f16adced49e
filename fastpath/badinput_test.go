package fastpath_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
)

// TestBadInput: every malformed or unroutable request gets a 4xx with an
// OpenAI error body, reaches no engine and leaves nothing booked.
func TestBadInput(t *testing.T) {
	eng := startE2EEngine(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"choices":[{"index":0,"text":"x","finish_reason":"stop"}]}`)
	})
	const maxBody = 4096
	cfg := e2eConfig(
		node.StaticWorker{ID: 1, Endpoint: eng.addr(), Model: e2eModel},
		node.StaticWorker{ID: 2, DPRank: 0, Endpoint: eng.addr(), Model: e2eModel},
		node.StaticWorker{ID: 2, DPRank: 1, Endpoint: eng.addr(), Model: e2eModel},
		node.StaticWorker{ID: 3, Endpoint: eng.addr(), Model: "other-model"},
	)
	cfg.HTTP.MaxBodyBytes = maxBody
	cfg.HTTP.MaxTokenID = 1000
	r := startE2ERouter(t, cfg)
	ok := []byte(`{"model":"mock","prompt":[1,2,3]}`)
	cases := []struct {
		name   string
		method string // POST when empty
		path   string // PathCompletions when empty
		body   []byte
		hdr    map[string]string
		status int
		msg    string // the message says this, when set
		code   string
	}{
		// Malformed JSON.
		{name: "unclosed array", body: []byte(`{"prompt":[1,2,3}`), status: 400, code: "invalid_json"},
		{name: "truncated", body: []byte(`{"model":"mock","prompt":[1,2`), status: 400, code: "invalid_json"},
		{name: "trailing garbage", body: []byte(`{"prompt":[1,2]} x`), status: 400, code: "invalid_json"},
		{name: "empty body", body: []byte{}, status: 400, code: "invalid_json"},
		{name: "bad escape", body: []byte(`{"prompt":"a\qb"}`), status: 400, code: "invalid_json"},
		{name: "route endpoint", path: fastpath.PathRouteCompletions, body: []byte(`{"prompt":`), status: 400, code: "invalid_json"},
		{name: "chat", path: fastpath.PathChatCompletions, body: []byte(`{"messages":[{"role":"user",}]}`), status: 400, code: "invalid_json"},
		// Wrong types.
		{name: "not an object", body: []byte(`[1,2,3]`), status: 400, code: "invalid_type"},
		{name: "model number", body: []byte(`{"model":5,"prompt":[1]}`), status: 400, code: "invalid_type"},
		{name: "prompt object", body: []byte(`{"prompt":{"a":1}}`), status: 400, code: "invalid_type"},
		{name: "prompt number", body: []byte(`{"prompt":42}`), status: 400, code: "invalid_type"},
		{name: "token as string", body: []byte(`{"prompt":[1,"2"]}`), status: 400, code: "invalid_type"},
		{name: "fractional token", body: []byte(`{"prompt":[1.5]}`), status: 400, code: "invalid_type"},
		{name: "token as bool", body: []byte(`{"prompt":[1,true]}`), status: 400, code: "invalid_type"},
		{name: "stream string", body: []byte(`{"prompt":[1],"stream":"maybe"}`), status: 400, code: "invalid_type"},
		{name: "max_tokens string", body: []byte(`{"prompt":[1],"max_tokens":"ten"}`), status: 400, code: "invalid_type"},
		{name: "max_tokens zero", body: []byte(`{"prompt":[1],"max_tokens":0}`), status: 400, code: "invalid_value"},
		{name: "max_tokens past int64", body: []byte(`{"prompt":[1],"max_tokens":99999999999999999999999999}`), status: 400, code: "invalid_value", msg: "at most"},
		{name: "messages string", path: fastpath.PathChatCompletions, body: []byte(`{"messages":"hi"}`), status: 400, code: "invalid_type"},
		// Limits.
		{name: "negative token", body: []byte(`{"prompt":[1,-2,3]}`), status: 400, code: "token_out_of_range"},
		{name: "token over max id", body: []byte(`{"prompt":[1,1001]}`), status: 400, code: "token_out_of_range"},
		{name: "token over uint32", body: []byte(`{"prompt":[4294967296]}`), status: 400, code: "token_out_of_range"},
		// Empty and missing prompts.
		{name: "empty string prompt", body: []byte(`{"model":"mock","prompt":""}`), status: 400, code: "empty_prompt"},
		{name: "empty token prompt", body: []byte(`{"model":"mock","prompt":[]}`), status: 400, code: "empty_prompt"},
		{name: "empty messages", path: fastpath.PathChatCompletions, body: []byte(`{"model":"mock","messages":[]}`), status: 400, code: "empty_prompt"},
		{name: "no prompt", body: []byte(`{"model":"mock"}`), status: 400, code: "missing_required_parameter"},
		{name: "null prompt", body: []byte(`{"model":"mock","prompt":null}`), status: 400, code: "missing_required_parameter"},
		// Batches.
		{name: "batch of strings", body: []byte(`{"prompt":["a","b"]}`), status: 400, code: "batch_not_supported"},
		{name: "batch of token arrays", body: []byte(`{"prompt":[[1,2],[3,4]]}`), status: 400, code: "batch_not_supported"},
		// Routing.
		{name: "unknown model", body: []byte(`{"model":"gpt-9","prompt":[1,2]}`), status: 404, code: "model_not_found"},
		{name: "unknown model, route-only", path: fastpath.PathRouteCompletions, body: []byte(`{"model":"gpt-9","prompt":"x"}`), status: 404, code: "model_not_found"},
		{name: "unknown pinned worker", body: ok, hdr: map[string]string{fastpath.HeaderWorker: "99"}, status: 404, code: "worker_not_found"},
		{name: "unknown pinned rank", body: ok, hdr: map[string]string{fastpath.HeaderWorker: "2", fastpath.HeaderDPRank: "7"}, status: 404, code: "worker_not_found"},
		{name: "ambiguous pin", body: ok, hdr: map[string]string{fastpath.HeaderWorker: "2"}, status: 400, code: "ambiguous_pin"},
		{name: "pin outside the allow-list", body: ok, hdr: map[string]string{fastpath.HeaderWorker: "1", fastpath.HeaderAllow: "2"}, status: 400, code: "pin_excluded"},
		{name: "pin to a worker without the model", body: ok, hdr: map[string]string{fastpath.HeaderWorker: "3"}, status: 400, code: "pin_excluded"},
		// Bad hint headers.
		{name: "worker not a number", body: ok, hdr: map[string]string{fastpath.HeaderWorker: "abc"}, status: 400, code: "invalid_header"},
		{name: "negative worker", body: ok, hdr: map[string]string{fastpath.HeaderWorker: "-1"}, status: 400, code: "invalid_header"},
		{name: "rank without worker", body: ok, hdr: map[string]string{fastpath.HeaderDPRank: "0"}, status: 400, code: "invalid_header"},
		{name: "rank not a number", body: ok, hdr: map[string]string{fastpath.HeaderWorker: "1", fastpath.HeaderDPRank: "zero"}, status: 400, code: "invalid_header"},
		{name: "rank over uint32", body: ok, hdr: map[string]string{fastpath.HeaderWorker: "1", fastpath.HeaderDPRank: "4294967296"}, status: 400, code: "invalid_header"},
		{name: "query-only yes", body: ok, hdr: map[string]string{fastpath.HeaderQueryOnly: "yes"}, status: 400, code: "invalid_header"},
		{name: "query-only 2", body: ok, hdr: map[string]string{fastpath.HeaderQueryOnly: "2"}, status: 400, code: "invalid_header"},
		{name: "priority not a number", body: ok, hdr: map[string]string{fastpath.HeaderPriority: "high"}, status: 400, code: "invalid_header"},
		{name: "priority out of range", body: ok, hdr: map[string]string{fastpath.HeaderPriority: "1000001"}, status: 400, code: "invalid_header"},
		{name: "allow-list garbage", body: ok, hdr: map[string]string{fastpath.HeaderAllow: "1,zz"}, status: 400, code: "invalid_header"},
		{name: "allow-list unknown worker", body: ok, hdr: map[string]string{fastpath.HeaderAllow: "42"}, status: 400, code: "invalid_header"},
		{name: "allow-list unknown rank", body: ok, hdr: map[string]string{fastpath.HeaderAllow: "2:5"}, status: 400, code: "invalid_header"},
		// Wrong method or path.
		{name: "GET completions", method: http.MethodGet, status: 405, code: "method_not_allowed"},
		{name: "POST models", path: fastpath.PathModels, body: ok, status: 405, code: "method_not_allowed", msg: "GET and HEAD only"},
		{name: "DELETE a model", method: http.MethodDelete, path: fastpath.PathModels + "/" + e2eModel, status: 405, code: "method_not_allowed", msg: "GET and HEAD only"},
		{name: "POST health", path: fastpath.PathHealth, body: ok, status: 405, code: "method_not_allowed", msg: "GET and HEAD only"},
		{name: "PUT ready", method: http.MethodPut, path: fastpath.PathReady, status: 405, code: "method_not_allowed", msg: "GET and HEAD only"},
		{name: "DELETE metrics", method: http.MethodDelete, path: fastpath.PathMetrics, status: 405, code: "method_not_allowed", msg: "GET and HEAD only"},
		{name: "POST admin workers", path: fastpath.PathAdminWorkers, body: ok, status: 405, code: "method_not_allowed", msg: "GET and HEAD only"},
		{name: "unknown path", path: "/v1/embeddings", body: ok, status: 404, code: "not_found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			method, path := tc.method, tc.path
			if method == "" {
				method = http.MethodPost
			}
			if path == "" {
				path = fastpath.PathCompletions
			}
			resp := r.do(t, method, path, tc.body, tc.hdr)
			if resp.status != tc.status {
				t.Errorf("status %d, want %d: %s", resp.status, tc.status, resp.body)
			}
			if ct := resp.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if code := checkOpenAIError(t, resp.body); code != tc.code {
				t.Errorf("code %q, want %q: %s", code, tc.code, resp.body)
			}
			if !bytes.Contains(resp.body, []byte(tc.msg)) {
				t.Errorf("the message does not say %q: %s", tc.msg, resp.body)
			}
			if v := r.node.Snapshot(); v.Queue.Booked != 0 || !reservationsReleased(v) {
				t.Errorf("a refused request booked load: queue %+v", v.Queue)
			}
		})
	}
	// Bodies over the limit are refused as soon as the router knows: from
	// the declared length before reading the body, a chunked one as soon as
	// what it read passes the limit. A raw connection sends only a first
	// part of the first and one byte over the limit of the second, so that
	// the refusal is read back before the client has written more.
	for _, tc := range []struct{ name, head, part string }{
		{"declared length over the limit", "Content-Length: 100000\r\n", `{"prompt":[` + strings.Repeat("1,", 500)},
		{"chunked body over the limit", "Transfer-Encoding: chunked\r\n",
			"800\r\n" + `{"prompt":[` + strings.Repeat("1,", 1018) + "1\r\n" + "801\r\n" + strings.Repeat(",1", 1024) + ",\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := rawRequest(t, strings.TrimPrefix(r.url, "http://"),
				"POST /v1/completions HTTP/1.1\r\nHost: kvfast\r\nContent-Type: application/json\r\n"+tc.head+"\r\n"+tc.part)
			if resp.StatusCode != http.StatusRequestEntityTooLarge {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if code := checkOpenAIError(t, body); code != "body_too_large" {
				t.Errorf("code %q", code)
			}
			if !bytes.Contains(body, []byte("at most 4096 bytes (the router's --max-body-bytes)")) {
				t.Errorf("the refusal does not name the limit: %s", body)
			}
		})
	}
	// The table reached no engine and the router still routes.
	if n := eng.requests.Load(); n != 0 {
		t.Errorf("bad requests reached the engine %d times", n)
	}
	if resp := r.post(t, fastpath.PathCompletions, ok, map[string]string{fastpath.HeaderWorker: "1"}); resp.status != 200 {
		t.Errorf("a good request after the table: %d %s", resp.status, resp.body)
	}
	waitReleased(t, r.node)
	m := r.metrics(t)
	if v, _ := metricValue(m, `kvfast_requests_total{endpoint="completions",status="client_error"}`); v < 30 {
		t.Errorf("client errors counted: %v", v)
	}
	wantMetric(t, m, `kvfast_requests_total{endpoint="completions",status="ok"}`, 1)
}

// TestSlowClientsHitReadTimeout: slowloris clients that drip their headers
// or body are cut at the read timeout, and do not stop others from being
// served meanwhile.
func TestSlowClientsHitReadTimeout(t *testing.T) {
	eng := startMock(t, mocker.Config{WorkerID: 1})
	const readTimeout = 300 * time.Millisecond
	cfg := e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.Addr(), Model: e2eModel})
	cfg.HTTP.ReadTimeout = readTimeout
	cfg.HTTP.HeaderTimeout = readTimeout // headers are cut by the header timeout, bodies by the read timeout
	r := startE2ERouter(t, cfg)
	addr := strings.TrimPrefix(r.url, "http://")

	body := `{"model":"mock","prompt":[1,2,3],"max_tokens":1}`
	cases := []struct {
		name string
		head string   // sent at once
		drip []string // then one piece every 50 ms, for as long as the server listens
	}{
		{"slow headers", "POST /v1/completions HTTP/1.1\r\nHost: kvfast\r\n", repeatLines("X-Slow-%d: 1\r\n", 200)},
		{"slow request line", "POST /v1/compl", strings.Split(strings.Repeat("e", 200), "")},
		{"slow body", "POST /v1/completions HTTP/1.1\r\nHost: kvfast\r\nContent-Type: application/json\r\nContent-Length: " +
			strconv.Itoa(len(body)) + "\r\n\r\n", strings.Split(body, "")},
	}
	type outcome struct {
		data    []byte
		elapsed time.Duration
	}
	results := make([]chan outcome, len(cases))
	var dripping sync.WaitGroup // every slow client connected and sent its head
	for i, tc := range cases {
		results[i] = make(chan outcome, 1)
		dripping.Add(1)
		go func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				dripping.Done()
				results[i] <- outcome{data: []byte(err.Error())}
				return
			}
			defer c.Close()
			start := time.Now()
			_ = c.SetDeadline(start.Add(e2eWait))
			read := make(chan []byte, 1)
			go func() {
				b, _ := io.ReadAll(c) // until the server answers and closes, or resets
				read <- b
			}()
			_, _ = io.WriteString(c, tc.head)
			dripping.Done()
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for _, piece := range tc.drip {
				select {
				case b := <-read:
					results[i] <- outcome{b, time.Since(start)}
					return
				case <-tick.C:
					if _, err := io.WriteString(c, piece); err != nil {
						results[i] <- outcome{<-read, time.Since(start)}
						return
					}
				}
			}
			results[i] <- outcome{[]byte("the client finished dripping before the server cut it"), time.Since(start)}
		}()
	}
	// Meanwhile an ordinary client is served.
	dripping.Wait()
	if resp := r.post(t, fastpath.PathCompletions, []byte(body), nil); resp.status != 200 {
		t.Errorf("a normal request during the slowloris: %d %s", resp.status, resp.body)
	}
	for i, tc := range cases {
		out := <-results[i]
		if out.elapsed > readTimeout+3*time.Second || out.elapsed < readTimeout/2 {
			t.Errorf("%s: cut after %v, want about the read timeout %v", tc.name, out.elapsed, readTimeout)
		}
		// Either a 408 with an OpenAI error body, or a closed connection.
		if len(out.data) > 0 {
			head, payload, _ := bytes.Cut(out.data, []byte("\r\n\r\n"))
			if !bytes.HasPrefix(head, []byte("HTTP/1.1 408 ")) {
				t.Errorf("%s: got %q, want a 408 or a closed connection", tc.name, out.data)
				continue
			}
			resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(out.data)), nil)
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
				continue
			}
			if code := checkOpenAIError(t, payload); code != "request_timeout" {
				t.Errorf("%s: code %q", tc.name, code)
			}
			resp.Body.Close()
		}
		t.Logf("%s: cut after %v with %d bytes", tc.name, out.elapsed, len(out.data))
	}
	waitReleased(t, r.node)
}

func repeatLines(format string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = strings.Replace(format, "%d", strconv.Itoa(i), 1)
	}
	return out
}

// rawRequest writes req on a new connection and reads one response.
func rawRequest(t *testing.T, addr, req string) (*http.Response, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(e2eWait))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the response body: %v", err)
	}
	return resp, body
}

// TestTransportErrorsLoggedStructured: what fasthttp itself reports about
// connections it could not serve goes to the router's slog logger, not to
// the standard library's unstructured log, and no log line carries the
// request's bytes: a malformed request's credentials stay out of the log,
// which records its method, path, size and the reason instead.
func TestTransportErrorsLoggedStructured(t *testing.T) {
	logs := newLogCapture()
	cfg := e2eConfig()
	cfg.HTTP.MaxBodyBytes = 1024
	cfg.Logger = slog.New(logs)
	r := startE2ERouter(t, cfg)
	const secret = "sk-secret-7f3a9c"
	resp, body := rawRequest(t, strings.TrimPrefix(r.url, "http://"),
		"POST /v1/completions HTTP/1.1\r\nHost: kvfast\r\nAuthorization: Bearer "+secret+"\r\nContent-Length: 12\r\n"+
			"X-Api-Key: "+secret+"\r\nBroken header line without a colon "+secret+"\r\n\r\n{\"prompt\":1}")
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	waitFor(t, "fasthttp's report in the router's log", func() bool {
		_, ok := logs.find("component=fasthttp")
		return ok
	})
	line, _ := logs.find("component=fasthttp")
	if !strings.HasPrefix(line, "WARN ") {
		t.Errorf("logged as %q", line)
	}
	if line, ok := logs.find("could not be read"); !ok || !strings.Contains(line, "reason=malformed") {
		t.Errorf("no structured record of the refusal: %q", line)
	}
	if line, ok := logs.find(secret); ok {
		t.Errorf("a credential reached the log: %q", line)
	}
	if line, ok := logs.find("Bearer"); ok {
		t.Errorf("request bytes reached the log: %q", line)
	}

	// Any client can send garbage: the warnings it causes are throttled,
	// the count of refusals is not.
	for range 4 {
		rawRequest(t, strings.TrimPrefix(r.url, "http://"), "GARBAGE\r\n\r\n")
	}
	waitFor(t, "the refusals to be counted", func() bool {
		v, _ := metricValue(r.metrics(t), `kvfast_http_transport_errors_total{reason="malformed"}`)
		return v == 5
	})
	if n := logs.count("WARN cannot serve a connection"); n != 1 {
		t.Errorf("%d warnings about malformed requests, want 1 a minute", n)
	}
}

func TestRedactHidesCredentials(t *testing.T) {
	for in, want := range map[string]string{
		"error: Authorization: Bearer abc.def rest":  "error: Authorization: [REDACTED]",
		"authorization: basic dXNlcjpw\r\nHost: h":   "authorization: [REDACTED]\r\nHost: h",
		`buf="Authorization: Bearer sk-1 2\r\nX: y"`: `buf="Authorization: [REDACTED]\r\nX: y"`,
		"cannot serve: bearer sk-abc, retrying":      "cannot serve: bearer [REDACTED], retrying",
		`buf="x-api-key: k1 k2\r\n"`:                 `buf="x-api-key: [REDACTED]\r\n"`,
		"GET /v1/models?api_key=zzz&x=1":             "GET /v1/models?api_key=[REDACTED]&x=1",
		"nothing to hide":                            "nothing to hide",
	} {
		if got := fastpath.Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestClientWentAwayIsRoutine: fasthttp's report of a write to a
// connection the client or the router already closed is not a warning;
// anything else still is.
func TestClientWentAwayIsRoutine(t *testing.T) {
	for err, want := range map[error]bool{
		net.ErrClosed: true,
		&net.OpError{Op: "write", Err: os.NewSyscallError("write", syscall.EPIPE)}:    true,
		&net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}: true,
		errors.New("cannot parse request line"):                                       false,
	} {
		if got := fastpath.ClientWentAway(err); got != want {
			t.Errorf("%v: %v, want %v", err, got, want)
		}
	}
}
