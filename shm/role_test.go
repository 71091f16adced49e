package shm

import (
	"encoding/binary"
	"testing"

	"github.com/kvfast/kvfast/workers"
)

// TestRegistryRole: a publisher's role reaches readers; a slot re-taken
// by a publisher that declares none reads as workers.RoleBoth; a role this build
// does not know makes the slot unreadable rather than misrouted.
func TestRegistryRole(t *testing.T) {
	seg, path := openTest(t, Options{})
	cfg := WorkerConfig{WorkerID: 7, Model: "m", BlockSize: 16, Endpoint: "http://127.0.0.1:8001", Role: workers.RolePrefill}
	p, err := Register(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if w, ok := seg.Worker(p.Slot()); !ok || w.Role != workers.RolePrefill {
		t.Fatalf("registered as prefill, read %+v (ok %v)", w, ok)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.Role = workers.RoleBoth
	p, err = Register(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if w, ok := seg.Worker(p.Slot()); !ok || w.Role != workers.RoleBoth {
		t.Fatalf("re-registered without a role, read %+v (ok %v)", w, ok)
	}
	binary.LittleEndian.PutUint32(seg.bytesAt(slotOff(int(p.Slot()))+sRole, 4), 9)
	if _, err := seg.ReadWorker(p.Slot()); err == nil {
		t.Error("a slot with an unknown role was read")
	}
	binary.LittleEndian.PutUint32(seg.bytesAt(slotOff(int(p.Slot()))+sRole, 4), uint32(workers.RoleEncode))
	if w, err := seg.ReadWorker(p.Slot()); err != nil || w.Role != workers.RoleEncode {
		t.Errorf("an encode slot read as %+v, %v", w, err)
	}
	cfg.Role = workers.RoleEncode + 1
	if _, err := Register(path, cfg); err == nil {
		t.Error("registered an unknown role")
	}
}
