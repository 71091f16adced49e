package fastpath_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/node"
)

// silentEngine takes requests and never answers them, as an engine does
// while it queues or generates a long answer; with streamHeaders it first
// sends the headers of an event stream, as vLLM does before prefill. It
// answers everything but generation at once (health, model discovery). Each
// connection the router closes is reported on closed: closing it is how
// the router tells an OpenAI-compatible engine to stop generating.
type silentEngine struct {
	ln       net.Listener
	requests atomic.Int64
	closed   chan struct{}
	// rejectOne makes it answer requests for one token (max_tokens 1)
	// with a 400 at once, as an engine refuses a request it judges bad.
	rejectOne atomic.Bool
}

func startSilentEngine(t *testing.T, streamHeaders bool) *silentEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &silentEngine{ln: ln, closed: make(chan struct{}, 16)}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
			go e.serve(c, streamHeaders)
		}
	}()
	return e
}

func (e *silentEngine) serve(c net.Conn, streamHeaders bool) {
	br := bufio.NewReader(c)
	var req fasthttp.Request
	for {
		if err := req.Read(br); err != nil {
			return
		}
		switch string(req.URI().Path()) {
		case fastpath.PathCompletions, fastpath.PathChatCompletions:
			if e.rejectOne.Load() && bytes.Contains(req.Body(), []byte(`"max_tokens":1,`)) {
				const body = `{"error":{"message":"bad request","type":"invalid_request_error"}}`
				_, _ = io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
				continue
			}
		case fastpath.PathHealth:
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
			continue
		default: // the router's model discovery
			_, _ = io.WriteString(c, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
			continue
		}
		break
	}
	e.requests.Add(1)
	if streamHeaders {
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
	}
	// Nothing more comes from the router: the read ends when it closes
	// the connection.
	_, _ = io.Copy(io.Discard, br)
	e.closed <- struct{}{}
}

func (e *silentEngine) addr() string { return e.ln.Addr().String() }

func (e *silentEngine) waitClosed(t *testing.T) {
	t.Helper()
	select {
	case <-e.closed:
	case <-time.After(e2eWait):
		t.Fatal("the router did not close its connection to the engine: the engine would go on generating")
	}
}

// TestDepartedClientCancelsEngine: a client that leaves while the engine
// is silent, before any byte of the answer, makes the router close its
// engine connection (the engine stops generating) and release the booking,
// for a non-streaming request and for a stream, whether the engine sent
// its headers or not. The first-byte and idle timeouts are an hour: only
// the hang-up can end the call within the test.
func TestDepartedClientCancelsEngine(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		stream, streamHeaders bool
	}{
		{"non-streaming", false, false},
		{"stream/before-headers", true, false},
		{"stream/before-first-event", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := startSilentEngine(t, tc.streamHeaders)
			cfg := e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.addr(), Model: e2eModel})
			cfg.Dispatch.Timeouts.FirstByte, cfg.Dispatch.Timeouts.Idle = time.Hour, time.Hour
			r := startE2ERouter(t, cfg)
			c := sendRaw(t, r, completionBody(e2eTokens(31, 64), tc.stream, 4))
			waitFor(t, "the engine to receive the request", func() bool { return eng.requests.Load() == 1 })
			if v := workerView(t, r.node, 1, 0); v.Requests != 1 {
				t.Fatalf("the request in flight is not booked: %+v", v)
			}
			_ = c.Close()
			eng.waitClosed(t)
			waitReleased(t, r.node)
		})
	}
}

