package dispatch

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

// splitReader returns its data in pieces whose sizes cycle through sizes.
type splitReader struct {
	data   []byte
	sizes  []int
	i      int
	err    error // returned after the data instead of io.EOF, if set
	closed bool
}

func (r *splitReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		return 0, io.EOF
	}
	n := r.sizes[r.i%len(r.sizes)]
	r.i++
	n = min(n, len(p), len(r.data))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

func (r *splitReader) Close() error { r.closed = true; return nil }

// failWriter fails every write once limit bytes went through.
type failWriter struct {
	buf   bytes.Buffer
	limit int
}

func (w *failWriter) Write(p []byte) (int, error) {
	if w.buf.Len()+len(p) > w.limit {
		return 0, errors.New("client closed")
	}
	return w.buf.Write(p)
}

// relayCall returns a call whose response is body, as if Do had succeeded.
func relayCall(t *testing.T, bufSize int, contentType string, status int, body io.Reader, obs Observer) *Call {
	t.Helper()
	p := NewPool(Config{RelayBufferSize: bufSize, Health: noHealth})
	c := p.AcquireCall()
	c.obs, c.finished, c.open = obs, obs == nil, true
	c.resp.SetStatusCode(status)
	c.resp.Header.SetContentType(contentType)
	c.resp.SetBodyStream(body, -1)
	return c
}

func TestRelayByteExact(t *testing.T) {
	big := "data: {\"choices\":[{\"text\":\"" + strings.Repeat("x", 300) + "\",\"finish_reason\":null}]}\n\n"
	events := append([]string{": hello\n\n", "event: message\r\ndata: {\"choices\":[{\"text\":\"a\"}]}\r\n\r\n", big}, vllmStream(5)...)
	stream := []byte(strings.Join(events, ""))
	for _, bufSize := range []int{64, 100, 257, 4096} {
		for _, sizes := range [][]int{{1}, {2, 3}, {7, 1, 50}, {4096}} {
			rec := newRecorder()
			src := &splitReader{data: stream, sizes: sizes}
			c := relayCall(t, bufSize, "text/event-stream", 200, src, rec)
			var out bytes.Buffer
			w := bufio.NewWriterSize(&out, 16)
			if err := c.Relay(w); err != nil {
				t.Fatalf("buf %d sizes %v: %v", bufSize, sizes, err)
			}
			if !bytes.Equal(out.Bytes(), stream) {
				t.Fatalf("buf %d sizes %v: relayed bytes differ\n got %q\nwant %q", bufSize, sizes, out.Bytes(), stream)
			}
			rec.wait(t)
			if bufSize >= 4096 {
				// Nothing was too large to inspect: the full protocol shows.
				if got := rec.summary(); got != "first item×7 complete:stop" {
					t.Fatalf("buf %d sizes %v: observer saw %q", bufSize, sizes, got)
				}
			} else if got := rec.summary(); !strings.HasSuffix(got, "complete:stop") && !strings.HasSuffix(got, "complete:") {
				// Events larger than the buffer pass uninspected, but the
				// stream still completes, at the latest on [DONE].
				t.Fatalf("buf %d sizes %v: observer saw %q", bufSize, sizes, got)
			}
			c.Release()
		}
	}
}

func TestRelayCompletesBeforeTerminalItemIsSent(t *testing.T) {
	stream := []byte(strings.Join(vllmStream(3), ""))
	terminal := bytes.Index(stream, []byte(`"finish_reason":"stop"`))
	rec := newRecorder()
	var out bytes.Buffer
	rec.atComplete = func() {
		if out.Len() > terminal {
			t.Errorf("the terminal item reached the client before OnComplete")
		}
	}
	c := relayCall(t, 4096, "text/event-stream", 200, &splitReader{data: stream, sizes: []int{4096}}, rec)
	if err := c.Relay(bufio.NewWriter(&out)); err != nil {
		t.Fatal(err)
	}
	c.Release()
	if rec.reason != "stop" {
		t.Fatalf("finish reason %q", rec.reason)
	}
}

