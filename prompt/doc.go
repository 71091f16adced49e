// Package prompt turns an OpenAI text or chat request into the token ids the
// engine will see, per model, so that such requests route on exact token
// blocks like token-id prompts do. It owns the tokenizer configuration of
// a router: which model is tokenized how.
//
// # Responsibility
//
// A Renderer produces one request's prompt token ids. There are two kinds:
//
//   - Remote asks the engine itself, over HTTP, for each request: vLLM's
//     POST /v1/chat/completions/render and /v1/completions/render, which
//     take the client's body unchanged and return the ids the engine would
//     compute, and, on engines without them (older vLLM, SGLang), POST
//     /tokenize with a body built from the request's prompt-shaping
//     fields. It is exact by construction and costs a round trip; it is
//     bounded by a timeout and a response size, validates every id, and on
//     any failure returns an error so that the caller routes the request
//     approximately. Which endpoint an engine has is probed on first use
//     and remembered per engine.
//     From the render endpoint it also learns a prompt's multimodal
//     inputs (MultimodalRenderer, Multimodal: each image's mm_hash and
//     placeholder range, bounded in count and length, refused unless
//     every hash has one range inside the prompt), which the caller
//     folds into the blocks' hashes as the engine does
//     (radix.AppendBlockHashesMM); /tokenize says nothing of them.
//     HasMultimodalParts tells a chat request with images, audio or
//     video, which without them routes approximately.
//   - Media reads a chat request's multimodal content parts from the body
//     itself, for the encoder stage: each part's raw JSON and a content
//     identity (a hash of a data URL's decoded bytes, or of the URL; the
//     router downloads nothing), bounded by MediaLimits, without
//     allocating.
//   - Builtin renders the chat template (package chat) and tokenizes
//     (package tokenizer) in process, from the model's tokenizer.json and
//     tokenizer_config.json, with the PrefixCache below.
//
// The Registry holds the configuration (--tokenizer: MODEL=DIR,
// MODEL=hf:ORG/NAME, MODEL=remote, auto; Spec, ParseSpec), resolves
// tokenizer files in a directory or the local Hugging Face cache
// (ResolveFiles), hands each served model its Renderer (or none, logged
// once), and reports every model's mode and outcome counters (Status) for
// /admin/workers and /metrics.
//
// PrefixCache is the built-in path's cache of tokenized prefixes: a chat
// request is encoded in segments cut where the tokenizer cannot merge
// across (right after an added special token of the rendered template), and
// the segments of a prefix seen before are copied rather than encoded, so
// that a new turn of a conversation tokenizes only its tail. It is bounded
// in bytes, evicts the least recently used segment, and counts hits,
// misses, bytes and evictions.
//
// # Ownership
//
// The node owns the Registry and gives it an Engines, its view of which
// healthy worker serves a model; the front end (package fastpath) borrows
// each model's Renderer and calls it on the request path. A Remote owns
// one fasthttp connection pool per engine it has asked (at most one per
// worker slot) and its pooled call buffers. Renderers append to the
// caller's buffer; they keep no reference to the request body or the
// returned ids after Tokens returns.
//
// # Concurrency
//
// Renderers and the PrefixCache are safe for concurrent use; a Remote's
// steady state takes no lock and allocates nothing (TestRemoteAllocations).
// Registry methods are safe from any goroutine; Renderer is called when
// the worker set changes, Status at scrape time, and neither is on the
// request path.
package prompt
