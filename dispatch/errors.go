package dispatch

import (
	"errors"
	"strconv"

	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/workers"
)

// What went wrong with a forwarded request. Errors returned by Call.Do and
// Call.Relay, and passed to Observer.OnAbort, wrap exactly one of these;
// test with errors.Is.
var (
	// ErrConnect: no connection to the engine could be had (refused,
	// unreachable, connect timeout). The request never left the router,
	// so it may go to another worker.
	ErrConnect = errors.New("kvfast: cannot connect to the engine")
	// ErrConnsExhausted: every connection the router may open to the
	// engine (Config.MaxConnsPerEngine) carries a request already. The
	// request never left the router, so it may go to another worker; it
	// is the router's bound, not the engine's fault.
	ErrConnsExhausted = errors.New("kvfast: every connection the router may open to the engine is in use (its --max-conns-per-engine)")
	// ErrFirstByteTimeout: the engine took the request but sent no response
	// within Timeouts.FirstByte.
	ErrFirstByteTimeout = errors.New("kvfast: the engine did not answer within the first-byte timeout")
	// ErrWriteTimeout: the engine did not take the whole request within
	// Timeouts.Write (it stopped reading).
	ErrWriteTimeout = errors.New("kvfast: the engine did not take the request within the write timeout")
	// ErrIdleTimeout: a started response paused longer than Timeouts.Idle.
	ErrIdleTimeout = errors.New("kvfast: the engine response stalled beyond the idle timeout")
	// ErrEngineFailed: the connection broke, or the engine sent something
	// that is not HTTP, or a success answer that is not what was asked
	// for (Call.RequireObject), after the request was sent.
	ErrEngineFailed = errors.New("kvfast: the engine broke the connection or sent a malformed answer")
	// ErrTruncated: a stream ended without its terminal item or [DONE].
	ErrTruncated = errors.New("kvfast: the engine stream ended before the response was complete")
	// ErrEngineError: the engine answered with an error status or an error
	// event; the client received the engine's own error.
	ErrEngineError = errors.New("kvfast: the engine reported an error")
	// ErrEngineOverloaded: the engine refused the request with 429 Too
	// Many Requests (Call.Failed), which says nothing of the request:
	// another engine may take it.
	ErrEngineOverloaded = errors.New("kvfast: the engine refused the request as overloaded (429)")
	// ErrEngineAuth: the engine refused the router's engine API key
	// (Config.EngineToken) with a 401 or 403 (Call.Failed): a fault of
	// the router's configuration, not of the client's key, so the client
	// is not shown the engine's refusal.
	ErrEngineAuth = errors.New("kvfast: the engine refused the router's engine API key (--engine-api-key-file)")
	// ErrAdapterGone: the engine answered 404 to a request naming a LoRA
	// adapter it listed when last asked: unloaded since (Call.DiscardUnserved).
	// Another engine listing the adapter may serve it.
	ErrAdapterGone = errors.New("kvfast: the engine no longer serves the LoRA adapter the request names; retry later")
	// ErrClientGone: the client left (Call.Abort), or writing to it
	// failed, so the upstream request was cancelled by closing its
	// connection.
	ErrClientGone = errors.New("kvfast: the client went away")
	// ErrResponseTooLarge: a non-streaming response exceeded
	// Config.MaxResponseBodySize.
	ErrResponseTooLarge = errors.New("kvfast: the engine response is larger than the router accepts (its --max-response-bytes)")
	// ErrResponseBudget: reading a non-streaming response would take the
	// bytes the router holds of such responses, over all requests, past
	// Config.ResponseBudgetBytes. The router's overload, not the engine's
	// fault.
	ErrResponseBudget = errors.New("kvfast: the router holds too many large engine responses at once")
	// ErrShuttingDown: the router cut the call because it is shutting
	// down and the request outlived the drain (Call.Cut).
	ErrShuttingDown = errors.New("kvfast: the router is shutting down")
	// ErrPrefillFailed: the request's prefill stage, sent to another
	// engine, failed, so this call was cancelled (Call.FailPrefill): no
	// fault of this call's engine.
	ErrPrefillFailed = errors.New("kvfast: the prefill stage of the request failed")
	// ErrUnknownEngine: no engine is registered in the worker slot.
	ErrUnknownEngine = errors.New("kvfast: no engine in the worker slot")
	// ErrAbandoned: the call was released or reused before its response was
	// relayed to the end.
	ErrAbandoned = errors.New("kvfast: the response was abandoned before it was relayed")
)

