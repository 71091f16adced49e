package fastpath

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/openai"
)

// The edge: what stands between a hostile network and the request path.
// Connections are tagged with the listener they came from (API or admin),
// request bodies are read under a global byte budget, credentials are
// checked, and a connection refused while its client is still sending is
// closed so that the client reads the refusal instead of a reset.

// edgeListener tags every connection it accepts with its listener's role
// and bounds the connections of each client address (connLimiter). The
// bound is kept here rather than by fasthttp's MaxConnsPerIP, which would
// wrap the connection and hide edgeConn from the handlers.
type edgeListener struct {
	net.Listener
	admin bool
	limit *connLimiter
	// tlsRefused counts and logs a connection that began a TLS handshake
	// (edgeConn.Read).
	tlsRefused func(remote net.Addr, admin bool)
}

func (l edgeListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := remoteIP(c)
		if refusal := l.limit.enter(ip); refusal != nil {
			l.limit.refuse(c, refusal)
			continue
		}
		return &edgeConn{Conn: c, admin: l.admin, ip: ip, limit: l.limit, tlsRefused: l.tlsRefused}, nil
	}
}

// connLimiter counts a listener's open connections, in all and per
// client address. The bound in all is kept here too, not by fasthttp's
// Concurrency, which answers a connection over it with a plain-text 503
// of its own that no client parses as an API error.
type connLimiter struct {
	max      int // per address; 0: no bound
	maxTotal int // in all; 0: no bound
	mu       sync.Mutex
	total    int
	perIP    map[netip.Addr]int
	// refused counts the connections refused
	// (kvfast_http_transport_errors_total{reason="too_many_connections"}).
	refused prometheus.Counter
	// lingering bounds the refusals being written and drained at once:
	// past it a refused connection is closed at once, reset or not.
	lingering chan struct{}
}

func (l *connLimiter) init(max, maxTotal int, refused prometheus.Counter) {
	l.max, l.maxTotal, l.perIP, l.refused = max, maxTotal, map[netip.Addr]int{}, refused
	l.lingering = make(chan struct{}, maxRefusalsLingering)
}

// maxRefusalsLingering bounds the goroutines answering refused
// connections, each for at most lingerTime.
const maxRefusalsLingering = 64

// enter admits a connection from ip, or returns the answer that refuses
// it.
func (l *connLimiter) enter(ip netip.Addr) (refusal []byte) {
	if l.max <= 0 && l.maxTotal <= 0 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.maxTotal > 0 && l.total >= l.maxTotal:
		return tooManyConnsInAllAnswer
	case l.max > 0 && l.perIP[ip] >= l.max:
		return tooManyConnsAnswer
	}
	l.total++
	if l.max > 0 {
		l.perIP[ip]++
	}
	return nil
}

func (l *connLimiter) exit(ip netip.Addr) {
	if l.max <= 0 && l.maxTotal <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.max > 0 {
		if l.perIP[ip]--; l.perIP[ip] <= 0 {
			delete(l.perIP, ip)
		}
	}
}

// refuse answers a connection over its address's bound with 429, or over
// the listener's with 503, in the OpenAI error format with Retry-After, as
// other overload refusals are answered, and closes it. The answer is
// written and the connection drained on a goroutine of its own, so that
// accepting goes on: a client
// that writes its whole request before reading (Python's urllib) reads
// the 429 instead of a reset, as a refused body's client does
// (edgeConn.Close). Past maxRefusalsLingering at once, a refusal is
// written without waiting and the connection closed.
func (l *connLimiter) refuse(c net.Conn, answer []byte) {
	l.refused.Inc()
	select {
	case l.lingering <- struct{}{}:
	default:
		_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		_, _ = c.Write(answer)
		_ = c.Close()
		return
	}
	go func() {
		defer func() { <-l.lingering }()
		_ = c.SetDeadline(time.Now().Add(lingerTime))
		if _, err := c.Write(answer); err == nil {
			if tc, ok := c.(interface{ CloseWrite() error }); ok && tc.CloseWrite() == nil {
				_, _ = io.CopyN(io.Discard, c, lingerBytes)
			}
		}
		_ = c.Close()
	}()
}