func TestRelayFailures(t *testing.T) {
	stream := []byte(strings.Join(vllmStream(4), ""))
	firstTwo := len(chunk(0, "tok", "")) + len(chunk(1, "tok", ""))
	cases := []struct {
		name      string
		body      *splitReader
		status    int
		ctype     string
		writer    io.Writer
		wantErr   error // nil: success
		wantLog   string
		wantOut   string // a suffix the client must have received
		wantClose bool
	}{
		{"engine breaks mid-stream",
			&splitReader{data: stream[:firstTwo], sizes: []int{100}, err: io.ErrUnexpectedEOF},
			200, "text/event-stream", nil, ErrEngineFailed, "first item×2 abort",
			string(sseErrors[kindOf(ErrEngineFailed)]), true},
		{"engine idles out",
			&splitReader{data: stream[:firstTwo], sizes: []int{100}, err: errIdle},
			200, "text/event-stream", nil, ErrIdleTimeout, "first item×2 abort",
			`"code":"engine_timeout"}}` + "\n\ndata: [DONE]\n\n", true},
		{"stream ends early",
			&splitReader{data: stream[:firstTwo], sizes: []int{100}},
			200, "text/event-stream", nil, ErrTruncated, "first item×2 abort",
			`"code":"engine_stream_truncated"}}` + "\n\ndata: [DONE]\n\n", true},
		{"break after the terminal item needs no error event",
			&splitReader{data: stream[:bytes.Index(stream, []byte("data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",\"choices\":[]"))], sizes: []int{100}, err: io.ErrUnexpectedEOF},
			200, "text/event-stream", nil, ErrEngineFailed, "first item×4 complete:stop",
			chunk(3, "tok", "stop"), true},
		{"client goes away",
			&splitReader{data: stream, sizes: []int{50}},
			200, "text/event-stream", &failWriter{limit: firstTwo}, ErrClientGone, "first item×3 abort", "", true},
		{"engine error event",
			&splitReader{data: []byte(chunk(0, "a", "") + `data: {"error":{"message":"x"}}` + "\n\ndata: [DONE]\n\n"), sizes: []int{9}},
			200, "text/event-stream", nil, nil, "first item×1 abort", "data: [DONE]\n\n", false},
		{"error status stream",
			&splitReader{data: []byte("data: [DONE]\n\n"), sizes: []int{9}},
			500, "text/event-stream", nil, nil, "abort", "data: [DONE]\n\n", false},
		{"an event cut short is dropped, and the error event stands alone",
			&splitReader{data: append(stream[:firstTwo:firstTwo], `data: {"id":"cmpl-1","obj`...), sizes: []int{100}},
			200, "text/event-stream", nil, ErrTruncated, "first item×2 abort",
			chunk(1, "tok", "") + string(sseErrors[kindOf(ErrTruncated)]), true},
		{"a last [DONE] without its blank line is completed",
			&splitReader{data: stream[:len(stream)-2], sizes: []int{64}},
			200, "text/event-stream", nil, nil, "first item×4 complete:stop", "}}\n\ndata: [DONE]\n\n", true},
		{"an engine silent after [DONE] is not failed for it",
			&splitReader{data: stream, sizes: []int{64}, err: errIdle},
			200, "text/event-stream", nil, nil, "first item×4 complete:stop", "}}\n\ndata: [DONE]\n\n", true},
		{"an engine silent after its last finish_reason is not failed for it",
			&splitReader{data: stream[:len(stream)-len("data: [DONE]\n\n")], sizes: []int{64}, err: errIdle},
			200, "text/event-stream", nil, nil, "first item×4 complete:stop", `"completion_tokens":4}}` + "\n\n", true},
		{"a plain body is ReadBody's, not relayed",
			&splitReader{data: []byte(`{"choices":[{"text":"hi","finish_reason":"length"}]}`), sizes: []int{5}},
			200, "application/json", nil, ErrEngineFailed, "abort", "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder()
			c := relayCall(t, 4096, tc.ctype, tc.status, tc.body, rec)
			var out bytes.Buffer
			var dst io.Writer = &out
			if tc.writer != nil {
				dst = tc.writer
			}
			err := c.Relay(bufio.NewWriterSize(dst, 16))
			if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("Relay = %v, want %v", err, tc.wantErr)
			}
			rec.wait(t)
			if got := rec.summary(); got != tc.wantLog {
				t.Fatalf("observer saw %q, want %q", got, tc.wantLog)
			}
			if rec.abortErr != nil && tc.wantErr != nil && tc.wantLog[len(tc.wantLog)-5:] == "abort" && !errors.Is(rec.abortErr, tc.wantErr) {
				t.Fatalf("OnAbort(%v), want %v", rec.abortErr, tc.wantErr)
			}
			if tc.writer == nil && !strings.HasSuffix(out.String(), tc.wantOut) {
				t.Fatalf("client got %q, want suffix %q", out.String(), tc.wantOut)
			}
			if tc.body.closed != tc.wantClose && tc.wantClose {
				t.Fatal("the engine stream was not closed")
			}
			c.Release()
		})
	}
}

