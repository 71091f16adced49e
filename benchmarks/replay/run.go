package replay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/kvfast/kvfast/internal/redact"
)

const (
	// DefaultRouterURL is where `kvfast serve` listens by default.
	DefaultRouterURL = "http://127.0.0.1:8000"
	// DefaultModel is the model name sent when Config.Model is empty.
	DefaultModel = "mock"
	// DefaultMaxInFlight caps open requests in timestamp mode, so that a
	// router that stops answering costs file descriptors, not the machine.
	// It is kvfast serve's default --max-conns-per-ip: each request in
	// flight holds a connection from this one address, and a burst past
	// the router's bound would be refused 429 by the router's edge.
	DefaultMaxInFlight = 256
	// WorkerHeader is the response header in which the router may name the
	// worker that served a request.
	WorkerHeader = "x-kvfast-worker"
)

// Replay modes, as reported in Result.Mode.
const (
	ModeTimestamps  = "timestamps"  // open loop: requests leave at trace time / Speedup
	ModeConcurrency = "concurrency" // closed loop: Concurrency requests always in flight
)

// ErrBadConfig is wrapped by every error Run returns for a Config it cannot use.
var ErrBadConfig = errors.New("kvfast: bad replay config")

// Config describes one replay.
type Config struct {
	// RouterURL is the router's base URL (DefaultRouterURL if empty); the
	// workload's endpoint, /v1/completions or /v1/chat/completions, is
	// appended unless the path already ends with it, without a second /v1
	// when the base URL ends in one (as the OpenAI clients take it).
	RouterURL string
	// Trace is the workload. Required.
	Trace *Trace
	// MaxRequests replays only the first MaxRequests records; 0 means all.
	MaxRequests int
	// Speedup divides trace time in timestamp mode: 10 replays ten seconds
	// of trace per second. 0 means 1.
	Speedup float64
	// Concurrency > 0 selects closed-loop mode: that many requests are kept
	// in flight regardless of timestamps. 0 replays timestamps.
	Concurrency int
	// MaxInFlight caps concurrent requests in timestamp mode; when reached,
	// sending waits and the wait shows up as send lag. 0 means
	// DefaultMaxInFlight.
	MaxInFlight int
	// Workload is what each record becomes: WorkloadTokens (the default
	// when empty), WorkloadChat or WorkloadMultimodal (Chat with
	// Chat.Images, or the default images when nil).
	Workload string
	// Tokens synthesises the token workload's prompts, Chat the chat
	// workload's conversations. Their TraceBlockSize is taken from Trace.
	Tokens TokenSynth
	Chat   ChatSynth
	// MaxOutputTokens caps max_tokens (the trace's output_length); 0 = no cap.
	MaxOutputTokens int
	// PooledCapacityBlocks, when positive, adds the pooled-LRU reference
	// to the result: one LRU cache of that many KV blocks of
	// EngineBlockSize tokens (all engines' capacity together) fed the same
	// prompts. The token workload only: chat prompts are the engines'
	// tokens, which the trace does not know.
	PooledCapacityBlocks int
	EngineBlockSize      int
	// MaxBodyBytes is the largest request body to send, the router's
	// --max-body-bytes; 0 means DefaultMaxBodyBytes. Run refuses a trace
	// with a larger request before sending anything.
	MaxBodyBytes int
	// Model is sent in every request; DefaultModel if empty.
	Model string
	// APIKey, when set, is sent in every request as Authorization: Bearer
	// APIKey, for a router started with --api-key-file.
	APIKey string
	// Timeout bounds one request from send to the end of its stream;
	// 0 means no bound beyond ctx.
	Timeout time.Duration
	// Client sends the requests. nil uses a pooled client that bypasses
	// proxies and keeps one idle connection per possible in-flight request.
	Client *http.Client
	// Progress, when set, receives a progress bar (normally os.Stderr when
	// it is a terminal).
	Progress io.Writer
	// ProgressLabel prefixes the progress bar, e.g. the policy name.
	ProgressLabel string
}