// IsRetryable reports whether err, from Do, Discard or ReadBody, allows
// sending the same request to another worker: the engine refused the
// connection, broke it or sent garbage instead of an answer, answered
// with a 5xx or a 429 or refused the router's key (Discard), or every
// connection the router may open to it was in use. Whether any byte
// already reached the client is the caller's to know: a relayed stream is
// never sent again. Timeouts are not retried, since the engine may still
// be generating, nor is a departed client.
func IsRetryable(err error) bool {
	return errors.Is(err, ErrConnect) || errors.Is(err, ErrEngineFailed) || errors.Is(err, ErrEngineError) || errors.Is(err, ErrEngineAuth) ||
		errors.Is(err, ErrAdapterGone) || errors.Is(err, ErrEngineOverloaded) || errors.Is(err, ErrConnsExhausted)
}

// IsMalformedAnswer reports whether err, an ErrEngineFailed, is an answer
// that came whole but is not what an OpenAI-compatible engine sends: a
// success that is not a JSON object or carries an error object, a stream
// answering a request that asked for one object, or a plain answer to a
// request that asked for a stream. One engine
// answering so is likely no engine at all (a worker URL naming another
// service), which an operator must hear of, where a broken connection is
// an engine's everyday failure.
func IsMalformedAnswer(err error) bool {
	return errors.Is(err, errNotObject) || errors.Is(err, errErrorUnder2xx) || errors.Is(err, errUnaskedStream) ||
		errors.Is(err, errUnaskedObject)
}

// Error is the error of one forwarded request: which engine, at which step,
// what kind (one of the sentinels above) and the transport's cause.
type Error struct {
	Slot  workers.Slot
	Addr  string
	Op    string // "forward to" or "relay from"
	Kind  error
	Cause error // may be nil
}

func (e *Error) Error() string {
	s := "cannot " + e.Op + " engine " + e.Addr + " (slot " + strconv.Itoa(int(e.Slot)) + "): " + e.Kind.Error()
	if e.Cause != nil {
		s += ": " + e.Cause.Error()
	}
	return s
}

func (e *Error) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Cause}
}

// ErrorStatus is the HTTP status a server answers with when Call.Do failed
// with err and no retry is left.
func ErrorStatus(err error) int {
	switch {
	case errors.Is(err, ErrUnknownEngine), errors.Is(err, ErrResponseBudget), errors.Is(err, ErrShuttingDown), errors.Is(err, ErrAdapterGone),
		errors.Is(err, ErrConnsExhausted):
		return 503
	case errors.Is(err, ErrEngineOverloaded):
		return 429
	case errors.Is(err, ErrFirstByteTimeout), errors.Is(err, ErrIdleTimeout), errors.Is(err, ErrWriteTimeout):
		return 504
	}
	return 502
}

// AppendErrorJSON appends the OpenAI-style error body for err, a failure of
// Call.Do, to dst: {"error":{"message":…,"type":"server_error",…}}. The
// message names the kind of failure, not the engine's address.
func AppendErrorJSON(dst []byte, err error) []byte {
	return appendError(dst, kindOf(err))
}

var kinds = [...]struct {
	kind error
	code string
}{
	{ErrEngineFailed, "engine_failed"}, // first: the kind of unclassified errors
	{ErrConnect, "engine_unavailable"},
	{ErrConnsExhausted, "engine_connections_exhausted"},
	{ErrEngineOverloaded, "engine_overloaded"},
	{ErrFirstByteTimeout, "engine_timeout"},
	{ErrIdleTimeout, "engine_timeout"},
	{ErrWriteTimeout, "engine_timeout"},
	{ErrTruncated, "engine_stream_truncated"},
	{ErrEngineError, "engine_error"},
	{ErrEngineAuth, "engine_auth_failed"},
	{ErrAdapterGone, "model_unavailable"},
	{ErrClientGone, "client_gone"},
	{ErrResponseTooLarge, "engine_response_too_large"},
	{ErrResponseBudget, "response_budget_exceeded"},
	{ErrShuttingDown, "shutting_down"},
	{ErrPrefillFailed, "prefill_failed"},
	{ErrUnknownEngine, "engine_unavailable"},
	{ErrAbandoned, "abandoned"},
}

// kindOf returns the index in kinds of err's kind, ErrEngineFailed's if none.
func kindOf(err error) int {
	for i, k := range kinds {
		if errors.Is(err, k.kind) {
			return i
		}
	}
	return 0
}

func appendError(dst []byte, kind int) []byte {
	k := &kinds[kind]
	e := openai.Error{Status: ErrorStatus(k.kind), Type: openai.TypeServerError, Code: k.code,
		Message: k.kind.Error()[len("kvfast: "):]}
	return e.AppendJSON(dst)
}

// sseErrors holds, per kind, the events written to a client whose stream
// broke: the error, then [DONE], as vLLM and SGLang end a stream whose
// generation failed, so that a client reading up to [DONE] stops there.
// Prepared once so that the failure path allocates nothing.
var sseErrors = func() (out [len(kinds)][]byte) {
	for i := range kinds {
		b := append([]byte("data: "), appendError(nil, i)...)
		out[i] = append(b, "\n\ndata: [DONE]\n\n"...)
	}
	return out
}()
