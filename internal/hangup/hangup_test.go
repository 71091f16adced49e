//go:build linux

package hangup

import (
	"net"
	"testing"
	"time"
)

type chanTarget chan struct{}

func (c chanTarget) HangUp() { close(c) }

func pair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if server, err = ln.Accept(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// TestHangUpReported: data from the client (a pipelined request) is no
// hang-up and stays unread; closing the client is reported, once.
func TestHangUpReported(t *testing.T) {
	w, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	client, server := pair(t)
	hung := make(chanTarget)
	reg, err := w.Watch(server, hung)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Stop()
	if _, err := client.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	_ = server.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := server.Read(buf); err != nil || n != 18 {
		t.Fatalf("the pipelined bytes were not all left for the server: %d, %v", n, err)
	}
	select {
	case <-hung:
		t.Fatal("data from the client was reported as a hang-up")
	default:
	}
	client.Close()
	select {
	case <-hung:
	case <-time.After(10 * time.Second):
		t.Fatal("the client's close was not reported")
	}
}

// TestStoppedWatchIsSilent: after Stop a hang-up reaches nobody; a peer
// gone before Watch is reported at once.
func TestStoppedWatchIsSilent(t *testing.T) {
	w, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	client, server := pair(t)
	reg, err := w.Watch(server, chanTarget(make(chan struct{}))) // a second close would panic
	if err != nil {
		t.Fatal(err)
	}
	reg.Stop()
	client.Close()

	client2, server2 := pair(t)
	client2.Close()
	hung := make(chanTarget)
	reg2, err := w.Watch(server2, hung)
	if err != nil {
		t.Fatal(err)
	}
	defer reg2.Stop()
	select {
	case <-hung:
	case <-time.After(10 * time.Second):
		t.Fatal("a peer that had already left was not reported")
	}
}

// TestHangUpAll: every watched request is told at once, before its client
// left, and only once: the client's later close reaches nobody (a second
// HangUp would close a closed channel and panic), and Stop still returns.
func TestHangUpAll(t *testing.T) {
	w, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var regs []Registration
	var targets []chanTarget
	var clients []net.Conn
	for range 3 {
		client, server := pair(t)
		hung := make(chanTarget)
		reg, err := w.Watch(server, hung)
		if err != nil {
			t.Fatal(err)
		}
		regs, targets, clients = append(regs, reg), append(targets, hung), append(clients, client)
	}
	w.HangUpAll()
	for i, hung := range targets {
		select {
		case <-hung:
		default:
			t.Fatalf("target %d was not told when HangUpAll returned", i)
		}
	}
	for _, c := range clients {
		c.Close()
	}
	// A fresh watch that sees a hang-up proves the run loop went past the
	// closes above without telling anyone twice.
	client, server := pair(t)
	hung := make(chanTarget)
	reg, err := w.Watch(server, hung)
	if err != nil {
		t.Fatal(err)
	}
	client.Close()
	select {
	case <-hung:
	case <-time.After(10 * time.Second):
		t.Fatal("a hang-up after HangUpAll was not reported")
	}
	for _, r := range append(regs, reg) {
		r.Stop()
	}
	var nilWatcher *Watcher
	nilWatcher.HangUpAll()
}
