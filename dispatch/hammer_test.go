package dispatch

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvfast/kvfast/internal/testnet"
	"github.com/kvfast/kvfast/workers"
	"github.com/valyala/fasthttp"
)

// TestHammerExactlyOneTerminal runs concurrent requests that complete, lose
// their client, lose their engine, or fail to connect and retry, and checks
// the invariant the guard relies on: every observer gets exactly one
// terminal call (the recorder panics on a second), and every engine
// connection is given back.
func TestHammerExactlyOneTerminal(t *testing.T) {
	clients, perClient := 8, 40
	if testing.Short() {
		perClient = 10
	}
	stream := vllmStream(30)
	engine := serve(t, func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/plain":
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"choices":[{"finish_reason":"stop"}]}`)
		case "/die":
			ctx.HijackSetNoResponse(true)
			ctx.Hijack(func(c net.Conn) {
				ev := chunk(0, "a", "")
				_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
					strconv.FormatInt(int64(len(ev)), 16) + "\r\n" + ev + "\r\n"))
				_ = c.Close()
			})
		default:
			sseEngine(stream, 200*time.Microsecond, nil)(ctx)
		}
	}, nil)
	pool := NewPool(Config{Health: noHealth})
	defer pool.Close()
	mustAdd(t, pool, 0, engine)
	mustAdd(t, pool, 1, testnet.RefusingAddr(t))

	var mu sync.Mutex
	var recs []*recorder
	track := func() Observer {
		r := newRecorder()
		mu.Lock()
		recs = append(recs, r)
		mu.Unlock()
		return r
	}
	// The front tries the dead slot first, then retries on the live one.
	router := serve(t, func(ctx *fasthttp.RequestCtx) {
		call := pool.AcquireCall()
		call.SetRequest(ctx.RequestURI(), ctx.PostBody())
		slot := workers.Slot(0)
		if ctx.Request.Header.Peek("X-Dead-First") != nil {
			slot = 1
		}
		for {
			err := call.Do(slot, track())
			if err == nil {
				break
			}
			if !IsRetryable(err) || slot == 0 {
				call.Release()
				ctx.SetStatusCode(ErrorStatus(err))
				return
			}
			slot = 0
		}
		call.CopyHeaders(&ctx.Response.Header)
		if call.IsEventStream() {
			ctx.SetBodyStreamWriter(call.StreamWriter())
			return
		}
		body, err := call.ReadBody()
		if err == nil {
			ctx.SetBody(body)
		}
		call.Release()
	}, nil)

	var wg sync.WaitGroup
	errs := make(chan error, clients*perClient)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 1))
			for range perClient {
				if err := hammerOne(router, rng.IntN(5)); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, r := range recs {
		select {
		case <-r.terminal:
		case <-time.After(10 * time.Second):
			t.Fatalf("observer %d of %d never ended: %s", i, len(recs), r.summary())
		}
	}
	// A connection not given back stays busy: neither idle in the pool nor
	// closed.
	client := pool.Engine(0).client
	busy := func() int { return client.ConnsCount() - client.IdleConnsCount() }
	deadline := time.Now().Add(10 * time.Second)
	for busy() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d engine connections still busy", busy())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// hammerOne makes one request of the given kind: 0 a full stream, 1 a
// client that leaves mid-stream, 2 an engine that dies, 3 a plain
// response, 4 a stream that first hits a dead engine.
func hammerOne(addr string, kind int) error {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	path, extra := "/v1/completions", ""
	switch kind {
	case 2:
		path = "/die"
	case 3:
		path = "/plain"
	case 4:
		extra = "X-Dead-First: 1\r\n"
	}
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: kvfast\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		path, extra, len(completionBody), completionBody)
	br := bufio.NewReader(conn)
	var all strings.Builder
	for {
		line, err := br.ReadString('\n')
		all.WriteString(line)
		if kind == 1 && strings.HasPrefix(line, "data: ") {
			return nil // leave mid-stream
		}
		if err != nil {
			break
		}
	}
	got := all.String()
	switch kind {
	case 0, 4:
		if !strings.Contains(got, "data: [DONE]") {
			return fmt.Errorf("kind %d: incomplete stream %q", kind, got)
		}
	case 2:
		if !strings.Contains(got, `"code":"engine_failed"`) {
			return fmt.Errorf("kind 2: no error event in %q", got)
		}
	case 3:
		if !strings.Contains(got, `"finish_reason":"stop"`) {
			return fmt.Errorf("kind 3: %q", got)
		}
	}
	return nil
}
