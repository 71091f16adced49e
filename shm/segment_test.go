package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
)

var testIndex = radix.Config{Capacity: 1 << 14}

func openTest(t testing.TB, opts Options) (*Segment, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "seg")
	if opts.Index.Capacity == 0 {
		opts.Index = testIndex
	}
	if opts.RingBytes == 0 {
		opts.RingBytes = 64 << 10
	}
	seg, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seg.Close() })
	return seg, path
}

func TestSegmentCreateAttach(t *testing.T) {
	seg, path := openTest(t, Options{})
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	if off := seg.Header().IndexOffset; off%64 != 0 {
		t.Errorf("index offset %d not 64-byte aligned", off)
	}
	for i := 0; i < workers.Max; i++ {
		if seg.lay.ringOff(i)%64 != 0 || (seg.lay.ringOff(i)+ringControlSize)%64 != 0 {
			t.Fatalf("ring %d not 64-byte aligned", i)
		}
	}
	hashes := radix.AppendBlockHashes(nil, 7, make([]uint32, 64), 16)
	seg.Index().Stored(3, hashes)

	// A second router attaches to the warm index.
	again, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if again.Header().SegmentID != seg.Header().SegmentID {
		t.Fatal("attached to a different segment")
	}
	var ov workers.Overlaps
	if set := again.Index().FindMatches(hashes, &ov); !set.Has(3) || ov[3] != 4 {
		t.Fatalf("warm index lost blocks: set %b overlap %d", set, ov[3])
	}
	if _, err := Open(path, Options{RingBytes: 128 << 10}); !errors.As(err, new(*MismatchError)) {
		t.Fatalf("ring size mismatch: got %v", err)
	} else if want := fmt.Sprintf("give --ring-bytes %d", seg.lay.ringBytes); !strings.Contains(err.Error(), want) {
		// The fix that keeps the segment (and whoever uses it) comes first.
		t.Fatalf("ring size mismatch %q does not say %q", err, want)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "none"), Options{NoCreate: true}); !errors.Is(err, ErrNoSegment) {
		t.Fatalf("NoCreate: got %v", err)
	}
}

