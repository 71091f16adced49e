package shm

import (
	"errors"
	"fmt"
	"io/fs"
)

// recreateHint ends every refusal, because the operator's next step is
// always the same: the segment holds only soft state that engines and the
// router rebuild.
const recreateHint = "delete the file or start the router with --recreate-segment"

var (
	// ErrIncompatible is the sentinel every refusal to attach a segment
	// wraps: wrong magic or version, a truncated file, a corrupt header,
	// a corrupt index region, or sizes that differ from the options.
	ErrIncompatible = errors.New("kvfast: incompatible or corrupt shm segment")
	// ErrNoSegment means the segment file does not exist and the caller
	// asked not to create it.
	ErrNoSegment = errors.New("kvfast: shm segment does not exist")
	// ErrRegistryFull means all 64 worker slots are held by live workers.
	ErrRegistryFull = errors.New("kvfast: every worker slot is taken")
	// ErrRingFull means the record was dropped because the consumer is
	// behind; the router sees the gap in sequence numbers and resyncs.
	ErrRingFull = errors.New("kvfast: event ring full, record dropped")
	// ErrSlotLost means another publisher took over this worker's slot
	// (same worker id and DP rank registered again).
	ErrSlotLost = errors.New("kvfast: worker slot was taken over by another registration")
	// ErrWorkerLive means another engine, alive and heartbeating, holds
	// the worker id and DP rank being registered: two engines were given
	// one id. Taking its slot would leave that engine unseen and publishing
	// nothing, and the two taking the slot from each other.
	ErrWorkerLive = errors.New("kvfast: a live engine holds this worker id and DP rank")
	// ErrClosed is returned by a closed publisher or segment.
	ErrClosed = errors.New("kvfast: closed")
	// ErrRetired means a router recreated the segment under a new file,
	// or the file was deleted, replaced or truncated; publishers must
	// register again (at the path, once a router has created it anew) to
	// be seen.
	ErrRetired = errors.New("kvfast: shm segment was recreated; register again")
	// ErrForeignSegment is what OwnerError wraps: the segment is not this
	// user's alone.
	ErrForeignSegment = errors.New("kvfast: shm segment is owned or writable by another user")
	// ErrNoSpace is what SpaceError wraps: the segment's file system
	// cannot hold it.
	ErrNoSpace = errors.New("kvfast: no room for the shm segment")
	// ErrSlotCorrupt means a registry slot's bytes are not a registration
	// any publisher writes (see SlotError).
	ErrSlotCorrupt = errors.New("kvfast: corrupt registry slot")
	// ErrTorn means a seqlock read kept racing a writer (or the writer
	// died mid-update) and no consistent snapshot was obtained.
	ErrTorn = errors.New("kvfast: no consistent snapshot (writer busy or dead mid-update)")
)

// NotSegmentError refuses a file that is not a kvfast segment at all (it
// does not begin with the magic): a mistyped path, most likely. Unlike a
// damaged segment it is never overwritten, not even by --recreate-segment.
type NotSegmentError struct{ Path string }

func (e *NotSegmentError) Error() string {
	return fmt.Sprintf("kvfast: %s is not a kvfast shm segment (it does not begin with %q): check the path (--segment); "+
		"kvfast will not overwrite it, even with --recreate-segment; delete it yourself if it is a leftover", e.Path, magic)
}

func (e *NotSegmentError) Unwrap() error { return ErrIncompatible }

// CorruptError refuses a segment whose bytes cannot be trusted.
type CorruptError struct {
	Path   string
	Reason string
	index  bool // the index region's header is what failed (Options.ResetDamagedIndex)
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("kvfast: cannot attach shm segment %s: %s; %s", e.Path, e.Reason, recreateHint)
}

func (e *CorruptError) Unwrap() error { return ErrIncompatible }

// VersionError refuses a segment written by a build with another layout.
type VersionError struct {
	Path       string
	Have, Want uint32
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("kvfast: cannot attach shm segment %s: layout version %d, this build reads version %d; %s",
		e.Path, e.Have, e.Want, recreateHint)
}

func (e *VersionError) Unwrap() error { return ErrIncompatible }

// MismatchError refuses a valid segment whose sizes differ from what the
// options ask for, rather than silently running with other sizes.
type MismatchError struct {
	Path       string
	Field      string
	Flag       string // the setting that asks for Want, as kvfast serve spells it
	Have, Want int
}

func (e *MismatchError) Error() string {
	// Attaching with the segment's own setting is the fix that keeps it:
	// recreating it retires the routers and engines using it, and the
	// warm index with them.
	return fmt.Sprintf("kvfast: cannot attach shm segment %s: it was formatted with %s %d, the options ask for %d; "+
		"to attach (as a second router, or after a restart) give %s %d, or, to replace it and everything using it, %s",
		e.Path, e.Field, e.Have, e.Want, e.Flag, e.Have, recreateHint)
}

func (e *MismatchError) Unwrap() error { return ErrIncompatible }

// OwnerError refuses a segment that another user owns, or that group or
// others may access: any of them could register engines, forge KV events
// and rewrite the index. It wraps ErrForeignSegment.
type OwnerError struct {
	Path  string
	Owner int         // the file's owner uid
	Mode  fs.FileMode // its permission bits
	UID   int         // ours
}

func (e *OwnerError) Error() string {
	return fmt.Sprintf("kvfast: cannot attach shm segment %s: it is owned by uid %d with mode %#o, and the router (uid %d) only trusts a segment "+
		"it owns with mode 0600, since whoever can write it can register engines and rewrite the index; "+
		"delete the file (or, if it is a kvfast segment, start the router with --recreate-segment), or `chown %d %s && chmod 600 %s` if it is yours, "+
		"or pass --allow-foreign-segment to attach anyway",
		e.Path, e.Owner, e.Mode, e.UID, e.UID, e.Path, e.Path)
}

func (e *OwnerError) Unwrap() error { return ErrForeignSegment }

// SpaceError refuses a segment its file system cannot back: a /dev/shm
// smaller than the segment (a container's is 64 MiB unless enlarged)
// would otherwise let the file be created sparse and kill the process
// with SIGBUS at the first write to a page it cannot supply. It wraps
// ErrNoSpace.
type SpaceError struct {
	Path       string
	Size, Free int64 // bytes; Free is -1 when the file system did not say
}

func (e *SpaceError) Error() string {
	free := "its file system did not say how much is free"
	if e.Free >= 0 {
		free = fmt.Sprintf("its file system has %d MiB free", e.Free>>20)
	}
	return fmt.Sprintf("kvfast: cannot back shm segment %s: it needs %d MiB and %s; enlarge the file system "+
		"(docker run --shm-size, a Kubernetes emptyDir's sizeLimit) or make the segment smaller (--index-capacity, --ring-bytes)",
		e.Path, (e.Size+1<<20-1)>>20, free)
}

func (e *SpaceError) Unwrap() error { return ErrNoSpace }

// SlotError says why a registry slot could not be read. It wraps
// ErrSlotCorrupt.
type SlotError struct {
	Slot   int
	Reason string
}

func (e *SlotError) Error() string {
	return fmt.Sprintf("kvfast: registry slot %d is corrupt: %s", e.Slot, e.Reason)
}

func (e *SlotError) Unwrap() error { return ErrSlotCorrupt }
