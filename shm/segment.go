package shm

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvfast/kvfast/radix"
)

// DefaultDir is where segments live unless the operator says otherwise:
// tmpfs, so the segment costs no disk I/O and survives router restarts
// but not reboots (the state is soft).
const DefaultDir = "/dev/shm"

// DefaultPath returns the segment path for name under DefaultDir.
func DefaultPath(name string) string { return filepath.Join(DefaultDir, name) }

// Options configure Open.
type Options struct {
	// Index sizes the embedded radix index. Required when the segment is
	// created; when attaching, a non-zero Capacity must match the file's.
	Index radix.Config
	// RingBytes is each worker's ring data size (a power of two). 0 means
	// DefaultRingBytes when creating and "whatever the file has" when
	// attaching.
	RingBytes int
	// Bindings is how many sticky sessions the bindings region holds. 0
	// means DefaultBindings when creating and "whatever the file has"
	// when attaching; another value must match the file's.
	Bindings int
	// Recreate formats a fresh segment even if a valid one exists. The old
	// file is marked retired once the new one is ready, so that attached
	// publishers notice.
	Recreate bool
	// ResetDamagedIndex formats the index region afresh, empty, when its
	// own header is damaged (a stray write) and no process ingests the
	// segment; IndexReset says so. Without it such a segment is refused
	// (*CorruptError). The index is soft state, refilled by the engines'
	// next KV events; a router sets it, kvfast inspect does not.
	ResetDamagedIndex bool
	// NoCreate refuses to create a missing segment (ErrNoSegment).
	NoCreate bool
	// AllowForeign attaches to an existing segment that another user owns
	// or that group or others may access. Without it such a segment is
	// refused (*OwnerError): whoever can write it can register engines,
	// forge KV events and rewrite the index the router trusts.
	AllowForeign bool
}

// Segment is one mapped segment file. A router opens it with Open (which
// also attaches the radix index); a publisher gets one through Register.
// All methods are safe for concurrent use.
type Segment struct {
	path string
	f    *os.File
	mem  []byte
	base unsafe.Pointer
	lay  layout
	hdr  Header
	// header is the header's bytes as attached, checksum included:
	// immutable once written, so any change is an overwrite (CheckSize).
	header [headerSumOff + 8]byte
	ix     *radix.Index // nil for publisher-only attachments
	binds  *Bindings    // nil for publisher-only attachments
	// indexReset says why Open formatted the index afresh, or "".
	indexReset string
	// displaced is the recorded pid of the router that ingested the file
	// this one replaced (Options.Recreate) while it still held the role,
	// or 0.
	displaced uint64
	closed    atomic.Bool
	mu        sync.Mutex // guards ingester-lock state
	locked    bool
	fault     faultState // fault.go
}

func newSegment(path string, f *os.File, mem []byte, lay layout, hdr Header) *Segment {
	base := unsafe.Pointer(unsafe.SliceData(mem))
	seg := &Segment{path: path, f: f, mem: mem, base: base, lay: lay, hdr: hdr}
	seg.fault.base, seg.fault.lo, seg.fault.hi = base, uintptr(base), uintptr(base)+uintptr(len(mem))
	return seg
}

