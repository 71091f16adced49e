package dispatch

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/kvfast/kvfast/internal/redact"
	"github.com/valyala/fasthttp"
)

// A Call does its own round trip over the engine's pooled connections,
// instead of HostClient.Do, so that it knows which connection carries its
// request: Abort can then close that very connection while Do waits for a
// silent engine, which HostClient.Do gives no handle on.

// connOps are the HostClient methods that take and give back a pooled
// connection. fasthttp does not export the connection's type, so the
// methods are bound once through a generic helper and the connection
// travels as an interface value (a pointer in an interface: no allocation).
type connOps struct {
	acquire func(hc *fasthttp.HostClient) (cc any, conn net.Conn, err error)
	release func(hc *fasthttp.HostClient, cc any)
	close   func(hc *fasthttp.HostClient, cc any)
}

var pooledConns = bindConnOps((*fasthttp.HostClient).AcquireConn,
	(*fasthttp.HostClient).ReleaseConn, (*fasthttp.HostClient).CloseConn)

func bindConnOps[C interface{ Conn() net.Conn }](
	acquire func(*fasthttp.HostClient, time.Duration, bool) (C, error),
	release, closeConn func(*fasthttp.HostClient, C),
) connOps {
	return connOps{
		acquire: func(hc *fasthttp.HostClient) (any, net.Conn, error) {
			// No wait for a free connection (MaxConnWaitTimeout is 0):
			// a full pool is ErrNoFreeConns, which lets the request go
			// elsewhere.
			cc, err := acquire(hc, 0, false)
			if err != nil {
				return nil, nil, err
			}
			return cc, cc.Conn(), nil
		},
		release: func(hc *fasthttp.HostClient, cc any) { release(hc, cc.(C)) },
		close:   func(hc *fasthttp.HostClient, cc any) { closeConn(hc, cc.(C)) },
	}
}

// Abort cancels the call because its client is gone. It may be called from
// any goroutine, any number of times, until Release: it closes the engine
// connection the call is using, which wakes a Do, Relay or ReadBody waiting
// on the engine and tells an OpenAI-compatible engine to stop generating.
// The call then fails, or the next Do fails at once, with ErrClientGone,
// and its observer gets that abort as its one terminal call.
func (c *Call) Abort() { c.cancel(ErrClientGone) }

// Cut is Abort for a router that is shutting down: the call fails with
// ErrShuttingDown instead, and a stream's client, still there, is told so
// with an error event before its stream ends.
func (c *Call) Cut() { c.cancel(ErrShuttingDown) }

// FailPrefill is Abort for a call that cannot complete because its
// request's prefill, running elsewhere, failed: an SGLang decode engine
// would otherwise wait for KV that never comes until its bootstrap
// timeout. The call fails with ErrPrefillFailed, which is no fault of
// this call's engine, and a stream's client is told with an error event.
func (c *Call) FailPrefill() { c.cancel(ErrPrefillFailed) }

// cancel closes the call's connection and records why. The first reason
// stays, except that a shutdown's cut overrides any: the client, if still
// there, is owed that reason.
func (c *Call) cancel(kind error) {
	c.cancelMu.Lock()
	if c.cancelled == nil || kind == ErrShuttingDown {
		c.cancelled = kind
	}
	if c.conn != nil {
		_ = c.conn.Close()
	}
	c.cancelMu.Unlock()
}

// cancelKind is the kind of failure a cancelled call reports.
func (c *Call) cancelKind() error {
	c.cancelMu.Lock()
	defer c.cancelMu.Unlock()
	if c.cancelled == nil {
		return ErrClientGone
	}
	return c.cancelled
}

// isCancelled reports whether the call was cancelled (Abort, Cut or
// FailPrefill). Failure paths ask it, so that a read broken by a cancel
// is not blamed on the engine.
func (c *Call) isCancelled() bool {
	c.cancelMu.Lock()
	defer c.cancelMu.Unlock()
	return c.cancelled != nil
}

// roundTrip sends the request to e and reads the response status and
// headers, leaving the body to be streamed from the connection, which the
// call holds until closeStream. A pooled keep-alive connection that the
// engine closed while idle fails before any byte of a response came back,
// and the engine then never saw the request: that is sent again, once, on
// a new connection to the same engine. If the engine itself is gone, that
// attempt fails to connect, which lets the caller pick another worker;
// it is then a brokenThenGone, as the engine most likely died with the
// request in hand rather than being unreachable all along. A connection
// dialled for this request that fails so is not stale: the engine took
// the request and broke the connection, and sending it there again could
// run it twice.
func (c *Call) roundTrip(e *Engine) error {
	var stale error
	for attempt := 1; ; attempt++ {
		retry, err := c.send(e)
		if err == nil {
			return nil
		}
		if retry && attempt == 1 && c.reused && isStale(err) && !c.isCancelled() {
			stale = err
			continue
		}
		if err == io.EOF {
			err = fasthttp.ErrConnectionClosed
		}
		if de := (*dialError)(nil); stale != nil && errors.As(err, &de) {
			return &brokenThenGone{broken: stale, dial: err}
		}
		return err
	}
}

// brokenThenGone is a pooled connection that broke before the response
// began, on an engine that then refused a new one: the engine failed
// (classified ErrEngineFailed), which is not the same as an engine that
// could not be reached at all (ErrConnect). An engine that stopped
// cleanly, closing its idle connections, looks the same.
type brokenThenGone struct{ broken, dial error }

func (e *brokenThenGone) Error() string {
	return e.broken.Error() + ", then " + e.dial.Error()
}

