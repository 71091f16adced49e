package mocker

import (
	"bufio"
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/internal/hangup"
	"github.com/kvfast/kvfast/internal/jsonscan"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/workers"
)

// maxLag bounds how far the engine may fall behind its schedule (a starved
// CPU, a long GC). Beyond it, simulated time is stretched rather than made
// up in a burst of back-to-back steps that would compress later latencies.
const maxLag = 50 * time.Millisecond

// Engine is one simulated engine: a Core driven in (scaled) real time by one
// goroutine, behind a fasthttp server speaking the OpenAI API.
type Engine struct {
	cfg       Config
	bearer    []byte // "Bearer " + cfg.APIKey
	core      *Core  // owned by the loop goroutine
	ownedPub  func() error
	zmq       *ZMQPublisher // nil unless Config.ZMQ.Listen is set
	ln        net.Listener
	srv       *fasthttp.Server
	serveDone chan struct{}
	serveErr  error
	// unused holds the connections that have not yet carried a request.
	// Shutdown counts such a connection as busy for its first five seconds
	// (fasthttp, like net/http), so a client's spare dial would otherwise
	// hold Close for that long.
	unused sync.Map // net.Conn → struct{}
	// hangups tells a non-streaming request that its client left, as
	// vLLM's server does, so that it is aborted rather than run to its
	// end; nil where connections cannot be watched.
	hangups *hangup.Watcher

	mu     sync.Mutex
	inbox  []engineOp
	spare  []engineOp
	closed bool

	wake     chan struct{} // cap 1: the inbox has work
	stop     chan struct{} // closed by Close: the loop exits
	loopDone chan struct{}
	closing  chan struct{} // closed after the loop exits: waiters give up

	statsMu sync.Mutex
	stats   Stats

	lastLoad  [4]uint64
	loadValid bool

	nextID    atomic.Uint64
	idTag     string
	modelJSON []byte
	closeOnce sync.Once
	closeErr  error

	transfers transfers // prompts kept for a remote decode (disagg.go)
	enc       encoder   // the encoder: its cache and timeline (encode.go)
}

type opKind uint8

const (
	opAdd opKind = iota
	opAbort
	opReset
	opReleaseKept
)

type engineOp struct {
	kind opKind
	r    *Request
	res  chan error
}

// Start validates cfg, listens on cfg.Listen and starts serving. Close
// stops it.
func Start(cfg Config) (*Engine, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("cannot listen on %s: %w", cfg.Listen, err)
	}
	pub := cfg.Publisher
	var ownedPub func() error
	if cfg.Segment != "" || cfg.SegmentHandle != nil {
		if pub != nil || (cfg.Segment != "" && cfg.SegmentHandle != nil) {
			ln.Close()
			return nil, errors.New("cannot start mock engine: set only one of Publisher, Segment and SegmentHandle")
		}
		sp, err := openSegmentPublisher(cfg, "http://"+ln.Addr().String())
		if err != nil {
			ln.Close()
			return nil, err
		}
		pub, ownedPub = sp, sp.Close
	}
	var zp *ZMQPublisher
	if cfg.ZMQ.Listen != "" {
		if pub != nil {
			ln.Close()
			closeOwned(ownedPub)
			return nil, errors.New("cannot start mock engine: set only one of Publisher, Segment, SegmentHandle and ZMQ")
		}
		zp, err = NewZMQPublisher(cfg.ZMQ, cfg.DPRank)
		if err != nil {
			ln.Close()
			return nil, fmt.Errorf("cannot start mock engine: %w", err)
		}
		pub, ownedPub = zp, zp.Close
	}
	core, err := NewCore(cfg, pub)
	if err != nil {
		ln.Close()
		closeOwned(ownedPub)
		return nil, err
	}
	e := &Engine{
		cfg:       cfg,
		bearer:    []byte("Bearer " + cfg.APIKey),
		core:      core,
		ownedPub:  ownedPub,
		zmq:       zp,
		ln:        ln,
		serveDone: make(chan struct{}),
		wake:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
		loopDone:  make(chan struct{}),
		closing:   make(chan struct{}),
		idTag:     "w" + strconv.FormatUint(cfg.WorkerID, 10) + "r" + strconv.FormatUint(uint64(cfg.DPRank), 10) + "-",
		modelJSON: jsonscan.AppendQuoted(nil, cfg.Model),
	}
	e.enc.capacity = cfg.EncoderCacheItems
	e.stats = core.Stats()
	e.srv = &fasthttp.Server{
		Handler:            e.handle,
		Name:               "kvfast-mock",
		MaxRequestBodySize: 64 << 20,
		// Bodies are JSON: a multipart one is not parsed into memory and
		// temporary files before the handler refuses it.
		DisablePreParseMultipartForm: true,
		ReadTimeout:                  60 * time.Second,
		IdleTimeout:                  120 * time.Second,
		CloseOnShutdown:              true,
		Logger:                       quietLogger{},
		ConnState:                    e.trackConn,
	}
	if w, err := hangup.New(); err == nil {
		e.hangups = w
	}
	go e.loop()
	go func() {
		if err := e.srv.Serve(ln); !errors.Is(err, net.ErrClosed) {
			e.serveErr = err
		}
		close(e.serveDone)
	}()
	return e, nil
}

