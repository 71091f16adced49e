package feed

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// zmq4 allocates each frame it receives at the size the frame's ZMTP
// header claims, before reading a byte of it: ten bytes from whatever
// listens on an engine's port could make it allocate exabytes, which
// panics on a goroutine the router cannot recover, or gigabytes, which
// it cannot afford. So the subscriber dials through transports of its
// own that read ZMTP framing as the bytes pass and break the connection
// at a header claiming more than maxZMQFrameBytes, before zmq4 sees it.
// zmq4 also keeps every frame of a message until its last: the guard
// bounds a message's frames (maxZMQMessageFrames) and their bytes
// together (maxZMQFrameBytes), or a peer could send a message of a
// thousand 19 MiB frames, or ten million empty ones (about 80 bytes of
// zmq4's per 2 on the wire).
// Commands get stricter bounds still: zmq4 parses a READY command's
// metadata without checking its lengths, so a READY whose property
// claims more bytes than it holds panicked the router (81 bytes from
// whatever listens on the engine's port). The guard checks each command
// before zmq4 reads its last byte: at most maxZMTPCommandBytes, a single
// frame (RFC 23), and a READY's properties within its body. And the
// handshake has a deadline: zmq4 reads the peer's greeting and READY
// with none, so a port that accepts and stays silent held the feed, and
// the router's shutdown, for as long as the peer liked. Until the peer's
// READY has passed, reads time out after the dialer's timeout, and the
// dialing socket's context closes the connection when it ends.
// The feed then counts a disconnect and redials, as for any other
// broken connection.

// maxZMQFrameBytes bounds one frame from an engine. The decoder's own
// limits (DefaultMaxBatchBlocks block hashes of at most 32 bytes and
// DefaultMaxBatchTokens token ids of at most 5 bytes each in msgpack)
// and DefaultMaxBatchEvents envelopes fit in about 19 MiB
// (TestDecoderLimitsFitTheFrameBound), so a batch the decoder would
// accept is never cut here; what is larger is refused by the decoder
// anyway.
const maxZMQFrameBytes = 20 << 20

// maxZMQMessageFrames bounds the frames of one message. The engines send
// three (topic, sequence, payload), their replay sockets at most four
// (with the ROUTER's empty delimiter).
const maxZMQMessageFrames = 8

// maxZMTPCommandBytes bounds one command frame. An engine's commands are
// its READY (a socket type and perhaps an identity: tens of bytes) and
// heartbeats.
const maxZMTPCommandBytes = 64 << 10

// zmtpHandshakeTimeout bounds the peer's greeting and READY when the
// dialer names no timeout of its own.
const zmtpHandshakeTimeout = 2 * time.Second

// zmtpGreetingBytes is the size of the greeting that opens a ZMTP 3
// connection; frames follow it.
const zmtpGreetingBytes = 64

// ZMTP frame flags (RFC 23): more frames follow, an 8-byte size, a command.
const (
	zmtpFlagMore    = 0x01
	zmtpFlagLong    = 0x02
	zmtpFlagCommand = 0x04
)

// guardedPrefix names the bounded transports: "kvfast-tcp" for tcp://
// endpoints, "kvfast-ipc" for ipc://.
const guardedPrefix = "kvfast-"

func init() {
	for scheme, network := range map[string]string{"tcp": "tcp", "ipc": "unix"} {
		if err := zmq4.RegisterTransport(guardedPrefix+scheme, boundedTransport{transport.New(network)}); err != nil {
			panic("BUG: feed: cannot register the bounded ZMQ transport: " + err.Error())
		}
	}
}

// guarded rewrites an endpoint CheckZMQEndpoint accepted onto its
// bounded transport.
func guarded(endpoint string) string { return guardedPrefix + endpoint }

// boundedTransport is zmq4's net transport with a frameGuard on each
// connection it dials.
type boundedTransport struct{ transport.Transport }

func (t boundedTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := t.Transport.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	timeout := zmtpHandshakeTimeout
	if nd, ok := d.(*net.Dialer); ok && nd.Timeout > 0 {
		timeout = nd.Timeout
	}
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("cannot bound the ZMTP handshake: %w", err)
	}
	g := &frameGuard{Conn: c, skip: zmtpGreetingBytes, handshaking: true}
	g.stop = context.AfterFunc(ctx, func() { _ = c.Close() })
	return g, nil
}

func (t boundedTransport) Addr(ep string) (string, error) {
	return t.Transport.Addr(strings.TrimPrefix(ep, guardedPrefix))
}

