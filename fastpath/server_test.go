package fastpath

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvfast/kvfast/mocker"
)

// serverWait bounds every wait for something the front end does on its
// own goroutines; generous, because the race detector on a shared 2-core
// machine is slow.
const serverWait = 10 * time.Second

// TestShutdownRacingServe: a Shutdown that comes while Serve is still
// starting (a signal at boot) stops the server all the same; Serve must not
// go on accepting after Shutdown returned.
func TestShutdownRacingServe(t *testing.T) {
	for i := range 12 {
		srv := newTestFront(t, DefaultConfig(), "", nil)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()
		if i%2 == 1 {
			time.Sleep(time.Duration(i) * 20 * time.Microsecond) // vary where in Serve the Shutdown lands
		}
		ctx, cancel := context.WithTimeout(context.Background(), serverWait)
		err = srv.Shutdown(ctx)
		cancel()
		if err != nil {
			t.Fatalf("round %d: Shutdown: %v", i, err)
		}
		select {
		case <-served:
		case <-time.After(serverWait):
			ln.Close()
			<-served
			t.Fatalf("round %d: Serve still running after Shutdown returned", i)
		}
		if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
			c.Close()
			t.Errorf("round %d: the listener still accepts after Shutdown", i)
		}
	}
}

// TestNoRequestHandledAfterDrainedShutdown: once Shutdown has not
// reported ErrNotDrained, the node unmaps the segment handlers read, so no
// handler may start afterwards. fasthttp counts a connection that has not
// yet sent a request as idle only after 5s, and a Shutdown whose context
// has ended (Node.Close's) leaves it open: its first request must be
// refused, not handled.
func TestNoRequestHandledAfterDrainedShutdown(t *testing.T) {
	srv := newTestFront(t, DefaultConfig(), "", nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(serverWait))
	replies := bufio.NewReader(conn)
	get := func() (int, error) {
		if _, err := io.WriteString(conn, "GET "+PathAdminWorkers+" HTTP/1.1\r\nHost: kvfast\r\n\r\n"); err != nil {
			return 0, err
		}
		resp, err := http.ReadResponse(replies, nil)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	deadline := time.Now().Add(serverWait)
	for srv.conns.Size() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the front end never accepted the connection")
		}
		time.Sleep(time.Millisecond)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel() // as Node.Close: no drain
	if err := srv.Shutdown(ctx); errors.Is(err, ErrNotDrained) {
		t.Fatalf("Shutdown with no request running: %v", err)
	}
	if status, err := get(); err == nil && status == http.StatusOK {
		t.Fatal("a request was handled after Shutdown reported the front end drained")
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(serverWait):
		t.Fatal("Serve still running after Shutdown returned")
	}
}

// servedFront serves a front end over one mock engine on loopback and
// returns its URL and the engine.
func servedFront(t *testing.T, arm func(*Server)) (string, *mocker.Engine, *Server) {
	t.Helper()
	eng, err := mocker.Start(mocker.Config{Speedup: math.Inf(1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() }) // runs last: the front end stops first
	cfg := DefaultConfig()
	cfg.AdminOnAPI = true // the tests read /metrics from the one listener
	s := newTestFront(t, cfg, "", []frontWorker{{endpoint: eng.Addr(), model: mocker.DefaultModel}})
	arm(s) // before Serve: no request goroutine sees the change happen
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	return "http://" + ln.Addr().String(), eng, s
}

// mockBody is a completions request for the mock engine's model.
func mockBody(seed, tokens int, stream bool) []byte {
	b := []byte(`{"model":"` + mocker.DefaultModel + `","max_tokens":4,"stream":` + strconv.FormatBool(stream) + `,"prompt":[`)
	for i := range tokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(seed*1000+i), 10)
	}
	return append(b, "]}"...)
}

// postBody posts body and returns the status and the whole response body
// (what arrived of it, for a cut stream).
func postBody(t *testing.T, url string, body []byte) (int, []byte) {
	t.Helper()
	return postWith(t, url+PathCompletions, body, nil)
}

// postWith posts body to url with extra headers, as postBody does.
func postWith(t *testing.T, url string, body []byte, headers map[string]string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), serverWait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, got
}

