package shm

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvfast/kvfast/workers"
)

// A file truncated under the router faults its next access to the mapping;
// guarded, that access detaches the segment instead of crashing the
// process, and every later access, guarded or not, reads zero pages.
func TestTruncatedSegmentDetachesOnFault(t *testing.T) {
	seg, path := openTest(t, Options{})
	b := seg.Bindings()
	key := b.Key([]byte("session"))
	hour := int64(time.Hour)
	if res := b.Bind(key, 7, 0, b.Now(), hour); res != BindNew {
		t.Fatalf("Bind before truncation = %v", res)
	}
	seg.Index().Stored(3, []uint64{11, 12})

	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	var out workers.Overlaps
	if seg.Guard(func() { seg.Index().FindMatches([]uint64{11, 12}, &out) }) {
		t.Fatal("a lookup in a truncated segment ran to its end: it should have faulted")
	}
	if why := seg.Lost(); !strings.Contains(why, "truncated") {
		t.Fatalf("Lost() = %q after a fault, want the truncation named", why)
	}

	// Unguarded from here on: a fault would kill the test binary.
	if got := seg.Index().FindMatches([]uint64{11, 12}, &out); got != 0 {
		t.Errorf("detached index matches %v, want none", got)
	}
	if _, res := b.Lookup(key, b.Now(), hour); res != BindingMiss {
		t.Errorf("detached bindings Lookup = %v, want a miss", res)
	}
	if ws := seg.Workers(nil); len(ws) != 0 {
		t.Errorf("detached registry lists %d workers", len(ws))
	}
	if !seg.CheckSize() {
		t.Error("CheckSize() = false on a lost segment")
	}
	if err := seg.Close(); err != nil {
		t.Fatalf("Close after a detach: %v", err)
	}
}

// The bindings table guards itself: the request path's session lookups
// need no guard of their own.
func TestTruncatedSegmentBindingsMiss(t *testing.T) {
	seg, path := openTest(t, Options{})
	b := seg.Bindings()
	key := b.Key([]byte("session"))
	b.Bind(key, 7, 0, b.Now(), int64(time.Hour))
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	if _, res := b.Lookup(key, b.Now(), int64(time.Hour)); res != BindingMiss {
		t.Errorf("Lookup in a truncated segment = %v, want a miss", res)
	}
	if seg.Lost() == "" {
		t.Error("a faulting Lookup did not detach the segment")
	}
	if res := b.Bind(key, 8, 0, b.Now(), int64(time.Hour)); res != BindNew {
		t.Errorf("Bind after the detach = %v, want a new binding in the zeroed table", res)
	}
}

// CheckSize detaches a shrunk segment before anything touches the lost
// pages, and leaves an intact one alone.
func TestCheckSizeDetachesShrunkFile(t *testing.T) {
	seg, path := openTest(t, Options{})
	if seg.CheckSize() || seg.Lost() != "" {
		t.Fatal("CheckSize detached an intact segment")
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, st.Size()-4096); err != nil {
		t.Fatal(err)
	}
	if !seg.CheckSize() {
		t.Fatal("CheckSize() = false after the file lost its last page")
	}
	if why := seg.Lost(); !strings.Contains(why, "shrank") {
		t.Errorf("Lost() = %q, want the shrink named", why)
	}
	var out workers.Overlaps
	seg.Index().FindMatches([]uint64{1}, &out) // zero pages: no fault, unguarded
}

// A panic that is not a fault in the mapping is not the guard's to
// swallow.
func TestGuardPassesOtherPanicsOn(t *testing.T) {
	seg, _ := openTest(t, Options{})
	defer func() {
		if r := recover(); r != "not a fault" {
			t.Errorf("recovered %v, want the original panic", r)
		}
		if seg.Lost() != "" {
			t.Error("an unrelated panic detached the segment")
		}
	}()
	seg.Guard(func() { panic("not a fault") })
	t.Fatal("Guard returned after a panic")
}