// Result is everything one replay measured. Requests are in trace order.
type Result struct {
	Source      string  `json:"source"`
	Workload    string  `json:"workload"`
	Mode        string  `json:"mode"`
	Speedup     float64 `json:"speedup,omitempty"`
	Concurrency int     `json:"concurrency,omitempty"`
	// BlockTokens is the tokens sent per hash id; for the chat workload,
	// the words, which are about as many tokens.
	BlockTokens int           `json:"block_tokens"`
	Started     time.Time     `json:"started"`
	Duration    time.Duration `json:"duration_ns"` // first send to last completion
	// Bound is the infinite-cache bound of the replayed records, with the
	// prompt sizes actually sent.
	Bound Bound `json:"bound"`
	// PooledLRU is the pooled-LRU reference (Config.PooledCapacityBlocks),
	// nil when not asked for.
	PooledLRU *PooledLRU      `json:"pooled_lru,omitempty"`
	Requests  []RequestResult `json:"requests"`
	// Gaps holds every inter-chunk gap of every successful request (ITL).
	Gaps []time.Duration `json:"-"`
}

// RequestResult is one request's outcome. Durations are offsets from
// Result.Started (Scheduled, Sent) or from Sent (TTFT, Latency).
type RequestResult struct {
	Index     int  `json:"index"` // in the replayed trace
	Line      int  `json:"line"`  // in the trace file
	Attempted bool `json:"attempted"`
	// Interrupted: sent, then cut short by the run's end (an interrupt),
	// so neither a success nor the router's failure.
	Interrupted bool          `json:"interrupted,omitempty"`
	Scheduled   time.Duration `json:"scheduled_ns"`
	// Sent - Scheduled is the client's own lag; it should stay near zero.
	Sent    time.Duration `json:"sent_ns"`
	TTFT    time.Duration `json:"ttft_ns"`    // to the first SSE event with output
	Latency time.Duration `json:"latency_ns"` // to the end of the stream
	// PromptTokens is the prompt length sent (for the chat workload, its
	// words, the template's tokens not counted); the Usage fields are
	// what the server reported (zero when HasUsage is false).
	PromptTokens          int    `json:"prompt_tokens"`
	HasUsage              bool   `json:"has_usage"`
	UsagePromptTokens     int    `json:"usage_prompt_tokens"`
	UsageCachedTokens     int    `json:"usage_cached_tokens"`
	UsageCompletionTokens int    `json:"usage_completion_tokens"`
	Chunks                int    `json:"chunks"` // SSE events carrying output
	Worker                string `json:"worker,omitempty"`
	Status                int    `json:"status,omitempty"`
	Err                   string `json:"error,omitempty"`
}

// OK reports whether the request completed.
func (r *RequestResult) OK() bool { return r.Attempted && r.Err == "" }

// OutputTokens is the server's completion_tokens, or the number of output
// events when it reported no usage.
func (r *RequestResult) OutputTokens() int {
	if r.HasUsage {
		return r.UsageCompletionTokens
	}
	return r.Chunks
}

// Run replays cfg.Trace against the router and measures every request.
// Failed requests are counted in the result, not returned as an error. The
// error is non-nil only for an unusable Config (wrapping ErrBadConfig) or
// when ctx ends first; then the partial result is returned too.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	r, err := newRunner(cfg)
	if err != nil {
		return nil, err
	}
	defer r.close()
	r.res.Started = time.Now()
	r.start = r.res.Started
	if cfg.Concurrency > 0 {
		r.closedLoop(ctx, cfg.Concurrency)
	} else {
		r.openLoop(ctx)
	}
	r.res.Duration = time.Since(r.start)
	if r.bar != nil {
		if ctx.Err() != nil {
			_ = r.bar.Exit()
		} else {
			_ = r.bar.Finish()
		}
	}
	if err := ctx.Err(); err != nil {
		return r.res, fmt.Errorf("cannot finish replay of %s: %w", r.res.Source, err)
	}
	return r.res, nil
}

type runner struct {
	trace     *Trace
	synth     TokenSynth
	chat      ChatSynth // when isChat
	isChat    bool
	body      requestBody
	endpoint  string
	auth      string // the Authorization header's value, "" for none
	client    *http.Client
	ownClient bool
	timeout   time.Duration
	maxOut    int
	maxBody   int
	speedup   float64
	inFlight  int
	bar       *progressbar.ProgressBar

	start time.Time
	res   *Result
	mu    sync.Mutex // guards res.Gaps; each res.Requests[i] has one writer
}

