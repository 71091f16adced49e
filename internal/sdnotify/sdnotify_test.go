package sdnotify

import (
	"net"
	"path/filepath"
	"testing"
	"time"
)

// listen is a stand-in service manager's notify socket.
func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func receive(t *testing.T, conn *net.UnixConn) string {
	t.Helper()
	if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("the manager received nothing: %v", err)
	}
	return string(buf[:n])
}

func TestNotifySendsToTheSocket(t *testing.T) {
	for _, name := range []string{filepath.Join(t.TempDir(), "notify"), "@kvfast-sdnotify-test-" + filepath.Base(t.TempDir())} {
		conn := listen(t, name)
		t.Setenv("NOTIFY_SOCKET", name)
		sent, err := Notify("READY=1\nSTATUS=serving")
		if err != nil || !sent {
			t.Fatalf("Notify to %s = %v, %v", name, sent, err)
		}
		if got := receive(t, conn); got != "READY=1\nSTATUS=serving" {
			t.Errorf("the manager at %s received %q", name, got)
		}
	}
}

func TestNotifyWithoutManager(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if sent, err := Notify("READY=1"); sent || err != nil {
		t.Errorf("Notify without NOTIFY_SOCKET = %v, %v; want false, nil", sent, err)
	}
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "absent"))
	if sent, err := Notify("READY=1"); sent || err == nil {
		t.Errorf("Notify to a socket nobody listens on = %v, %v; want an error", sent, err)
	}
}
