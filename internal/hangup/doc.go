// Package hangup tells a server when a client closed its connection while
// a request on it is still being answered, without a goroutine per
// request.
//
// # Responsibility
//
// fasthttp reads a connection only between requests, so a client that
// leaves while its non-streaming request waits in the admission queue or
// on the engine goes unnoticed until the response is written. A Watcher
// adds the connection's socket to one epoll set for the span of the
// request, asking only for the peer's hang-up (EPOLLRDHUP, EPOLLHUP,
// EPOLLERR), never for readable data: a pipelined next request neither
// wakes it nor is consumed. When the peer hangs up, the request's Target
// is told once, on the Watcher's goroutine. A half-close by a client that
// still waits for its answer counts as leaving, as it does for nginx.
// HangUpAll tells every watched request at once, for a server that cuts
// its connections itself (a closed socket leaves the epoll set unreported).
//
// On systems without epoll New reports ErrUnsupported and a server goes
// without the early notice: a departed client is then found at the write.
//
// # Ownership and concurrency
//
// A Watcher owns its epoll descriptor, a wake-up pipe and, from the first
// Watch until Close, one goroutine. Watch, Registration.Stop and Close are
// safe for concurrent use, and so is HangUpAll, which tells its targets on
// the caller's goroutine, one at a time. A Target must not block: it runs on the one
// goroutine that serves every hang-up.
//
// # Cost
//
// Per watched request: two epoll_ctl calls and the raw-connection handle
// (one small allocation); nothing for requests that are not watched.
package hangup