func newRunner(cfg Config) (*runner, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("cannot replay: %s: %w", fmt.Sprintf(format, args...), ErrBadConfig)
	}
	if cfg.Trace == nil || cfg.Trace.Len() == 0 {
		return nil, bad("no trace")
	}
	workload := cfg.Workload
	if workload == "" {
		workload = WorkloadTokens
	}
	path := pathCompletions
	switch workload {
	case WorkloadTokens:
	case WorkloadChat, WorkloadMultimodal:
		path = pathChatCompletions
	default:
		return nil, bad("workload %q is not one of %v", cfg.Workload, Workloads)
	}
	endpoint, err := endpointURL(cfg.RouterURL, path)
	if err != nil {
		return nil, bad("%v", err)
	}
	switch {
	case cfg.MaxRequests < 0:
		return nil, bad("max requests %d is negative", cfg.MaxRequests)
	case cfg.Speedup < 0 || math.IsNaN(cfg.Speedup):
		return nil, bad("speed-up %v is not positive", cfg.Speedup)
	case cfg.Concurrency < 0:
		return nil, bad("concurrency %d is negative", cfg.Concurrency)
	case cfg.MaxInFlight < 0:
		return nil, bad("max in-flight %d is negative", cfg.MaxInFlight)
	case cfg.MaxOutputTokens < 0:
		return nil, bad("max output tokens %d is negative", cfg.MaxOutputTokens)
	case cfg.Timeout < 0:
		return nil, bad("timeout %v is negative", cfg.Timeout)
	case cfg.MaxBodyBytes < 0:
		return nil, bad("max body bytes %d is negative", cfg.MaxBodyBytes)
	}
	trace := cfg.Trace.Head(cfg.MaxRequests)
	synth := cfg.Tokens
	synth.TraceBlockSize = trace.blockSize()
	if err := synth.Validate(); err != nil {
		return nil, bad("%v", err)
	}
	synth = synth.normalized()
	chat := cfg.Chat
	chat.TraceBlockSize = trace.blockSize()
	if err := chat.Validate(); err != nil {
		return nil, bad("%v", err)
	}
	chat = chat.normalized()
	if workload != WorkloadMultimodal {
		chat.Images = nil
	} else if chat.Images == nil {
		chat.Images, _ = NewImageSet(ImageSynth{}) // the defaults compile
	}
	blockTokens := synth.BlockTokens
	if workload != WorkloadTokens {
		blockTokens = chat.BlockWords
	}
	model := cfg.Model
	if model == "" {
		model = DefaultModel
	}
	r := &runner{
		trace:    trace,
		synth:    synth,
		chat:     chat,
		isChat:   workload != WorkloadTokens,
		body:     newRequestBody(model),
		endpoint: endpoint,
		client:   cfg.Client,
		timeout:  cfg.Timeout,
		maxOut:   cfg.MaxOutputTokens,
		maxBody:  cfg.MaxBodyBytes,
		speedup:  cfg.Speedup,
		inFlight: cfg.MaxInFlight,
	}
	if r.maxBody == 0 {
		r.maxBody = DefaultMaxBodyBytes
	}
	if err := r.checkBodies(); err != nil {
		return nil, bad("%v", err)
	}
	if cfg.APIKey != "" {
		r.auth = "Bearer " + cfg.APIKey
	}
	if r.speedup == 0 {
		r.speedup = 1
	}
	if r.inFlight == 0 {
		r.inFlight = DefaultMaxInFlight
	}
	conns := r.inFlight
	if cfg.Concurrency > 0 {
		conns = cfg.Concurrency
	}
	if r.client == nil {
		r.client, r.ownClient = newHTTPClient(conns), true
	}
	r.res = &Result{
		Source:      trace.Source,
		Workload:    workload,
		BlockTokens: blockTokens,
		Bound:       trace.HitBound(blockTokens),
		Requests:    make([]RequestResult, trace.Len()),
	}
	if cfg.PooledCapacityBlocks > 0 && workload == WorkloadTokens {
		ref := trace.PooledLRU(cfg.PooledCapacityBlocks, blockTokens, cfg.EngineBlockSize)
		r.res.PooledLRU = &ref
	}
	if cfg.Concurrency > 0 {
		r.res.Mode, r.res.Concurrency = ModeConcurrency, cfg.Concurrency
	} else {
		r.res.Mode, r.res.Speedup = ModeTimestamps, r.speedup
	}
	for i := range r.res.Requests {
		r.res.Requests[i].Index = i
		r.res.Requests[i].Line = trace.Records[i].Line
	}
	if cfg.Progress != nil {
		r.bar = newProgressBar(cfg.Progress, trace.Len(), cfg.ProgressLabel)
	}
	return r, nil
}