// tooManyConnsAnswer is the whole response to a connection over its
// address's bound, and tooManyConnsInAllAnswer to one over the listener's.
var (
	tooManyConnsAnswer = refusalAnswer("429 Too Many Requests", &openai.Error{Status: 429, Type: openai.TypeServerError, Code: "too_many_connections",
		Message: "this client address has as many connections open as the router allows (--max-conns-per-ip); reuse them, or retry after the Retry-After interval"})
	tooManyConnsInAllAnswer = refusalAnswer("503 Service Unavailable", &openai.Error{Status: 503, Type: openai.TypeServerError, Code: "too_many_connections",
		Message: "the router has as many client connections open as it allows (--max-conns); retry after the Retry-After interval"})
)

func refusalAnswer(status string, e *openai.Error) []byte {
	body := e.AppendJSON(nil)
	return fmt.Appendf(nil, "HTTP/1.1 %s\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", status, len(body), body)
}

func remoteIP(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	}
	return netip.Addr{} // not TCP: one shared bound
}

// edgeConn is a client connection. A refusal sent before the request body
// was read marks it to linger: closing a socket with unread bytes makes
// the kernel send a reset, which discards the refusal at a client still
// writing (Python's requests and urllib write the whole body before they
// read). Lingering half-closes first, so the client sees the end of the
// response, and discards what it still sends, within lingerBytes and
// lingerTime, before the close.
type edgeConn struct {
	net.Conn
	admin  bool
	linger atomic.Bool
	closed atomic.Bool
	ip     netip.Addr
	limit  *connLimiter
	// begun is set by the first read that returned bytes. Only the
	// goroutine serving the connection reads it.
	begun      bool
	tlsRefused func(remote net.Addr, admin bool)
}

// Read reads from the client. A client whose first byte opens a TLS
// handshake record (a URL of https:// for a plain-HTTP listener, the
// commonest misconfiguration in front of a router) is answered at once
// with a plain 400 and its connection ended: fasthttp would wait the
// whole --header-timeout for a request line a ClientHello never ends,
// and then answer 408. A TLS client cannot read the answer, but reading
// it at all is what makes its library report the well-known symptom
// (OpenSSL's "wrong version number", Go's "first record does not look
// like a TLS handshake"), where a close would read as a network fault.
// No HTTP request begins with this byte.
func (c *edgeConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.begun || n == 0 {
		return n, err
	}
	c.begun = true
	if p[0] != tlsHandshakeRecord {
		return n, err
	}
	if c.tlsRefused != nil {
		c.tlsRefused(c.RemoteAddr(), c.admin)
	}
	_ = c.SetWriteDeadline(time.Now().Add(lingerTime))
	_, _ = c.Write(tlsOnPlainHTTPAnswer)
	// The ClientHello is unread: a plain close would reset the
	// connection and could drop the answer at the client.
	c.linger.Store(true)
	return 0, io.EOF
}

// tlsHandshakeRecord is the content type byte of a TLS handshake record,
// the first byte a TLS client sends (RFC 8446, section 5.1).
const tlsHandshakeRecord = 0x16