func closeOwned(f func() error) {
	if f != nil {
		_ = f()
	}
}

// quietLogger drops fasthttp's per-connection errors, which here are
// clients hanging up mid-stream: routine for a load generator.
type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

// Addr is the address the engine listens on, "host:port".
func (e *Engine) Addr() string { return e.ln.Addr().String() }

// URL is the engine's base URL, "http://host:port".
func (e *Engine) URL() string { return "http://" + e.Addr() }

// ZMQEndpoint is the bound endpoint of the engine's KV-event PUB socket,
// tcp://host:port, or "" when it publishes none.
func (e *Engine) ZMQEndpoint() string {
	if e.zmq == nil {
		return ""
	}
	return e.zmq.Endpoint()
}

// ZMQReplayEndpoint is the bound endpoint of the engine's KV-event replay
// socket, or "" when it has none.
func (e *Engine) ZMQReplayEndpoint() string {
	if e.zmq == nil {
		return ""
	}
	return e.zmq.ReplayEndpoint()
}

// ZMQPublished is how many KV-event batches the engine has published on
// ZMQ (0 when it publishes none): a subscriber that applied batch
// ZMQPublished()-1 knows every change so far. A reply is delivered only
// after the step that finished it has published its events, so a test
// can wait for a router to catch up with an engine before it asks it.
func (e *Engine) ZMQPublished() uint64 {
	if e.zmq == nil {
		return 0
	}
	return e.zmq.Published()
}

// Config is the engine's configuration with defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// Stats is a snapshot of the engine's counters, at most one step old.
func (e *Engine) Stats() Stats {
	e.statsMu.Lock()
	defer e.statsMu.Unlock()
	return e.stats
}

// ResetPrefixCache drops every cached block (publishing Cleared), or fails
// with ErrCacheBusy while requests are running.
func (e *Engine) ResetPrefixCache() error {
	res := make(chan error, 1)
	if err := e.submit(engineOp{kind: opReset, res: res}); err != nil {
		return err
	}
	select {
	case err := <-res:
		return err
	case <-e.closing:
		return ErrClosed
	}
}

// Close stops the engine: the scheduler stops, requests in flight end
// (streams with an error event, others with 503), and the server shuts
// down. It is safe to call more than once.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		e.mu.Lock()
		e.closed = true
		e.mu.Unlock()
		close(e.stop)
		<-e.loopDone
		close(e.closing)
		e.unused.Range(func(c, _ any) bool { _ = c.(net.Conn).Close(); return true })
		// Longer than the five seconds a connection accepted after the
		// sweep may count as busy.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := e.srv.ShutdownWithContext(ctx)
		// A Serve goroutine that had not yet handed ln to fasthttp when
		// Shutdown ran would then accept forever: close ln ourselves.
		_ = e.ln.Close()
		<-e.serveDone
		e.hangups.Close() // after the handlers: their registrations are stopped
		if e.serveErr != nil && err == nil {
			err = e.serveErr
		}
		if e.ownedPub != nil {
			err = errors.Join(err, e.ownedPub())
		}
		if err != nil {
			e.closeErr = fmt.Errorf("cannot close mock engine %s: %w", e.Addr(), err)
		}
	})
	return e.closeErr
}

func (e *Engine) trackConn(c net.Conn, st fasthttp.ConnState) {
	switch st {
	case fasthttp.StateNew:
		e.unused.Store(c, struct{}{})
	case fasthttp.StateActive, fasthttp.StateClosed, fasthttp.StateHijacked:
		e.unused.Delete(c)
	}
}