func (r *runner) close() {
	if r.ownClient {
		r.client.CloseIdleConnections()
	}
}

// The endpoints the workloads post to.
const (
	pathCompletions     = "/v1/completions"
	pathChatCompletions = "/v1/chat/completions"
)

// CheckRouterURL reports whether base is a router base URL Run can use,
// so that a command can refuse it before announcing a run.
func CheckRouterURL(base string) error {
	_, err := endpointURL(base, pathCompletions)
	return err
}

// endpointURL turns a router base URL into its endpoint at path.
func endpointURL(base, path string) (string, error) {
	if base == "" {
		base = DefaultRouterURL
	}
	// A URL's credentials or query may hold a key: its errors name it
	// redacted.
	hint := ""
	if !strings.Contains(base, "://") {
		// host:port alone parses as a scheme and an opaque path, or not.
		hint = ": give its scheme, as in http://" + redact.Endpoint(base)
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("router URL %q cannot be parsed%s", redact.Endpoint(base), hint)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("router URL %q is not an http(s) URL with a host%s", redact.Endpoint(base), hint)
	}
	if !strings.HasSuffix(u.Path, path) {
		base := strings.TrimSuffix(u.Path, "/")
		if strings.HasPrefix(path, "/v1/") {
			// A base URL as the OpenAI clients take it ends in /v1: the
			// path appended has its own (/v1/v1/completions was a 404
			// for every request).
			base = strings.TrimSuffix(base, "/v1")
		}
		u.Path = base + path
	}
	return u.String(), nil
}

// redactURLError hides what the router URL's query holds (Go strips its
// password already) in the client's error, which the report prints.
func redactURLError(err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		ue.URL = redact.Endpoint(ue.URL)
	}
	return err
}

func newHTTPClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		// A benchmark must measure the router, never an HTTP_PROXY.
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		WriteBufferSize:     64 << 10,
		ReadBufferSize:      64 << 10,
	}}
}

func newProgressBar(w io.Writer, total int, label string) *progressbar.ProgressBar {
	if label == "" {
		label = "replay"
	}
	return progressbar.NewOptions(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(label),
		progressbar.OptionSetWidth(30),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("req"),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }),
	)
}

// openLoop sends each request at its trace time divided by the speed-up,
// whether or not earlier ones have finished, as real users would.
func (r *runner) openLoop(ctx context.Context) {
	var (
		wg    sync.WaitGroup
		slots = make(chan struct{}, r.inFlight)
		pool  = sync.Pool{New: func() any { return new(requestBuffers) }}
		timer = time.NewTimer(time.Hour)
		t0    = r.trace.Records[0].Timestamp
	)
	defer timer.Stop()
	for i := range r.trace.Records {
		due := scaleDuration(r.trace.Records[i].Timestamp-t0, r.speedup)
		if wait := time.Until(r.start.Add(due)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				wg.Wait()
				return
			case <-timer.C:
			}
		}
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case slots <- struct{}{}:
		}
		r.res.Requests[i].Scheduled = due
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := pool.Get().(*requestBuffers)
			r.do(ctx, i, b)
			b.trim()
			pool.Put(b)
			<-slots
		}()
	}
	wg.Wait()
}

// closedLoop keeps n requests in flight, each worker sending its next
// request as soon as the previous one ends.
func (r *runner) closedLoop(ctx context.Context, n int) {
	var (
		wg   sync.WaitGroup
		next atomic.Int64
	)
	for range min(n, r.trace.Len()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := new(requestBuffers)
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= r.trace.Len() {
					return
				}
				r.res.Requests[i].Scheduled = time.Since(r.start)
				r.do(ctx, i, b)
			}
		}()
	}
	wg.Wait()
}

// scaleDuration divides d by speedup, saturating instead of overflowing.
func scaleDuration(d time.Duration, speedup float64) time.Duration {
	f := float64(d) / speedup
	if f >= math.MaxInt64/2 {
		return math.MaxInt64 / 2
	}
	return time.Duration(f)
}

