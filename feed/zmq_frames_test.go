package feed

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// zmtpGreeting is a ZMTP 3.0 greeting with the NULL mechanism.
func zmtpGreeting() []byte {
	g := make([]byte, zmtpGreetingBytes)
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	return g
}

// longFrameHeader is the header of a frame claiming size bytes.
func longFrameHeader(size uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{zmtpFlagLong}, size)
}

// TestFrameGuardFollowsFraming: short and long frames up to the limit
// pass, at any split into reads; the first header over the limit is
// refused, wherever the reads split it.
func TestFrameGuardFollowsFraming(t *testing.T) {
	var ok []byte
	ok = append(ok, zmtpGreeting()...)
	ok = append(ok, 0x04, 6)
	ok = append(ok, "\x05READY"...)
	ok = append(ok, 0x01, 3, 'a', 'b', 'c') // more frames follow
	ok = append(ok, longFrameHeader(300)...)
	ok = append(ok, bytes.Repeat([]byte{7}, 300)...)
	ok = append(ok, 0x00, 0) // an empty frame
	bad := append(bytes.Clone(ok), longFrameHeader(maxZMQFrameBytes+1)...)
	for split := 1; split <= 17; split++ {
		g := frameGuard{skip: zmtpGreetingBytes}
		var err error
		for b := ok; len(b) > 0 && err == nil; b = b[min(split, len(b)):] {
			err = g.scan(b[:min(split, len(b))])
		}
		if err != nil || g.skip != 0 || g.hdrLen != 0 {
			t.Fatalf("split %d: a well-formed stream: %v, skip %d, header %d", split, err, g.skip, g.hdrLen)
		}
		g = frameGuard{skip: zmtpGreetingBytes}
		err = nil
		for b := bad; len(b) > 0 && err == nil; b = b[min(split, len(b)):] {
			err = g.scan(b[:min(split, len(b))])
		}
		if err == nil {
			t.Fatalf("split %d: a frame of %d bytes passed", split, maxZMQFrameBytes+1)
		}
	}
}

// TestFrameGuardBoundsMessages: a message may have up to
// maxZMQMessageFrames frames and maxZMQFrameBytes in all, and messages
// one after another each have their own allowance; beyond either bound
// the guard refuses, however small each frame.
func TestFrameGuardBoundsMessages(t *testing.T) {
	scan := func(b []byte) error {
		g := frameGuard{skip: zmtpGreetingBytes}
		return g.scan(append(zmtpGreeting(), b...))
	}
	frames := func(n int, size uint64) []byte { // a message of n frames of size bytes
		var b []byte
		for i := range n {
			flags := byte(zmtpFlagLong | zmtpFlagMore)
			if i == n-1 {
				flags = zmtpFlagLong
			}
			b = append(b, flags)
			b = binary.BigEndian.AppendUint64(b, size)
			b = append(b, make([]byte, size)...)
		}
		return b
	}
	var many []byte
	for range 100 {
		many = append(many, frames(3, 10)...)
	}
	if err := scan(many); err != nil {
		t.Errorf("100 messages of three frames: %v", err)
	}
	if err := scan(frames(maxZMQMessageFrames, 0)); err != nil {
		t.Errorf("a message of %d empty frames: %v", maxZMQMessageFrames, err)
	}
	if err := scan(frames(maxZMQMessageFrames+1, 0)); err == nil {
		t.Errorf("a message of %d empty frames passed", maxZMQMessageFrames+1)
	}
	// Two frames of half the limit and one more byte: headers only, the
	// guard refuses at the second header before its body is read.
	half := uint64(maxZMQFrameBytes/2 + 1)
	hdrs := append([]byte{zmtpFlagLong | zmtpFlagMore}, binary.BigEndian.AppendUint64(nil, half)...)
	g := frameGuard{skip: zmtpGreetingBytes}
	err := g.scan(append(zmtpGreeting(), hdrs...))
	g.skip = 0 // as if the first frame's body had been read
	if err == nil {
		err = g.scan(hdrs)
	}
	if err == nil {
		t.Errorf("a message of two frames of %d bytes passed", half)
	}
}

// TestZMQHugeFrameClaimIsRefused: a peer on the engine's port that claims
// a frame of 2^62 bytes (zmq4 would allocate it, and panic) breaks only
// its connection: the subscriber counts the disconnect and dials again.
func TestZMQHugeFrameClaimIsRefused(t *testing.T) {
	// A peer that completes a ZMTP handshake as a PUB socket, then sends a
	// frame header that claims 2^62 bytes.
	ep := hostilePeer(t, func(c net.Conn) {
		if !zmtpGreet(c) {
			return
		}
		if _, err := c.Write(pubReady()); err != nil {
			return
		}
		_, _ = c.Write(longFrameHeader(1 << 62))
		_, _ = io.Copy(io.Discard, c) // until the subscriber hangs up
	})
	s := startSub(t, newZMQIndex(t), &testEngine{ep: ep}, nil)
	waitFor(t, func() bool { return s.Stats().Disconnects >= 2 }, func() any { return s.Stats() })
}

