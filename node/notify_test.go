package node

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRunNotifiesSystemd: under systemd (NOTIFY_SOCKET set), Run says
// READY=1 once it listens, its status once start-up has settled, and
// STOPPING=1 when its context ends.
func TestRunNotifiesSystemd(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "notify")
	manager, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer manager.Close()
	t.Setenv("NOTIFY_SOCKET", socket)
	cfg := testConfig(t)
	cfg.Listen = "127.0.0.1:0"
	cfg.Segment.Path = ""
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- Run(ctx, cfg) }()

	receive := func() string {
		t.Helper()
		if err := manager.SetReadDeadline(time.Now().Add(testWait)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4096)
		n, err := manager.Read(buf)
		if err != nil {
			t.Fatalf("the service manager heard nothing: %v", err)
		}
		return string(buf[:n])
	}
	if got := receive(); !strings.HasPrefix(got, "READY=1\n") {
		t.Fatalf("first notification %q, want READY=1", got)
	}
	if got := receive(); !strings.HasPrefix(got, "STATUS=ready") {
		t.Fatalf("second notification %q, want the settled status", got)
	}
	cancel()
	if got := receive(); got != "STOPPING=1" {
		t.Fatalf("notification at shutdown %q, want STOPPING=1", got)
	}
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run returned %v", err)
		}
	case <-time.After(testWait):
		t.Fatal("Run did not return after its context ended")
	}
}