// requestBuffers are one sender's reusable buffers.
type requestBuffers struct {
	tokens []uint32
	body   []byte
	reader *bufio.Reader
	line   []byte // an SSE line longer than reader's buffer
	event  []byte // data of the SSE event being assembled
	gaps   []time.Duration
}

// maxKeptBuffer bounds what a pooled requestBuffers keeps between requests,
// so one giant prompt does not pin its memory for the rest of the run.
const maxKeptBuffer = 4 << 20

func (b *requestBuffers) trim() {
	if cap(b.body) > maxKeptBuffer {
		b.body = nil
	}
	if cap(b.tokens)*4 > maxKeptBuffer {
		b.tokens = nil
	}
}

// maxTokens is the max_tokens of rec's request.
func (r *runner) maxTokens(rec *Record) int {
	n := max(rec.OutputLength, 1) // 0 is not a valid max_tokens
	if r.maxOut > 0 {
		n = min(n, r.maxOut)
	}
	return n
}

// do sends request i and fills in r.res.Requests[i].
func (r *runner) do(ctx context.Context, i int, b *requestBuffers) {
	rec := &r.trace.Records[i]
	rr := &r.res.Requests[i]
	rr.Attempted = true
	defer func() {
		if r.bar != nil {
			_ = r.bar.Add(1)
		}
	}()

	maxTokens := r.maxTokens(rec)
	if r.isChat {
		b.body = r.body.appendChat(b.body[:0], r.chat, rec, maxTokens)
		rr.PromptTokens, _ = r.chat.PromptLen(rec)
	} else {
		b.tokens = r.synth.AppendPrompt(b.tokens[:0], rec)
		b.body = r.body.appendBody(b.body[:0], b.tokens, maxTokens)
		rr.PromptTokens = len(b.tokens)
	}

	reqCtx := ctx
	if r.timeout > 0 {
		var cancel context.CancelFunc
		reqCtx, cancel = context.WithTimeout(ctx, r.timeout)
		defer cancel()
	}
	body := &closeSignalReader{Reader: bytes.NewReader(b.body), closed: make(chan struct{})}
	// The transport may still read the body after Do returns, even after
	// an error; b.body is reused only once the transport has closed it.
	// It closes it on its own goroutine, which a connection the router
	// refused before reading can keep waiting: past bodyReleaseWait the
	// buffer is left to the transport and the next request makes its own.
	defer func() {
		if !body.closedWithin(bodyReleaseWait) {
			b.body = nil
		}
	}()
	// Judged before the wait above (deferred calls run last first): a
	// failure then an interrupt within that wait is the failure.
	defer func() {
		if rr.Err != "" && ctx.Err() != nil {
			rr.Interrupted = true
		}
	}()
	req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, r.endpoint, body)
	if err != nil {
		panic("BUG: replay: request for a validated URL failed: " + err.Error())
	}
	req.ContentLength = int64(len(b.body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if r.auth != "" {
		req.Header.Set("Authorization", r.auth)
	}

	sent := time.Now()
	rr.Sent = sent.Sub(r.start)
	resp, err := r.client.Do(req)
	if err != nil {
		rr.Err = redactURLError(err).Error()
		return
	}
	defer resp.Body.Close()
	rr.Status = resp.StatusCode
	rr.Worker = resp.Header.Get(WorkerHeader)
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		rr.Err = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
		return
	}
	b.gaps = b.gaps[:0]
	if err := r.readStream(resp.Body, b, sent, rr); err != nil {
		rr.Err = err.Error()
		return
	}
	r.mu.Lock()
	r.res.Gaps = append(r.res.Gaps, b.gaps...)
	r.mu.Unlock()
}

// closeSignalReader tells when the transport is done with a request body.
type closeSignalReader struct {
	*bytes.Reader
	once   sync.Once
	closed chan struct{}
}

func (c *closeSignalReader) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

// closedWithin reports whether the body was closed, waiting at most d.
func (c *closeSignalReader) closedWithin(d time.Duration) bool {
	select {
	case <-c.closed:
		return true
	default:
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.closed:
		return true
	case <-t.C:
		return false
	}
}

// bodyReleaseWait bounds how long a finished request waits for the
// transport to let go of its body.
const bodyReleaseWait = time.Second

// streamChunk is the part of an OpenAI completion chunk replay reads. It
// also accepts chat deltas and both error shapes (OpenAI's {"error":{...}}
// and vLLM's {"object":"error","message":...}).
type streamChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error   json.RawMessage `json:"error"`
	Object  string          `json:"object"`
	Message string          `json:"message"`
}