func (e *brokenThenGone) Unwrap() []error { return []error{e.broken, e.dial} }

func isStale(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, fasthttp.ErrConnectionClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// send is one attempt of roundTrip. retry reports a failure after the
// connection was had, which a stale one would cause.
func (c *Call) send(e *Engine) (retry bool, err error) {
	cc, conn, err := c.acquire(e)
	if err != nil {
		return false, err
	}
	c.client, c.cc, c.bodyEOF = e.client, cc, false
	c.reused = false
	ec, _ := conn.(*engineConn)
	if ec != nil {
		// Handed from goroutine to goroutine with the connection, as its
		// other fields are (engineConn).
		c.reused, ec.used = ec.used, true
		ec.forwarding()
	}
	if !c.hold(conn) {
		c.letGo(false)
		return false, ErrClientGone
	}
	if wt := c.pool.cfg.Timeouts.Write; wt > 0 {
		if err := conn.SetWriteDeadline(time.Now().Add(wt)); err != nil {
			c.letGo(false)
			return true, err
		}
	}
	bw := c.client.AcquireWriter(conn)
	err = c.req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	c.client.ReleaseWriter(bw)
	if err != nil {
		c.letGo(false)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			err = ErrWriteTimeout
		}
		return true, err
	}
	c.resp.Reset()
	c.resp.StreamBody = true
	c.resp.Header.DisableNormalizing()
	c.br = c.client.AcquireReader(conn)
	if err := c.resp.Read(c.br); err != nil {
		c.resp.Reset()
		c.letGo(false)
		return true, withoutAnswerBytes(err)
	}
	if ec != nil {
		// A 2xx stream's first bytes are its first token: under the
		// first-byte timeout still, unless they came with the headers.
		ec.gotHeaders(c.resp.StatusCode()/100 == 2 && c.IsEventStream() && c.br.Buffered() == 0)
	}
	if err := c.checkResponse(); err != nil {
		// Its framing cannot be trusted, nor anything after it on the
		// connection.
		_ = c.resp.CloseBodyStream()
		c.resp.Reset()
		c.letGo(false)
		return false, err
	}
	if c.resp.BodyStream() == nil {
		c.bodyEOF = true // a status without a body (204)
	}
	return false, nil
}

// acquire takes one of e's connections for the call. A pooled one that
// has bytes waiting, or that its engine closed, while it sat idle
// (engineConn.unsolicited) is closed and another taken: what is waiting
// was never asked for, and reading it as this request's answer would
// hand the client someone else's. Each one closed so makes room for a
// new one, so the loop ends with a fresh connection at worst.
func (c *Call) acquire(e *Engine) (any, net.Conn, error) {
	for {
		cc, conn, err := pooledConns.acquire(e.client)
		if err != nil {
			return nil, nil, err
		}
		if ec, ok := conn.(*engineConn); !ok || !ec.used || !ec.unsolicited() {
			return cc, conn, nil
		}
		pooledConns.close(e.client, cc)
	}
}

// checkResponse refuses response headers no OpenAI-compatible engine
// sends to the router's requests, so that they are not relayed as the
// engine's answer: a final status outside 2xx, 4xx and 5xx (a 1xx the
// client cannot use, a redirect to the engine's own address, a status
// past 599), or a body encoded with a Content-Encoding the router did
// not ask for, which it could not inspect.
func (c *Call) checkResponse() error {
	switch s := c.resp.StatusCode(); {
	case s < 200 || s > 599 || s >= 300 && s < 400:
		return &responseError{what: "status " + strconv.Itoa(s)}
	}
	if ce := c.resp.Header.ContentEncoding(); len(ce) > 0 && !bytes.EqualFold(ce, identity) {
		return &responseError{what: "Content-Encoding " + strconv.Quote(string(ce))}
	}
	return nil
}

var identity = []byte("identity")

// responseError is a response the router refuses to relay
// (checkResponse): the engine failed.
type responseError struct{ what string }

func (e *responseError) Error() string {
	return "the engine answered with " + e.what + ", which the router does not relay"
}

// hold records conn as the one Abort must close, unless Abort came first.
func (c *Call) hold(conn net.Conn) bool {
	c.cancelMu.Lock()
	defer c.cancelMu.Unlock()
	if c.cancelled != nil {
		return false
	}
	c.conn = conn
	return true
}

// letGo ends the call's use of its connection: back to the engine's pool
// when reuse (the response was read to its end) and nobody aborted the
// call, else closed. The response's body stream must be closed already.
func (c *Call) letGo(reuse bool) {
	if c.cc == nil {
		return
	}
	c.cancelMu.Lock()
	c.conn = nil
	// After Abort the connection is closed, or about to be: never pool it.
	reuse = reuse && c.cancelled == nil
	c.cancelMu.Unlock()
	if c.br != nil {
		// Bytes read past the response's end are bytes it did not
		// frame: the connection no longer knows where the next answer
		// starts.
		reuse = reuse && c.br.Buffered() == 0
		c.client.ReleaseReader(c.br)
		c.br = nil
	}
	if reuse {
		pooledConns.release(c.client, c.cc)
	} else {
		pooledConns.close(c.client, c.cc)
	}
	c.client, c.cc = nil, nil
}

// withoutAnswerBytes is redact.AnswerError with the call's own timeouts
// kept as they are.
func withoutAnswerBytes(err error) error {
	return redact.AnswerError(err, ErrFirstByteTimeout, ErrIdleTimeout)
}