// tlsOnPlainHTTPAnswer is the whole response to a connection that began a
// TLS handshake.
var tlsOnPlainHTTPAnswer = func() []byte {
	body := errTLSOnPlainHTTP.AppendJSON(nil)
	return fmt.Appendf(nil, "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}()

// NetConn returns the accepted connection, so that the hang-up watcher
// (internal/hangup) can poll its socket.
func (c *edgeConn) NetConn() net.Conn { return c.Conn }

// lingerBytes and lingerTime bound what a lingering close reads and waits
// for: enough for a client to finish writing a body a few times the
// largest one accepted, not enough to hold a connection for long.
const (
	lingerBytes = 64 << 20
	lingerTime  = 5 * time.Second
)

func (c *edgeConn) Close() error {
	if c.closed.Swap(true) {
		return c.Conn.Close() // net.Conn's own answer to a second Close
	}
	defer c.limit.exit(c.ip)
	if c.linger.Swap(false) {
		if tc, ok := c.Conn.(interface{ CloseWrite() error }); ok && tc.CloseWrite() == nil {
			_ = c.Conn.SetReadDeadline(time.Now().Add(lingerTime))
			_, _ = io.CopyN(io.Discard, c.Conn, lingerBytes)
		}
	}
	return c.Conn.Close()
}

// lingerOnClose closes ctx's connection after this response, gracefully:
// for refusals sent while the client may still be writing its body.
func lingerOnClose(ctx *fasthttp.RequestCtx) {
	ctx.SetConnectionClose()
	if c, ok := ctx.Conn().(*edgeConn); ok {
		c.linger.Store(true)
	}
}

// fromAdminListener says whether ctx arrived on the admin listener.
func fromAdminListener(ctx *fasthttp.RequestCtx) bool {
	c, ok := ctx.Conn().(*edgeConn)
	return ok && c.admin
}

// bodyBudget bounds the request body bytes held in memory at once, over
// every request. A body is charged its buffer's capacity from before it is
// read until its request ends (a stream's body stays forwarded, and
// referenced, until the stream ends).
type bodyBudget struct {
	limit int64
	used  atomic.Int64
	// returnMemory's state: when it last ran, and whether it is due.
	lastReturn    atomic.Int64 // unix nanoseconds
	returnPending atomic.Bool
}

// reserve charges n bytes, or reports that they do not fit.
func (b *bodyBudget) reserve(n int64) bool {
	for {
		used := b.used.Load()
		if used+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(used, used+n) {
			return true
		}
	}
}

func (b *bodyBudget) release(n int64) { b.used.Add(-n) }

// maxPooledBody keeps a pooled exchange from pinning a large body buffer:
// bigger ones are dropped when their request ends. A pooled buffer is
// reused without a charge: the pool holds at most one per exchange, and
// exchanges are bounded by the connections.
const maxPooledBody = 64 << 10

// readBody reads the request body into ex.buf (ex.body) under the body
// budget. The server streams request bodies (fasthttp reads only a small
// prefix before the handler), so a body over the size limit is refused
// from its headers, before it is read. The budget is charged as the body
// arrives, in steps, never for bytes a client has only declared:
// sixteen connections declaring 16 MiB and sending one byte each would
// otherwise hold the whole default budget, refusing every other body,
// until the read timeout cut them. A declared body at most eagerBodyBytes
// long takes its buffer at once. The charge stays on ex until cleanup.
func (s *Server) readBody(ctx *fasthttp.RequestCtx, ex *exchange) *openai.Error {
	r := ctx.RequestBodyStream()
	if r == nil {
		// Not streamed (a RequestCtx built in process): already in memory.
		ex.body = ctx.PostBody()
		if len(ex.body) > s.cfg.MaxBodyBytes {
			return s.errBodyTooLarge
		}
		return nil
	}
	declared := ctx.Request.Header.ContentLength()
	if declared > s.cfg.MaxBodyBytes {
		lingerOnClose(ctx)
		return s.errBodyTooLarge
	}
	// Growth stops at the declared length, or (chunked) one byte over the
	// limit, which detects a body past it.
	ceiling := s.cfg.MaxBodyBytes + 1
	if declared >= 0 {
		ceiling = declared
	}
	buf := ex.buf[:0]
	for declared < 0 || len(buf) < declared {
		if len(buf) == cap(buf) {
			want := min(max(bodyGrowth*cap(buf), eagerBodyBytes), ceiling)
			if want <= len(buf) {
				lingerOnClose(ctx)
				return s.errBodyTooLarge
			}
			ex.buf = buf
			if err := ex.growBody(want); err != nil {
				lingerOnClose(ctx)
				return err
			}
			buf = ex.buf[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):min(cap(buf), ceiling)])
		buf = buf[:len(buf)+n]
		ex.buf = buf
		if len(buf) > s.cfg.MaxBodyBytes {
			lingerOnClose(ctx)
			return s.errBodyTooLarge
		}
		if err == io.EOF && (declared < 0 || len(buf) == declared) {
			break
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF // shorter than declared
		}
		if err != nil {
			return bodyReadFailed(ctx, err)
		}
	}
	ex.body = buf
	return nil
}

// eagerBodyBytes is the first step of a body's buffer: a body this short
// (a 1K-token prompt is about 7.5 KB of JSON) is read into one buffer,
// which the exchange's pool keeps (maxPooledBody). Past it the buffer
// grows bodyGrowth-fold each time it fills: a client holds at most that
// many times the bytes it has sent, and the buffers a body outgrows,
// garbage the budget does not see (the soft memory limit does), add up to
// a third of the body, where doubling would leave as much as the body.
const (
	eagerBodyBytes = 64 << 10
	bodyGrowth     = 4
)

// bodyReadFailed closes the connection of a body that could not be read:
// what is left of it on the wire cannot be told from a next request.
func bodyReadFailed(ctx *fasthttp.RequestCtx, err error) *openai.Error {
	ctx.SetConnectionClose()
	if isTimeout(err) {
		return errBodyTimeout
	}
	return errUnreadableBody
}

// growBody makes ex.buf's capacity at least n, charging the budget for
// what it adds; its contents are kept.
func (ex *exchange) growBody(n int) *openai.Error {
	if n <= cap(ex.buf) {
		return nil
	}
	grow := int64(n - cap(ex.buf))
	if !ex.s.budget.reserve(grow) {
		return errBodyBudget
	}
	ex.charged += grow
	b := make([]byte, len(ex.buf), n)
	copy(b, ex.buf)
	ex.buf = b
	return nil
}

// releaseBody ends ex's charge against the budget and drops a body buffer
// too large to pool.
func (ex *exchange) releaseBody() {
	if ex.charged > 0 {
		ex.s.budget.release(ex.charged)
		ex.charged = 0
	}
	if cap(ex.buf) > maxPooledBody {
		large := cap(ex.buf) >= returnAfterBytes
		ex.buf = nil
		if large {
			ex.s.budget.returnMemory()
		}
	}
	ex.buf, ex.body = ex.buf[:0], nil
}

// returnAfterBytes is the body size whose end may return memory to the
// system, and returnEvery how often at most.
const (
	returnAfterBytes = 1 << 20
	returnEvery      = 10 * time.Second
)

// returnMemory hands the memory of finished large bodies back to the
// system once none is in flight. Left to itself the runtime keeps it: an
// idle router runs no collection for two minutes, and until one runs the
// dead bodies count as in use. A timer does it, at most once every
// returnEvery and at least returnEvery after the last time, so that no
// request waits for the collection and a flood does not run one per body;
// a timer already pending covers later calls.
func (b *bodyBudget) returnMemory() {
	if b.used.Load() != 0 || !b.returnPending.CompareAndSwap(false, true) {
		return // the last body of those in flight calls again
	}
	wait := time.Duration(b.lastReturn.Load() + int64(returnEvery) - time.Now().UnixNano())
	time.AfterFunc(max(wait, 0), func() {
		b.returnPending.Store(false)
		if b.used.Load() != 0 {
			return // more bodies arrived: the last of them calls again
		}
		b.lastReturn.Store(time.Now().UnixNano())
		debug.FreeOSMemory()
	})
}

// bearer returns the token of an "Authorization: Bearer TOKEN" header, or
// nil.
func bearer(ctx *fasthttp.RequestCtx) []byte {
	v := ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)
	const scheme = "bearer "
	if len(v) <= len(scheme) || !bytes.EqualFold(v[:len(scheme)], []byte(scheme)) {
		return nil
	}
	return bytes.TrimSpace(v[len(scheme):])
}

