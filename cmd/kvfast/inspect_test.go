package main

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/shm"
)

func TestInspect(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seg")
	seg, err := shm.Open(path, shm.Options{Index: radix.Config{Capacity: 4096}, RingBytes: shm.MinRingBytes})
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	p, err := seg.Register(shm.WorkerConfig{WorkerID: 9, DPRank: 2, Model: "llama", BlockSize: 16, Endpoint: "http://127.0.0.1:8000"})
	if err != nil {
		t.Fatal(err)
	}
	p.Load(shm.Load{Running: 3, Waiting: 1, KVUsedBlocks: 10, KVTotalBlocks: 100})
	p.Cleared()
	seg.Index().Stored(p.Slot(), radix.AppendBlockHashes(nil, 1, make([]uint32, 48), 16))
	var out bytes.Buffer
	if err := inspect(&out, seg, true); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"layout version 2", "session bindings at", "index: 3/4096 blocks", "llama", "http://127.0.0.1:8000", "live", "10/100", "shard"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if code := runInspect([]string{"--segment", t.TempDir()}); code != 2 {
		t.Errorf("a directory for --segment: exit %d, want 2 (a usage error that says to give the file)", code)
	}
	if code := runInspect([]string{"--segment", filepath.Join(t.TempDir(), "missing")}); code != 1 {
		t.Fatalf("missing segment: exit %d", code)
	}
	if code := runInspect([]string{"--verify", "--segment", path}); code != 0 {
		t.Fatalf("inspect --verify: exit %d", code)
	}
}

// TestInspectQuotesWhatPublishersWrote: a model or endpoint a publisher
// wrote is printed on one line, escapes and all: a newline in it cannot
// forge a row, nor a terminal escape reach the terminal.
func TestInspectQuotesWhatPublishersWrote(t *testing.T) {
	for in, want := range map[string]string{
		"llama":                         "llama",
		"http://127.0.0.1:8000":         "http://127.0.0.1:8000",
		"x\n  7  live  1  gpt-4":        `"x\n  7  live  1  gpt-4"`,
		"\x1b[2Jm":                      `"\x1b[2Jm"`,
		"two words":                     `"two words"`,
		"http://h:1\r\nX-Injected: yes": `"http://h:1\r\nX-Injected: yes"`,
	} {
		if got := printable(in); got != want {
			t.Errorf("printable(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestInspectShowsUnreadableSlots: a live slot the router cannot read (a
// role no publisher writes) is named, with why, not left out of the list.
func TestInspectShowsUnreadableSlots(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seg")
	seg, err := shm.Open(path, shm.Options{Index: radix.Config{Capacity: 4096}, RingBytes: shm.MinRingBytes})
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	p, err := seg.Register(shm.WorkerConfig{WorkerID: 9, Model: "llama", BlockSize: 16, Endpoint: "http://127.0.0.1:8000"})
	if err != nil {
		t.Fatal(err)
	}
	// docs/shm-layout.md: the registry starts at byte 8192, 512 bytes a
	// slot, the role a u32 at byte 60 of it.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt(binary.LittleEndian.AppendUint32(nil, 77), 8192+int64(p.Slot())*512+60)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := inspect(&out, seg, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "unreadable registration") || !strings.Contains(out.String(), "role") {
		t.Errorf("the unreadable slot is not shown:\n%s", out.String())
	}
}

// TestInspectVerifyLiveSegment: a damaged index fails --verify; the same
// damage under a live ingester (a router writing the index, whose writes
// in flight a check cannot tell from damage) is inconclusive, after
// several checks, and says to stop the router first.
func TestInspectVerifyLiveSegment(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seg")
	seg, err := shm.Open(path, shm.Options{Index: radix.Config{Capacity: 4096}, RingBytes: shm.MinRingBytes})
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	p, err := seg.Register(shm.WorkerConfig{WorkerID: 9, Model: "llama", BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	seg.Index().Stored(p.Slot(), radix.AppendBlockHashes(nil, 1, make([]uint32, 48), 16))
	// Scribble over the start of the index region: its live counters no
	// longer match the tables.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	junk := bytes.Repeat([]byte{0xA5}, 64<<10)
	if _, err := f.WriteAt(junk, seg.Header().IndexOffset+4096); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var out, errOut bytes.Buffer
	if code := verifyIndex(seg, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "index verification failed") {
		t.Fatalf("damaged, no router: exit %d, %q %q", code, out.String(), errOut.String())
	}
	if ok, err := seg.TryLockIngester(); !ok || err != nil {
		t.Fatalf("cannot take the ingester role: %v %v", ok, err)
	}
	defer seg.UnlockIngester()
	out.Reset()
	errOut.Reset()
	if code := verifyIndex(seg, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "inconclusive") ||
		!strings.Contains(errOut.String(), "stop the router") {
		t.Fatalf("damaged, a live router: exit %d, %q %q", code, out.String(), errOut.String())
	}
}

// TestInspectRedactsEndpointCredentials: an endpoint registered with a
// user:password (which the router refuses to route to, and logs redacted)
// is printed redacted too.
func TestInspectRedactsEndpointCredentials(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seg")
	seg, err := shm.Open(path, shm.Options{Index: radix.Config{Capacity: 4096}, RingBytes: shm.MinRingBytes})
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	if _, err := seg.Register(shm.WorkerConfig{WorkerID: 9, Model: "llama", BlockSize: 16, Endpoint: "http://user:s3cret@127.0.0.1:8000"}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := inspect(&out, seg, false); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "s3cret") || !strings.Contains(out.String(), "REDACTED@127.0.0.1:8000") {
		t.Fatalf("output:\n%s", out.String())
	}
}
