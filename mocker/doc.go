// Package mocker is a simulated LLM inference engine for kvfast's tests,
// benchmarks and demo. It behaves, as seen from the router, like one vLLM
// rank: it serves the OpenAI API, keeps a paged KV cache with prefix
// caching, batches continuously, takes time to prefill and decode, and
// publishes every cache change as a KV event.
//
// # Responsibility
//
//   - Disaggregated serving (disagg.go, Config.Role, SGLangBootstrap): a
//     prefill engine keeps a prompt's KV for a remote decode and names its
//     blocks in vLLM's kv_transfer_params (or keeps them for an SGLang
//     bootstrap room); a decode engine pulls them over HTTP, paying
//     Timing.TransferPerBlock a block, and refuses blocks no longer kept.
//   - Encoder disaggregation (encode.go, Config.Role workers.RoleEncode, ECStore,
//     EncoderCacheItems): an encode engine encodes a chat request's
//     images at Timing.EncodePerItem each, one at a time, unless its
//     encoder cache (LRU, by mm_hash) has them, and saves them to the
//     shared encoder-cache store; the other engines skip encoding the
//     images they find there and pay for the others.
//   - HTTP (fasthttp): POST /v1/completions and /v1/chat/completions,
//     streaming (vLLM-shaped SSE chunks ending in "data: [DONE]") or not;
//     GET /v1/models, GET /health, POST /reset_prefix_cache, and
//     GET /mock/stats (the engine's counters as JSON); and, in vLLM's
//     shapes, POST /v1/completions/render, /v1/chat/completions/render
//     and /tokenize, which answer the prompt ids the engine computes for
//     a request (Config.DisableRender answers the render endpoints with
//     404, as an engine without them does). Every response
//     carries usage with prompt_tokens_details.cached_tokens, the prompt
//     tokens served from the prefix cache; streams carry it in a final
//     chunk when stream_options.include_usage is set, as vLLM does. Bad
//     input gets an OpenAI error body (openai.Error, with vLLM's numeric
//     code).
//   - Prompts: a completions prompt is read by the router's own reader
//     (openai.Parser.ParsePrompt), so both accept the same prompt forms;
//     the rest of a body is decoded with encoding/json. Token-id arrays
//     are used exactly. Text and chat prompts are tokenized by
//     Config.Renderer when the engine has one (a real tokenizer and chat
//     template: package prompt's built-in renderer), which is handed the
//     body and the router's parse of it (openai.Parser.Parse). Without
//     one, a toy tokenizer stands in: text is one token per
//     whitespace-separated word, the id a hash of the word, except the
//     words that spell a special token (TextSystem, ...), which are that
//     token (AppendTextTokens); chat messages go through a fixed template
//     whose text form tokenizes to the same ids (AppendChatTokens). An
//     image_url part becomes ImageTokens placeholder tokens known by the
//     image's hash (ImageHash of its URL), which the render endpoint
//     reports in features and the engine hashes into the blocks it
//     overlaps, as vLLM does (multimodal.go).
//     Replies are words from a fixed list chosen by a hash of the prompt,
//     so they are deterministic, and their ids are the toy tokenizer's
//     either way; a request always generates exactly max_tokens (default
//     16) and finishes with "length".
//   - KV cache: KVBlocks blocks of BlockSize tokens. Full blocks are
//     hashed with radix.AppendBlockHashes' chaining under EngineSeed(model)
//     (deliberately not the router's seed: engine hashes are opaque keys)
//     and deduplicated by hash. A request naming one of Config.LoRAAdapters
//     as its model, or carrying cache_salt, is hashed in that adapter's
//     and salt's namespace, as vLLM's are, and shares blocks only within
//     it; ZMQPublisher reports the namespace as the engine it speaks does,
//     ShmPublisher (whose records cannot name one) leaves such blocks out. Blocks are reference-counted; unreferenced
//     cached blocks stay findable until evicted, least recently used first,
//     and only when no never-cached block is free.
//   - CPU tier (Config.HostBlocks): an evicted block is copied to a bounded
//     host pool (LRU), and a prefix continuing there is loaded back at
//     Timing.HostLoadPerBlock a block instead of computed.
//   - Hybrid models (Config.SlidingWindow): a second KV-cache group of
//     sliding-window attention caches every block and frees it once no
//     running request's window covers it; a prefix is reused only if that
//     group holds the window before its end, as vLLM's hybrid manager
//     decides, so cached_tokens says what the engine really reused.
//   - Scheduling, after vLLM's V1 scheduler: each step has a token budget
//     (MaxBatchedTokens) shared by running sequences (decode one token, or
//     continue a chunked prefill) and then waiting ones (FCFS, from their
//     longest cached prefix, the last prompt token always recomputed). If a
//     running sequence cannot get a block, the most recently scheduled one
//     is preempted: its blocks are released and it recomputes later.
//   - Timing: see Timing. A step's simulated duration grows with the
//     uncached tokens it prefills and, for decode, with batch size and
//     context. Config.Speedup divides simulated time on the wall clock.
//   - Events: Stored for every block entering the prefix cache (or the
//     host pool, or group 1), Removed for every eviction (each naming its
//     Placement: tier and group), Cleared on start and on a cache reset, Load whenever
//     it changes and with every Heartbeat (each HeartbeatInterval). They go
//     to a Publisher: a Recorder in tests, ShmPublisher for a kvfast shm
//     segment (Config.Segment or Config.SegmentHandle), or ZMQPublisher
//     (Config.ZMQ), which speaks vLLM's or SGLang's own ZMQ wire format
//     (PUB socket, ROUTER replay socket and its end marker), so that the
//     router's ZMQ path runs end to end against the mock.
//
// # Ownership
//
// A Core owns the cache, the queues and the simulated clock; it is
// deterministic: the same configuration and the same sequence of Add,
// Abort and Step calls make the same decisions and the same events, which
// is how the tests drive it. An Engine owns one Core, one goroutine that
// drives it, one listener and one fasthttp server. A Request belongs to
// the Core from Add until it finishes or is aborted.
//
// # Concurrency
//
// Core and the Publisher it is given are used by one goroutine only: the
// engine loop (ZMQPublisher's replay goroutine shares only its buffer,
// under a mutex); the Renderer is called from the HTTP handlers,
// concurrently. HTTP handlers hand requests to the loop through a
// mutex-guarded inbox and learn of progress through per-request atomics and
// a one-slot notification channel; they never touch the Core. Engine
// methods are safe for concurrent use. The loop steps back to back while
// there is work, sleeps after each step until simulated time divided by
// Speedup has passed on the wall clock, then delivers the step's tokens.
// When the process cannot keep up by more than 50ms, simulated time is
// stretched rather than caught up in a burst.
//
// # Throughput envelope
//
// A step costs microseconds of CPU (one map probe per cached block looked
// up, one xxhash per block filled, O(batch) bookkeeping) and makes no
// allocation in steady state; token-id arrays in request bodies are
// decoded without reflection, by openai. At Speedup 1 an engine spends far
// less CPU than the time it simulates, so tens of engines share a small
// machine; at high speed-ups the HTTP and JSON work per token, not the
// scheduler, is the limit. BenchmarkMock* measure it (BENCHMARKS.md, "The
// mock engine").
package mocker