// keyDigest is the SHA-256 digest of an API key or admin token.
type keyDigest = [sha256.Size]byte

// anyKeyMatches compares tok's digest with every key's in constant time,
// so that neither the position of a mismatch, nor which key matched, nor
// a key's length shows in the time taken.
func anyKeyMatches(tok []byte, keys []keyDigest) bool {
	if len(tok) == 0 {
		return false
	}
	d := sha256.Sum256(tok)
	match := 0
	for i := range keys {
		match |= subtle.ConstantTimeCompare(d[:], keys[i][:])
	}
	return match == 1
}

// hasObsFold reports a header line continued on the next (obsolete line
// folding). RFC 9112 lets a server refuse it or unfold it; unfolding is
// how one header is read differently by two parsers, e.g. a folded
// Transfer-Encoding that a proxy ignores and fasthttp reads as chunked,
// so the router refuses it.
func hasObsFold(raw []byte) bool {
	return bytes.Contains(raw, []byte("\n ")) || bytes.Contains(raw, []byte("\n\t"))
}

var (
	errBodyBudget = &openai.Error{Status: 503, Type: openai.TypeServerError, Code: "body_budget_exceeded",
		Message: "the router is holding as many request bodies as its memory budget allows; retry after the Retry-After interval"}
	errUnreadableBody = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "bad_request",
		Message: "the request body could not be read in full"}
	errBodyTimeout = &openai.Error{Status: 408, Type: openai.TypeInvalidRequest, Code: "request_timeout",
		Message: "the request body was not received within the read timeout"}
	errTLSOnPlainHTTP = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "tls_on_plain_http",
		Message: "the router serves plain HTTP on this port, and the client began a TLS handshake: use an http:// URL, or terminate TLS in front of the router"}
	errObsFold = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "bad_request",
		Message: "folded header lines are not accepted"}
	errUnauthorized = &openai.Error{Status: 401, Type: openai.TypeInvalidRequest, Code: "invalid_api_key",
		Message: "missing or incorrect API key; send it as Authorization: Bearer KEY"}
	errAdminUnauthorized = &openai.Error{Status: 401, Type: openai.TypeInvalidRequest, Code: "invalid_admin_token",
		Message: "missing or incorrect admin token; send it as Authorization: Bearer TOKEN"}
)

