// Package replay drives a running kvfast router with a recorded workload and
// measures what users would feel: time to first token, inter-token latency,
// end-to-end latency, throughput, and how much of each prompt the engines
// already had cached, set against the best any router could do.
//
// # Responsibility
//
// It reads Mooncake-format traces (JSONL records of timestamp in ms,
// input_length, output_length and hash_ids, each hash id standing for a
// block of 512 tokens unless told otherwise), turns every record into a
// token-id prompt replayed through the router's /v1/completions, or (the
// chat workload) into a conversation replayed through its
// /v1/chat/completions, as streaming requests, and reports on the
// responses.
//
// # What it owns
//
//   - Trace loading and validation (LoadTrace, ReadTrace), and
//     a trimmed copy of the shipped trace compiled in (EmbeddedTrace).
//   - The infinite-cache bound (Trace.HitBound): the fraction of prompt
//     tokens in blocks whose whole chain of hash ids an earlier request
//     already had. On the shipped trace it is 0.640 of blocks and 0.651 of
//     tokens; the token figure is the one a measured hit rate is set
//     against, since engines report cached tokens.
//   - The pooled-LRU reference (Trace.PooledLRU): the hit rate of one LRU
//     cache of all engines' KV blocks together on the same prompts,
//     simulated exactly as the mock engines cache (prefix-contiguous
//     hits, the last token always computed, a prompt's tail evicted
//     before its head), for capacities below the working set where the
//     infinite-cache bound is out of reach; and the working set itself
//     (Trace.WorkingSetBlocks).
//   - Generated traces (Generate, GeneratedTraces): multi-turn sessions
//     over shared system prompts, "low" and "high" reuse, deterministic
//     from a seed.
//   - Token synthesis (TokenSynth): each hash id maps to a fixed
//     pseudo-random block of token ids keyed by (seed, hash id), so equal
//     hash-id prefixes yield equal token prefixes. Blocks can be shrunk
//     (BlockTokens) to replay the trace's sharing structure with small
//     prompts on a small machine.
//   - Text synthesis (ChatSynth), for the chat workload: each hash id maps
//     to a fixed stretch of words keyed the same way, and a record becomes
//     a conversation whose system prompt is its first hash id, whose
//     earlier turns (a user message and a short assistant reply per hash
//     id) are the prefix it shares with other records, and whose last hash
//     id is the new user turn. The engines' tokenizer and chat template
//     decide the tokens, so the bound, counted in hash ids, holds only
//     approximately: with a tokenizer that spends one token per word (the
//     demo's), each shared hash id stands for its words plus the template
//     tokens of its two messages and the reply.
//   - Image synthesis (ImageSynth, ImageSet), for the multimodal
//     workload: the chat workload's conversations with an image_url part
//     in some user turns, drawn from a set of Zipf popularity, keyed by
//     the turn's hash id as its text is.
//   - The replay client (Run): open loop at trace time divided by a
//     speed-up, or closed loop at a fixed concurrency, over a pooled
//     net/http client. TTFT is the time from sending to the first SSE event
//     that carries output; ITL is every gap between such events. The
//     measured hit rate sums usage.prompt_tokens_details.cached_tokens over
//     usage.prompt_tokens from the final usage chunk (requested with
//     stream_options.include_usage). The worker named in the
//     x-kvfast-worker response header, if any, is recorded per request.
//   - Statistics (Result.Summary, Percentile) and reports: a text summary,
//     JSON (Summary.MarshalJSON), a side-by-side table (WriteTable) and a
//     self-contained HTML page with inline SVG charts (WriteHTML), with
//     capacity sweeps (hit rate against capacity) and tables of the
//     caller's own when asked (WriteHTMLWith).
//
// net/http rather than fasthttp sends the requests: reading a response
// body while it streams is first-class there, and the client's few
// microseconds per request vanish next to an engine's milliseconds.
//
// # Concurrency
//
// A loaded Trace is immutable and may be shared by concurrent runs. Run
// uses one goroutine per in-flight request; each RequestResult has a single
// writer, and the shared ITL slice is appended under a mutex once per
// request. TokenSynth is a value and safe to share. Reports only read.
//
// # Performance
//
// Prompts are synthesised and encoded into reused buffers without
// allocation (the allocation tests assert it), and each output event costs
// one small JSON decode, so a replay is paced by the router and engines,
// not by this client; Summary.MaxSendLag shows when that stops being true.
package replay
