package shm

import (
	"errors"
	"testing"
)

// TestRegisterRefusesARetiredSegmentInPlace: a segment marked retired
// that no new file replaced (a stray write, a router that died while
// recreating it) takes no registration: one would be retired at its next
// heartbeat and registered again, for ever, each time dropping the
// worker's blocks.
func TestRegisterRefusesARetiredSegmentInPlace(t *testing.T) {
	seg, path := openTest(t, Options{})
	seg.retire()
	if _, err := seg.Register(WorkerConfig{WorkerID: 1, BlockSize: 16}); !errors.Is(err, ErrRetired) {
		t.Fatalf("Register in a retired segment: %v", err)
	}
	if _, err := Register(path, WorkerConfig{WorkerID: 1, BlockSize: 16}); !errors.Is(err, ErrRetired) {
		t.Fatalf("Register by path of a retired segment: %v", err)
	}
}
