package epp

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/kvfast/kvfast/internal/configerr"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
)

// The protocol's names (docs/proposals/004-endpoint-picker-protocol in the
// Gateway API Inference Extension). The gateway may be configured with
// other metadata namespaces; Config carries the ones in use.
const (
	// HeaderDestination names the chosen endpoint, "ip:port", or several,
	// comma-separated, the first preferred.
	HeaderDestination = "x-gateway-destination-endpoint"
	// DefaultDestinationNamespace wraps HeaderDestination in the dynamic
	// metadata of the response.
	DefaultDestinationNamespace = "envoy.lb"
	// DefaultSubsetNamespace wraps KeySubset in the request's filter
	// metadata.
	DefaultSubsetNamespace = "envoy.lb.subset_hint"
	// KeySubset lists the endpoints the picker must choose from.
	KeySubset = "x-gateway-destination-endpoint-subset"
	// KeyServed is the endpoint that served the request, which the
	// gateway reports in the response phase's metadata, under the
	// destination namespace, when it tried a fallback.
	KeyServed = "x-gateway-destination-endpoint-served"
)

// BodyMode is how the gateway sends the request body, which decides when
// the picker can answer: Envoy's ProcessingMode.request_body_mode.
type BodyMode = extprocfilter.ProcessingMode_BodySendMode

// Config is the picker's configuration. DefaultConfig fills it.
type Config struct {
	// Model is the base model the pool's engines serve: it seeds the
	// block hashes (radix.NamespaceSeed) of both the index and the
	// requests. A request naming another model is taken to name one of
	// its LoRA adapters and is hashed in that adapter's namespace, where
	// the engines' events put its blocks.
	Model string
	// Sched configures the scheduler; Policy names its routing policy
	// (sched.ParsePolicy: kv, approx, round-robin, random, least-loaded).
	Sched  sched.Config
	Policy string
	// IndexCapacity is the distinct KV blocks the index holds.
	IndexCapacity int
	// IndexWorkerShare is the most of the index one pod's blocks may take
	// (radix.Index.SetWorkerShare).
	IndexWorkerShare float64
	// ApproxTTL and ApproxCapacity size the approximate index, which
	// text and chat prompts route on (by the picker's own decisions).
	ApproxTTL        time.Duration
	ApproxCapacity   int
	ApproxChunkBytes int
	// Topic is the ZMQ subscription prefix of every endpoint's events.
	Topic string
	// EngineToken is the API key the endpoints' engines were started with
	// (vLLM's --api-key), which keeps their GET /v1/models, where the
	// picker learns their LoRA adapters, behind Authorization: Bearer.
	// Empty: the picker asks without one. Never logged.
	EngineToken string

	// RequestBodyMode is assumed when the gateway does not say which it
	// uses (Envoy sends ProcessingRequest.protocol_config on each
	// stream's first message; older ones do not). GIE's gateways use
	// FULL_DUPLEX_STREAMED.
	RequestBodyMode BodyMode
	// MaxBodyBytes bounds a request body the picker buffers to read the
	// prompt (413 beyond).
	MaxBodyBytes int
	// BodyBudgetBytes bounds the request body bytes buffered at once over
	// every stream: past it a body is refused with 503 and Retry-After
	// (the per-stream bound alone let 40 streams of 15 MiB take 1.6 GB).
	BodyBudgetBytes int64
	// BodyIdleTimeout bounds the wait for the next part of a request body
	// the picker has begun to buffer: a stream that stops mid-body would
	// otherwise hold its share of the budget (and every other body's
	// 503) until the gateway gave up on it, or for good from a client
	// that reaches the picker directly. Past it the request gets 408.
	BodyIdleTimeout time.Duration
	// BodyTimeout bounds the whole wait for a body the picker has begun
	// to buffer, however steadily it trickles: a byte every
	// BodyIdleTimeout would otherwise hold its share for as long as the
	// sender liked. Past it the request gets 408.
	BodyTimeout time.Duration
	// ResponseTimeout bounds how long a routed request's booking waits on
	// the gateway: for the response's headers (the endpoint's first
	// byte, as kvfast serve's --first-byte-timeout), or for the gateway
	// to take one of the picker's answers. Past it the booking is
	// released (the stream stays, for the gateway to end): a hung
	// endpoint or a gateway that stopped reading would otherwise hold
	// the endpoint's load, and steer requests away from it, for good.
	ResponseTimeout time.Duration
	// QueueTimeout bounds a request's wait in the admission queue when
	// every endpoint is busy (503 past it).
	QueueTimeout time.Duration
	// Fallbacks is how many further endpoints, cheapest first, follow the
	// chosen one in the destination, for a gateway that retries.
	Fallbacks int
	// QueryNodes says the endpoints are kvfast routers, one per node,
	// each asked per request, through its route-only endpoint and within
	// QueryTimeout, what it caches of the prompt (nodequery.go), instead
	// of the picker following engines' events.
	QueryNodes   bool
	QueryTimeout time.Duration
	// DestinationNamespace and SubsetNamespace are the metadata
	// namespaces; empty means the protocol's defaults.
	DestinationNamespace, SubsetNamespace string

	Logger *slog.Logger // nil: slog.Default()
}