// Open creates the segment at path, or attaches to the one already there.
// An existing file that fails any check is refused with an error wrapping
// ErrIncompatible (see CorruptError, VersionError, MismatchError) unless
// opts.Recreate is set.
func Open(path string, opts Options) (*Segment, error) {
	if opts.Recreate {
		return recreate(path, opts)
	}
	for attempt := 0; ; attempt++ {
		seg, err := attach(path, true, opts.AllowForeign)
		if cerr := (*CorruptError)(nil); errors.As(err, &cerr) && cerr.index && opts.ResetDamagedIndex {
			seg, err = resetIndex(path, opts.AllowForeign, cerr)
		}
		if err == nil {
			if err := seg.checkOptions(opts); err != nil {
				seg.Close()
				return nil, err
			}
			return seg, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		if opts.NoCreate {
			return nil, fmt.Errorf("cannot attach shm segment %s: %w", path, ErrNoSegment)
		}
		seg, err = create(path, opts, nil)
		if errors.Is(err, fs.ErrExist) && attempt < 3 {
			continue // another router created it first; attach to theirs
		}
		return seg, err
	}
}

func (s *Segment) checkOptions(opts Options) error {
	if opts.RingBytes != 0 && opts.RingBytes != s.lay.ringBytes {
		return &MismatchError{Path: s.path, Field: "ring size", Flag: "--ring-bytes", Have: s.lay.ringBytes, Want: opts.RingBytes}
	}
	if opts.Index.Capacity != 0 && opts.Index.Capacity != s.lay.indexCfg.Capacity {
		return &MismatchError{Path: s.path, Field: "index capacity", Flag: "--index-capacity", Have: s.lay.indexCfg.Capacity, Want: opts.Index.Capacity}
	}
	if opts.Bindings != 0 && opts.Bindings != s.hdr.Bindings {
		want, err := BindingsRegionSize(opts.Bindings)
		if err != nil {
			return err
		}
		if want != s.lay.bindingsSize {
			return &MismatchError{Path: s.path, Field: "session bindings", Flag: "--session-capacity", Have: s.hdr.Bindings, Want: opts.Bindings}
		}
	}
	return nil
}

func recreate(path string, opts Options) (*Segment, error) {
	if err := checkReplaceable(path); err != nil {
		return nil, err
	}
	// Tell publishers on the old file that it is dead, once the new one is
	// ready to take its name: a recreate that fails (an option out of
	// range, no room in /dev/shm) must leave the old file in service, not
	// retired under its own name, which every publisher then leaves for a
	// successor that never comes. Best effort: the old file may be too
	// corrupt to attach, and then nobody useful is on it.
	var displaced uint64
	seg, err := create(path, opts, func() {
		if old, err := attach(path, false, true); err == nil {
			if held, herr := old.IngesterHeld(); herr == nil && held {
				displaced = max(old.Ingester().PID, 1)
			}
			old.retire()
			old.Close()
		}
	})
	if seg != nil {
		seg.displaced = displaced
	}
	return seg, err
}

// checkReplaceable refuses to let recreate replace what is not a kvfast
// segment: a directory, or a file whose first bytes are not the magic (a
// mistyped path naming someone's data), however short. A missing or empty
// file, or a segment however damaged, may be replaced.
func checkReplaceable(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cannot recreate shm segment %s: %w", path, err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return fmt.Errorf("cannot recreate shm segment %s: not a regular file", path)
	}
	var head [len(magic)]byte
	n, err := io.ReadFull(f, head[:])
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("cannot recreate shm segment %s: %w", path, err)
	}
	return checkMagic(path, head[:n])
}

// create formats a new segment in a temporary file and only then makes it
// visible under path, so no process ever attaches a half-formatted
// segment. With replace nil it fails with fs.ErrExist if path appeared in
// the meantime; otherwise it calls replace, then renames the new file
// over whatever path names.
func create(path string, opts Options, replace func()) (*Segment, error) {
	ringBytes := opts.RingBytes
	if ringBytes == 0 {
		ringBytes = DefaultRingBytes
	}
	indexSize, err := radix.RegionSize(opts.Index)
	if err != nil {
		return nil, fmt.Errorf("cannot create shm segment %s: %w", path, err)
	}
	bindings := opts.Bindings
	if bindings == 0 {
		bindings = DefaultBindings
	}
	bindingsSize, err := BindingsRegionSize(bindings)
	if err != nil {
		return nil, fmt.Errorf("cannot create shm segment %s: %w", path, err)
	}
	lay, err := newLayout(ringBytes, indexSize, bindingsSize, opts.Index)
	if err != nil {
		return nil, fmt.Errorf("cannot create shm segment %s: %w", path, err)
	}
	sweepStaleTemps(path)
	var nonce [8]byte
	rand.Read(nonce[:])
	tmp := fmt.Sprintf("%s.tmp-%d-%x", path, os.Getpid(), nonce[:4])
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrNotExist) {
		// ENOENT from a create is a missing directory, or a file system
		// (procfs, sysfs) that creates no files where it says the
		// directory is.
		if st, serr := os.Stat(filepath.Dir(path)); serr == nil && st.IsDir() {
			return nil, fmt.Errorf("cannot create shm segment %s: directory %s takes no new files (%w): use a directory on tmpfs, such as /dev/shm", path, filepath.Dir(path), err)
		}
		return nil, fmt.Errorf("cannot create shm segment %s: directory %s does not exist: %w", path, filepath.Dir(path), fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("cannot create shm segment %s: %w", path, err)
	}
	defer os.Remove(tmp)
	fail := func(err error) (*Segment, error) {
		f.Close()
		return nil, fmt.Errorf("cannot create shm segment %s: %w", path, err)
	}
	if err := f.Chmod(0o600); err != nil { // umask cannot widen 0600, but a pre-set ACL might
		return fail(err)
	}
	if err := f.Truncate(int64(lay.fileSize)); err != nil {
		return fail(err)
	}
	if err := reserve(f, path, int64(lay.fileSize)); err != nil {
		f.Close()
		return nil, err
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, lay.fileSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(err)
	}
	seg := newSegment(path, f, mem, lay, Header{})
	ix, err := radix.Format(mem[lay.indexOff:lay.indexOff+lay.indexSize], opts.Index)
	if err != nil {
		seg.Close()
		return nil, fmt.Errorf("cannot create shm segment %s: %w", path, err)
	}
	seg.ix = ix
	// The header goes last: its checksum is what makes the file valid.
	lay.encodeHeader(mem[:headerSize], binary.LittleEndian.Uint64(nonce[:]), time.Now().UnixNano())
	if _, seg.hdr, err = decodeHeader(path, mem, int64(len(mem))); err != nil {
		panic("BUG: shm: freshly encoded header does not decode: " + err.Error())
	}
	copy(seg.header[:], mem)
	if seg.binds, err = attachBindings(seg.bytesAt(lay.bindingsOff, lay.bindingsSize), seg.hdr.SegmentID); err != nil {
		panic("BUG: shm: freshly laid out bindings region does not attach: " + err.Error())
	}
	seg.binds.seg = seg
	if replace != nil {
		replace()
		err = os.Rename(tmp, path)
	} else {
		err = os.Link(tmp, path)
	}
	if err != nil {
		seg.Close()
		return nil, fmt.Errorf("cannot publish shm segment %s: %w", path, err)
	}
	return seg, nil
}

