package testnet

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestRefusingAddr: a connection to the address is refused, and no
// listener can take its port while the test holds it.
func TestRefusingAddr(t *testing.T) {
	addr := RefusingAddr(t)
	if c, err := net.DialTimeout("tcp", addr, 5*time.Second); err == nil {
		c.Close()
		t.Fatalf("a connection to %s was accepted", addr)
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("a connection to %s: %v, want connection refused", addr, err)
	}
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Fatalf("a listener took the held port %s", addr)
	}
}