// DefaultConfig is the picker's defaults.
func DefaultConfig() Config {
	return Config{
		Policy:           "kv",
		IndexCapacity:    1 << 20,
		IndexWorkerShare: radix.DefaultWorkerShare,
		ApproxTTL:        2 * time.Minute,
		ApproxCapacity:   1 << 20,
		ApproxChunkBytes: radix.DefaultApproxChunkBytes,
		RequestBodyMode:  extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED,
		MaxBodyBytes:     16 << 20,
		BodyBudgetBytes:  256 << 20,
		BodyIdleTimeout:  30 * time.Second,
		// 16 MiB (--max-body-bytes) at about 0.5 Mbit/s.
		BodyTimeout:  5 * time.Minute,
		QueueTimeout: 30 * time.Second,
		// As kvfast serve's --first-byte-timeout: a long prompt behind a
		// deep queue may take minutes to its first token.
		ResponseTimeout: 10 * time.Minute,
		// Admission as kvfast serve has it: an endpoint over a busy
		// threshold takes no new request, which waits in the queue.
		Sched:                sched.Config{Busy: sched.DefaultBusy, QueueCapacity: sched.DefaultQueueCapacity},
		QueryTimeout:         250 * time.Millisecond,
		DestinationNamespace: DefaultDestinationNamespace,
		SubsetNamespace:      DefaultSubsetNamespace,
	}
}

// ErrInvalidConfig is what Validate's errors wrap.
var ErrInvalidConfig = errors.New("kvfast: invalid endpoint-picker configuration")

// invalidf is an error matching ErrInvalidConfig whose text is the formatted
// message alone.
func invalidf(format string, args ...any) error {
	return configerr.New(ErrInvalidConfig, format, args...)
}

// Validate reports the first setting the picker cannot run with.
func (c *Config) Validate() error {
	if c.Model == "" {
		return invalidf("cannot pick without the pool's model: give --model, the base model the pool serves, which seeds the block hashes")
	}
	if _, _, err := sched.ParsePolicy(c.Policy); err != nil {
		return fmt.Errorf("--policy: %w", err)
	}
	switch c.RequestBodyMode {
	case extprocfilter.ProcessingMode_NONE, extprocfilter.ProcessingMode_STREAMED, extprocfilter.ProcessingMode_BUFFERED,
		extprocfilter.ProcessingMode_BUFFERED_PARTIAL, extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED:
	default:
		return invalidf("cannot assume request body mode %s: want NONE, STREAMED, BUFFERED, BUFFERED_PARTIAL or FULL_DUPLEX_STREAMED",
			c.RequestBodyMode)
	}
	for _, v := range []struct {
		name string
		n    int
	}{{"index capacity", c.IndexCapacity}, {"approx capacity", c.ApproxCapacity},
		{"approx chunk bytes", c.ApproxChunkBytes}, {"max body bytes", c.MaxBodyBytes}} {
		if v.n <= 0 {
			return invalidf("cannot use %s %d: must be positive", v.name, v.n)
		}
	}
	if s := c.IndexWorkerShare; !(s > 0 && s <= 1) {
		return invalidf("cannot use --index-worker-share %v: want more than 0 and at most 1 (1: no bound)", s)
	}
	if c.BodyBudgetBytes < int64(c.MaxBodyBytes) {
		return invalidf("cannot use --body-budget-bytes %d: must hold at least one body of --max-body-bytes (%d)", c.BodyBudgetBytes, c.MaxBodyBytes)
	}
	if c.BodyIdleTimeout <= 0 {
		return invalidf("cannot use --body-idle-timeout %s: must be positive", c.BodyIdleTimeout)
	}
	if c.ResponseTimeout <= 0 {
		return invalidf("cannot use --response-timeout %s: must be positive", c.ResponseTimeout)
	}
	if c.BodyTimeout <= 0 {
		return invalidf("cannot use --body-timeout %s: must be positive", c.BodyTimeout)
	}
	if c.ApproxTTL <= 0 || c.QueueTimeout <= 0 || (c.QueryNodes && c.QueryTimeout <= 0) {
		return invalidf("cannot use approx TTL %s, queue timeout %s and node query timeout %s: each must be positive",
			c.ApproxTTL, c.QueueTimeout, c.QueryTimeout)
	}
	if c.Fallbacks < 0 || c.Fallbacks > 8 {
		return invalidf("cannot name %d fallback endpoints: want 0 to 8", c.Fallbacks)
	}
	return nil
}