// credentialMarks start a credential in a message: what follows each is
// replaced by redacted, up to the line's end for a header's value (a
// scheme and its credential, "Bearer KEY", are one value), else up to the
// next space, quote or separator.
var credentialMarks = []struct {
	mark        string
	headerValue bool
}{{"authorization:", true}, {"api-key:", true}, {"bearer ", false}, {"api_key=", false}, {"api-key=", false}, {"token=", false}}

const redacted = "[REDACTED]"

// redact hides credentials in a log message quoting request bytes, as
// fasthttp's reports may. The request path does not call it: it logs no
// request bytes.
func redact(msg string) string {
	lower := []byte(msg)
	for i, c := range lower {
		if 'A' <= c && c <= 'Z' {
			lower[i] = c + 'a' - 'A'
		}
	}
	var out []byte
	last := 0
	for i := 0; i < len(lower); i++ {
		for _, m := range credentialMarks {
			if !bytes.HasPrefix(lower[i:], []byte(m.mark)) {
				continue
			}
			start := i + len(m.mark)
			for start < len(msg) && msg[start] == ' ' {
				start++
			}
			end := start
			for end < len(msg) && !isCredentialEnd(msg[end], m.headerValue) {
				end++
			}
			if end == start {
				continue
			}
			out = append(out, msg[last:start]...)
			out = append(out, redacted...)
			last, i = end, end-1
			break
		}
	}
	if out == nil {
		return msg
	}
	return string(append(out, msg[last:]...))
}

func isCredentialEnd(c byte, headerValue bool) bool {
	switch c {
	case '\r', '\n', '"', '\'', '\\':
		return true
	case ' ', '\t', ',', ';', '&':
		return !headerValue
	}
	return false
}
