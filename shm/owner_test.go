package shm

import (
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/workers"
)

func TestOpenRefusesASegmentOthersCanWrite(t *testing.T) {
	seg, path := openTest(t, Options{})
	seg.Close()
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	_, err := Open(path, Options{})
	var oe *OwnerError
	if !errors.As(err, &oe) || !errors.Is(err, ErrForeignSegment) {
		t.Fatalf("Open of a world-writable segment: %v, want an *OwnerError", err)
	}
	for _, hint := range []string{"mode 0666", "chmod 600", "--allow-foreign-segment", "--recreate-segment"} {
		if !strings.Contains(err.Error(), hint) {
			t.Errorf("refusal %q does not say %q", err, hint)
		}
	}
	// The override attaches; so does the fix the message gives.
	again, err := Open(path, Options{AllowForeign: true})
	if err != nil {
		t.Fatalf("Open with AllowForeign: %v", err)
	}
	again.Close()
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	again, err = Open(path, Options{})
	if err != nil {
		t.Fatalf("Open after chmod 600: %v", err)
	}
	again.Close()
	// Engines (publishers) may run as other users: they are not refused.
	if err := os.Chmod(path, 0o660); err != nil {
		t.Fatal(err)
	}
	p, err := Register(path, WorkerConfig{WorkerID: 1, BlockSize: 16, Endpoint: "http://127.0.0.1:9"})
	if err != nil {
		t.Fatalf("Register on a group-writable segment: %v", err)
	}
	p.Close()
}

func TestOpenRefusesASegmentAnotherUserOwns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root can give a file to another user")
	}
	seg, path := openTest(t, Options{})
	seg.Close()
	if err := os.Chown(path, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	_, err := Open(path, Options{})
	var oe *OwnerError
	if !errors.As(err, &oe) || oe.Owner != 65534 {
		t.Fatalf("Open of a segment owned by uid 65534: %v, want an *OwnerError naming it", err)
	}
	if seg, err := Open(path, Options{AllowForeign: true}); err != nil {
		t.Fatalf("Open with AllowForeign: %v", err)
	} else {
		seg.Close()
	}
}

func TestReadWorkerReportsCorruptSlots(t *testing.T) {
	seg, path := openTest(t, Options{})
	p, err := Register(path, WorkerConfig{WorkerID: 1, Model: "m", BlockSize: 16, Endpoint: "http://127.0.0.1:9"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	slot := p.Slot()
	if info, err := seg.ReadWorker(slot); err != nil || info.State != StateLive {
		t.Fatalf("sound slot: %+v, %v", info, err)
	}
	if info, err := seg.ReadWorker(workers.Slot(63)); err != nil || info.State != StateFree {
		t.Fatalf("free slot: %+v, %v", info, err)
	}
	// A model length past its field: no publisher writes that.
	b := seg.bytesAt(slotOff(int(slot)), slotSize)
	binary.LittleEndian.PutUint16(b[sModelLen:], MaxModelLen+1)
	_, err = seg.ReadWorker(slot)
	var se *SlotError
	if !errors.As(err, &se) || se.Slot != int(slot) || !errors.Is(err, ErrSlotCorrupt) {
		t.Fatalf("corrupt slot: %v, want a *SlotError for slot %d", err, slot)
	}
	if _, ok := seg.Worker(slot); ok {
		t.Fatal("Worker lists a corrupt slot")
	}
}
