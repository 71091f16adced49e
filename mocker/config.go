package mocker

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
)

// Config describes one simulated engine. The zero value of every field
// means its default.
type Config struct {
	// Listen is the HTTP listen address (default "127.0.0.1:0", an
	// ephemeral port; Engine.Addr tells which).
	Listen string
	// Model is the served model name (default "mock"). Requests naming
	// another model get a 404; requests naming none are served.
	Model string

	// BlockSize is the tokens per KV block (default radix.DefaultBlockSize).
	BlockSize int
	// KVBlocks is the KV cache capacity in blocks (default 16384).
	KVBlocks int
	// MaxBatchedTokens is the token budget of one step, prefill chunks and
	// decodes together (default 8192).
	MaxBatchedTokens int
	// MaxSeqs caps the running batch (default 256).
	MaxSeqs int
	// MaxModelLen caps prompt plus max_tokens (default and upper bound:
	// KVBlocks·BlockSize, so that any accepted request fits in an empty
	// cache).
	MaxModelLen int
	// DefaultMaxTokens applies when a request sets no max_tokens (default
	// 16, OpenAI's completions default), shortened if the prompt leaves
	// less room than that.
	DefaultMaxTokens int

	// Timing is the step cost model (default DefaultTiming when zero).
	Timing Timing
	// Speedup divides simulated time when mapping it onto the wall clock
	// (default 1). +Inf runs steps back to back without sleeping.
	Speedup float64
	// HeartbeatInterval is the wall-clock period of Heartbeat and of the
	// load refresh (default 250ms).
	HeartbeatInterval time.Duration

	// Renderer, when set, tokenizes text and chat prompts in place of the
	// toy tokenizer (AppendTextTokens, AppendChatTokens): a real model's
	// tokenizer and chat template, say prompt.Open's built-in renderer of
	// a tokenizer directory. Generation, the render endpoints and
	// /tokenize all use it, so that the ids the engine caches and
	// publishes are the ids a router asking it for them gets. Token-id
	// prompts are used as they are either way.
	Renderer Renderer

	// APIKey, when set, guards the engine as vLLM's --api-key does: a
	// request to a path under /v1 without Authorization: Bearer APIKey is
	// answered 401 {"error":"Unauthorized"}; /health, /tokenize and the
	// mock's own paths stay open.
	APIKey string

	// DisableRender makes the engine answer its render endpoints with 404,
	// as a vLLM release before them (or SGLang) does, so that a router
	// asking it falls back to /tokenize.
	DisableRender bool

	// LoRAAdapters are adapter names GET /v1/models lists with the model
	// as their parent, as vLLM lists its LoRA modules, so that a router
	// learns them. The mock does not simulate adapters otherwise.
	LoRAAdapters []string

	// HostBlocks > 0 gives the engine a CPU tier of that many blocks, as
	// vLLM's OffloadingConnector and SGLang's HiCache keep the blocks the
	// GPU evicts in host memory: an evicted block is copied there (the
	// least recently used copy making room), and a request whose prefix
	// continues there loads those blocks back at Timing.HostLoadPerBlock
	// each instead of computing them. ZMQPublisher announces the copies
	// as the engine it speaks does; ShmPublisher, whose records name no
	// tier, leaves them out.
	HostBlocks int

	// SlidingWindow > 0 makes the engine a hybrid model (vLLM's hybrid KV
	// cache manager) with a second KV-cache group of sliding-window
	// attention over that many tokens: group 1 caches every block group 0
	// does and frees it as soon as no running request's window covers it,
	// and a cached prefix is reused only if group 1 still holds the
	// blocks its window needs before the prefix's end. Events name their
	// group, which only vLLM's ZMQ format can: the engine refuses it with
	// SGLang's format or a shm segment. Not with HostBlocks (vLLM does
	// not offload hybrid models either). 0: one full-attention group.
	SlidingWindow int

	// workers.Role is the engine's part in disaggregated serving (disagg.go):
	// workers.RolePrefill keeps a prompt's KV for a remote decode when asked
	// (kv_transfer_params do_remote_decode), workers.RoleDecode pulls it from the
	// prefill engine the params name (do_remote_prefill), workers.RoleBoth (the
	// default) does either. Every role also serves plain requests, as a
	// vLLM engine with a KV connector does. The role is registered in the
	// shm segment.
	Role workers.Role
	// SGLangBootstrap simulates SGLang's disaggregation instead: a
	// request carrying bootstrap_host, bootstrap_port and bootstrap_room
	// is a prefill (on a prefill engine: it computes the prompt and keeps
	// it for the room) or a decode (it pulls the room's KV from the
	// prefill engine's bootstrap server, which the mock serves on its
	// HTTP port).
	SGLangBootstrap bool
	// TransferTimeout is how long a prefill engine keeps a finished
	// prompt's blocks for a remote decode that does not come (vLLM's
	// VLLM_NIXL_ABORT_REQUEST_TIMEOUT; default DefaultTransferTimeout).
	TransferTimeout time.Duration
	// ECStore is the encoder-cache connector's storage (encode.go): an
	// encode engine (workers.RoleEncode, which needs one) saves every item it
	// encodes there, and the other engines skip encoding the items they
	// find there. Nil: no engine finds any, and every engine encodes its
	// own requests' items.
	ECStore *ECStore
	// EncoderCacheItems is an encode engine's encoder cache, in items
	// (default DefaultEncoderCacheItems; negative: none).
	EncoderCacheItems int

	// WorkerID and DPRank identify this engine to the router's registry.
	WorkerID uint64
	DPRank   uint32

	// Publisher receives KV events and load. Nil publishes nothing (unless
	// Segment is set).
	Publisher Publisher
	// Segment is the path of a kvfast shm segment (created by the router)
	// to register with and publish into, instead of Publisher.
	Segment string
	// SegmentHandle is a segment already open in this process (an
	// in-process demo or test): the engine registers in it, instead of
	// Publisher or Segment.
	SegmentHandle *shm.Segment
	// ZMQ publishes the KV events on ZMQ sockets in vLLM's or SGLang's
	// wire format (ZMQConfig.Listen set), instead of Publisher or Segment.
	ZMQ ZMQConfig
}