// frameGuard follows the ZMTP framing of what it reads and fails the
// read that brings a frame header claiming more than maxZMQFrameBytes.
// Only the connection's reader (zmq4's) calls Read.
type frameGuard struct {
	net.Conn
	skip   uint64  // greeting or body bytes to pass before the next header
	hdr    [9]byte // the header being read: flags, then the size
	hdrLen int
	// frames and bytes of the message being read, up to its last frame
	frames   int
	msgBytes uint64
	// the command being read: its bytes so far, and how many are to come
	cmd     []byte
	cmdLeft uint64
	// handshaking: the peer's READY has not passed yet, and reads have a
	// deadline
	handshaking bool
	stop        func() bool // stops closing the connection when the dialing context ends
	err         error       // the refusal, returned by every later Read
}

func (g *frameGuard) Close() error {
	g.stop()
	return g.Conn.Close()
}

func (g *frameGuard) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.Conn.Read(p)
	if g.err = g.scan(p[:n]); g.err != nil {
		_ = g.Conn.Close()
		return 0, g.err
	}
	return n, err
}

// scan moves the framing state over b.
func (g *frameGuard) scan(b []byte) error {
	for len(b) > 0 {
		if g.cmdLeft > 0 {
			k := min(uint64(len(b)), g.cmdLeft)
			g.cmd = append(g.cmd, b[:k]...)
			g.cmdLeft -= k
			b = b[k:]
			if g.cmdLeft == 0 {
				if err := g.command(); err != nil {
					return err
				}
			}
			continue
		}
		if g.skip > 0 {
			k := min(uint64(len(b)), g.skip)
			g.skip -= k
			b = b[k:]
			continue
		}
		g.hdr[g.hdrLen] = b[0]
		g.hdrLen++
		b = b[1:]
		need := 2
		if g.hdr[0]&zmtpFlagLong != 0 {
			need = 9
		}
		if g.hdrLen < need {
			continue
		}
		size := uint64(g.hdr[1])
		if need == 9 {
			size = binary.BigEndian.Uint64(g.hdr[1:9])
		}
		g.hdrLen = 0
		if size > maxZMQFrameBytes {
			return fmt.Errorf("cannot accept a ZMTP frame of %d bytes from the engine: the limit is %d", size, maxZMQFrameBytes)
		}
		flags := g.hdr[0]
		g.frames++
		g.msgBytes += size
		switch {
		case g.frames > maxZMQMessageFrames:
			return fmt.Errorf("cannot accept a ZMQ message of more than %d frames from the engine", maxZMQMessageFrames)
		case g.msgBytes > maxZMQFrameBytes:
			return fmt.Errorf("cannot accept a ZMQ message of more than %d bytes from the engine", maxZMQFrameBytes)
		case flags&zmtpFlagMore == 0:
			g.frames, g.msgBytes = 0, 0
		}
		if flags&zmtpFlagCommand == 0 {
			g.skip = size
			continue
		}
		switch {
		case flags&zmtpFlagMore != 0:
			return errors.New("cannot accept a ZMTP command of several frames from the engine")
		case size > maxZMTPCommandBytes:
			return fmt.Errorf("cannot accept a ZMTP command of %d bytes from the engine: the limit is %d", size, maxZMTPCommandBytes)
		}
		g.cmd, g.cmdLeft = g.cmd[:0], size
		if size == 0 {
			if err := g.command(); err != nil {
				return err
			}
		}
	}
	return nil
}

// command checks a whole command (g.cmd) before zmq4 parses it. zmq4's
// command parser checks its name's length; a READY's metadata it parses
// without checking, so that is checked here. The first READY ends the
// handshake and its deadline.
func (g *frameGuard) command() error {
	c := g.cmd
	if len(c) == 0 || int(c[0]) > len(c)-1 {
		return nil // zmq4 refuses it (ErrBadCmd)
	}
	name, body := c[1:1+int(c[0])], c[1+int(c[0]):]
	if string(name) != "READY" {
		return nil
	}
	if err := checkZMTPMetadata(body); err != nil {
		return err
	}
	if g.handshaking {
		g.handshaking = false
		if err := g.Conn.SetReadDeadline(time.Time{}); err != nil {
			return fmt.Errorf("cannot lift the ZMTP handshake's deadline: %w", err)
		}
	}
	return nil
}

// checkZMTPMetadata checks that a READY's metadata is a sequence of
// properties (RFC 23: a 1-byte name length, the name, a 4-byte value
// length, the value) that ends where the body does.
func checkZMTPMetadata(p []byte) error {
	for len(p) > 0 {
		n := 1 + int(p[0]) + 4
		if n > len(p) {
			return errors.New("cannot accept a ZMTP READY from the engine: a property runs past the command")
		}
		v := uint64(binary.BigEndian.Uint32(p[n-4 : n]))
		if v > uint64(len(p)-n) {
			return errors.New("cannot accept a ZMTP READY from the engine: a property's value runs past the command")
		}
		p = p[n+int(v):]
	}
	return nil
}