// sweepStaleTemps removes the temporary files that create left beside
// path in processes that died before they could remove them (killed
// while formatting): each is as large as a segment and fully allocated,
// in tmpfs memory, and a crash loop had filled /dev/shm with them until
// no segment fit. A file whose process still runs (another router
// creating the segment now) is left alone. A process in another PID
// namespace, which looks dead from here, would lose its file and fail to
// publish its segment, saying so; its next start succeeds.
func sweepStaleTemps(path string) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		// Exactly create's name: <base>.tmp-<pid>-<8 hex digits>.
		m := tempName.FindStringSubmatch(e.Name())
		if m == nil || m[1] != base || !e.Type().IsRegular() {
			continue
		}
		pid, err := strconv.Atoi(m[2])
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := unix.Kill(pid, 0); !errors.Is(err, unix.ESRCH) {
			continue // alive, or not ours to signal: not known dead
		}
		_ = os.Remove(filepath.Join(dir, e.Name()))
	}
}

// tempName matches the names create gives its temporary files.
var tempName = regexp.MustCompile(`^(.+)\.tmp-([0-9]+)-[0-9a-f]{8}$`)

// attach maps an existing segment and validates it; withIndex also
// attaches the radix index (routers and inspect need it, publishers not).
// Without allowForeign, a segment that is not ours alone is refused
// before any of its bytes is read.
func attach(path string, withIndex, allowForeign bool) (*Segment, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		if st, serr := os.Stat(path); errors.Is(err, fs.ErrPermission) && serr == nil {
			// Someone else's segment: say whose, and what mends it.
			owner := -1
			if sys, ok := st.Sys().(*syscall.Stat_t); ok {
				owner = int(sys.Uid)
			}
			return nil, fmt.Errorf("cannot attach shm segment %s: %w: it is owned by uid %d with mode %#o, and the router runs as uid %d; "+
				"its owner or root can delete it (in a sticky directory such as /dev/shm no one else can, nor replace it with --recreate-segment), "+
				"or give it to this user: `chown %d %s && chmod 600 %s`; or run the router as uid %d, or give it another --segment",
				path, err, owner, st.Mode().Perm(), os.Geteuid(), os.Geteuid(), path, path, owner)
		}
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("cannot attach shm segment %s: %w", path, err)
	}
	if !allowForeign {
		if err := checkOwner(path, st); err != nil {
			f.Close()
			return nil, err
		}
	}
	size := st.Size()
	// Validate the header from a private copy first: mapping a huge file
	// only to refuse it would be wasteful, and the copy cannot change
	// under us while we check it. The copy is whatever the file has, so
	// that a short file is judged by its magic before its size.
	var hb [headerSize]byte
	n, err := f.ReadAt(hb[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		f.Close()
		return nil, fmt.Errorf("cannot attach shm segment %s: %w", path, err)
	}
	if size > 1<<41 {
		f.Close()
		return nil, &CorruptError{Path: path, Reason: fmt.Sprintf("file is %d bytes, larger than any layout", size)}
	}
	lay, hdr, err := decodeHeader(path, hb[:n], size)
	if err != nil {
		f.Close()
		return nil, err
	}
	// A segment left sparse (by an older router, or a file system that
	// filled since) is backed now, so that no later write can fault.
	if err := reserve(f, path, int64(lay.fileSize)); err != nil {
		f.Close()
		return nil, err
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, lay.fileSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("cannot map shm segment %s: %w", path, err)
	}
	seg := newSegment(path, f, mem, lay, hdr)
	copy(seg.header[:], hb[:n]) // as validated
	if withIndex {
		ix, err := radix.Attach(mem[lay.indexOff : lay.indexOff+lay.indexSize])
		if err != nil {
			seg.Close()
			return nil, &CorruptError{Path: path, Reason: "index region: " + err.Error(), index: true}
		}
		if err := seg.attachRegions(ix); err != nil {
			seg.Close()
			return nil, err
		}
	}
	return seg, nil
}

