// Package chat renders an OpenAI chat-completions request into the prompt
// text an engine tokenizes: the model's chat template applied as Hugging
// Face transformers' apply_chat_template(tokenize=False) applies it, to the
// conversation as vLLM prepares it for /v1/chat/completions.
//
// # Responsibility
//
// Compile parses a template (the chat_template of tokenizer_config.json)
// with a Jinja2 implementation of its own, built for Python-exact output:
// transformers' environment (ImmutableSandboxedEnvironment, trim_blocks,
// lstrip_blocks, loop controls, the generation tag) and its globals and
// filters (raise_exception, strftime_now, tojson as json.dumps), and
// Python's semantics for what templates print and compute (str and repr of
// values, int and float arithmetic, string methods, json.dumps' number and
// string formats). It also detects, as vLLM does, whether a template reads
// message content as a string or as a list of parts.
//
// DecodeInput reads what the template sees from a request body, with
// vLLM's normalization: content parts joined with "\n" for string-content
// templates and kept as {"type": ...} parts for the others, tool-call
// arguments decoded from their JSON string, tools dumped as vLLM's request
// model dumps them, chat_template_kwargs filtered to what the template can
// read, and the request flags (add_generation_prompt, continue_final_message,
// add_special_tokens) with vLLM's defaults. Render applies a template to an
// Input. Tokenizing the result is the tokenizer package's job, and caching
// tokenized prefixes the prompt package's.
//
// Every rendering is bounded (Limits): output size, bytes built by
// concatenation, loop iterations and macro recursion, so that no template
// or request can make it run or grow without end; a rendering stopped for
// the bytes it builds wraps ErrTooCostly (the request is fine; the router
// routes it unrendered). Errors the request caused wrap ErrInvalidRequest (the
// router answers 400, as vLLM does); content this package cannot render
// as the engine would (media in a string-content template, a call of a
// method or function it does not implement) wraps ErrUnsupported, for the
// caller to fall back to approximate routing.
//
// # What it owns
//
// Templates and Inputs it returns, both immutable once built; the values a
// rendering builds, which live only for that call; and a pool of rendering
// buffers.
//
// # Concurrency
//
// A Template is read-only and serves all goroutines. An Input is read-only
// after DecodeInput (its per-format view of the conversation is built once,
// under a sync.Once), so several goroutines may render one Input with
// different templates. Render appends to the caller's dst and keeps no
// reference to it.
package chat