func (e *Engine) submit(op engineOp) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	e.inbox = append(e.inbox, op)
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
	return nil
}

// drain applies queued operations to the core, in arrival order.
func (e *Engine) drain() {
	e.mu.Lock()
	ops := e.inbox
	e.inbox = e.spare[:0]
	e.mu.Unlock()
	for i, op := range ops {
		switch op.kind {
		case opAdd:
			if err := e.core.Add(op.r); err != nil {
				// Handlers validate before submitting; an error here means
				// the request was submitted twice.
				op.r.pubDone.Store(doneAborted)
				notify(op.r)
			}
		case opAbort:
			if e.core.Abort(op.r) {
				// Its handler may be waiting for it (a non-streaming
				// request whose client hung up): it ends now.
				op.r.pubDone.Store(doneAborted)
				notify(op.r)
			}
		case opReset:
			op.res <- e.core.ResetPrefixCache()
		case opReleaseKept:
			e.core.ReleaseKept(op.r)
		}
		ops[i] = engineOp{}
	}
	e.spare = ops[:0]
}

// loop is the engine's only goroutine touching the Core and the Publisher.
// It runs steps back to back while there is work, sleeping after each so
// that simulated time advances at Speedup times the wall clock, and hands
// each step's tokens to their requests when the step's time is up.
func (e *Engine) loop() {
	defer close(e.loopDone)
	var hb <-chan time.Time
	if e.cfg.HeartbeatInterval > 0 {
		t := time.NewTicker(e.cfg.HeartbeatInterval)
		defer t.Stop()
		hb = t.C
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()

	// A new engine owns an empty cache; say so, in case its slot held
	// another engine's blocks.
	e.core.ev.cleared()
	e.heartbeat()

	realtime := !math.IsInf(e.cfg.Speedup, 1)
	var anchorWall time.Time
	var anchorSim time.Duration
	busy := false
	for {
		e.drain()
		if e.core.Idle() {
			busy = false
			e.publishLoad(false)
			e.snapshotStats()
			select {
			case <-e.wake:
			case <-hb:
				e.heartbeat()
			case <-e.stop:
				return
			}
			continue
		}
		if !busy {
			anchorWall, anchorSim, busy = time.Now(), e.core.Now(), true
		}
		rep := e.core.Step()
		e.publishLoad(false)
		if realtime {
			due := anchorWall.Add(time.Duration(float64(e.core.Now()-anchorSim) / e.cfg.Speedup))
			if lag := time.Since(due); lag > maxLag {
				anchorWall = anchorWall.Add(lag)
				due = due.Add(lag)
			}
			for d := time.Until(due); d > 0; d = time.Until(due) {
				timer.Reset(d)
				select {
				case <-timer.C:
				case <-hb:
					e.heartbeat()
				case <-e.stop:
					timer.Stop()
					return
				}
			}
		} else {
			select {
			case <-hb:
				e.heartbeat()
			case <-e.stop:
				return
			default:
			}
		}
		// Stats first: a client that has its answer must find it in
		// Stats (a prefill's kept blocks were read as 0 under load, when
		// the answer beat the snapshot).
		e.snapshotStats()
		e.deliver(rep.Progressed)
	}
}

func (e *Engine) heartbeat() {
	e.core.ev.heartbeat()
	e.publishLoad(true)
}

// publishLoad sends Load when it changed, or always when forced (the
// periodic refresh).
func (e *Engine) publishLoad(force bool) {
	r, w, u, t := e.core.Load()
	cur := [4]uint64{r, w, u, t}
	if !force && e.loadValid && cur == e.lastLoad {
		return
	}
	e.lastLoad, e.loadValid = cur, true
	e.core.ev.load(r, w, u, t)
}

func (e *Engine) snapshotStats() {
	s := e.core.Stats()
	e.statsMu.Lock()
	e.stats = s
	e.statsMu.Unlock()
}

// deliver publishes each request's progress to the goroutine serving it.
// Produced is stored before done, so a reader that sees done sees the final
// count.
func (e *Engine) deliver(progressed []*Request) {
	for _, r := range progressed {
		r.pubCached.Store(int32(r.cached))
		r.pubProduced.Store(int32(len(r.tokens) - len(r.Prompt)))
		if r.state == stateFinished {
			r.pubDone.Store(doneFinished)
		}
		notify(r)
	}
}

func notify(r *Request) {
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

func (e *Engine) handle(ctx *fasthttp.RequestCtx) {
	if e.cfg.APIKey != "" && bytes.HasPrefix(ctx.Path(), []byte("/v1")) && !e.authorized(ctx) {
		ctx.SetStatusCode(fasthttp.StatusUnauthorized)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":"Unauthorized"}`)
		return
	}
	switch string(ctx.Path()) {
	case "/v1/completions":
		e.handleGenerate(ctx, false)
	case "/v1/chat/completions":
		e.handleGenerate(ctx, true)
	case "/v1/completions/render", "/v1/chat/completions/render":
		if e.cfg.DisableRender {
			// As a vLLM release without the endpoints answers: FastAPI's 404.
			ctx.SetStatusCode(fasthttp.StatusNotFound)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"detail":"Not Found"}`)
			return
		}
		e.handleRender(ctx, string(ctx.Path()) == "/v1/chat/completions/render")
	case "/tokenize":
		e.handleTokenize(ctx)
	case "/v1/models":
		if !e.method(ctx, fasthttp.MethodGet) {
			return
		}
		e.handleModels(ctx)
	case "/health":
		if !e.method(ctx, fasthttp.MethodGet) {
			return
		}
		ctx.SetStatusCode(fasthttp.StatusOK)
	case "/reset_prefix_cache":
		if !e.method(ctx, fasthttp.MethodPost) {
			return
		}
		if err := e.ResetPrefixCache(); err != nil {
			status := fasthttp.StatusConflict
			if errors.Is(err, ErrClosed) {
				status = fasthttp.StatusServiceUnavailable
			}
			writeError(ctx, &openai.Error{Status: status, Message: err.Error(), Type: openai.TypeServerError})
			return
		}
		ctx.SetStatusCode(fasthttp.StatusOK)
	case pathKVPull, pathBootstrapPull:
		if !e.method(ctx, fasthttp.MethodPost) {
			return
		}
		e.handlePull(ctx, string(ctx.Path()) == pathBootstrapPull)
	case "/mock/stats":
		if !e.method(ctx, fasthttp.MethodGet) {
			return
		}
		e.handleStats(ctx)
	default:
		writeError(ctx, &openai.Error{Status: fasthttp.StatusNotFound, Message: "no such endpoint: " + string(ctx.Path()), Type: openai.TypeInvalidRequest})
	}
}

// authorized reports whether the request carries the engine's API key,
// compared in constant time as vLLM compares it.
func (e *Engine) authorized(ctx *fasthttp.RequestCtx) bool {
	return subtle.ConstantTimeCompare(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization), e.bearer) == 1
}

func (e *Engine) method(ctx *fasthttp.RequestCtx, want string) bool {
	if string(ctx.Method()) == want {
		return true
	}
	ctx.Response.Header.Set("Allow", want)
	writeError(ctx, &openai.Error{Status: fasthttp.StatusMethodNotAllowed, Message: "method " + string(ctx.Method()) + " is not allowed; use " + want, Type: openai.TypeInvalidRequest})
	return false
}

func writeError(ctx *fasthttp.RequestCtx, e *openai.Error) {
	ctx.SetStatusCode(e.Status)
	ctx.SetContentType("application/json")
	ctx.SetBody(e.AppendJSON(nil))
}

// admit reads a completions (chat false) or chat body and checks it as the
// engine would before generating: its model, its length and max_tokens. It
// answers the client itself and returns ok false when the body is refused.
func (e *Engine) admit(ctx *fasthttp.RequestCtx, chat bool, req *apiRequest) (maxTokens int, ok bool) {
	if !e.method(ctx, fasthttp.MethodPost) {
		return 0, false
	}
	if err := parseRequest(ctx, ctx.PostBody(), chat, e.cfg.Renderer, req); err != nil {
		writeError(ctx, err)
		return 0, false
	}
	if !e.servesModel(ctx, req.model) {
		return 0, false
	}
	maxTokens = req.maxTokens
	if maxTokens < 0 {
		// Like vLLM, an unset limit never makes a prompt too long by itself.
		maxTokens = min(e.cfg.DefaultMaxTokens, e.cfg.MaxModelLen-len(req.tokens))
	}
	if err := e.cfg.validateRequest(len(req.tokens), maxTokens); err != nil {
		param := "max_tokens"
		if req.maxTokens < 0 {
			param = "prompt"
		}
		writeError(ctx, badRequest(param, "%v", err))
		return 0, false
	}
	return maxTokens, true
}

// servesModel refuses, with vLLM's 404, a request naming another model.
func (e *Engine) servesModel(ctx *fasthttp.RequestCtx, model string) bool {
	if model != "" && model != e.cfg.Model && !slices.Contains(e.cfg.LoRAAdapters, model) {
		writeError(ctx, &openai.Error{Status: fasthttp.StatusNotFound, Message: "The model `" + model + "` does not exist.", Type: "NotFoundError", Param: "model", Code: "model_not_found"})
		return false
	}
	return true
}

func (e *Engine) handleGenerate(ctx *fasthttp.RequestCtx, chat bool) {
	if e.cfg.Role == workers.RoleEncode {
		e.handleEncode(ctx, chat)
		return
	}
	var req apiRequest
	maxTokens, ok := e.admit(ctx, chat, &req)
	if !ok {
		return
	}
	r := &Request{Prompt: req.tokens, MaxTokens: maxTokens, CacheSalt: req.cacheSalt, MM: req.mm, notify: make(chan struct{}, 1)}
	if req.model != "" && req.model != e.cfg.Model {
		r.LoRA = req.model // servesModel let it through: an adapter
	}
	if oerr := e.prepareDisagg(&req, r); oerr != nil {
		writeError(ctx, oerr)
		return
	}
	if err := e.encodeLocally(&req); err != nil {
		writeError(ctx, &openai.Error{Status: fasthttp.StatusServiceUnavailable, Message: err.Error(), Type: openai.TypeServerError})
		return
	}
	if err := e.submit(engineOp{kind: opAdd, r: r}); err != nil {
		writeError(ctx, &openai.Error{Status: fasthttp.StatusServiceUnavailable, Message: err.Error(), Type: openai.TypeServerError})
		return
	}
	h := &respHead{created: time.Now().Unix(), model: e.modelJSON, chat: chat}
	if r.LoRA != "" {
		// vLLM answers with the adapter's name (OpenAIServingModels.model_name).
		h.model = jsonscan.AppendQuoted(nil, r.LoRA)
	}
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	h.id = prefix + e.idTag + strconv.FormatUint(e.nextID.Add(1), 10)

	if !req.stream {
		if e.hangups != nil {
			if reg, err := e.hangups.Watch(ctx.Conn(), abortOnHangUp{e, r}); err == nil {
				defer reg.Stop()
			}
		}
		for r.pubDone.Load() == 0 {
			select {
			case <-r.notify:
			case <-e.closing:
				if r.pubDone.Load() == 0 {
					writeError(ctx, &openai.Error{Status: fasthttp.StatusServiceUnavailable, Message: ErrClosed.Error(), Type: openai.TypeServerError})
					return
				}
			}
		}
		if r.pubDone.Load() != doneFinished {
			writeError(ctx, &openai.Error{Status: fasthttp.StatusServiceUnavailable, Message: "request aborted by the engine", Type: openai.TypeServerError})
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBody(e.finishDisagg(&req, r, h.id, h.appendFull(nil, r.outSeed, len(r.Prompt), r.MaxTokens, int(r.pubCached.Load()), "length")))
		return
	}
	ctx.SetContentType("text/event-stream")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	opt := streamOptions{includeUsage: req.includeUsage, continuousUsage: req.continuousUsage}
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) { e.stream(w, r, h, opt) })
}

// abortOnHangUp aborts a non-streaming request whose client left.
type abortOnHangUp struct {
	e *Engine
	r *Request
}

func (a abortOnHangUp) HangUp() { _ = a.e.submit(engineOp{kind: opAbort, r: a.r}) }

type streamOptions struct{ includeUsage, continuousUsage bool }

// stream writes a request's tokens as SSE events as the loop delivers them,
// one flush per step. A failed flush means the client went away: the
// request is aborted so that it frees its blocks.
func (e *Engine) stream(w *bufio.Writer, r *Request, h *respHead, opt streamOptions) {
	buf := make([]byte, 0, 1024)
	promptLen := len(r.Prompt)
	sent := 0
	for {
		closing := false
		select {
		case <-r.notify:
		case <-e.closing:
			closing = true
		}
		done := r.pubDone.Load()
		produced := int(r.pubProduced.Load())
		cached := int(r.pubCached.Load())
		for ; sent < produced; sent++ {
			finish := ""
			if sent == r.MaxTokens-1 {
				finish = "length"
			}
			buf = h.appendChunk(buf[:0], r.outSeed, sent, finish, opt.continuousUsage, promptLen, cached)
			_, _ = w.Write(buf)
		}
		if done == doneFinished {
			if opt.includeUsage {
				buf = h.appendUsageChunk(buf[:0], promptLen, produced, cached)
				_, _ = w.Write(buf)
			}
			_, _ = w.WriteString(sseDone)
			_ = w.Flush()
			return
		}
		if done == doneAborted || closing {
			buf = append(buf[:0], "data: "...)
			buf = (&openai.Error{Status: fasthttp.StatusServiceUnavailable, Message: "request aborted: " + ErrClosed.Error(), Type: openai.TypeServerError}).AppendJSON(buf)
			buf = append(buf, "\n\n"...)
			_, _ = w.Write(buf)
			_, _ = w.WriteString(sseDone)
			_ = w.Flush()
			return
		}
		if err := w.Flush(); err != nil {
			_ = e.submit(engineOp{kind: opAbort, r: r})
			return
		}
	}
}

func (e *Engine) handleModels(ctx *fasthttp.RequestCtx) {
	b := append([]byte(nil), `{"object":"list","data":[{"id":`...)
	b = append(b, e.modelJSON...)
	b = append(b, `,"object":"model","created":`...)
	b = strconv.AppendInt(b, time.Now().Unix(), 10)
	b = append(b, `,"owned_by":"`+openai.OwnedByMock+`","root":`...)
	b = append(b, e.modelJSON...)
	b = append(b, `,"parent":null,"max_model_len":`...)
	b = strconv.AppendInt(b, int64(e.cfg.MaxModelLen), 10)
	b = append(b, `,"permission":[]}`...)
	// LoRA adapters as vLLM lists them (vllm/entrypoints/openai/
	// serving_models.py, show_available_models): root the adapter's path,
	// parent the base model.
	for _, a := range e.cfg.LoRAAdapters {
		b = append(b, `,{"id":`...)
		b = jsonscan.AppendQuoted(b, a)
		b = append(b, `,"object":"model","created":`...)
		b = strconv.AppendInt(b, time.Now().Unix(), 10)
		b = append(b, `,"owned_by":"`+openai.OwnedByMock+`","root":`...)
		b = jsonscan.AppendQuoted(b, "/adapters/"+a)
		b = append(b, `,"parent":`...)
		b = append(b, e.modelJSON...)
		b = append(b, `,"max_model_len":null,"permission":[]}`...)
	}
	b = append(b, `]}`...)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// statsView is Stats with the engine's identity and a few derived values,
// for GET /mock/stats.
type statsView struct {
	Stats
	Model                string      `json:"model"`
	WorkerID             uint64      `json:"worker_id"`
	DPRank               uint32      `json:"dp_rank"`
	BlockSize            int         `json:"block_size"`
	Speedup              float64     `json:"speedup"` // 0 for +Inf
	PrefixHitRate        float64     `json:"prefix_hit_rate"`
	SimulatedTimeSeconds float64     `json:"simulated_time_seconds"`
	Encode               EncodeStats `json:"encode"`
}

func (e *Engine) handleStats(ctx *fasthttp.RequestCtx) {
	s := e.Stats()
	v := statsView{
		Stats: s, Model: e.cfg.Model, WorkerID: e.cfg.WorkerID, DPRank: e.cfg.DPRank,
		BlockSize: e.cfg.BlockSize, PrefixHitRate: s.PrefixHitRate(),
		SimulatedTimeSeconds: s.SimulatedTime.Seconds(), Encode: e.EncodeStats(),
	}
	if !math.IsInf(e.cfg.Speedup, 0) {
		v.Speedup = e.cfg.Speedup
	}
	b, err := json.Marshal(v)
	if err != nil {
		writeError(ctx, &openai.Error{Status: fasthttp.StatusInternalServerError, Message: err.Error(), Type: openai.TypeServerError})
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}