func waitReleasedFront(t *testing.T, s *Server) {
	t.Helper()
	deadline := time.Now().Add(serverWait)
	for !released(s) {
		if time.Now().After(deadline) {
			t.Fatalf("reservations leaked: %+v", s.sched.Stats())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestPanicWhileRoutingIsContained: a panic in the handler after the
// booking (injected where the router times its scheduling stage) is
// answered with a 500 OpenAI error, releases the booking, and leaves the
// router serving.
func TestPanicWhileRoutingIsContained(t *testing.T) {
	var armed atomic.Bool
	url, eng, s := servedFront(t, func(s *Server) {
		timer := s.metrics.stageSched
		s.metrics.stageSched = prometheus.ObserverFunc(func(v float64) {
			if armed.Load() {
				panic("injected fault")
			}
			timer.Observe(v)
		})
	})
	body := mockBody(10, 64, false)
	armed.Store(true)
	status, got := postBody(t, url, body)
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if status != http.StatusInternalServerError || json.Unmarshal(got, &e) != nil || e.Error.Code != "internal_error" {
		t.Fatalf("a panicking request: status %d: %s", status, got)
	}
	waitReleasedFront(t, s)
	if st := s.sched.Stats(); st.Booked != 1 {
		t.Errorf("the panicking request was not booked before the fault: %+v", st)
	}
	armed.Store(false)
	if status, got := postBody(t, url, body); status != http.StatusOK {
		t.Fatalf("after the panic: status %d: %s", status, got)
	}
	if n := eng.Stats().Requests; n != 1 {
		t.Errorf("the engine got %d requests, want only the one after the fault", n)
	}
	waitReleasedFront(t, s)
	_, m := getPath(t, url, PathMetrics)
	if want := "\n" + `kvfast_requests_total{endpoint="completions",status="engine_error"} 1` + "\n"; !strings.Contains(string(m), want) {
		t.Errorf("/metrics lacks %q", want)
	}
}

// TestPanicWhileStreamingIsContained: a panic on the stream relay
// goroutine (fasthttp's, which recovers nothing) must neither kill the
// router nor strand the request's load.
func TestPanicWhileStreamingIsContained(t *testing.T) {
	var armed atomic.Bool
	url, _, s := servedFront(t, func(s *Server) {
		ttft := s.metrics.ttft
		s.metrics.ttft = prometheus.ObserverFunc(func(v float64) {
			if armed.Load() {
				panic("injected fault in the relay")
			}
			ttft.Observe(v)
		})
	})
	body := mockBody(3, 48, true)
	armed.Store(true)
	_, _ = postBody(t, url, body) // the stream is cut; the client sees a short body
	waitReleasedFront(t, s)
	armed.Store(false)
	status, got := postBody(t, url, body)
	if status != http.StatusOK || !bytes.HasSuffix(got, []byte("data: [DONE]\n\n")) {
		t.Fatalf("after the panic the router does not serve: %d %q", status, got)
	}
	waitReleasedFront(t, s)
}

func getPath(t *testing.T, url, path string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestHeaderLimit pins what the connection read buffer (readBufferBytes)
// does to headers: one that fits is served, one larger than the buffer is
// refused with 431 and its connection closed, and the router goes on
// serving.
func TestHeaderLimit(t *testing.T) {
	url, _, _ := servedFront(t, func(*Server) {})
	body := mockBody(1, 32, false)
	for _, tc := range []struct {
		name   string
		header int // bytes of one extra header's value
		status int
	}{
		{"fits", readBufferBytes - 1024, http.StatusOK},
		{"larger than the buffer", readBufferBytes + 256, http.StatusRequestHeaderFieldsTooLarge},
		{"small again", 16, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, got := postWith(t, url+PathRouteCompletions, body, map[string]string{"X-Padding": strings.Repeat("p", tc.header)})
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, got)
			}
			if status == http.StatusRequestHeaderFieldsTooLarge && !strings.Contains(string(got), `"header_too_large"`) {
				t.Fatalf("431 without its code: %s", got)
			}
		})
	}
}

// TestDateHeader: answers carry a Date, as RFC 9110 asks of a server with
// a clock (caches and clients read ages and skew from it).
func TestDateHeader(t *testing.T) {
	url, _, _ := servedFront(t, func(*Server) {})
	ctx, cancel := context.WithTimeout(context.Background(), serverWait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+PathRouteCompletions, bytes.NewReader(mockBody(1, 32, false)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	date, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		t.Fatalf("status %d, Date %q: %v", resp.StatusCode, resp.Header.Get("Date"), err)
	}
	if d := time.Since(date); d > time.Hour || d < -time.Hour {
		t.Fatalf("Date %v is %v from now", date, d)
	}
}
