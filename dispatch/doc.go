// Package dispatch is kvfast's engine-facing side: it forwards a routed
// request to the chosen engine, relays the response to the client, cancels
// the engine's work when the client leaves, and checks engine health.
//
// # Responsibility
//
// A Call sends the request body unchanged to one engine over a pooled
// keep-alive connection and relays the answer byte for byte. It does the
// round trip itself with fasthttp's exported pieces (HostClient.AcquireConn,
// Request.Write, Response.Read with a streamed body, ReleaseConn or
// CloseConn), not HostClient.Do, so that it knows the connection carrying
// its request from the moment it is sent until the body is closed: Abort,
// from any goroutine, closes that connection, and a Do waiting for the
// headers of a silent engine, or a Relay or ReadBody waiting for its next
// byte, returns at once with ErrClientGone. For an
// OpenAI event stream it inspects each event on the way, without
// allocating (splitting and classifying events is package openai's), and
// tells an Observer what the request lifecycle needs: the
// engine answered (OnDispatched), the first token (OnFirstToken), each item
// (OnItem), and exactly one end, OnComplete with the finish_reason before
// the terminal item reaches the client, or OnAbort with the reason. The
// guard adapts itself to Observer; the server calls AwaitStream before it
// answers (so that a stream with no byte after its headers is a failed
// attempt, not a 200), then Relay from the body stream writer it gives
// fasthttp.
//
// Failures are classified so that the caller can act on them:
//   - ErrConnect, ErrConnsExhausted: no connection could be made
//     (refused, connect timeout), or every connection the router may open
//     to the engine (Config.MaxConnsPerEngine) carries a request; the
//     latter is the router's bound, no verdict on the engine. Nothing
//     reached the engine or the client, so the request may be sent to
//     another worker (IsRetryable, which also accepts ErrEngineFailed and
//     a 5xx or 429 given up with Discard, as long as the caller has sent
//     the client nothing). A pooled connection the engine closed while
//     idle is retried once on the same engine before any of this is
//     decided.
//   - ErrWriteTimeout, ErrFirstByteTimeout, ErrIdleTimeout: the engine
//     stopped reading the request, took too long to send the response's
//     headers, or was silent too long between two reads of a started
//     response.
//   - ErrResponseTooLarge, ErrResponseBudget: a non-streaming answer (or
//     one event of a stream) over Config.MaxResponseBodySize, or one that
//     would take the answers held at once past Config.ResponseBudgetBytes
//     (the router's overload).
//   - ErrEngineFailed, ErrTruncated, ErrEngineError: the engine broke off,
//     ended a stream early, or reported an error. A response the router
//     will not relay (a final status outside 2xx, 4xx and 5xx, a
//     Content-Encoding it did not ask for; a 2xx that is not the shape
//     asked for: RequireObject, RefuseUnaskedStream, RefuseUnaskedObject)
//     is ErrEngineFailed too, and a pooled connection holding bytes no
//     request asked for is closed rather than reused (roundtrip.go).
//   - ErrEngineOverloaded: the engine answered 429 (Call.Failed,
//     Call.Discard): retried elsewhere, but no verdict for passive
//     health (load, not sickness). The pool remembers for how long its
//     Retry-After asked not to be sent requests (Pool.Throttled, bounded
//     by MaxThrottle), for the caller to send them elsewhere meanwhile.
//     A stream that opens with an error event the engine codes 5xx may
//     be given up too (Call.OpensWithServerError,
//     Call.RefuseFailedStart), its verdict held as a 5xx's is.
//   - ErrEngineAuth: the engine refused the router's own engine key with
//     a 401 or 403 (Call.Failed, Call.Discard): retried elsewhere like an
//     engine error, and answered as a 502 of its own, never relayed as a
//     401 the client would take for a refusal of its key.
//   - ErrClientGone: the call was aborted (Abort), or a write to the client
//     failed; the engine connection is closed, which is how an
//     OpenAI-compatible engine (vLLM, SGLang) learns to abort. It is never
//     held against the engine, nor retried.
//
// A stream that fails after it started gets an OpenAI error event
// (data: {"error":{…}}, an openai.Error) unless its terminal item was
// already sent, nor when its client left. Without Abort a departed client
// is noticed only at the next write, so the server that can tell (package
// fastpath, through internal/hangup) aborts the call when its client
// hangs up, and while the engine is silent (queueing, prefill, a long
// non-streaming generation) nothing waits for a timeout. An aborted
// call's connection is closed, never pooled again.
//
// Every attempt is also a verdict on its engine (passive health,
// OutlierConfig): consecutive failures or a failure rate over a window
// eject the engine for a backoff that grows with each ejection in a row,
// with at most MaxEjectedPercent of each ejection group's engines (the
// router's groups are roles: Engine.SetEjectionGroup) out at once. A 5xx of a
// request whose caller retries it elsewhere waits in the request's
// Attempts: it counts when another engine serves the request, and at the
// request's end only against an engine that served nothing else within
// the window, so that a request every engine fails (its own fault, as
// far as the router can tell) does not eject healthy engines. An ejection
// reaches the selector the way active-health flips do, through
// HealthConfig.OnChange, which reports one routable bit (healthy and not
// ejected), so a passing /health cannot undo an ejection.
//
// # What it owns
//
// Per worker slot, one Engine: a fasthttp.HostClient whose connections
// enforce the first-byte and idle timeouts themselves (fasthttp's own read
// timeout would cut long streams), its last health verdict, and a goroutine
// running the active health checks, its outlier record (counters, the
// ejection state and its timer), and the set of its open connections, so
// that Abandon, for an engine the router learned is gone, can fail its
// requests at once instead of at their timeouts. The Pool pools Calls
// with their relay buffers. It does not own the health that selection filters by: each
// flip goes to HealthConfig.OnChange, which the server points at the
// scheduler.
//
// # Concurrency
//
// Pool methods are safe for concurrent use; Engine is a single atomic
// load. Add, Remove and Close are serialised. A Call belongs to one
// goroutine at a time: the handler's until it hands the call to a body
// stream writer, then the stream's. Abort is the exception: any goroutine
// may call it until Release, and a mutex per call orders it with the
// call's taking and letting go of its connection, so that it never closes
// a connection already back in the pool. Observer calls for one Call never
// overlap. Health flips of one engine are serialised, and none is
// reported after Remove.
//
// # Throughput envelope
//
// Relaying a stream allocates nothing per event (the allocation tests
// assert it). BENCHMARKS.md records openai's BenchmarkSSEScan (the event
// scanner) and BenchmarkProxyOverhead (package benchmarks: the latency a
// forwarded request adds); BenchmarkRelay times a relayed stream alone.
package dispatch