// A publisher whose segment file was truncated survives it too: its
// writes fault, are caught, and say ErrRetired, so that the engine
// registers again by path once a router has made the file whole.
func TestTruncatedSegmentPublisherRetires(t *testing.T) {
	_, path := openTest(t, Options{})
	p, err := Register(path, WorkerConfig{WorkerID: 1, BlockSize: 16, Endpoint: "http://127.0.0.1:9"})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	tokens := make([]uint32, 16)
	if err := p.Stored(0, false, []uint64{1}, tokens); !errors.Is(err, ErrRetired) {
		t.Errorf("Stored into a truncated segment: %v, want ErrRetired", err)
	}
	p.Load(Load{Running: 1}) // reads zero pages now: no fault
	if err := p.Heartbeat(); !errors.Is(err, ErrRetired) {
		t.Errorf("Heartbeat on a truncated segment: %v, want ErrRetired", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, err := Register(path, WorkerConfig{WorkerID: 1, BlockSize: 16, Endpoint: "http://127.0.0.1:9"}); err == nil {
		t.Error("registered in a truncated file")
	}
}

// A heartbeat notices a shrunk file before any write faults on it.
func TestHeartbeatNoticesShrunkFile(t *testing.T) {
	_, path := openTest(t, Options{})
	p, err := Register(path, WorkerConfig{WorkerID: 1, BlockSize: 16, Endpoint: "http://127.0.0.1:9"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, st.Size()-4096); err != nil {
		t.Fatal(err)
	}
	if err := p.Heartbeat(); !errors.Is(err, ErrRetired) {
		t.Errorf("Heartbeat on a shrunk segment: %v, want ErrRetired", err)
	}
}

// A file truncated and grown back to its size faults nothing (its pages
// are zeros again), but nothing in it is the segment any more: its
// header, written once, says so, and CheckSize detaches.
func TestCheckSizeDetachesRegrownFile(t *testing.T) {
	seg, path := openTest(t, Options{})
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, st.Size()); err != nil {
		t.Fatal(err)
	}
	if !seg.CheckSize() {
		t.Fatal("CheckSize() = false on a file truncated and grown back")
	}
	if why := seg.Lost(); !strings.Contains(why, "header changed") {
		t.Errorf("Lost() = %q, want the header named", why)
	}
}

// A header byte rewritten in place (the layout version, here) is an
// overwrite too: the router served on while every publisher, inspect and
// the next router refused the file. A segment attached afresh, and one
// just created, do not take their own header for a change.
func TestCheckSizeDetachesRewrittenHeader(t *testing.T) {
	seg, path := openTest(t, Options{})
	again, err := Open(path, Options{Index: testIndex, RingBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if seg.CheckSize() || again.CheckSize() {
		t.Fatalf("an unchanged header read as changed: %q, %q", seg.Lost(), again.Lost())
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte{3}, hVersion); err != nil {
		t.Fatal(err)
	}
	if !seg.CheckSize() || !strings.Contains(seg.Lost(), "header changed") {
		t.Fatalf("a rewritten layout version: lost %q, want the header named", seg.Lost())
	}
}

// A fault in the middle of an index write leaves no shard locked: after
// the detach, the index takes writes again instead of hanging its writers
// (the feed's, the ZMQ subscribers') for good.
func TestFaultInIndexWriteReleasesItsLocks(t *testing.T) {
	seg, path := openTest(t, Options{})
	ix := seg.Index()
	ix.Stored(3, []uint64{11, 12})
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	// A worker's removal reads the shard's counters under its lock, so
	// that is where this one faults.
	if seg.Guard(func() { ix.RemoveWorker(3) }) {
		t.Fatal("a removal from a truncated segment ran to its end: it should have faulted")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ix.RemoveWorker(3)
		ix.Stored(3, []uint64{15})
		ix.Cleared(3)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("index writes after a caught fault hang: a shard lock was left held")
	}
}