// attachRegions makes ix the segment's index and attaches its bindings.
func (s *Segment) attachRegions(ix *radix.Index) error {
	s.ix = ix
	// The region's geometry comes from the validated header; its contents
	// are hints that Bindings bounds-checks by construction.
	var err error
	if s.binds, err = attachBindings(s.bytesAt(s.lay.bindingsOff, s.lay.bindingsSize), s.hdr.SegmentID); err != nil {
		return &CorruptError{Path: s.path, Reason: "bindings region: " + err.Error()}
	}
	s.binds.seg = s
	return nil
}

// resetIndex attaches a segment whose index region's header is damaged
// (damage), formatting the region afresh: under the ingester lock, so
// that no process is writing the index meanwhile. A segment another
// process ingests is refused as damaged, saying so.
func resetIndex(path string, allowForeign bool, damage *CorruptError) (*Segment, error) {
	seg, err := attach(path, false, allowForeign)
	if err != nil {
		return nil, err
	}
	ok, err := seg.TryLockIngester()
	if !ok {
		seg.Close()
		if err != nil {
			return nil, err
		}
		return nil, &CorruptError{Path: path, Reason: damage.Reason + " (another process ingests the segment: stop it first)", index: true}
	}
	defer seg.UnlockIngester()
	ix, err := radix.Format(seg.mem[seg.lay.indexOff:seg.lay.indexOff+seg.lay.indexSize], seg.lay.indexCfg)
	if err == nil {
		err = seg.attachRegions(ix)
	}
	if err != nil {
		seg.Close()
		return nil, err
	}
	seg.indexReset = damage.Reason
	return seg, nil
}

// IndexReset says why Open formatted the index afresh
// (Options.ResetDamagedIndex), or "" if it did not.
func (s *Segment) IndexReset() string { return s.indexReset }

// MemoryBacked reports whether the segment's file lives on a file system
// kept in memory (tmpfs, as /dev/shm is, ramfs, hugetlbfs), and the file
// system's type otherwise. On a disk-backed one the kernel writes the
// mapped pages back to disk, and engines registering under /dev/shm look
// for another file. An error reading it reports true: nothing to warn of.
func (s *Segment) MemoryBacked() (fsType int64, ok bool) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(s.f.Fd()), &st); err != nil {
		return 0, true
	}
	switch st.Type {
	case unix.TMPFS_MAGIC, unix.RAMFS_MAGIC, unix.HUGETLBFS_MAGIC:
		return st.Type, true
	}
	return st.Type, false
}

// Displaced reports whether Open (Options.Recreate) replaced a file that a
// running router still ingested, and that router's pid as it recorded it
// (in its own PID namespace; 1 when it recorded none). That router reads
// the retired file from then on, until it is restarted.
func (s *Segment) Displaced() (pid uint64, ok bool) { return s.displaced, s.displaced != 0 }

// fallocate is unix.Fallocate; tests make it report a full file system.
var fallocate = unix.Fallocate

