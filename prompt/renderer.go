package prompt

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/workers"
)

// Renderer produces the engine's prompt token ids for one request.
//
// Tokens appends to dst the ids of r's text or chat prompt (r.Prompt is
// openai.PromptText or PromptMessages) as the engine serving r.Model will
// compute them for body, the request's unchanged body, posted to api. On
// error the caller routes the request approximately; the returned slice is
// then dst, possibly grown, so that the caller keeps its buffer. An error
// wrapping ErrInvalidRequest is the client's fault, which the caller
// answers with 400.
type Renderer interface {
	Tokens(ctx context.Context, dst []uint32, api openai.API, body []byte, r *openai.ParsedRequest) ([]uint32, error)
}

// ErrInvalidRequest marks a request that cannot be rendered because of what
// the client sent (a message shape the chat template refuses, say), as
// opposed to a renderer that failed.
var ErrInvalidRequest = errors.New("the request cannot be rendered")

// Engines picks the engine a Remote asks: any healthy worker serving the
// model. The node implements it over its worker set.
type Engines interface {
	// PickEngine returns a healthy worker serving model, and requested
	// (the request's own model name: a LoRA adapter of model, or model
	// itself): its slot and its host:port. ok is false when there is
	// none.
	PickEngine(model string, requested []byte) (slot workers.Slot, addr string, ok bool)
}

// The kinds of failure a Remote returns (as a *Failure, which errors.Is
// matches against them); each is also the outcome it counts.
var (
	ErrNoEngine    = errors.New("no healthy engine serves the model")
	ErrTimeout     = errors.New("the engine did not render the prompt in time")
	ErrEngine      = errors.New("the engine failed to render the prompt")
	ErrRejected    = errors.New("the engine refused to render the prompt")
	ErrUnsupported = errors.New("the engine has no render or tokenize endpoint for this API")
	ErrBadResponse = errors.New("the engine's rendered prompt is not a valid token-id array")
	ErrNotRendered = errors.New("only text and chat prompts are rendered")
	// ErrBackoff: the engine timed out or failed on its last calls, and is
	// not asked again until its backoff ends, so that a stalled engine
	// costs requests nothing rather than the timeout each.
	ErrBackoff = errors.New("the engine failed its last render calls: not asked until its backoff ends")
	// ErrBusy: as many render calls as the budget holds are under way (a
	// remote model's answers, the built-in renderers' prompt bytes); the
	// request routes approximately rather than wait.
	ErrBusy = errors.New("too many prompts are being rendered at once")
)

// Outcomes counts how a renderer's calls ended: the outcome label of
// kvfast_tokenize_total. Every outcome but OK sent the request on
// approximately.
type Outcomes struct {
	OK          uint64 `json:"ok"`
	Timeout     uint64 `json:"timeout"`      // ErrTimeout
	EngineError uint64 `json:"engine_error"` // ErrEngine: connection failure, 5xx, every connection busy
	Rejected    uint64 `json:"rejected"`     // ErrRejected: a 4xx (the request, or missing credentials)
	Unsupported uint64 `json:"unsupported"`  // ErrUnsupported
	BadResponse uint64 `json:"bad_response"` // ErrBadResponse: unparsable, too large, an id out of range
	NoEngine    uint64 `json:"no_engine"`    // ErrNoEngine
	Cancelled   uint64 `json:"cancelled"`    // the request's context ended first
	Backoff     uint64 `json:"backoff"`      // ErrBackoff: not asked, the engine is backing off
	Busy        uint64 `json:"busy"`         // ErrBusy: not rendered, too many calls in flight
}

// outcomeCounters are Outcomes as atomics, bumped on the request path.
type outcomeCounters struct {
	ok, timeout, engine, rejected, unsupported, bad, noEngine, cancelled, backoff, busy atomic.Uint64
}

// count records how a call ended; err is what Tokens returns.
func (c *outcomeCounters) count(err error) {
	switch {
	case err == nil:
		c.ok.Add(1)
	case errors.Is(err, ErrTimeout):
		c.timeout.Add(1)
	case errors.Is(err, ErrRejected):
		c.rejected.Add(1)
	case errors.Is(err, ErrUnsupported):
		c.unsupported.Add(1)
	case errors.Is(err, ErrBadResponse):
		c.bad.Add(1)
	case errors.Is(err, ErrNoEngine):
		c.noEngine.Add(1)
	case errors.Is(err, ErrBackoff):
		c.backoff.Add(1)
	case errors.Is(err, ErrBusy):
		c.busy.Add(1)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		c.cancelled.Add(1)
	default:
		c.engine.Add(1)
	}
}

func (c *outcomeCounters) load() Outcomes {
	return Outcomes{OK: c.ok.Load(), Timeout: c.timeout.Load(), EngineError: c.engine.Load(), Rejected: c.rejected.Load(),
		Unsupported: c.unsupported.Load(), BadResponse: c.bad.Load(), NoEngine: c.noEngine.Load(), Cancelled: c.cancelled.Load(),
		Backoff: c.backoff.Load(), Busy: c.busy.Load()}
}