// TestShutdownAbortsCallsOnSilentEngines: a request still waiting on a
// silent engine when Shutdown's deadline passes is cut with its engine
// call, so Shutdown returns drained (the deadline's error, not
// ErrNotDrained) and the node may free what requests read.
func TestShutdownAbortsCallsOnSilentEngines(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "non-streaming", true: "stream"}[stream], func(t *testing.T) {
			eng := startSilentEngine(t, stream)
			cfg := e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.addr(), Model: e2eModel})
			cfg.Dispatch.Timeouts.FirstByte, cfg.Dispatch.Timeouts.Idle = time.Hour, time.Hour
			r := startE2ERouter(t, cfg)
			sendRaw(t, r, completionBody(e2eTokens(32, 64), stream, 4))
			waitFor(t, "the engine to receive the request", func() bool { return eng.requests.Load() == 1 })
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			shut := make(chan error, 1)
			go func() { shut <- r.node.Shutdown(ctx) }()
			select {
			case err := <-shut:
				if errors.Is(err, fastpath.ErrNotDrained) || !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Shutdown with a call on a silent engine: %v", err)
				}
			case <-time.After(e2eWait):
				t.Fatal("Shutdown did not return")
			}
			eng.waitClosed(t)
			waitReleased(t, r.node)
		})
	}
}

// startStallRouter routes to eng alone with no dispatch timeouts and the
// stall time after.
func startStallRouter(t *testing.T, eng *silentEngine, after time.Duration) *e2eRouter {
	t.Helper()
	cfg := e2eConfig(node.StaticWorker{ID: 1, Endpoint: eng.addr(), Model: e2eModel})
	cfg.Dispatch.Timeouts.FirstByte, cfg.Dispatch.Timeouts.Idle = time.Hour, time.Hour
	cost := *cfg.Sched.Cost
	cost.StallAfter = after
	cfg.Sched.Cost = &cost
	return startE2ERouter(t, cfg)
}

// TestSilentEngineStalls: a request that waits on a silent engine past the
// stall time shows the worker stalled in /admin/workers and /metrics, and
// the stall ends with the request.
func TestSilentEngineStalls(t *testing.T) {
	eng := startSilentEngine(t, false)
	r := startStallRouter(t, eng, 50*time.Millisecond)
	const series = `kvfast_worker_stalled{dp_rank="0",worker="1"}`
	if v, ok := metricValue(r.metrics(t), series); !ok || v != 0 {
		t.Fatalf("an idle worker: %s = %v (found %v), want 0", series, v, ok)
	}
	c := sendRaw(t, r, completionBody(e2eTokens(33, 64), false, 4))
	waitFor(t, "the worker to count as stalled", func() bool { return workerView(t, r.node, 1, 0).Stalled })
	wantMetric(t, r.metrics(t), series, 1)
	_ = c.Close() // the client leaves: nothing waits on the engine any more
	eng.waitClosed(t)
	waitReleased(t, r.node)
	if workerView(t, r.node, 1, 0).Stalled {
		t.Fatal("the worker is still stalled with nothing waiting on it")
	}
}

// TestRejectingEngineAnswers: an engine's 4xx is an answer. A worker
// stalled by a request it never answers is no longer stalled once it
// refuses another request, which proves it is reading them.
func TestRejectingEngineAnswers(t *testing.T) {
	eng := startSilentEngine(t, false)
	eng.rejectOne.Store(true)
	// Long enough that the check after the 400 comes well inside it.
	r := startStallRouter(t, eng, 2*time.Second)
	c := sendRaw(t, r, completionBody(e2eTokens(33, 64), false, 4))
	waitFor(t, "the worker to count as stalled", func() bool { return workerView(t, r.node, 1, 0).Stalled })
	resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(34, 64), false, 1), nil)
	if resp.status != http.StatusBadRequest {
		t.Fatalf("status %d, want the engine's 400: %s", resp.status, resp.body)
	}
	if workerView(t, r.node, 1, 0).Stalled {
		t.Fatal("the worker is still stalled after it answered a request with a 400")
	}
	// The client's input, not a failure: outside the error ratio's statuses.
	waitFor(t, "the refusal to be counted", func() bool {
		v, _ := metricValue(r.metrics(t), `kvfast_requests_total{endpoint="completions",status="engine_rejected"}`)
		return v == 1
	})
	_ = c.Close()
	eng.waitClosed(t)
	waitReleased(t, r.node)
}
