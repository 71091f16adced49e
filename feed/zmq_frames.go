package feed

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"

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
// thousand 60 MiB frames, or ten million empty ones (about 80 bytes of
// zmq4's per 2 on the wire).
// The feed then counts a disconnect and redials, as for any other
// broken connection.

// maxZMQFrameBytes bounds one frame from an engine. The decoder's own
// limits (DefaultMaxBatchBlocks block hashes of at most 32 bytes and
// DefaultMaxBatchTokens token ids of at most 5 bytes each in msgpack)
// fit in about 30 MiB, so a batch the decoder would accept is never cut
// here; what is larger is refused by the decoder anyway.
const maxZMQFrameBytes = 64 << 20

// maxZMQMessageFrames bounds the frames of one message. The engines send
// three (topic, sequence, payload), their replay sockets at most four
// (with the ROUTER's empty delimiter).
const maxZMQMessageFrames = 8

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
	return &frameGuard{Conn: c, skip: zmtpGreetingBytes}, nil
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
	err      error // the refusal, returned by every later Read
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
		if flags := g.hdr[0]; flags&zmtpFlagCommand == 0 {
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
		}
		g.skip = size
	}
	return nil
}
