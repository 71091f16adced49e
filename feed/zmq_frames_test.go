package feed

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go evilPub(c)
		}
	}()
	defer func() {
		_ = ln.Close()
		<-served
	}()
	s := startSub(t, newZMQIndex(t), &testEngine{ep: "tcp://" + ln.Addr().String()}, nil)
	waitFor(t, func() bool { return s.Stats().Disconnects >= 2 }, func() any { return s.Stats() })
}

// evilPub completes a ZMTP handshake as a PUB socket, then sends a frame
// header that claims 2^62 bytes.
func evilPub(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(zmtpGreeting()); err != nil {
		return
	}
	var peer [zmtpGreetingBytes]byte
	if _, err := io.ReadFull(c, peer[:]); err != nil {
		return
	}
	ready := []byte("\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB")
	if _, err := c.Write(append([]byte{0x04, byte(len(ready))}, ready...)); err != nil {
		return
	}
	_, _ = c.Write(longFrameHeader(1 << 62))
	_, _ = io.Copy(io.Discard, c) // until the subscriber hangs up
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
		if err == nil && (g.skip > maxZMQFrameBytes+zmtpGreetingBytes || g.hdrLen > len(g.hdr)-1) {
			t.Fatalf("state out of range: skip %d, header %d", g.skip, g.hdrLen)
		}
	})
}