// streamState follows one response stream.
type streamState struct {
	sent     time.Time
	last     time.Time // of the latest output event
	done     bool      // [DONE] seen
	finished bool      // a finish_reason seen
}

// readStream reads an SSE response to its end, timing output events.
func (r *runner) readStream(body io.Reader, b *requestBuffers, sent time.Time, rr *RequestResult) error {
	if b.reader == nil {
		b.reader = bufio.NewReaderSize(body, 64<<10)
	} else {
		b.reader.Reset(body)
	}
	st := streamState{sent: sent}
	b.event = b.event[:0]
	hasData := false
	for !st.done {
		line, err := readLine(b.reader, &b.line)
		if len(line) == 0 && err == nil { // blank line: the event is complete
			if hasData {
				if err := r.handleEvent(b.event, &st, b, rr); err != nil {
					return err
				}
			}
			b.event, hasData = b.event[:0], false
			continue
		}
		if data, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			data = bytes.TrimPrefix(data, []byte(" "))
			if hasData {
				b.event = append(b.event, '\n')
			}
			b.event, hasData = append(b.event, data...), true
		} // comments (":...") and other fields carry nothing replay needs
		if err == io.EOF {
			if hasData { // a server that closes without the final blank line
				if err := r.handleEvent(b.event, &st, b, rr); err != nil {
					return err
				}
			}
			break
		}
		if err != nil {
			return fmt.Errorf("cannot read response stream: %w", err)
		}
	}
	rr.Latency = time.Since(sent)
	if st.done {
		// Let the connection return to the pool: what follows [DONE] is at
		// most the end of the chunked body.
		_, _ = io.Copy(io.Discard, io.LimitReader(body, 4<<10))
	}
	switch {
	case rr.Chunks == 0:
		return errors.New("stream ended without output")
	case !st.done && !st.finished:
		return errors.New("stream ended before finish_reason or [DONE]")
	}
	return nil
}

// readLine returns the next line without its line ending. Lines longer than
// the reader's buffer are assembled in *long.
func readLine(br *bufio.Reader, long *[]byte) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		*long = append((*long)[:0], line...)
		for err == bufio.ErrBufferFull {
			line, err = br.ReadSlice('\n')
			*long = append(*long, line...)
		}
		line = *long
	}
	line = bytes.TrimSuffix(line, []byte("\n"))
	line = bytes.TrimSuffix(line, []byte("\r"))
	return line, err
}

func (r *runner) handleEvent(data []byte, st *streamState, b *requestBuffers, rr *RequestResult) error {
	now := time.Now()
	if bytes.Equal(data, []byte("[DONE]")) {
		st.done = true
		return nil
	}
	var c streamChunk
	if err := json.Unmarshal(data, &c); err != nil {
		return fmt.Errorf("cannot decode stream event %.80q: %v", data, err)
	}
	if len(c.Error) > 0 && !bytes.Equal(c.Error, []byte("null")) {
		var e struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(c.Error, &e) == nil && e.Message != "" {
			return fmt.Errorf("server error in stream: %s", e.Message)
		}
		return fmt.Errorf("server error in stream: %.200s", c.Error)
	}
	if c.Object == "error" {
		return fmt.Errorf("server error in stream: %s", c.Message)
	}
	if c.Usage != nil {
		rr.HasUsage = true
		rr.UsagePromptTokens = c.Usage.PromptTokens
		rr.UsageCompletionTokens = c.Usage.CompletionTokens
		if d := c.Usage.PromptTokensDetails; d != nil {
			rr.UsageCachedTokens = d.CachedTokens
		}
	}
	output := false
	for _, ch := range c.Choices {
		// A token may decode to no text, so an unfinished choice counts as
		// output even when empty; a finishing one only if it carries text.
		if ch.Text != "" || ch.Delta.Content != "" || ch.FinishReason == nil {
			output = true
		}
		if ch.FinishReason != nil {
			st.finished = true
		}
	}
	if output {
		if rr.Chunks == 0 {
			rr.TTFT = now.Sub(st.sent)
		} else {
			b.gaps = append(b.gaps, now.Sub(st.last))
		}
		st.last = now
		rr.Chunks++
	}
	return nil
}