func TestReleaseAbandons(t *testing.T) {
	rec := newRecorder()
	src := &splitReader{data: []byte(strings.Join(vllmStream(2), "")), sizes: []int{10}}
	c := relayCall(t, 4096, "text/event-stream", 200, src, rec)
	c.Release()
	rec.wait(t)
	if !errors.Is(rec.aborted(), ErrAbandoned) || !src.closed {
		t.Fatalf("Release: abort %v, closed %v", rec.aborted(), src.closed)
	}
}

// TestStreamAfterTheEngineError: a stream that carried the engine's own
// error event ends with [DONE] however it ends (the engine's body ending,
// or breaking), standing alone after an event the client got only part
// of; and the error counts against the engine once.
func TestStreamAfterTheEngineError(t *testing.T) {
	errorEvent := `data: {"object":"error","message":"boom","code":500}` + "\n\n"
	part := "data: {\"x\":\"" + strings.Repeat("a", 1000) // an event larger than the buffer, cut
	for _, tc := range []struct {
		name, stream string
		err          error
		want         string
	}{
		{"ended", errorEvent, nil, errorEvent + "data: [DONE]\n\n"},
		{"broken", errorEvent, io.ErrUnexpectedEOF, errorEvent + "data: [DONE]\n\n"},
		{"ended mid-event", errorEvent + part, nil, errorEvent + part + "\n\ndata: [DONE]\n\n"},
		{"broken mid-event", errorEvent + part, io.ErrUnexpectedEOF, ""}, // what of the event was sent, then [DONE]
		{"with its own [DONE]", errorEvent + "data: [DONE]\n\n", nil, errorEvent + "data: [DONE]\n\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder()
			src := &splitReader{data: []byte(tc.stream), sizes: []int{100}, err: tc.err}
			c := relayCall(t, 256, "text/event-stream", 200, src, rec)
			defer c.Release()
			var out bytes.Buffer
			_ = c.Relay(bufio.NewWriterSize(&out, 16))
			got := out.String()
			if tc.want == "" {
				if sent, ok := strings.CutSuffix(got, "\n\ndata: [DONE]\n\n"); !ok || !strings.HasPrefix(tc.stream, sent) || len(sent) <= len(errorEvent) {
					t.Errorf("relayed %q; want the error event, part of the cut one, a blank line and [DONE]", got)
				}
			} else if got != tc.want {
				t.Errorf("relayed %q\nwant    %q", got, tc.want)
			}
			rec.wait(t)
			if err := rec.aborted(); !errors.Is(err, ErrEngineError) {
				t.Errorf("observer: %v; want the engine's error", err)
			}
		})
	}
}

// TestStreamEventBound: one event larger than MaxResponseBodySize ends
// the stream, whether or not it fits the relay buffer.
func TestStreamEventBound(t *testing.T) {
	small := chunk(0, "tok", "")
	big := "data: {\"x\":\"" + strings.Repeat("a", 8000) + "\"}\n\n"
	p := NewPool(Config{Health: noHealth, MaxResponseBodySize: 1024})
	c := p.AcquireCall()
	defer c.Release()
	rec := newRecorder()
	c.obs, c.finished, c.open = rec, false, true
	c.resp.SetStatusCode(200)
	c.resp.Header.SetContentType("text/event-stream")
	c.resp.SetBodyStream(&splitReader{data: []byte(small + big + small), sizes: []int{4096}}, -1)
	var out bytes.Buffer
	if err := c.Relay(bufio.NewWriterSize(&out, 16)); !errors.Is(err, ErrResponseTooLarge) {
		t.Fatalf("Relay = %v; want the event refused as too large", err)
	}
	if want := small + string(sseErrors[kindOf(ErrResponseTooLarge)]); out.String() != want {
		t.Errorf("relayed %q\nwant    %q", out.String(), want)
	}
}