// TestFrameGuardChecksCommands: a command is one frame of at most
// maxZMTPCommandBytes, and a READY's properties end where it does (zmq4
// parses them unchecked, and panicked on the first case below).
func TestFrameGuardChecksCommands(t *testing.T) {
	command := func(flags byte, body string) []byte {
		return append([]byte{flags, byte(len(body))}, body...)
	}
	for _, tc := range []struct {
		name string
		wire []byte
		ok   bool
	}{
		{"a READY with a socket type", pubReady(), true},
		{"a READY without properties", command(zmtpFlagCommand, "\x05READY"), true},
		{"a heartbeat", command(zmtpFlagCommand, "\x04PING\x00\x0a"), true},
		{"an empty command", command(zmtpFlagCommand, ""), true},
		{"a property's name past the command", command(zmtpFlagCommand, "\x05READY\x01"), false},
		{"a property's value length cut", command(zmtpFlagCommand, "\x05READY\x01A\x00\x00"), false},
		{"a property's value past the command", command(zmtpFlagCommand, "\x05READY\x0bSocket-Type\x00\x00\x00\x09PUB"), false},
		{"a command with more frames", command(zmtpFlagCommand|zmtpFlagMore, "\x05READY"), false},
		{"a command over the limit", append([]byte{zmtpFlagCommand | zmtpFlagLong}, binary.BigEndian.AppendUint64(nil, maxZMTPCommandBytes+1)...), false},
	} {
		for split := 1; split <= 7; split++ {
			g := frameGuard{skip: zmtpGreetingBytes}
			var err error
			for b := append(zmtpGreeting(), tc.wire...); len(b) > 0 && err == nil; b = b[min(split, len(b)):] {
				err = g.scan(b[:min(split, len(b))])
			}
			if (err == nil) != tc.ok {
				t.Errorf("%s, split %d: err %v, want ok %v", tc.name, split, err, tc.ok)
			}
		}
	}
}

// FuzzZMTPMetadata: whatever READY body checkZMTPMetadata lets through,
// zmq4 parses without panicking.
func FuzzZMTPMetadata(f *testing.F) {
	f.Add([]byte("\x0bSocket-Type\x00\x00\x00\x03PUB"))
	f.Add([]byte("\x01"))
	f.Fuzz(func(t *testing.T, body []byte) {
		if checkZMTPMetadata(body) != nil {
			return
		}
		md := zmq4.Metadata{}
		if err := md.UnmarshalZMTP(body); err != nil {
			t.Fatalf("checked metadata that zmq4 refuses: %v", err)
		}
	})
}

// TestZMQHostileHandshakes: a peer on the engine's port that breaks the
// ZMTP handshake breaks only its connection, and the subscriber dials
// again: a READY that would have panicked zmq4, a command of two frames,
// one too large, and a peer that accepts and says nothing (the handshake
// has the dialer's timeout).
func TestZMQHostileHandshakes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ready []byte // after the greetings; nil: the peer stays silent
	}{
		{"a READY whose property runs past it", []byte("\x04\x07\x05READY\x01")},
		{"a READY of two frames", []byte("\x05\x06\x05READY\x04\x06\x05READY")},
		{"a command of 1 MiB", append([]byte{zmtpFlagCommand | zmtpFlagLong}, binary.BigEndian.AppendUint64(nil, 1<<20)...)},
		{"silence", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep := hostilePeer(t, func(c net.Conn) {
				if tc.ready == nil {
					_, _ = io.Copy(io.Discard, c)
					return
				}
				if !zmtpGreet(c) {
					return
				}
				_, _ = c.Write(tc.ready)
				_, _ = io.Copy(io.Discard, c)
			})
			s := startSub(t, newZMQIndex(t), &testEngine{ep: ep}, func(c *ZMQConfig) { c.DialTimeout = 200 * time.Millisecond })
			waitFor(t, func() bool { return s.Stats().Disconnects >= 2 }, func() any { return s.Stats() })
		})
	}
}

// TestZMQSilentPeerDoesNotHoldShutdown: a subscriber in the handshake
// with a silent peer stops when its context ends, long before the
// handshake's timeout (startSub's clean-up waits for Run to return).
func TestZMQSilentPeerDoesNotHoldShutdown(t *testing.T) {
	accepted := make(chan struct{}, 1)
	ep := hostilePeer(t, func(c net.Conn) {
		accepted <- struct{}{}
		_, _ = io.Copy(io.Discard, c)
	})
	startSub(t, newZMQIndex(t), &testEngine{ep: ep}, func(c *ZMQConfig) { c.DialTimeout = time.Hour })
	<-accepted
}