func TestSegmentRefusals(t *testing.T) {
	le := binary.LittleEndian
	cases := []struct {
		name   string
		damage func(t *testing.T, path string, b []byte) []byte
		check  func(error) bool
	}{
		{"wrong version", func(t *testing.T, _ string, b []byte) []byte {
			le.PutUint32(b[hVersion:], LayoutVersion+1)
			le.PutUint64(b[headerSumOff:], headerSum(b))
			return b
		}, func(err error) bool { return errors.As(err, new(*VersionError)) }},
		{"bad magic", func(t *testing.T, _ string, b []byte) []byte { b[0] ^= 0xff; return b },
			func(err error) bool { return errors.As(err, new(*NotSegmentError)) }},
		// Shorter than the magic or the header, yet not a segment: the magic
		// is checked first, so neither is taken for a truncated segment.
		{"six bytes of data", func(t *testing.T, _ string, b []byte) []byte { return []byte("hello\n") },
			func(err error) bool { return errors.As(err, new(*NotSegmentError)) }},
		{"nineteen bytes of data", func(t *testing.T, _ string, b []byte) []byte { return []byte("not a segment, data") },
			func(err error) bool { return errors.As(err, new(*NotSegmentError)) }},
		{"empty", func(t *testing.T, _ string, b []byte) []byte { return nil },
			func(err error) bool { return errors.As(err, new(*CorruptError)) }},
		{"magic only", func(t *testing.T, _ string, b []byte) []byte { return b[:len(magic)] },
			func(err error) bool { return errors.As(err, new(*CorruptError)) }},
		{"checksum", func(t *testing.T, _ string, b []byte) []byte { b[hRingBytes] ^= 1; return b },
			func(err error) bool { return errors.As(err, new(*CorruptError)) }},
		{"consistent but lying offset", func(t *testing.T, _ string, b []byte) []byte {
			le.PutUint64(b[hIndexOff:], le.Uint64(b[hIndexOff:])+4096)
			le.PutUint64(b[headerSumOff:], headerSum(b))
			return b
		}, func(err error) bool { return errors.As(err, new(*CorruptError)) }},
		{"truncated", func(t *testing.T, _ string, b []byte) []byte { return b[:len(b)/2] },
			func(err error) bool { return errors.As(err, new(*CorruptError)) }},
		{"shorter than header", func(t *testing.T, _ string, b []byte) []byte { return b[:100] },
			func(err error) bool { return errors.As(err, new(*CorruptError)) }},
		{"corrupt index region", func(t *testing.T, _ string, b []byte) []byte {
			off := le.Uint64(b[hIndexOff:])
			b[off+20] ^= 0xff
			return b
		}, func(err error) bool { return errors.As(err, new(*CorruptError)) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			seg, path := openTest(t, Options{})
			seg.Close()
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, tc.damage(t, path, b), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err = Open(path, Options{Index: testIndex})
			if err == nil || !tc.check(err) || !errors.Is(err, ErrIncompatible) {
				t.Fatalf("got %v (%T)", err, err)
			}
			if !strings.Contains(err.Error(), "--recreate-segment") || !strings.Contains(err.Error(), path) {
				t.Fatalf("error does not say how to recover: %v", err)
			}
			// Publishers never touch the index, so only header damage concerns them.
			if _, err := Register(path, WorkerConfig{BlockSize: 16}); tc.name != "corrupt index region" && !errors.Is(err, ErrIncompatible) {
				t.Fatalf("publisher attached a refused segment: %v", err)
			}
			if errors.As(err, new(*NotSegmentError)) {
				// Not a segment, maybe someone's data: never overwritten, and
				// the first refusal must not suggest that it may be.
				if strings.Contains(err.Error(), recreateHint) {
					t.Fatalf("refusal of a file that is not a segment suggests recreating it: %v", err)
				}
				before, _ := os.ReadFile(path)
				if _, err := Open(path, Options{Index: testIndex, Recreate: true}); !errors.As(err, new(*NotSegmentError)) {
					t.Fatalf("recreate over a file that is not a segment: %v", err)
				}
				if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
					t.Fatal("recreate changed a file that is not a segment")
				}
				return
			}
			fresh, err := Open(path, Options{Index: testIndex, Recreate: true})
			if err != nil {
				t.Fatalf("recreate: %v", err)
			}
			fresh.Close()
			again, err := Open(path, Options{})
			if err != nil {
				t.Fatalf("attach after recreate: %v", err)
			}
			again.Close()
		})
	}
}

