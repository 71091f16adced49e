package prompt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/internal/clock"
	"github.com/kvfast/kvfast/internal/redact"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/workers"
)

// RemoteConfig bounds a Remote's calls.
type RemoteConfig struct {
	Timeout          time.Duration // one round trip, connecting included
	MaxResponseBytes int
	// MaxTokenID is the largest id accepted from the engine, normally the
	// vocabulary size minus one; 0 means any uint32.
	MaxTokenID uint32
	// EngineToken, when not empty, goes with every call as Authorization:
	// Bearer EngineToken, for engines started with an API key (vLLM keeps
	// its render endpoints, under /v1, behind it; SGLang everything but
	// /health).
	EngineToken string
}

// Remote renders a model's prompts by asking an engine that serves it:
// the render endpoint where the engine has one, else /tokenize (see
// wire.go for the shapes and their sources).
type Remote struct {
	model   string
	engines Engines
	cfg     RemoteConfig
	parser  openai.Parser // validates the ids an engine returns

	states   [workers.Max]atomic.Pointer[engineState]
	calls    sync.Pool
	inFlight atomic.Int64 // calls under way, at most maxInFlight
	outcomes outcomeCounters
	lastErr  atomic.Pointer[Failure] // for status

	authorization []byte // "Bearer " + cfg.EngineToken; nil without one
}

// bearer returns an Authorization header's value for token, nil for none.
func bearer(token string) []byte {
	if token == "" {
		return nil
	}
	return []byte("Bearer " + token)
}

// renderBudgetBytes bounds the answers one model's renderer may hold at
// once: each call may hold up to RemoteConfig.MaxResponseBytes, and
// nothing else bounds how many run at once (one per text or chat request
// in flight), so without it a sick engine answering every render with
// megabytes would take the router's memory with it.
const renderBudgetBytes = 256 << 20

// maxInFlight is how many calls may be under way at once: as many as the
// budget holds at the largest answer, and at least 8.
func (rm *Remote) maxInFlight() int64 {
	return max(8, renderBudgetBytes/int64(max(rm.cfg.MaxResponseBytes, 1)))
}

// NewRemote returns the remote renderer of model, which asks the engines
// picks.
func NewRemote(model string, engines Engines, cfg RemoteConfig) *Remote {
	rm := &Remote{model: model, engines: engines, cfg: cfg, authorization: bearer(cfg.EngineToken),
		parser: openai.Parser{MaxBodyBytes: max(cfg.MaxResponseBytes, 1), MaxTokenID: cfg.MaxTokenID}}
	rm.calls.New = func() any { return new(remoteCall) }
	return rm
}

// Endpoint support, per engine and API, learned from the engine's first
// answer.
const (
	probeUnknown  int32 = iota
	probeRender         // the render endpoint answers
	probeTokenize       // it does not: use /tokenize
)

// engineState is what a Remote keeps per engine: its connections and which
// endpoint it answers for completions (index 0) and chat (index 1).
type engineState struct {
	addr     string
	client   *fasthttp.HostClient
	endpoint [2]atomic.Int32
	// failures counts the calls in a row that timed out or failed on the
	// engine's side; from the second on, the engine is not asked again
	// until backoffUntil (clock.Now nanoseconds), a wait that doubles with
	// each further failure up to maxBackoff.
	failures     atomic.Int32
	backoffUntil atomic.Int64
}

// Backoff of an engine whose render calls keep failing.
const (
	minBackoff = time.Second
	maxBackoff = time.Minute
)

// failed records a call to st that timed out or failed on the engine's
// side.
func (st *engineState) failed() {
	n := st.failures.Add(1)
	if n < 2 {
		return // one failure may be a blip
	}
	wait := min(minBackoff<<min(n-2, 6), maxBackoff)
	st.backoffUntil.Store(clock.Now() + int64(wait))
}

// answered records a call st answered, whatever it said.
func (st *engineState) answered() {
	if st.failures.Load() != 0 {
		st.failures.Store(0)
	}
}

// remoteCall is one call's buffers, pooled.
type remoteCall struct {
	req    fasthttp.Request
	resp   fasthttp.Response
	body   []byte               // a /tokenize body
	parsed openai.ParsedRequest // decodes the returned ids
}

// maxPooledBody keeps one huge prompt from pinning its buffer in the pool.
const maxPooledBody = 1 << 20

