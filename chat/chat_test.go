package chat_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/chat"
)

const chatML = `{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}`

func mustCompile(t testing.TB, src string) *chat.Template {
	t.Helper()
	tpl, err := chat.Compile(src)
	if err != nil {
		t.Fatal(err)
	}
	return tpl
}

func TestDecodeInputDefaultsAndFlags(t *testing.T) {
	in, err := chat.DecodeInput([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if !in.AddGenerationPrompt() || in.AddSpecialTokens() || in.HasMedia() {
		t.Fatalf("defaults: add_generation_prompt=%v add_special_tokens=%v media=%v; want true, false, false",
			in.AddGenerationPrompt(), in.AddSpecialTokens(), in.HasMedia())
	}
	in, err = chat.DecodeInput([]byte(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}],
		"add_generation_prompt":false,"add_special_tokens":"yes"}`))
	if err != nil {
		t.Fatal(err)
	}
	if in.AddGenerationPrompt() || !in.AddSpecialTokens() || !in.HasMedia() {
		t.Fatal("flags were not read")
	}
}

func TestDecodeInputRefusesBadShapes(t *testing.T) {
	for _, body := range []string{
		``, `[]`, `{"messages":[]}`, `{}`, `{"messages":"hi"}`, `{"messages":[{"content":"x"}]}`,
		`{"messages":[{"role":"user","content":5}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":5}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"hologram"}]}]}`,
		`{"messages":[{"role":"assistant","tool_calls":[{"id":"x"}]}]}`,
		`{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{}}]}`,
		`{"messages":[{"role":"user","content":"x"}],"add_generation_prompt":2}`,
		`{"messages":[{"role":"user","content":"x"}],"continue_final_message":true}`,
		`{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[1]}`,
		`{"messages":[{"role":"user","content":"x"}],"documents":[{"title":1}]}`,
		`{"messages":[{"role":"user","content":"x"}`,
	} {
		if _, err := chat.DecodeInput([]byte(body)); !errors.Is(err, chat.ErrInvalidRequest) {
			t.Errorf("%s: got %v, want ErrInvalidRequest", body, err)
		}
	}
}

func TestRenderAppendsToDst(t *testing.T) {
	tpl := mustCompile(t, chatML)
	in, err := chat.DecodeInput([]byte(`{"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	out, err := tpl.Render([]byte("prefix:"), in, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if want := "prefix:<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"; string(out) != want {
		t.Fatalf("got %q, want %q", out, want)
	}
}

func TestContentFormatDetection(t *testing.T) {
	for _, tc := range []struct {
		src   string
		parts bool
	}{
		{chatML, false},
		{`{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}`, true},
		{`{% set loop_messages = messages[1:] %}{% for m in loop_messages %}{% for p in m['content'] | reverse %}{% endfor %}{% endfor %}`, true},
		{`{% for m in messages %}{% for x in other.content %}{% endfor %}{% endfor %}`, false},
	} {
		if got := mustCompile(t, tc.src).ReadsContentAsParts(); got != tc.parts {
			t.Errorf("%s: ReadsContentAsParts = %v, want %v", tc.src, got, tc.parts)
		}
	}
}

func TestMediaInStringTemplateIsUnsupported(t *testing.T) {
	in, err := chat.DecodeInput([]byte(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"what?"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mustCompile(t, chatML).Render(nil, in, "", ""); !errors.Is(err, chat.ErrUnsupported) {
		t.Fatalf("got %v, want ErrUnsupported", err)
	}
	parts := mustCompile(t, `{% for m in messages %}{% for p in m.content %}[{{ p.type }}]{% endfor %}{% endfor %}`)
	out, err := parts.Render(nil, in, "", "")
	if err != nil || string(out) != "[image][text]" {
		t.Fatalf("got %q, %v", out, err)
	}
}

func TestRaiseExceptionIsTheRequestsFault(t *testing.T) {
	tpl := mustCompile(t, `{{ raise_exception('roles must alternate') }}`)
	in, _ := chat.DecodeInput([]byte(`{"messages":[{"role":"user","content":"x"}]}`))
	_, err := tpl.Render(nil, in, "", "")
	if !errors.Is(err, chat.ErrInvalidRequest) || !strings.Contains(err.Error(), "roles must alternate") {
		t.Fatalf("got %v", err)
	}
}

func TestRenderingIsBounded(t *testing.T) {
	in, _ := chat.DecodeInput([]byte(`{"messages":[{"role":"user","content":"x"}]}`))
	for _, src := range []string{
		// endless in effect: nested loops far past the step limit
		`{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}`,
		// output growth
		`{% for a in range(100000) %}{{ 'x' * 100000 }}{% endfor %}`,
		`{{ 'x' * 1000000000000 }}`,
		`{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}`,
		// recursion
		`{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}`,
		`{{ 2 ** 100000000 }}`,
		`{{ range(1000000000) }}`,
	} {
		tpl := mustCompile(t, src)
		tpl.Limits = chat.Limits{MaxOutputBytes: 1 << 20, MaxSteps: 1 << 16, MaxCallDepth: 32}
		if _, err := tpl.Render(nil, in, "", ""); !errors.Is(err, chat.ErrInvalidRequest) {
			t.Errorf("%s: got %v, want a bounded failure", src, err)
		}
	}
}

// TestCostlyRenderingIsCutShort: a template that grows a string in a loop
// copies it whole on each step (DeepSeek-V3 joins its system messages so),
// and a request of many short system messages, each string well within
// MaxOutputBytes, made it cost seconds of CPU; the bytes built together
// are bounded, and the request is only too costly, not invalid.
func TestCostlyRenderingIsCutShort(t *testing.T) {
	src := `{% set ns = namespace(system_prompt='') %}{%- for message in messages %}{%- if message['role'] == 'system' %}` +
		`{% set ns.system_prompt = ns.system_prompt + '\n\n' + message['content'] %}{%- endif %}{%- endfor %}{{ ns.system_prompt }}`
	var body strings.Builder
	body.WriteString(`{"messages":[`)
	for range 18000 {
		body.WriteString(`{"role":"system","content":"aaaaaaaaaaaaaaaaaaaaaaaaaaa"},`)
	}
	body.WriteString(`{"role":"user","content":"u"}]}`)
	many, err := chat.DecodeInput([]byte(body.String()))
	if err != nil {
		t.Fatal(err)
	}
	tpl := mustCompile(t, src)
	if _, err := tpl.Render(nil, many, "", ""); !errors.Is(err, chat.ErrTooCostly) || errors.Is(err, chat.ErrInvalidRequest) {
		t.Fatalf("18,000 system messages: %v, want ErrTooCostly alone", err)
	}
	few, _ := chat.DecodeInput([]byte(`{"messages":[{"role":"system","content":"a"},{"role":"system","content":"b"},{"role":"user","content":"u"}]}`))
	if out, err := tpl.Render(nil, few, "", ""); err != nil || string(out) != "\n\na\n\nb" {
		t.Fatalf("two system messages: %q, %v", out, err)
	}
	// A list grown in a loop is bounded the same way.
	lists := mustCompile(t, `{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [i] %}{% endfor %}{{ ns.l|length }}`)
	if _, err := lists.Render(nil, few, "", ""); !errors.Is(err, chat.ErrTooCostly) {
		t.Fatalf("a list grown 100,000 times: %v, want ErrTooCostly", err)
	}
}

// TestWideDictKeepsPythonsSemantics: a dict past the size where it gains
// an index of its string keys still behaves as Python's: a repeated key
// keeps its first place and takes the last value, string and non-string
// keys stay apart, lookups and updates see the same entries.
func TestWideDictKeepsPythonsSemantics(t *testing.T) {
	var obj strings.Builder
	obj.WriteString(`{"d":{`)
	for i := range 40 {
		fmt.Fprintf(&obj, `"k%d":%d,`, i, i)
	}
	obj.WriteString(`"k5":"last","k39":"again"}}`)
	var lit []string
	for i := range 20 {
		lit = append(lit, fmt.Sprintf("'s%d': %d", i, i))
	}
	wideLiteral := strings.Join(lit, ", ")
	tpl := mustCompile(t, `{{ d|length }} {{ d['k5'] }} {{ d.k39 }} {{ d['k40'] is defined }} `+
		`{{ (d|list)[5] }} {{ (d|list)[-1] }} {% set e = dict(d, k41=1) %}{{ e|length }} {{ e['k41'] }} `+
		`{% set f = {1: 'int', `+wideLiteral+`, 1.0: 'float'} %}{{ f[1] }} {{ f['1'] is defined }} {{ f|length }} {{ f['s19'] }}`)
	got, err := chat.RenderVars(tpl, []byte(obj.String()))
	if err != nil {
		t.Fatal(err)
	}
	if want := "40 last again False k5 k39 41 1 float False 21 19"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestCompileRefusesWhatItCannotRender(t *testing.T) {
	for _, src := range []string{
		`{% include 'x' %}`, `{% extends 'x' %}`, `{% import 'x' as y %}`, `{% do x.append(1) %}`,
		`{{ x | nosuchfilter }}`, `{% if x is nosuchtest %}{% endif %}`, `{% for x in y %}`, `{{ (((`,
		strings.Repeat("(", 1000) + "1" + strings.Repeat(")", 1000),
		`{{ 'unterminated }}`, `{# unterminated`,
	} {
		if src[0] == '(' {
			src = "{{ " + src + " }}"
		}
		if _, err := chat.Compile(src); err == nil {
			t.Errorf("%.40s: compiled", src)
		}
	}
}

// TestUnimplementedCallsFallBack: a template that calls what chat does
// not implement compiles; a rendering that reaches such a call fails with
// ErrUnsupported (the request routes approximately: jinja2 would render
// it, so it is no client error), and one that does not reach it renders.
func TestUnimplementedCallsFallBack(t *testing.T) {
	for _, c := range []struct{ src, call string }{
		{`{{ 'x'.ljust(5) }}`, ".ljust()"},
		{`{{ 'x'.zfill(4) }}`, ".zfill()"},
		{`{% for m in messages %}{{ m.content.swapcase() }}{% endfor %}`, ".swapcase()"},
		{`{% for m in messages %}{% if loop.changed(m.role) %}{{ m.role }}{% endif %}{% endfor %}`, ".changed()"},
		{`{% set sep = joiner(', ') %}`, "joiner()"},
		{`{% set c = cycler('a', 'b') %}{{ c.next() }}`, "cycler()"},
		{`{{ nosuchfunction() }}`, "nosuchfunction()"},
	} {
		tpl, err := chat.Compile(`{% if tools %}` + c.src + `{% else %}plain{% endif %}`)
		if err != nil {
			t.Errorf("%s: %v", c.src, err)
			continue
		}
		if got := tpl.Unimplemented(); len(got) == 0 || got[0] != c.call {
			t.Errorf("%s: unimplemented %q, want %s first", c.src, got, c.call)
		}
		out, err := render(tpl, []byte(`{"messages":[{"role":"user","content":"hi"}]}`), "", "")
		if err != nil || out != "plain" {
			t.Errorf("%s: a rendering that does not reach the call: %q, %v", c.src, out, err)
		}
		_, err = render(tpl, []byte(`{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}]}`), "", "")
		if !errors.Is(err, chat.ErrUnsupported) || errors.Is(err, chat.ErrInvalidRequest) {
			t.Errorf("%s: a rendering that reaches the call: %v, want ErrUnsupported", c.src, err)
		}
	}
}

// TestCompileAcceptsTheCallsItRenders: what chat implements compiles, as
// do calls of names the template binds and the methods the sandbox
// refuses (list.append fails there as here).
func TestCompileAcceptsTheCallsItRenders(t *testing.T) {
	for _, src := range []string{
		`{{ messages[0].content.strip().split(' ')|join('-') }}`, `{{ raise_exception('no') if false }}`,
		`{{ range(3)|list }}`, `{% set ns = namespace(a=1) %}{{ ns.a }}`, `{{ {'a': 1}.get('a') }}`,
		`{{ {'a': 1}.items()|list }}`, `{{ [1, 2].index(2) }}`, `{% for x in [1] %}{{ loop.cycle('a', 'b') }}{% endfor %}`,
		`{% macro m(f) %}{{ f() }}{% endmacro %}{{ m(raise_exception) }}`, `{% call m() %}x{% endcall %}{% macro m() %}{{ caller() }}{% endmacro %}`,
		`{% set xs = [] %}{{ xs.append(1) }}`, `{{ strftime_now('%Y') }}`,
	} {
		tpl, err := chat.Compile(src)
		if err != nil {
			t.Errorf("%s: %v", src, err)
			continue
		}
		if calls := tpl.Unimplemented(); len(calls) != 0 {
			t.Errorf("%s: %q marked unimplemented", src, calls)
		}
	}
}

func FuzzDecodeInput(f *testing.F) {
	f.Add([]byte(`{"messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"a\": [1, 2.5, NaN]}"}}]},{"role":"tool","tool_call_id":"1","content":[{"type":"text","text":"r"}]}],"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"chat_template_kwargs":{"enable_thinking":false}}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}},"t"]}],"add_generation_prompt":false,"continue_final_message":true}`))
	tpl := mustCompile(f, chatML)
	parts := mustCompile(f, `{% for m in messages %}{% for p in m.content %}{{ p|tojson }}{% endfor %}{{ m|tojson }}{% endfor %}{{ tools|tojson(indent=2) }}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		in, err := chat.DecodeInput(body)
		if err != nil {
			if !errors.Is(err, chat.ErrInvalidRequest) {
				t.Fatalf("a bad body must wrap ErrInvalidRequest: %v", err)
			}
			return
		}
		for _, tp := range []*chat.Template{tpl, parts} {
			if _, err := tp.Render(nil, in, "<s>", "</s>"); err != nil &&
				!errors.Is(err, chat.ErrInvalidRequest) && !errors.Is(err, chat.ErrUnsupported) {
				t.Fatalf("unclassified error: %v", err)
			}
		}
	})
}

func FuzzCompileRender(f *testing.F) {
	for _, s := range []string{
		chatML,
		`{% set ns = namespace(a=1) %}{% for m in messages[::-1] if m.role != 'x' %}{{ loop.index }}{{ m.content|trim|tojson }}{% break %}{% endfor %}`,
		`{% macro f(x, y=2) %}{{ x ~ y }}{{ caller() if caller is defined }}{% endmacro %}{% call f(1) %}c{% endcall %}`,
		`{{ '%s %d' % ('a', 1) }}{{ 'a,b'.split(',')|join('|') }}{{ {'k': [1, 2.5, none]}|dictsort }}`,
		`{%- if messages[0]['role'] == 'system' -%}{{ raise_exception('x') }}{%- endif -%}`,
		`{% raw %}{{{% endraw %}{# c #}{{ 1 if true else 2 }}{{ (1,) }}{{ range(3)|list }}`,
		`{{ '%-+#08.3x|%5.2e|%c' % (255, 1.5, 65) }}{{ '{:*^+#012,.2f}|{0!r:>5}|{x:_}'.format(1234.5, x=10**9) }}`,
		`{{ 'Straße ǆ 日a'|upper }}{{ 'x'.title() }}{{ '²'.isdigit() }}{{ '' is lower }}{{ messages|groupby('role') }}`,
	} {
		f.Add(s)
	}
	in, err := chat.DecodeInput([]byte(`{"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}],"tools":[{"type":"function","function":{"name":"f"}}]}`))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, src string) {
		tpl, err := chat.Compile(src)
		if err != nil {
			return
		}
		tpl.Limits = chat.Limits{MaxOutputBytes: 1 << 16, MaxSteps: 1 << 12, MaxCallDepth: 16}
		out, err := tpl.Render(nil, in, "<s>", "</s>")
		if err == nil && len(out) > 1<<16 {
			t.Fatalf("output of %d bytes passed a limit of %d", len(out), 1<<16)
		}
	})
}