// reserve has the file system back every byte of the segment's file now.
// Truncate alone makes it sparse: on a tmpfs too small for it, the first
// write to a page it cannot supply raises SIGBUS, which kills the process
// (measured: kvfast serve on a 16 MiB tmpfs died formatting its 132 MiB
// index). A file system that cannot reserve (EOPNOTSUPP) keeps the file
// sparse, as before.
func reserve(f *os.File, path string, size int64) error {
	err := fallocate(int(f.Fd()), 0, 0, size)
	switch {
	case err == nil, errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOSYS):
		return nil
	case errors.Is(err, unix.ENOSPC):
		free := int64(-1)
		var st unix.Statfs_t
		if unix.Fstatfs(int(f.Fd()), &st) == nil {
			free = int64(st.Bavail) * st.Bsize
		}
		return &SpaceError{Path: path, Size: size, Free: free}
	}
	return fmt.Errorf("cannot back shm segment %s: %w", path, err)
}

// checkOwner refuses a segment file that another user owns or that group
// or others may read or write: the stat comes from the descriptor attach
// goes on to map, so the file cannot be swapped in between.
func checkOwner(path string, st fs.FileInfo) error {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return nil // not a POSIX file system: nothing to compare
	}
	uid := os.Geteuid()
	if int(sys.Uid) != uid || st.Mode().Perm()&0o077 != 0 {
		return &OwnerError{Path: path, Owner: int(sys.Uid), Mode: st.Mode().Perm(), UID: uid}
	}
	return nil
}

// Close unmaps the segment and closes the file, releasing the ingester
// lock if this Segment held it. Views obtained from it must not be used
// afterwards.
func (s *Segment) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	// Closing any descriptor of the file drops this process's POSIX
	// record locks on it, including the registry lock another goroutine
	// may hold, so wait for registrations in flight.
	registryMu.Lock()
	defer registryMu.Unlock()
	s.fault.mu.Lock() // a detach in progress maps over the range: not after it is freed
	defer s.fault.mu.Unlock()
	err := unix.Munmap(s.mem)
	s.mem, s.base = nil, nil
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Path returns the file the segment was opened from.
func (s *Segment) Path() string { return s.path }

// Header returns the validated header.
func (s *Segment) Header() Header { return s.hdr }

// Index returns the radix index embedded in the segment, or nil for a
// publisher-only attachment.
func (s *Segment) Index() *radix.Index { return s.ix }

// Bindings returns the sticky-session table embedded in the segment, or
// nil for a publisher-only attachment.
func (s *Segment) Bindings() *Bindings { return s.binds }

// Retired reports whether a router recreated the segment under a new
// file, leaving this mapping orphaned.
func (s *Segment) Retired() bool { return atomic.LoadUint64(s.u64(controlOff+controlRetired)) != 0 }

// Replaced reports whether the segment's path no longer names this file:
// it was deleted (as a refusal's message advises) or another file took
// its name. Whoever maps it then talks to no one who opens the path
// later: publishers must register again, as after Retired, and a router
// must be restarted. It costs two stat calls: for heartbeats and polls,
// not for hot paths.
func (s *Segment) Replaced() bool {
	var mine, named unix.Stat_t
	if unix.Fstat(int(s.f.Fd()), &mine) != nil {
		return false
	}
	if err := unix.Stat(s.path, &named); err != nil {
		return errors.Is(err, unix.ENOENT)
	}
	return mine.Dev != named.Dev || mine.Ino != named.Ino
}

func (s *Segment) retire() { atomic.StoreUint64(s.u64(controlOff+controlRetired), 1) }

// u64 and u32 address words whose offsets come from the validated layout;
// all are naturally aligned because every region starts 64-byte aligned.
func (s *Segment) u64(off int) *uint64 { return (*uint64)(unsafe.Add(s.base, off)) }
func (s *Segment) u32(off int) *uint32 { return (*uint32)(unsafe.Add(s.base, off)) }

// bytesAt returns a view of n bytes at off.
func (s *Segment) bytesAt(off, n int) []byte { return s.mem[off : off+n : off+n] }

// monoNow is CLOCK_MONOTONIC in nanoseconds: the clock every process on
// the host shares (Python's time.monotonic_ns reads the same one), immune
// to wall-clock steps, which heartbeats must be.
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("BUG: shm: CLOCK_MONOTONIC unavailable: " + err.Error())
	}
	return ts.Nano()
}

// MonotonicNow exposes the heartbeat clock for callers comparing against
// WorkerInfo.Heartbeat.
func MonotonicNow() int64 { return monoNow() }
