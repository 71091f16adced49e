package openai

import (
	"fmt"
	"slices"
	"testing"
)

func TestEventEnd(t *testing.T) {
	cases := []struct {
		in   string
		want int
	}{
		{"", -1},
		{"data: x\n", -1},
		{"data: x\n\n", 9},
		{"data: x\r\n\r\n", 11},
		{"data: x\n\r\ndata: y\n\n", 10},
		{"data: x\r\n\ndata: y\n\n", 10},
		{": ping\n\ndata: x\n\n", 8},
		{"\n", 1},
		{"event: e\ndata: x\n\n", 18},
		{"data: x\r", -1},
		{"data: x\r\r", -1}, // bare CR line endings are not split
		{"data: a\ndata: b\n", -1},
	}
	for _, tc := range cases {
		if got, _ := EventEnd([]byte(tc.in), 0); got != tc.want {
			t.Errorf("EventEnd(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestEventEndResumes(t *testing.T) {
	// Feeding bytes one at a time with the resume point must find the same
	// boundaries as scanning the whole buffer.
	stream := []byte("data: a\n\n: c\r\n\r\ndata: {\"x\":1}\n\ndata: [DONE]\n\n")
	var oneShot, incremental []int
	for b := stream; ; {
		n, _ := EventEnd(b, 0)
		if n < 0 {
			break
		}
		oneShot = append(oneShot, n)
		b = b[n:]
	}
	start, ls := 0, 0
	for end := 1; end <= len(stream); end++ {
		for {
			n, resume := EventEnd(stream[start:end], ls)
			if n < 0 {
				ls = resume
				break
			}
			incremental = append(incremental, n)
			start += n
			ls = 0
		}
	}
	if len(oneShot) != 4 || !slices.Equal(oneShot, incremental) {
		t.Fatalf("one shot %v, incremental %v", oneShot, incremental)
	}
}

func TestParseEvent(t *testing.T) {
	cases := []struct {
		name, ev string
		kind     EventKind
		reason   string
	}{
		{"completion item", chunk(0, "a", ""), EventItem, ""},
		{"terminal item", chunk(0, "a", "stop"), EventItem, "stop"},
		{"chat role chunk", `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n", EventItem, ""},
		{"chat terminal", `data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}` + "\n\n", EventItem, "length"},
		{"second choice finishes", `data: {"choices":[{"index":0,"text":"x"},{"index":1,"text":"y","finish_reason":"stop"}]}` + "\n\n", EventItem, "stop"},
		{"content mentioning finish_reason", `data: {"choices":[{"text":"\"finish_reason\":\"stop\"","finish_reason":null}]}` + "\n\n", EventItem, ""},
		{"escaped quote in content", `data: {"choices":[{"text":"a\\\"b\\\\","finish_reason":"stop"}]}` + "\n\n", EventItem, "stop"},
		{"usage only", `data: {"choices":[],"usage":{"completion_tokens":3}}` + "\n\n", EventOther, ""},
		{"done", "data: [DONE]\n\n", EventDone, ""},
		{"done crlf", "data: [DONE]\r\n\r\n", EventDone, ""},
		{"done without space", "data:[DONE]\n\n", EventDone, ""},
		{"vllm error", `data: {"error": {"object": "error", "message": "boom", "type": "BadRequestError", "param": null, "code": 400}}` + "\n\n", EventError, ""},
		{"old-style error", `data: {"object":"error","message":"boom"}` + "\n\n", EventError, ""},
		{"error field null", `data: {"error":null,"choices":[{"text":"x"}]}` + "\n\n", EventItem, ""},
		{"event error", "event: error\ndata: whatever\n\n", EventError, ""},
		{"comment", ": keep-alive\n\n", EventOther, ""},
		{"empty", "\n", EventOther, ""},
		{"not json", "data: hello\n\n", EventOther, ""},
		{"truncated json", `data: {"choices":[{"text":"x`, EventOther, ""},
		{"crlf item", "data: {\"choices\":[{\"finish_reason\":\"stop\"}]}\r\n\r\n", EventItem, "stop"},
		{"whitespace json", "data: { \"choices\" : [ { \"finish_reason\" : \"stop\" } ] }\n\n", EventItem, "stop"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ev := ParseEvent([]byte(tc.ev))
			if ev.Kind != tc.kind || string(ev.FinishReason) != tc.reason {
				t.Fatalf("ParseEvent = %v %q, want %v %q", ev.Kind, ev.FinishReason, tc.kind, tc.reason)
			}
		})
	}
}

// TestErrorCode: an error's integer code, where vLLM and SGLang put the
// failure's HTTP status, is read from either shape of error they send;
// anything else reads as none.
func TestErrorCode(t *testing.T) {
	for _, tc := range []struct {
		body string
		code int
	}{
		{`{"error":{"object":"error","message":"boom","type":"BadRequestError","param":null,"code":400}}`, 400},
		{`{"error": {"message": "engine core died", "type": "InternalServerError", "code": 500}}`, 500},
		{`{"object":"error","message":"x","type":"InternalServerError","param":null,"code":503}`, 503},
		{`{"code":500,"object":"error","message":"x"}`, 500},
		{`{"error":{"message":"x","code":"server_error"}}`, 0},
		{`{"error":{"message":"x"}}`, 0},
		{`{"error":{"nested":{"code":500},"message":"x"}}`, 0},
		{`{"error":{"code":500.5}}`, 0},
		{`{"error":{"code":5e2}}`, 0},
		{`{"error":{"code":12345}}`, 0},
		{`{"error":"a string"}`, 0},
		{`{"error":{"code":-500}}`, 0},
		{`{"choices":[{"text":"x"}],"code":500}`, 0}, // not an error: no code
	} {
		if ev := ParseResponse([]byte(tc.body)); ev.ErrorCode != tc.code {
			t.Errorf("%s: ErrorCode %d, want %d", tc.body, ev.ErrorCode, tc.code)
		}
	}
	if ev := ParseEvent([]byte("event: error\ndata: {\"code\":500}\n\n")); ev.Kind != EventError || ev.ErrorCode != 0 {
		t.Errorf("an event: error line: %+v", ev)
	}
}

func TestParseResponse(t *testing.T) {
	cases := []struct {
		name, body string
		kind       EventKind
		reason     string
	}{
		{"completion", `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"hi","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":3}}`, EventItem, "length"},
		{"chat", `{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"{\"finish_reason\":\"x\"}"},"finish_reason":"stop"}]}`, EventItem, "stop"},
		{"vllm error", `{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}`, EventError, ""},
		{"error after choices", `{"choices":[{"finish_reason":"stop"}],"object":"error"}`, EventError, ""},
		{"no choices", `{"object":"list","data":[]}`, EventOther, ""},
		{"not an object", `[{"choices":[{}]}]`, EventOther, ""},
		{"malformed choice", `{"choices":[{"finish_reason":"stop",}]}`, EventOther, ""},
		{"bad escape in a key", `{"ch\qoices":[{}]}`, EventOther, ""},
		{"an empty finish_reason is none", `{"choices":[{"text":"a","finish_reason":""}]}`, EventItem, ""},
		{"trailing bytes are the engine's", `{"choices":[{"finish_reason":"stop"}]} trailing`, EventItem, "stop"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ev := ParseResponse([]byte(tc.body))
			if ev.Kind != tc.kind || string(ev.FinishReason) != tc.reason || tc.reason == "" && ev.FinishReason != nil {
				t.Fatalf("ParseResponse = %v %q, want %v %q", ev.Kind, ev.FinishReason, tc.kind, tc.reason)
			}
		})
	}
}

func chunk(i int, text, finish string) string {
	fr := "null"
	if finish != "" {
		fr = `"` + finish + `"`
	}
	return fmt.Sprintf(`data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m",`+
		`"choices":[{"index":0,"text":%q,"logprobs":null,"finish_reason":%s}],"usage":null}`+"\n\n", text+fmt.Sprint(i), fr)
}

// vllmStream is a stream shaped like vLLM's: n items, the last terminal,
// a usage chunk, and [DONE].
func vllmStream(n int) []string {
	var evs []string
	for i := 0; i < n; i++ {
		fin := ""
		if i == n-1 {
			fin = "stop"
		}
		evs = append(evs, chunk(i, "tok", fin))
	}
	evs = append(evs,
		`data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":`+fmt.Sprint(n)+`}}`+"\n\n",
		"data: [DONE]\n\n")
	return evs
}

// TestFinishes: an item counts every choice that carries a finish_reason,
// so that a request for n choices ends when all of them have, however an
// engine groups them into events.
func TestFinishes(t *testing.T) {
	for _, tc := range []struct {
		body     string
		finishes int
	}{
		{`{"choices":[{"index":0,"text":"a","finish_reason":null}]}`, 0},
		{`{"choices":[{"index":0,"text":"a","finish_reason":"stop"}]}`, 1},
		{`{"choices":[{"index":0,"finish_reason":"stop"},{"index":1,"finish_reason":"length"}]}`, 2},
		{`{"choices":[{"index":0,"finish_reason":null},{"index":1,"finish_reason":"length"}]}`, 1},
		{`{"choices":[{"index":0,"finish_reason":""},{"index":1,"finish_reason":"stop"},{"index":2,"finish_reason":"stop"}]}`, 2},
		{`{"error":{"message":"x","code":500},"choices":[{"finish_reason":"stop"}]}`, 0},
	} {
		if ev := ParseResponse([]byte(tc.body)); ev.Finishes != tc.finishes {
			t.Errorf("%s: Finishes %d, want %d", tc.body, ev.Finishes, tc.finishes)
		}
	}
}