// TestZMQOtherTopicIsGarbage: a publisher that ignores the subscription
// and sends another topic's batch does not reach the index; the batch is
// counted as garbage and the next one of the worker's topic applies.
func TestZMQOtherTopicIsGarbage(t *testing.T) {
	frame := func(more bool, body []byte) []byte {
		flags := byte(zmtpFlagLong)
		if more {
			flags |= zmtpFlagMore
		}
		return append(binary.BigEndian.AppendUint64([]byte{flags}, uint64(len(body))), body...)
	}
	message := func(topic string, seq uint64, payload []byte) []byte {
		return slices.Concat(frame(true, []byte(topic)), frame(true, be64(seq)), frame(false, payload))
	}
	stored := encodeBatch(t, vllmMap, wireOps(intHashes, genOps(31, 1)))
	ep := hostilePeer(t, func(c net.Conn) {
		if !zmtpGreet(c) {
			return
		}
		wire := slices.Concat(pubReady(), message("other-engine", 0, stored), message("kv-events", 1, encodeBatch(t, vllmMap, nil)))
		if _, err := c.Write(wire); err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, c)
	})
	ix := newZMQIndex(t)
	s := startSub(t, ix, &testEngine{ep: ep}, nil)
	waitSeq(t, s, 1)
	if st := s.Stats(); st.Garbage != 1 || st.Batches != 1 || st.StoredBlocks != 0 {
		t.Fatalf("another topic's batch was applied: %+v", st)
	}
}

// hostilePeer listens on the loopback and serves every connection with
// serve until the test ends; the endpoint is the subscriber's to dial.
func hostilePeer(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	served := make(chan struct{})
	go func() {
		defer close(served)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(time.Minute))
				serve(c)
			})
		}
	}()
	t.Cleanup(func() { // after the subscriber's: clean-ups run last-in first-out
		_ = ln.Close()
		<-served
		conns.Wait()
	})
	return "tcp://" + ln.Addr().String()
}

// zmtpGreet exchanges ZMTP greetings with the subscriber on c, as a
// NULL-mechanism peer, and reports whether it could.
func zmtpGreet(c net.Conn) bool {
	if _, err := c.Write(zmtpGreeting()); err != nil {
		return false
	}
	var peer [zmtpGreetingBytes]byte
	_, err := io.ReadFull(c, peer[:])
	return err == nil
}

// pubReady is a PUB socket's READY command, as libzmq sends it.
func pubReady() []byte {
	ready := "\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB"
	return append([]byte{zmtpFlagCommand, byte(len(ready))}, ready...)
}

// FuzzFrameGuard: any bytes, in any split, leave the guard in a state it
// can go on from, and it refuses exactly when a header claims too much.
func FuzzFrameGuard(f *testing.F) {
	f.Add(append(zmtpGreeting(), 0x04, 1, 0), uint8(3))
	f.Add(append(zmtpGreeting(), longFrameHeader(1<<62)...), uint8(5))
	f.Fuzz(func(t *testing.T, data []byte, split uint8) {
		step := int(split%16) + 1
		g := frameGuard{skip: zmtpGreetingBytes}
		var err error
		for b := data; len(b) > 0 && err == nil; b = b[min(step, len(b)):] {
			err = g.scan(b[:min(step, len(b))])
		}
		if err == nil && (g.skip > maxZMQFrameBytes+zmtpGreetingBytes || g.hdrLen > len(g.hdr)-1 ||
			g.cmdLeft > maxZMTPCommandBytes || len(g.cmd) > maxZMTPCommandBytes) {
			t.Fatalf("state out of range: skip %d, header %d, command %d+%d", g.skip, g.hdrLen, len(g.cmd), g.cmdLeft)
		}
	})
}

// TestDecoderLimitsFitTheFrameBound: a batch at the decoder's limits,
// written as large as msgpack allows (32-byte block hashes as bin 8 with
// its 2-byte header, token ids as uint32 with their 1-byte tag, and each
// event's envelope), fits one frame, so the frame bound never cuts a
// batch the decoder would take.
func TestDecoderLimitsFitTheFrameBound(t *testing.T) {
	const eventEnvelope = 64 // tag, array headers, parent hash, block size, lora, medium
	worst := DefaultMaxBatchBlocks*(2+32) + DefaultMaxBatchTokens*5 + DefaultMaxBatchEvents*eventEnvelope
	if worst > maxZMQFrameBytes {
		t.Fatalf("a batch at the decoder's limits may take %d bytes, over the %d-byte frame bound", worst, maxZMQFrameBytes)
	}
}
