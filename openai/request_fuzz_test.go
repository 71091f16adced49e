package openai

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzParseRequest checks Parse against an oracle built on encoding/json:
// both must agree on which bodies are JSON, and on every accepted body the
// routing fields must equal what encoding/json decodes, with the same verdict
// on each field's type and range.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":[1,2,3],"stream":true,"max_tokens":16}`,
		`{"prompt":"hello","cache_salt":"s","max_completion_tokens":3}`,
		`{"model":"m","lora_path":"a","prompt":[1],"lora_path":["b"]}`,
		`{"prompt":"","prompt_embeds":"AAAA"}`, `{"prompt_embeds":["AAAA"]}`, `{"prompt_embeds":["A","B"],"prompt":""}`,
		`{"prompt_embeds":[1],"prompt":"x"}`, `{"prompt_embeds":"","prompt":""}`, `{"prompt_embeds":[],"prompt":[]}`,
		`{"prompt_embeds":"AA","prompt":"text"}`, `{"prompt_embeds":null}`, `{"prompt_embeds":{"a":1}}`, `{"lora_path":"s\u0071l","messages":[]}`,
		`{"prompt":[1,2],"n":3}`, `{"prompt":[1],"n":0}`, `{"prompt":[1],"n":"2"}`, `{"prompt":[1],"n":1.5}`,
		`{"prompt":[1],"n":"+2","max_tokens":"1_0","max_completion_tokens":"5.00"}`, `{"prompt":[1],"n":true,"max_tokens":false}`,
		`{"prompt":[1],"n":"+_2","max_tokens":"1_0.0","max_completion_tokens":"5.5"}`,
		`{"prompt":[[1,2]],"x":{"y":[null,true,false,-1.5e3]}}`,
		`{"prompt":["a","b"]}`,
		`{"prompt":[1,"a"],"stream":"x"}`,
		`{"model":"m\u00e9","messages":[{"role":"user","content":"hi"}],"stream":false}`,
		`{"messages":[],"prompt":[-1]}`,
		`{"prompt":[4294967296],"max_tokens":0}`,
		`{"prompt":[70000]}`,
		`{"prompt":[1.0,-0,2e0,-0.0E1,65535.00]}`, `{"prompt":[[1.5]]}`, `{"prompt":[1,-1e-999,65536.0]}`,
		`[1,2]`,
		`{"prompt":"x"`,
		`{"\u0070rompt":"x","prompt":null}`,
		`{"prompt":"\ud800\udc00","model":"\ud800"}`,
		`{"prompt":[1],"session_control":{"open":{"capacity_of_str_len":100}}}`,
		`{"prompt":[1],"session_control":{"close":true,"\u006fpen":true}}`,
		`{"prompt":[1],"session_control":{"open":1,"open":false}}`,
		`{"prompt":[1],"session_control":[true]}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	p := Parser{MaxTokenID: 65535, MaxBodyBytes: 1 << 20}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		api := APICompletions
		if chat {
			api = APIChatCompletions
		}
		r := new(ParsedRequest)
		err := p.Parse(body, api, r)
		if len(body) > p.MaxBodyBytes {
			if err != ErrBodyTooLarge {
				t.Fatalf("oversized body: %v", err)
			}
			return
		}
		valid := json.Valid(body)
		if (err == ErrMalformedJSON) == valid {
			t.Fatalf("Parse = %v but json.Valid = %v", err, valid)
		}
		if !valid {
			return
		}
		if !utf8.Valid(body) {
			// encoding/json reads invalid UTF-8 as U+FFFD; Parse refuses it.
			if err != ErrInvalidUTF8 {
				t.Fatalf("Parse = %v on a body that is not UTF-8", err)
			}
			return
		}
		want, wantErr := oracle(body, api, p.MaxTokenID)
		if err != wantErr {
			t.Fatalf("Parse = %v, oracle = %v", err, wantErr)
		}
		if err != nil {
			if r.Prompt != PromptNone || len(r.Tokens) != 0 {
				t.Fatal("a refused request kept a prompt")
			}
			return
		}
		checkAgainstOracle(t, r, want)
	})
}

type oracleResult struct {
	model, salt    any
	lora           any
	stream         bool
	maxTokens      int64
	choices        int64
	kind           PromptKind
	tokens         []uint32
	text, messages any
	embeds         any            // the prompt_embeds string, when the prompt
	session        SessionControl // OpenParams is only non-nil or nil
}

func oracleSession(v any) (SessionControl, *Error) {
	var sc SessionControl
	switch v := v.(type) {
	case nil:
		return sc, nil
	case map[string]any:
		switch o := v["open"].(type) {
		case nil:
		case bool:
			sc.Open = o
		case map[string]any:
			sc.Open, sc.OpenParams = true, []byte("{}")
		default:
			return SessionControl{}, ErrSessionControlType
		}
		switch c := v["close"].(type) {
		case nil:
		case bool:
			sc.Close = c
		default:
			return SessionControl{}, ErrSessionControlType
		}
		return sc, nil
	}
	return sc, ErrSessionControlType
}

// oracle decodes body with encoding/json and applies the parser's rules,
// field by field in the parser's order of precedence.
func oracle(body []byte, api API, maxTok uint32) (oracleResult, error) {
	var res oracleResult
	if b := bytes.TrimLeft(body, " \t\r\n"); len(b) == 0 || b[0] != '{' {
		return res, ErrNotObject
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		panic("oracle: valid JSON object did not decode: " + err.Error())
	}
	var errs [numFields]*Error
	str := func(key string, f int, typeErr *Error, nonEmpty bool) any {
		switch v := m[key].(type) {
		case nil:
		case string:
			if nonEmpty && v == "" {
				errs[f] = typeErr
			}
			return v
		default:
			errs[f] = typeErr
		}
		return nil
	}
	res.model = str("model", fModel, ErrModelType, false)
	res.salt = str("cache_salt", fCacheSalt, ErrCacheSaltType, true)
	res.lora = str("lora_path", fLoRAPath, nil, false) // a list is the engine's to judge
	// pydantic's lax bool: true and false, the numbers 0 and 1, and
	// str_as_bool's words in a string, in any case.
	switch v := m["stream"].(type) {
	case nil:
	case bool:
		res.stream = v
	case json.Number:
		switch x, err := strconv.ParseFloat(string(v), 64); {
		case err == nil && (x == 0 || x == 1):
			res.stream = x == 1
		default:
			errs[fStream] = ErrStreamType
		}
	case string:
		switch strings.ToLower(v) {
		case "1", "on", "t", "true", "y", "yes":
			res.stream = true
		case "0", "off", "f", "false", "n", "no":
		default:
			errs[fStream] = ErrStreamType
		}
	default:
		errs[fStream] = ErrStreamType
	}
	// vLLM's pydantic int fields, lax: integers, integral floats, true
	// and false, strings pydantic-core's clean_int_str reads (trimmed, a
	// plus sign dropped, a non-empty fraction of zeros cut, then single
	// underscores inside removed).
	integer := regexp.MustCompile(`^-?[0-9]+$`)
	signed := regexp.MustCompile(`^-?[0-9]+$`)
	zeros := regexp.MustCompile(`^(.*)\.0+$`)
	laxString := func(v string) (string, bool) {
		v = strings.TrimSpace(v)
		if strings.HasPrefix(v, "+") && !strings.HasPrefix(v, "+-") && !strings.HasPrefix(v, "++") {
			v = v[1:]
		}
		if m := zeros.FindStringSubmatch(v); m != nil {
			v = m[1]
		}
		if strings.Contains(v, "_") {
			if strings.HasPrefix(v, "_") || strings.HasSuffix(v, "_") || strings.Contains(v, "__") {
				return "", false
			}
			v = strings.ReplaceAll(v, "_", "")
		}
		if !signed.MatchString(v) {
			return "", false
		}
		return v, true
	}
	count := func(key string, f int, typeErr, rangeErr *Error) int64 {
		var s string
		switch v := m[key].(type) {
		case nil:
			return 0
		case bool:
			if !v {
				errs[f] = rangeErr
				return 0
			}
			return 1
		case json.Number:
			s = string(v)
		case string:
			var ok bool
			if s, ok = laxString(v); !ok {
				errs[f] = typeErr
				return 0
			}
		default:
			errs[f] = typeErr
			return 0
		}
		if !integer.MatchString(s) {
			x, err := strconv.ParseFloat(s, 64)
			switch {
			case err == nil && x != math.Trunc(x):
				errs[f] = typeErr
			case err != nil || x < 1 || x >= math.MaxInt64:
				errs[f] = rangeErr
			default:
				return int64(x)
			}
			return 0
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 {
			errs[f] = rangeErr
			return 0
		}
		return n
	}
	mt := count("max_tokens", fMaxTokens, ErrMaxTokensType, ErrMaxTokensRange)
	mc := count("max_completion_tokens", fMaxCompl, ErrMaxCompletionTokensType, ErrMaxCompletionTokensRange)
	res.choices = count("n", fChoices, ErrChoicesType, ErrChoicesRange)
	res.maxTokens = mt
	if mc != 0 {
		res.maxTokens = mc
	}
	if api == APIChatCompletions {
		switch v := m["messages"].(type) {
		case nil:
		case []any:
			if len(v) == 0 {
				errs[fMessages] = ErrEmptyMessages
			}
			for _, e := range v {
				if _, ok := e.(map[string]any); !ok {
					errs[fMessages] = ErrMessagesType
				}
			}
			res.kind, res.messages = PromptMessages, v
		default:
			errs[fMessages] = ErrMessagesType
		}
	} else {
		res.kind, res.tokens, res.text, errs[fPrompt] = oraclePrompt(m["prompt"], maxTok)
		// vLLM's prompt_embeds: a string, or a list of one; with no
		// prompt, or an empty one, it is the prompt.
		var embeds string
		switch v := m["prompt_embeds"].(type) {
		case nil:
		case string:
			embeds = v
		case []any:
			switch {
			case len(v) > 1:
				errs[fEmbeds] = ErrEmbedsBatch
				if _, ok := v[0].(string); !ok {
					errs[fEmbeds] = ErrEmbedsType
				}
			case len(v) == 1:
				if s, ok := v[0].(string); ok {
					embeds = s
				} else {
					errs[fEmbeds] = ErrEmbedsType
				}
			}
		default:
			errs[fEmbeds] = ErrEmbedsType
		}
		if embeds != "" && errs[fEmbeds] == nil && res.kind == PromptNone && (errs[fPrompt] == nil || errs[fPrompt] == ErrEmptyPrompt) {
			res.kind, res.embeds, errs[fPrompt] = PromptEmbeds, embeds, nil
		}
	}
	res.session, errs[fSessionControl] = oracleSession(m["session_control"])
	for _, e := range errs {
		if e != nil {
			return res, e
		}
	}
	if api == APIChatCompletions && res.kind != PromptMessages {
		return res, ErrMissingMessages
	}
	if api != APIChatCompletions && res.kind == PromptNone {
		return res, ErrMissingPrompt
	}
	return res, nil
}

func oraclePrompt(v any, maxTok uint32) (PromptKind, []uint32, any, *Error) {
	tokens := func(arr []any) ([]uint32, *Error) {
		if len(arr) == 0 {
			return nil, ErrEmptyPrompt
		}
		out := []uint32{}
		for _, e := range arr {
			n, ok := e.(json.Number)
			if !ok {
				return nil, ErrPromptType
			}
			s := string(n)
			if u, err := strconv.ParseUint(s, 10, 64); err == nil {
				if u > uint64(maxTok) {
					return nil, ErrTokenOutOfRange
				}
				out = append(out, uint32(u))
				continue
			}
			// pydantic's lax int, as for the int fields: an integral
			// float is its integer, -0 included.
			x, err := strconv.ParseFloat(s, 64)
			switch {
			case err == nil && x != math.Trunc(x):
				return nil, ErrPromptType
			case err != nil || x < 0 || x > float64(maxTok):
				return nil, ErrTokenOutOfRange
			}
			out = append(out, uint32(x))
		}
		return out, nil
	}
	switch v := v.(type) {
	case nil:
		return PromptNone, nil, nil, nil
	case string:
		if v == "" {
			return PromptNone, nil, nil, ErrEmptyPrompt
		}
		return PromptText, nil, v, nil
	case []any:
		if len(v) == 0 {
			return PromptNone, nil, nil, ErrEmptyPrompt
		}
		switch first := v[0].(type) {
		case json.Number:
			toks, err := tokens(v)
			if err != nil {
				return PromptNone, nil, nil, err
			}
			return PromptTokens, toks, nil, nil
		case []any:
			toks, err := tokens(first)
			if err != nil {
				return PromptNone, nil, nil, err
			}
			if len(v) > 1 {
				return PromptNone, nil, nil, ErrBatchNotSupported
			}
			return PromptTokens, toks, nil, nil
		case string:
			if len(v) > 1 {
				return PromptNone, nil, nil, ErrBatchNotSupported
			}
			if first == "" {
				return PromptNone, nil, nil, ErrEmptyPrompt
			}
			return PromptText, nil, first, nil
		}
	}
	return PromptNone, nil, nil, ErrPromptType
}

func checkAgainstOracle(t *testing.T, r *ParsedRequest, want oracleResult) {
	t.Helper()
	if r.Session.Open != want.session.Open || r.Session.Close != want.session.Close ||
		(r.Session.OpenParams == nil) != (want.session.OpenParams == nil) {
		t.Fatalf("session_control = %+v, oracle %+v", r.Session, want.session)
	}
	if p := r.Session.OpenParams; p != nil && !json.Valid(p) {
		t.Fatalf("session_control open parameters %q are not one JSON value", p)
	}
	decodeString := func(raw []byte) string {
		var s string
		if err := json.Unmarshal(append(append([]byte{'"'}, raw...), '"'), &s); err != nil {
			t.Fatalf("raw string %q does not decode: %v", raw, err)
		}
		return s
	}
	sameString := func(name string, got []byte, want any) {
		if want == nil {
			if got != nil {
				t.Fatalf("%s = %q, want absent", name, got)
			}
			return
		}
		// encoding/json turns invalid UTF-8 into U+FFFD; the parser keeps
		// the bytes the engine will see.
		if utf8.Valid(got) && string(got) != want.(string) {
			t.Fatalf("%s = %q, want %q", name, got, want)
		}
	}
	sameString("model", r.Model, want.model)
	sameString("cache_salt", r.CacheSalt, want.salt)
	sameString("lora_path", r.LoRAPath, want.lora)
	if r.Stream != want.stream || r.MaxTokens != want.maxTokens || r.Choices != want.choices || r.Prompt != want.kind {
		t.Fatalf("got stream=%v max=%d kind=%d, want %+v", r.Stream, r.MaxTokens, r.Prompt, want)
	}
	switch r.Prompt {
	case PromptTokens:
		if len(r.Tokens) == 0 || !reflect.DeepEqual(append([]uint32{}, r.Tokens...), want.tokens) {
			t.Fatalf("tokens %v, want %v", r.Tokens, want.tokens)
		}
	case PromptText:
		if got := decodeString(r.Text); len(r.Text) == 0 || got != want.text.(string) {
			t.Fatalf("text %q, want %q", got, want.text)
		}
	case PromptEmbeds:
		if got := decodeString(r.Embeds); len(r.Embeds) == 0 || got != want.embeds.(string) {
			t.Fatalf("embeds %q, want %q", got, want.embeds)
		}
	case PromptMessages:
		if len(r.Messages) < 2 || r.Messages[0] != '[' || r.Messages[len(r.Messages)-1] != ']' || !json.Valid(r.Messages) {
			t.Fatalf("messages %q are not one JSON array", r.Messages)
		}
		dec := json.NewDecoder(bytes.NewReader(r.Messages))
		dec.UseNumber()
		var got any
		if err := dec.Decode(&got); err != nil || !reflect.DeepEqual(got, want.messages) {
			t.Fatalf("messages decode to %v, want %v", got, want.messages)
		}
	default:
		t.Fatal("accepted without a prompt")
	}
}
