// Package fastpath is kvfast's HTTP front end: the OpenAI-compatible
// endpoints, the route-only endpoint, metrics, health and the admin view.
//
// # Responsibility
//
// It turns a client request into a routing decision and hands it on: parse
// the body (openai.Parser), render a text or chat prompt into the engine's
// token ids when its model has a renderer (package prompt), hash the
// prompt (radix's block hashes for token ids, its text-chunk hashes for
// text and chat prompts of models without a renderer), look up every
// worker's cached prefix (the event-fed index, or the approximate index of
// the router's own decisions), ask sched for a worker, put the booking into
// a guard, and let dispatch forward the unchanged body and relay the
// response.
//
// A request's life in the server (exchange.go): the pooled exchange owns
// every per-request buffer and is itself the dispatch.Observer, so engine
// progress becomes guard transitions (Dispatched, first token, items,
// Completed or Aborted) without a closure per request. The booking moves
// into the guard before the engine is called; from then on every path,
// including a panic in the handler and a stream whose client vanished,
// releases it exactly once. Until a byte of the answer reaches the client,
// a refused or broken engine connection, a full connection pool, a 5xx
// or 429, or a stream opening with a 5xx error event re-routes to another
// worker (dispatch.IsRetryable), up to MaxRetries times; each attempt's
// guard is released before the next is booked. An engine that answered
// 429 is left off later requests' allow-lists for the time its
// Retry-After asked (dispatch.Pool.Throttled), while another worker can
// take them and no pin or session binds them to it; engines that
// generate only (a prefill engine's or an encoder's 429 is retried by its
// stage). While a request is served
// its client connection is watched for a hang-up (internal/hangup): a
// client that leaves while queued gives up its queue slot, and one that
// leaves while its answer is awaited or relayed has its guard aborted,
// which frees its booking at once, and its engine call aborted
// (dispatch.Call.Abort), which closes the engine connection so that the
// engine stops generating and the handler or stream returns. Shutdown's
// cut, after its drain deadline, tells every watched request the same
// (hangup.Watcher.HangUpAll), so requests waiting on a silent engine do
// not outlive it. The watcher's one goroutine is the only long-lived one
// the front end starts; Shutdown stops it.
//
// Sticky sessions (session.go): a request naming its session in
// HeaderSession is pinned to the worker its session is bound to, in the
// bindings table shared through the segment (shm.Bindings), while that
// worker is eligible; transient overload does not move it. SGLang's
// session_control opens the engine session before dispatch and closes it
// from an action deferred on the guard, after the booking is freed; those
// calls run on short-lived goroutines of their own.
//
// With Config.Disagg on (disagg.go), a request runs in two stages: a
// decode worker is chosen first, conditional disaggregation decides
// whether it prefills the prompt itself, and otherwise a prefill worker
// computes it in the engines' protocol (vLLM's kv_transfer_params, or
// SGLang's bootstrap room, whose prefill request is sent from a goroutine
// of its own that cleanup joins); each stage has its own guard, and the
// decode stage is relayed as any request is.
//
// With encode workers present (encode.go), a chat request's images, audio
// and video (prompt.Media) first go to encoders, one guard and engine call
// per item, chosen by encoder-cache affinity (encoderAffinity, bounded
// per encoder and in time, under its own mutex) then load, sent from one
// goroutine each that the handler joins before the request goes on; a
// hang-up aborts every item's guard and call, and cleanup releases each
// exactly once.
//
// Tracing (trace.go) is off unless Deps.Tracer is set (--otlp-endpoint).
// Off, the client's W3C traceparent and tracestate are forwarded to the
// engine as they came, and each stage costs one nil check. On, the
// exchange starts the request's span (a child of the client's
// traceparent) and records route (tokenize, hash, lookup, select, queue)
// from the clock readings the metrics take anyway, one client span per
// engine call (dispatch, prefill, encode) whose context goes to that
// engine as its traceparent, and the first token; cleanup ends them.
// Spans of calls made on other goroutines (the encoders', SGLang's
// prefill) are ended there.
//
// The edge (edge.go) stands between the network and that path. Every
// connection comes through edgeListener, which tags it with its listener
// (API or admin: Serve and ServeAdmin) and bounds each client address's
// connections; a connection whose first byte opens a TLS handshake is
// answered 400 at once (the listeners serve plain HTTP), where it would
// wait the header timeout. fasthttp's read timeout is the header timeout, and a
// header-received hook gives the body its own (Config.ReadTimeout).
// Request bodies are streamed: the exchange reads its body itself,
// charging the server's body budget as the bytes arrive, so a body too
// large is refused from its header and one not fitting as soon as it
// does not, and a refusal sent while the client
// is still writing marks the connection to linger (half-close, bounded
// drain) so that the client reads it. Routes match fasthttp's normalised
// path; /admin/... and /metrics are served only on the admin listener
// (or on the API listener when Config.AdminOnAPI), behind the admin token
// if set, and the OpenAI endpoints behind the API keys if set. The engine
// is sent the routed path, never the client's spelling. No request bytes
// are logged: transport errors log method, path, size and reason, and
// fasthttp's own reports lose their quoted bytes and any credential.
//
// The OpenAI wire format is package openai's: parsing reads only what
// selection needs, validates the whole body, and refuses a bad one with an
// openai.Error, which is also how fastpath renders its own refusals
// (unknown model, bad routing headers, overload).
//
// # What it owns
//
// The HTTP listeners and their limits, the per-address connection counts,
// the body budget, the recent queue waits that Retry-After is derived
// from, the pool of exchanges (and the body, parsed request and hash
// buffers inside them), the guard pool, the
// model table (namespace seed and renderer per model, and per LoRA
// adapter the node learned from the engines' model lists: the workers that
// list it, its base model's renderer, its own namespace), and the Prometheus
// registry. It borrows the index, the approximate index, the scheduler, the
// engine pool and the renderers from package node, which owns them, their
// background work and the worker
// set, and which calls WorkersChanged after membership changes. The node's
// Snapshot (State) is the one source of /admin/workers and of the
// per-worker gauges in /metrics.
//
// # Concurrency
//
// The request path reads the worker set, the model table and the index
// without locks; a stream is relayed on fasthttp's stream-writer
// goroutine, which takes the exchange over from the handler. Serve runs
// until Shutdown, which drains in-flight requests and streams until its
// context ends and then cuts them; it reports ErrNotDrained when some are
// still running after the cut, so that the node keeps what they read
// mapped. Every handler and stream is counted from entry to end for that,
// and once a Shutdown has drained them a request still arriving on a
// connection fasthttp left open is refused with 503, not handled.
// Besides the hang-up watcher's goroutine, the front end's background
// work is small: an HTTP/1.0 stream is relayed on the goroutine fasthttp
// gives a taken-over connection, and when the last large body in flight
// ends, a timer returns memory to the system, at most every 10 s. The
// connection counts are under a mutex taken once per accept and close;
// the body budget and the queue-wait average are atomics.
//
// # Performance
//
// A routed request allocates nothing (TestRouteOnlyAllocations), and
// neither does a refusal, the 429 of a full queue included
// (TestRejectedRequestAllocations, TestOverloadAllocations).
// BenchmarkRouteStages times a route-only request's stages in process,
// which scripts/bench-issue15.sh frontend sets beside the router's CPU
// per request under wrk; BenchmarkRouteOnly measures a route-only
// request over loopback and benchmarks.BenchmarkProxyOverhead the
// latency forwarding adds; the figures are in BENCHMARKS.md.
package fastpath