// Defaults.
const (
	DefaultKVBlocks          = 16384
	DefaultMaxBatchedTokens  = 8192
	DefaultMaxSeqs           = 256
	DefaultMaxTokens         = 16
	DefaultModel             = "mock"
	DefaultHeartbeatInterval = 250 * time.Millisecond
	DefaultTransferTimeout   = 480 * time.Second // vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT
)

// MaxKVBlocks bounds an engine's GPU and host pools: the cache's tables
// are allocated whole at start, about 115 bytes a block, so this is some
// 1.9 GB, where the int32 bound the block ids allow (2^31) asked for 250 GB
// and ended in the runtime's out-of-memory crash. A real engine holds far
// fewer: an 80 GB GPU, some 500k blocks of 16 tokens of an 8B model.
const MaxKVBlocks = 1 << 24

// Check reports what New would refuse in cfg, without starting anything:
// for a command that starts engines later, so that a bad value is a usage
// error at once.
func (cfg Config) Check() error {
	_, err := cfg.withDefaults()
	return err
}

// withDefaults fills zero fields and checks the result.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Model == "" {
		cfg.Model = DefaultModel
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = radix.DefaultBlockSize
	}
	if cfg.KVBlocks == 0 {
		cfg.KVBlocks = DefaultKVBlocks
	}
	if cfg.MaxBatchedTokens == 0 {
		cfg.MaxBatchedTokens = DefaultMaxBatchedTokens
	}
	if cfg.MaxSeqs == 0 {
		cfg.MaxSeqs = DefaultMaxSeqs
	}
	if cfg.DefaultMaxTokens == 0 {
		cfg.DefaultMaxTokens = DefaultMaxTokens
	}
	if cfg.Timing == (Timing{}) {
		cfg.Timing = DefaultTiming
	}
	if cfg.Speedup == 0 {
		cfg.Speedup = 1
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if cfg.TransferTimeout == 0 {
		cfg.TransferTimeout = DefaultTransferTimeout
	}
	if cfg.EncoderCacheItems == 0 {
		cfg.EncoderCacheItems = DefaultEncoderCacheItems
	}
	switch {
	case cfg.Role > workers.RoleEncode:
		return cfg, fmt.Errorf("cannot configure mock engine: unknown role %d", cfg.Role)
	case cfg.Role == workers.RoleEncode && cfg.ECStore == nil:
		return cfg, fmt.Errorf("cannot configure mock engine: %w", errEncodeStore)
	case cfg.TransferTimeout < 0:
		return cfg, fmt.Errorf("cannot configure mock engine: transfer timeout %v is negative", cfg.TransferTimeout)
	case cfg.BlockSize < 1:
		return cfg, fmt.Errorf("cannot configure mock engine: block size %d is not positive", cfg.BlockSize)
	case cfg.KVBlocks < 1 || cfg.KVBlocks > MaxKVBlocks:
		return cfg, fmt.Errorf("cannot configure mock engine: KV capacity %d blocks is out of range (1..%d)", cfg.KVBlocks, MaxKVBlocks)
	case cfg.MaxBatchedTokens < 1:
		return cfg, fmt.Errorf("cannot configure mock engine: max batched tokens %d is not positive", cfg.MaxBatchedTokens)
	case cfg.MaxSeqs < 1:
		return cfg, fmt.Errorf("cannot configure mock engine: max sequences %d is not positive", cfg.MaxSeqs)
	case cfg.DefaultMaxTokens < 1:
		return cfg, fmt.Errorf("cannot configure mock engine: default max tokens %d is not positive", cfg.DefaultMaxTokens)
	case math.IsNaN(cfg.Speedup) || cfg.Speedup < 0:
		return cfg, fmt.Errorf("cannot configure mock engine: speed-up %v is not positive", cfg.Speedup)
	case cfg.HeartbeatInterval < 0:
		return cfg, fmt.Errorf("cannot configure mock engine: heartbeat interval %v is negative", cfg.HeartbeatInterval)
	case cfg.HostBlocks < 0 || cfg.HostBlocks > MaxKVBlocks:
		return cfg, fmt.Errorf("cannot configure mock engine: host pool of %d blocks is out of range (0..%d)", cfg.HostBlocks, MaxKVBlocks)
	case cfg.SlidingWindow < 0 || cfg.SlidingWindow == 1:
		return cfg, fmt.Errorf("cannot configure mock engine: sliding window of %d tokens is not 0 or at least 2", cfg.SlidingWindow)
	case cfg.SlidingWindow > 0 && cfg.HostBlocks > 0:
		return cfg, errors.New("cannot configure mock engine: a hybrid model (sliding window) with a host pool is not simulated")
	case cfg.SlidingWindow > 0 && (cfg.Segment != "" || cfg.SegmentHandle != nil):
		return cfg, errors.New("cannot configure mock engine: shm records cannot name the KV-cache groups of a sliding window")
	case cfg.SlidingWindow > 0 && cfg.ZMQ.Listen != "" && cfg.ZMQ.Format == ZMQSGLang:
		return cfg, errors.New("cannot configure mock engine: SGLang's events cannot name the KV-cache groups of a sliding window")
	}
	if err := cfg.Timing.validate(); err != nil {
		return cfg, err
	}
	capTokens := int64(cfg.KVBlocks) * int64(cfg.BlockSize)
	if capTokens > math.MaxInt32 {
		capTokens = math.MaxInt32
	}
	switch {
	case cfg.MaxModelLen == 0:
		cfg.MaxModelLen = int(capTokens)
	case cfg.MaxModelLen < 2 || int64(cfg.MaxModelLen) > capTokens:
		return cfg, fmt.Errorf("cannot configure mock engine: max model length %d is outside [2, %d], the KV capacity in tokens", cfg.MaxModelLen, capTokens)
	}
	return cfg, nil
}

// EngineSeed is the seed of the mock engine's own block hashes for model.
// It deliberately differs from radix.NamespaceSeed(model, "", ""), so that
// the engine hashes the router receives are opaque keys, as a real engine's
// are, and the router must re-hash the token ids it is sent.
func EngineSeed(model string) uint64 { return namespacedEngineSeed(model, "", "") }

// namespacedEngineSeed is EngineSeed in the namespace of a LoRA adapter and
// a cache salt.
func namespacedEngineSeed(model, lora, salt string) uint64 {
	return radix.NamespaceSeed("kvfast-mock-engine\x00"+model, lora, salt)
}