// Tokens asks an engine serving the model for r's prompt ids. See Renderer.
func (rm *Remote) Tokens(ctx context.Context, dst []uint32, api openai.API, body []byte, r *openai.ParsedRequest) ([]uint32, error) {
	return rm.TokensMultimodal(ctx, dst, nil, api, body, r)
}

// TokensMultimodal asks an engine serving the model for r's prompt ids
// and, from the render endpoint, its multimodal inputs. See
// MultimodalRenderer.
func (rm *Remote) TokensMultimodal(ctx context.Context, dst []uint32, mm *Multimodal, api openai.API, body []byte, r *openai.ParsedRequest) ([]uint32, error) {
	if mm != nil {
		mm.Reset()
	}
	out, err := rm.tokens(ctx, dst, mm, api, body, r)
	rm.outcomes.count(err)
	return out, err
}

func (rm *Remote) tokens(ctx context.Context, dst []uint32, mm *Multimodal, api openai.API, body []byte, r *openai.ParsedRequest) ([]uint32, error) {
	if r.Prompt != openai.PromptText && r.Prompt != openai.PromptMessages {
		return dst, ErrNotRendered
	}
	if err := ctx.Err(); err != nil {
		return dst, err
	}
	deadline := time.Now().Add(rm.cfg.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	slot, addr, ok := rm.engines.PickEngine(rm.model, r.Model)
	if !ok {
		return dst, ErrNoEngine
	}
	st := rm.engine(slot, addr)
	if until := st.backoffUntil.Load(); until != 0 && clock.Now() < until {
		return dst, ErrBackoff
	}
	if rm.inFlight.Add(1) > rm.maxInFlight() {
		rm.inFlight.Add(-1)
		return dst, ErrBusy
	}
	defer rm.inFlight.Add(-1)
	c := rm.calls.Get().(*remoteCall)
	defer rm.release(c)
	api01 := 0
	if api == openai.APIChatCompletions {
		api01 = 1
	}
	useRender := st.endpoint[api01].Load() != probeTokenize
	for {
		req := &c.req
		req.Header.SetMethod(fasthttp.MethodPost)
		req.Header.SetHost(st.addr)
		req.Header.SetContentType("application/json")
		if rm.authorization != nil {
			req.Header.SetBytesV(fasthttp.HeaderAuthorization, rm.authorization)
		}
		shape, key := shapeObject, "tokens"
		switch {
		case useRender && api01 == 1:
			req.SetRequestURI(pathRenderChat)
			req.SetBodyRaw(body)
			key = "token_ids"
		case useRender:
			req.SetRequestURI(pathRenderCompletions)
			req.SetBodyRaw(body)
			shape, key = shapeList, "token_ids"
		default:
			req.SetRequestURI(pathTokenize)
			c.body = appendTokenizeBody(c.body[:0], body, api, r)
			req.SetBodyRaw(c.body)
		}
		err := st.client.DoDeadline(req, &c.resp, deadline)
		if err != nil {
			kind := ErrEngine
			switch {
			case isTimeout(err):
				kind = ErrTimeout
			case errors.Is(err, fasthttp.ErrBodyTooLarge):
				kind = ErrBadResponse
			}
			if kind != ErrBadResponse {
				st.failed()
			}
			return dst, rm.fail(kind, c, st, redact.AnswerError(err))
		}
		status := c.resp.StatusCode()
		if status >= 500 && !routeMissing(status, c.resp.Body()) {
			st.failed()
		} else {
			st.answered()
		}
		if routeMissing(status, c.resp.Body()) {
			if useRender {
				// An engine without the render endpoint (vLLM before it,
				// SGLang): remember, and ask /tokenize within the same
				// deadline.
				st.endpoint[api01].Store(probeTokenize)
				useRender = false
				c.resp.Reset()
				continue
			}
			return dst, rm.fail(ErrUnsupported, c, st, nil)
		}
		switch {
		case status >= 500:
			return dst, rm.fail(ErrEngine, c, st, nil)
		case status != fasthttp.StatusOK:
			return dst, rm.fail(ErrRejected, c, st, nil)
		}
		if useRender {
			st.endpoint[api01].CompareAndSwap(probeUnknown, probeRender)
		}
		other := ""
		if useRender && mm != nil {
			other = "features"
		}
		raw, features, ok := topValues(c.resp.Body(), shape, key, other)
		if !ok {
			return dst, rm.fail(ErrBadResponse, c, st, errors.New("no token-id array where the endpoint puts it"))
		}
		// Decode after what dst holds, into its spare capacity.
		c.parsed.Tokens = dst[len(dst):]
		perr := rm.parser.ParsePrompt(raw, &c.parsed)
		ids := c.parsed.Tokens
		c.parsed.Tokens = nil // the caller's buffer: never pooled here
		if perr == nil && c.parsed.Prompt != openai.PromptTokens {
			perr = errors.New("the ids are not an array of integers")
		}
		if perr != nil {
			return dst, rm.fail(ErrBadResponse, c, st, perr)
		}
		if features != nil {
			if ferr := mm.parseFeatures(features, len(ids)); ferr != nil {
				return dst, rm.fail(ErrBadResponse, c, st, ferr)
			}
		}
		if limit := maxRenderedTokens(len(body), mm, r.Messages); len(ids) > limit {
			// Every id is booked as prefill on the worker chosen: an
			// engine answering with millions of ids for a short prompt
			// would fill every worker's queue with prefill nobody asked for.
			return dst, rm.fail(ErrBadResponse, c, st, fmt.Errorf("%d ids for a %d-byte request, more than the %d it could render to", len(ids), len(body), limit))
		}
		if len(ids) <= cap(dst)-len(dst) {
			return dst[:len(dst)+len(ids)], nil // decoded in place
		}
		return append(dst, ids...), nil
	}
}

// Bounds on the ids a render may return for a request of a given size:
// a tokenizer makes at most a token or so per byte of text, a chat
// template adds its own text (renderOverheadTokens is far more than any
// ships), and a media item stands for placeholder tokens: counted from
// the features when the engine reports them, and otherwise allowed
// renderMediaTokens for each mention of a media part in the messages
// (Qwen2.5-VL's largest image is 16,384 placeholders; a part names its
// type twice, so each gets twice that).
const (
	renderTokensPerByte  = 4
	renderOverheadTokens = 64 << 10
	renderMediaTokens    = 16 << 10
)

var mediaParts = [...][]byte{[]byte(`"image_url"`), []byte(`"video_url"`), []byte(`"audio_url"`), []byte(`"input_audio"`)}

// maxRenderedTokens is the most ids a render of a body of bodyBytes may
// return, mm holding the multimodal inputs it reported (nil or empty for
// none) and messages the chat request's messages (nil for a completion).
func maxRenderedTokens(bodyBytes int, mm *Multimodal, messages []byte) int {
	n := renderTokensPerByte*bodyBytes + renderOverheadTokens
	if mm != nil && len(mm.Items) > 0 {
		for _, it := range mm.Items {
			n += it.Length
		}
		return n
	}
	for _, part := range mediaParts {
		n += renderMediaTokens * bytes.Count(messages, part)
	}
	return n
}

// routeMissing reports whether an answer means the engine has no such
// endpoint: 404 from the web framework (FastAPI's {"detail":"Not Found"},
// not an OpenAI error body, which a 404 for an unknown model carries), 405,
// or 501 (vLLM's answer when the model cannot render).
func routeMissing(status int, body []byte) bool {
	switch status {
	case fasthttp.StatusMethodNotAllowed, fasthttp.StatusNotImplemented:
		return true
	case fasthttp.StatusNotFound:
		_, isError := tokenArray(body, shapeObject, "error")
		_, isVLLMError := tokenArray(body, shapeObject, "object") // vLLM's older {"object":"error",...}
		return !isError && !isVLLMError
	}
	return false
}

// engine returns the state of the engine at addr in slot, replacing what a
// slot's earlier engine left.
func (rm *Remote) engine(slot workers.Slot, addr string) *engineState {
	p := &rm.states[slot&(workers.Max-1)]
	if st := p.Load(); st != nil && st.addr == addr {
		return st
	}
	st := &engineState{addr: addr, client: &fasthttp.HostClient{
		Addr:                          addr,
		MaxResponseBodySize:           rm.cfg.MaxResponseBytes,
		MaxIdleConnDuration:           3 * time.Second, // under the engines' 5s keep-alive, as dispatch does
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: true,
		DisablePathNormalizing:        true,
		SecureErrorLogMessage:         true, // no engine bytes in the errors /admin/workers shows
		RetryIfErr:                    retryStaleConn,
		DialDualStack:                 true, // fasthttp's default dials IPv4 only: an engine at [::1] was unreachable
	}}
	for {
		old := p.Load()
		if old != nil && old.addr == addr {
			return old
		}
		if p.CompareAndSwap(old, st) {
			if old != nil {
				old.client.CloseIdleConnections()
			}
			return st
		}
	}
}

// closeIdle closes the idle connections to every engine asked so far.
func (rm *Remote) closeIdle() {
	for i := range rm.states {
		if st := rm.states[i].Load(); st != nil {
			st.client.CloseIdleConnections()
		}
	}
}

// retryStaleConn sends a render again, once, when the pooled connection
// closed before any answer: the engine closed it while idle and never saw
// the request. Rendering has no side effect, so the retry is always safe.
func retryStaleConn(_ *fasthttp.Request, attempts int, err error) (resetTimeout, retry bool) {
	stale := errors.Is(err, io.EOF) || errors.Is(err, fasthttp.ErrConnectionClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
	return false, attempts == 1 && stale
}

// Failure is a failed call: its kind (ErrTimeout, ErrEngine, ...), which
// errors.Is matches, and what happened, for operators (the status page's
// last_error, kvfast tokenize's message).
type Failure struct {
	Kind   error
	Detail string
	// Status is the engine's HTTP status, 0 when it did not answer: a
	// caller's advice depends on it (401 and 403 ask for a key, 404 for
	// another model).
	Status int
}

func (f *Failure) Error() string { return f.Kind.Error() + ": " + f.Detail }
func (f *Failure) Unwrap() error { return f.Kind }

// fail builds the Failure of a call to st that ended in kind, from cause
// or, without one, from the engine's answer, and remembers it. Failures
// allocate; the path that renders does not.
func (rm *Remote) fail(kind error, c *remoteCall, st *engineState, cause error) error {
	detail := "POST " + st.addr + string(c.req.URI().PathOriginal())
	status := 0
	if cause != nil {
		detail += ": " + cause.Error()
	} else {
		status = c.resp.StatusCode()
		body := c.resp.Body()
		if len(body) > 300 {
			body = body[:300]
		}
		detail += ": status " + strconv.Itoa(c.resp.StatusCode()) + ": " + string(body)
	}
	f := &Failure{Kind: kind, Detail: detail, Status: status}
	rm.lastErr.Store(f)
	return f
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, fasthttp.ErrDialTimeout) ||
		errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

func (rm *Remote) release(c *remoteCall) {
	c.req.Reset()
	c.resp.Reset()
	if cap(c.body) > maxPooledBody {
		c.body = nil
	}
	c.parsed.Recycle()
	rm.calls.Put(c)
}

// RemoteStatus is a Remote's view for operators.
type RemoteStatus struct {
	Engines   []EngineStatus `json:"engines"`
	LastError string         `json:"last_error,omitempty"`
}

// EngineStatus says which endpoint an engine answers, per API: "render",
// "tokenize", or "unknown" until the first call.
type EngineStatus struct {
	Addr        string `json:"addr"`
	Completions string `json:"completions"`
	Chat        string `json:"chat"`
}

func (rm *Remote) status() RemoteStatus {
	var s RemoteStatus
	names := [...]string{probeUnknown: "unknown", probeRender: "render", probeTokenize: "tokenize"}
	for i := range rm.states {
		if st := rm.states[i].Load(); st != nil {
			s.Engines = append(s.Engines, EngineStatus{Addr: st.addr,
				Completions: names[int(st.endpoint[0].Load())], Chat: names[int(st.endpoint[1].Load())]})
		}
	}
	if last := rm.lastErr.Load(); last != nil {
		s.LastError = last.Error()
	}
	return s
}

// FixedEngine is an Engines that always names one engine: kvfast tokenize
// asks the engine at a URL.
type FixedEngine string

// PickEngine returns the engine, in slot 0.
func (e FixedEngine) PickEngine(string, []byte) (workers.Slot, string, bool) {
	return 0, string(e), true
}

// engineAddr reads an engine URL, http://host:port (a path is ignored),
// into host:port. A URL with credentials or a query is not one: they
// would be dropped unsaid.
func engineAddr(v string) (string, bool) {
	u, err := url.Parse(v)
	if err != nil || u.Scheme != "http" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.ForceQuery {
		return "", false
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "80")
	}
	return host, true
}
