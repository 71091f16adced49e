// Package openai is kvfast's reader and writer of the OpenAI API wire
// format, the one place that knows its JSON shapes: what a completions or
// chat-completions request body holds, what a response or stream event
// says about the request's progress, and how an error is answered.
//
// # Responsibility
//
// Parser reads the few fields routing needs from a request body: model,
// prompt or messages, stream, max_tokens / max_completion_tokens, n and
// cache_salt. It validates the whole body as JSON, as strictly as
// encoding/json does, so a body the router accepts is one the engine can
// read; it builds no tree, decodes token ids straight into a
// caller-owned ParsedRequest, and refuses wrong types, text that is not UTF-8 (as the
// OpenAI API does, where encoding/json would read U+FFFD), out-of-range token ids, empty
// prompts, batches and oversized bodies with an Error. ParsePrompt reads a
// prompt value on its own by the same rules, for a reader (the mock engine)
// that decodes the rest of a body by other means.
//
// EventEnd splits an OpenAI server-sent event stream into events and
// ParseEvent classifies one, without allocating, as routing needs it: an
// item (a chunk with choices, and its finish_reason if it is the terminal
// one), the [DONE] sentinel, an error the engine reports, or anything else.
// ParseResponse does the same for a non-streaming response body. Both read
// only the fields they need and validate what they skip, so a garbled
// chunk counts as nothing rather than as progress.
//
// Error is the OpenAI error body, {"error":{"message","type","param",
// "code"}}; every component that answers an OpenAI client with an error
// renders it through Error.AppendJSON.
//
// Chat messages are kept as their raw, validated JSON array
// (ParsedRequest.Messages). Reading roles and content out of it, for a
// tokenizer or a chat template, belongs here, built like the rest on
// internal/jsonscan.
//
// # What it owns
//
// The package-level Err values, which are shared and must not be
// modified. Callers own their ParsedRequest values and pool them (the
// front end keeps one per pooled exchange; Recycle empties one for
// reuse). A ParsedRequest's byte slices alias the parsed body, and an
// Event's FinishReason the scanned event; those bytes must outlive their
// use.
//
// # Concurrency
//
// A Parser is read-only and serves all goroutines. A ParsedRequest belongs
// to one request at a time. EventEnd, ParseEvent and ParseResponse are pure.
// Error values are immutable once built, so rendering one concurrently is
// safe.
package openai