func TestRecreateRetiresOldSegment(t *testing.T) {
	seg, path := openTest(t, Options{})
	p, err := seg.Register(WorkerConfig{WorkerID: 1, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := Open(path, Options{Index: testIndex, RingBytes: 64 << 10, Recreate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if err := p.Heartbeat(); !errors.Is(err, ErrRetired) {
		t.Fatalf("heartbeat on retired segment: %v", err)
	}
	if fresh.Header().SegmentID == seg.Header().SegmentID {
		t.Fatal("recreate kept the segment id")
	}
	if _, ok := fresh.Displaced(); ok {
		t.Error("a recreate over a segment no router ingests says it displaced one")
	}
}

// TestRecreateNamesTheRouterItDisplaces: recreating a segment whose
// ingester lock is held tells the caller, with the holder's recorded pid,
// so that the router that recreates can say which router now reads a
// retired file.
func TestRecreateNamesTheRouterItDisplaces(t *testing.T) {
	seg, path := openTest(t, Options{})
	if ok, err := seg.TryLockIngester(); !ok || err != nil {
		t.Fatalf("TryLockIngester = %v, %v", ok, err)
	}
	fresh, err := Open(path, Options{Index: testIndex, RingBytes: 64 << 10, Recreate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if pid, ok := fresh.Displaced(); !ok || pid != uint64(os.Getpid()) {
		t.Fatalf("Displaced = %d, %v; want this process's pid %d", pid, ok, os.Getpid())
	}
}

// TestFailedRecreateLeavesTheSegmentInService: a recreate that fails
// (options out of range) must not retire the file still in service under
// the path, which every publisher would then leave for a successor that
// never comes.
func TestFailedRecreateLeavesTheSegmentInService(t *testing.T) {
	seg, path := openTest(t, Options{})
	p, err := seg.Register(WorkerConfig{WorkerID: 1, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path, Options{Index: radix.Config{Capacity: 1 << 40}, Recreate: true}); err == nil {
		t.Fatal("recreated a segment with a 2^40-block index")
	}
	if seg.Retired() || seg.Replaced() {
		t.Fatalf("the failed recreate retired (%v) or replaced (%v) the segment", seg.Retired(), seg.Replaced())
	}
	if err := p.Heartbeat(); err != nil {
		t.Fatalf("heartbeat after a failed recreate: %v", err)
	}
}

// TestDeletedOrReplacedSegmentRetiresPublishers: a segment file that was
// deleted (as a refusal's message advises) or replaced by another file
// under its name reaches no router that opens the path later: a
// publisher's heartbeat says so with ErrRetired, as after a recreate, so
// that it registers again.
func TestDeletedOrReplacedSegmentRetiresPublishers(t *testing.T) {
	seg, path := openTest(t, Options{})
	p, err := seg.Register(WorkerConfig{WorkerID: 1, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Heartbeat(); err != nil || seg.Replaced() {
		t.Fatalf("heartbeat on a live segment: %v (replaced %v)", err, seg.Replaced())
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := p.Heartbeat(); !errors.Is(err, ErrRetired) || !seg.Replaced() {
		t.Fatalf("heartbeat on a deleted segment: %v", err)
	}
	other, err := Open(path, Options{Index: testIndex, RingBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := p.Heartbeat(); !errors.Is(err, ErrRetired) || !seg.Replaced() || other.Replaced() {
		t.Fatalf("heartbeat on a segment whose path names another file: %v", err)
	}
}

// TestSegmentRefusedWhenItCannotBeBacked: a file system without room for
// the segment (a container's 64 MiB /dev/shm) refuses it at Open, create
// or attach, with a SpaceError that says what to enlarge, and leaves no
// file behind; one that cannot reserve at all keeps the file sparse.
func TestSegmentRefusedWhenItCannotBeBacked(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "seg")
	opts := Options{Index: testIndex, RingBytes: 64 << 10}
	restore := setFallocate(func(int, uint32, int64, int64) error { return unix.ENOSPC })
	_, err := Open(path, opts)
	restore()
	var se *SpaceError
	if !errors.As(err, &se) || !errors.Is(err, ErrNoSpace) || se.Path != path || se.Size <= 0 {
		t.Fatalf("create on a full file system: %v", err)
	}
	for _, want := range []string{"--shm-size", "--index-capacity", "MiB"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q: %v", want, err)
		}
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("a refused create left %v behind", left)
	}

	seg, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := seg.Close(); err != nil {
		t.Fatal(err)
	}
	restore = setFallocate(func(int, uint32, int64, int64) error { return unix.ENOSPC })
	_, err = Open(path, opts)
	restore()
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("attach on a full file system: %v", err)
	}

	restore = setFallocate(func(int, uint32, int64, int64) error { return unix.EOPNOTSUPP })
	defer restore()
	seg, err = Open(path, opts)
	if err != nil {
		t.Fatalf("attach where the file system cannot reserve: %v", err)
	}
	seg.Close()
}

// TestDamagedIndexHeaderIsReset: a stray write over the index region's
// header made every router restart fail until an operator recreated the
// segment; a router (ResetDamagedIndex) now formats the region afresh,
// unless another process ingests the segment. kvfast inspect still
// refuses it.
func TestDamagedIndexHeaderIsReset(t *testing.T) {
	seg, path := openTest(t, Options{})
	seg.Index().Stored(3, []uint64{1, 2})
	p, err := seg.Register(WorkerConfig{WorkerID: 1, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	off := int64(seg.lay.indexOff)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("garbage!"), off); err != nil {
		t.Fatal(err)
	}
	f.Close()

	if _, err := Open(path, Options{NoCreate: true}); !errors.As(err, new(*CorruptError)) {
		t.Fatalf("attach without the reset: %v", err)
	}
	// Another process ingests (here, this test's first handle): refused.
	if ok, err := seg.TryLockIngester(); !ok || err != nil {
		t.Fatalf("ingester lock: %v %v", ok, err)
	}
	if _, err := Open(path, Options{ResetDamagedIndex: true}); err == nil || !strings.Contains(err.Error(), "another process ingests") {
		t.Fatalf("reset under a live ingester: %v", err)
	}
	seg.UnlockIngester()

	fresh, err := Open(path, Options{ResetDamagedIndex: true})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if fresh.IndexReset() == "" || fresh.Index().Stats().Entries != 0 {
		t.Fatalf("reset %q, entries %d", fresh.IndexReset(), fresh.Index().Stats().Entries)
	}
	fresh.Index().Stored(3, []uint64{1})
	if fresh.Index().Stats().WorkerBlocks[3] != 1 {
		t.Fatal("the reset index takes no store")
	}
	if err := p.Heartbeat(); err != nil {
		t.Fatalf("the registered engine lost its registration: %v", err)
	}
	again, err := Open(path, Options{NoCreate: true})
	if err != nil {
		t.Fatalf("attach after the reset: %v", err)
	}
	again.Close()
}

// TestCreateSweepsDeadProcessesTemps: a process killed while it formatted
// a segment leaves its temporary file, as large as a segment, in tmpfs
// memory; a crash loop filled /dev/shm with them. The next create removes
// those of dead processes, and leaves a live one's (a router creating the
// segment now) alone.
func TestCreateSweepsDeadProcessesTemps(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "seg")
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Skipf("cannot run a process to outlive: %v", err)
	}
	dead := fmt.Sprintf("%s.tmp-%d-00000000", path, gone.Process.Pid)
	live := fmt.Sprintf("%s.tmp-%d-00000000", path, os.Getppid())
	// Another segment whose name only starts like a temporary file.
	other := fmt.Sprintf("%s.tmp-%d", path, gone.Process.Pid)
	for _, name := range []string{dead, live, other} {
		if err := os.WriteFile(name, make([]byte, 4096), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	seg, err := Open(path, Options{Index: testIndex, RingBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	if _, err := os.Stat(dead); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a dead process's temporary file is still there: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("a live process's temporary file was removed: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("a file not named as create names its temporary files was removed: %v", err)
	}
}

// TestIngesterHeld: the probe reports the flock, whoever holds it (this
// handle or another), and leaves it as it found it.
func TestIngesterHeld(t *testing.T) {
	seg, path := openTest(t, Options{})
	other, err := Open(path, Options{NoCreate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	held := func(s *Segment) bool {
		t.Helper()
		h, err := s.IngesterHeld()
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	if held(seg) || held(other) {
		t.Fatal("held before anyone locked it")
	}
	if ok, err := seg.TryLockIngester(); !ok || err != nil {
		t.Fatalf("lock: %v %v", ok, err)
	}
	if !held(seg) || !held(other) {
		t.Fatal("not held while a handle holds it")
	}
	// The probe took nothing: the other handle still cannot lock.
	if ok, _ := other.TryLockIngester(); ok {
		t.Fatal("a second ingester after the probe")
	}
	if err := seg.UnlockIngester(); err != nil {
		t.Fatal(err)
	}
	if held(other) {
		t.Fatal("held after the unlock")
	}
	if ok, err := other.TryLockIngester(); !ok || err != nil {
		t.Fatalf("the other handle cannot lock after the probes: %v %v", ok, err)
	}
}

// TestMemoryBacked: a segment under /dev/shm is on tmpfs; one on a
// disk-backed file system is reported with its type, for the router's
// warning (a relative --segment path put it in the working directory).
func TestMemoryBacked(t *testing.T) {
	if dir, err := os.MkdirTemp("/dev/shm", "kvfast-test-"); err == nil {
		t.Cleanup(func() { os.RemoveAll(dir) })
		seg, err := Open(filepath.Join(dir, "seg"), Options{Index: testIndex, RingBytes: 64 << 10})
		if err != nil {
			t.Fatal(err)
		}
		defer seg.Close()
		if fsType, ok := seg.MemoryBacked(); !ok {
			t.Errorf("a segment under /dev/shm is reported on a disk-backed file system (type %#x)", fsType)
		}
	}
	seg, path := openTest(t, Options{})
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(path), &st); err != nil {
		t.Fatal(err)
	}
	if st.Type == unix.TMPFS_MAGIC {
		t.Skip("the test's temp dir is on tmpfs: no disk-backed file system to try")
	}
	if fsType, ok := seg.MemoryBacked(); ok || fsType != st.Type {
		t.Errorf("a segment on file system type %#x: MemoryBacked = %#x, %v", st.Type, fsType, ok)
	}
}
