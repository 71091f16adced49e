package fastpath_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
)

// openAIClientDir holds the official openai npm client, installed by
// scripts/setup-test-deps.sh from package-lock.json.
const openAIClientDir = "testdata/openai"

// TestOfficialOpenAIClient runs the official openai npm client, streaming
// and not, for completions and chat, against the router in front of a mock
// engine. It needs Node.js: outside CI it is skipped when node is absent;
// in CI (CI set) a missing node or client fails.
func TestOfficialOpenAIClient(t *testing.T) {
	nodeJS, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv("CI") == "" {
			t.Skip("node is not installed; run scripts/setup-test-deps.sh to run the official openai client")
		}
		t.Fatal("CI needs node for the official openai client test: run scripts/setup-test-deps.sh")
	}
	if _, err := os.Stat(filepath.Join(openAIClientDir, "node_modules", "openai", "package.json")); err != nil {
		t.Fatalf("the openai npm client is not installed in %s (%v): run scripts/setup-test-deps.sh", openAIClientDir, err)
	}
	eng := startMock(t, mocker.Config{WorkerID: 4})
	cfg := e2eConfig(node.StaticWorker{ID: 4, Endpoint: eng.URL(), Model: e2eModel})
	cfg.HTTP.MaxTokenID = 100000
	r := startE2ERouter(t, cfg)

	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, nodeJS, filepath.Join(openAIClientDir, "client.mjs"), r.url+"/v1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) || ctx.Err() != nil {
			t.Fatalf("the openai client failed: %v\nstderr:\n%s\nstdout:\n%s", err, stderr.String(), stdout.String())
		}
		t.Fatal(err)
	}
	type usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		Details          *struct {
			Cached int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	type refusal struct {
		Thrown  bool    `json:"thrown"`
		Class   string  `json:"class"`
		Status  int     `json:"status"`
		Type    string  `json:"type"`
		Code    string  `json:"code"`
		Param   *string `json:"param"`
		Message string  `json:"message"`
	}
	var out struct {
		Completion struct {
			Object       string `json:"object"`
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
			Usage        usage  `json:"usage"`
			Worker       string `json:"worker"`
			RequestID    string `json:"request_id"`
		} `json:"completion"`
		CompletionStream struct {
			Text         string `json:"text"`
			Chunks       int    `json:"chunks"`
			FinishReason string `json:"finish_reason"`
			Worker       string `json:"worker"`
			ContentType  string `json:"content_type"`
		} `json:"completion_stream"`
		Chat struct {
			Object       string `json:"object"`
			Content      string `json:"content"`
			Role         string `json:"role"`
			FinishReason string `json:"finish_reason"`
			Usage        usage  `json:"usage"`
		} `json:"chat"`
		ChatStream struct {
			Content      string `json:"content"`
			Chunks       int    `json:"chunks"`
			FinishReason string `json:"finish_reason"`
			Usage        *usage `json:"usage"`
		} `json:"chat_stream"`
		Models struct {
			IDs       []string `json:"ids"`
			Retrieved struct {
				ID     string `json:"id"`
				Object string `json:"object"`
			} `json:"retrieved"`
		} `json:"models"`
		UnknownModel         refusal `json:"unknown_model"`
		UnknownModelRetrieve refusal `json:"unknown_model_retrieve"`
		EmptyPrompt          refusal `json:"empty_prompt"`
		BadToken             refusal `json:"bad_token"`
		UnknownPin           refusal `json:"unknown_pin"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("cannot read the client's report %q: %v (stderr %s)", stdout.String(), err, stderr.String())
	}
	t.Logf("openai npm client %s: %s", openAIClientVersion(t), stdout.Bytes())

	c := out.Completion
	if c.Object != "text_completion" || c.Text == "" || c.FinishReason != "length" ||
		c.Usage.PromptTokens != 48 || c.Usage.CompletionTokens != 6 || c.Worker != "4" || c.RequestID != "node-rid-1" {
		t.Errorf("completion: %+v", c)
	}
	cs := out.CompletionStream
	// The mock engine's reply depends on the prompt only, so the stream
	// spells the same text as the whole response.
	if cs.Text != c.Text || cs.Chunks != 6 || cs.FinishReason != "length" || cs.Worker != "4" ||
		!strings.HasPrefix(cs.ContentType, "text/event-stream") {
		t.Errorf("completion stream: %+v, want the text %q", cs, c.Text)
	}
	ch := out.Chat
	if ch.Object != "chat.completion" || ch.Content == "" || ch.Role != "assistant" || ch.FinishReason != "length" ||
		ch.Usage.CompletionTokens != 5 {
		t.Errorf("chat: %+v", ch)
	}
	cst := out.ChatStream
	if cst.Content != ch.Content || cst.FinishReason != "length" || cst.Usage == nil || cst.Usage.CompletionTokens != 5 ||
		cst.Chunks < 5 {
		t.Errorf("chat stream: %+v, want the content %q", cst, ch.Content)
	}
	if m := out.Models; len(m.IDs) != 1 || m.IDs[0] != e2eModel || m.Retrieved.ID != e2eModel || m.Retrieved.Object != "model" {
		t.Errorf("models: %+v", m)
	}
	for _, tc := range []struct {
		name   string
		got    refusal
		class  string
		status int
		code   string
		param  string
	}{
		{"unknown model", out.UnknownModel, "NotFoundError", 404, "model_not_found", "model"},
		{"unknown model retrieved", out.UnknownModelRetrieve, "NotFoundError", 404, "model_not_found", "model"},
		{"empty prompt", out.EmptyPrompt, "BadRequestError", 400, "empty_prompt", "prompt"},
		{"negative token", out.BadToken, "BadRequestError", 400, "token_out_of_range", "prompt"},
		{"unknown pin", out.UnknownPin, "NotFoundError", 404, "worker_not_found", fastpath.HeaderWorker},
	} {
		g := tc.got
		if !g.Thrown || g.Class != tc.class || g.Status != tc.status || g.Code != tc.code ||
			g.Type != "invalid_request_error" || g.Param == nil || *g.Param != tc.param || g.Message == "" {
			t.Errorf("%s: the client saw %+v, want %s %d %s", tc.name, g, tc.class, tc.status, tc.code)
		}
	}
	waitReleased(t, r.node)
	m := r.metrics(t)
	wantMetric(t, m, `kvfast_requests_total{endpoint="completions",status="ok"}`, 2)
	wantMetric(t, m, `kvfast_requests_total{endpoint="chat_completions",status="ok"}`, 2)
	wantMetric(t, m, `kvfast_requests_total{endpoint="completions",status="client_error"}`, 4)
}

// openAIClientVersion is the installed client's version, for the log.
func openAIClientVersion(t *testing.T) string {
	b, err := os.ReadFile(filepath.Join(openAIClientDir, "node_modules", "openai", "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	var pkg struct{ Version string }
	decodeJSON(t, b, &pkg)
	return pkg.Version
}
