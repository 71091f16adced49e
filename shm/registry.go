package shm

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvfast/kvfast/workers"
	"golang.org/x/sys/unix"
)

// WorkerState is the lifecycle state of a registry slot.
type WorkerState uint8

const (
	StateFree     WorkerState = 0 // never used
	StateClaiming WorkerState = 1 // a publisher is writing its fields; readers skip it
	StateLive     WorkerState = 2
	StateDown     WorkerState = 3 // the router saw the heartbeat stop: routed to no more, its blocks kept a while
	StateClosed   WorkerState = 4 // the publisher closed cleanly
	// StateReserved: a router holds the slot for an engine it was
	// configured with (--worker), whose index slot it is; publishers
	// never claim it (reserve.go).
	StateReserved WorkerState = 5
)

func (s WorkerState) String() string {
	switch s {
	case StateFree:
		return "free"
	case StateClaiming:
		return "claiming"
	case StateLive:
		return "live"
	case StateDown:
		return "down"
	case StateClosed:
		return "closed"
	case StateReserved:
		return "reserved"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Registry slot field offsets (little-endian). The state word's low byte
// is the WorkerState and its upper 56 bits count transitions, so a reader
// that sees the same word before and after copying the fields knows no
// re-registration happened in between.
const (
	sState      = 0  // u64
	sGeneration = 8  // u32
	sPID        = 12 // u32
	sWorkerID   = 16 // u64
	sDPRank     = 24 // u32
	sBlockSize  = 28 // u32
	sKVCapacity = 32 // u64
	sHeartbeat  = 40 // u64 monotonic ns
	sRegistered = 48 // u64 monotonic ns
	sModelLen   = 56 // u16
	sEndptLen   = 58 // u16
	// sRole was reserved (always zero) before roles existed, and zero is
	// workers.RoleBoth: a slot written by an older publisher reads as an
	// aggregated engine, so the layout version did not change.
	sRole     = 60 // u32: the worker's workers.Role
	sModel    = 64
	sEndpoint = 256

	// MaxModelLen and MaxEndpointLen bound the strings a slot stores.
	MaxModelLen    = sEndpoint - sModel
	MaxEndpointLen = slotSize - sEndpoint
)

func stateOf(word uint64) WorkerState { return WorkerState(word & 0xff) }

func nextState(word uint64, st WorkerState) uint64 { return (word>>8+1)<<8 | uint64(st) }

// WorkerInfo is one consistent snapshot of a registry slot.
type WorkerInfo struct {
	Slot             workers.Slot
	State            WorkerState
	Generation       uint32
	PID              uint32
	WorkerID         uint64
	DPRank           uint32
	BlockSize        int
	KVCapacityBlocks uint64
	Heartbeat        int64 // CLOCK_MONOTONIC ns of the last heartbeat
	Registered       int64 // CLOCK_MONOTONIC ns of the registration
	Model            string
	Endpoint         string
	Role             workers.Role
	stateWord        uint64
}

// registryMu serialises registry transitions within this process. POSIX
// record locks (the cross-process half) do not exclude threads of one
// process, and closing any descriptor of the file drops them.
var registryMu sync.Mutex

// lockRegistry takes the registry lock: registryMu, then an fcntl write
// lock on the registry's first byte, the same lock the Python publisher
// takes with os.lockf. With wait unset it gives up instead of blocking.
func (s *Segment) lockRegistry(wait bool) (unlock func(), ok bool, err error) {
	if wait {
		registryMu.Lock()
	} else if !registryMu.TryLock() {
		return nil, false, nil
	}
	if s.closed.Load() {
		registryMu.Unlock()
		return nil, false, ErrClosed
	}
	cmd := unix.F_SETLK
	if wait {
		cmd = unix.F_SETLKW
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: registryOff, Len: 1}
	for {
		err = unix.FcntlFlock(s.f.Fd(), cmd, &lk)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		registryMu.Unlock()
		if err == unix.EAGAIN || err == unix.EACCES {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("cannot lock registry of %s: %w", s.path, err)
	}
	return func() {
		lk.Type = unix.F_UNLCK
		unix.FcntlFlock(s.f.Fd(), unix.F_SETLK, &lk)
		registryMu.Unlock()
	}, true, nil
}

// RegistryLockHolder returns the pid of another process holding the
// registry lock now, as the kernel reports it (F_GETLK), or 0 when none
// does or its pid is not visible from this PID namespace: for a log line
// that names whom the lock waits on.
func (s *Segment) RegistryLockHolder() int {
	if s.closed.Load() {
		return 0
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: registryOff, Len: 1}
	if err := unix.FcntlFlock(s.f.Fd(), unix.F_GETLK, &lk); err != nil || lk.Type == unix.F_UNLCK {
		return 0
	}
	return int(lk.Pid)
}

func slotOff(slot int) int { return registryOff + slot*slotSize }

// decodeSlot reads the fields of a 512-byte slot image. It trusts nothing:
// string lengths beyond their fields make the slot unreadable rather than
// reading past them.
func decodeSlot(b []byte, info *WorkerInfo) error {
	if len(b) < slotSize {
		return fmt.Errorf("slot image is %d bytes, want %d", len(b), slotSize)
	}
	le := binary.LittleEndian
	word := le.Uint64(b[sState:])
	st := stateOf(word)
	if st > StateReserved {
		return fmt.Errorf("unknown worker state %d", uint8(st))
	}
	ml, el := int(le.Uint16(b[sModelLen:])), int(le.Uint16(b[sEndptLen:]))
	if ml > MaxModelLen || el > MaxEndpointLen {
		return fmt.Errorf("model length %d or endpoint length %d exceeds its field", ml, el)
	}
	bs := le.Uint32(b[sBlockSize:])
	if r := le.Uint32(b[sRole:]); r > uint32(workers.RoleEncode) {
		return fmt.Errorf("unknown worker role %d", r)
	}
	if bs > 1<<16 {
		return fmt.Errorf("block size %d out of range", bs)
	}
	info.State = st
	info.stateWord = word
	info.Generation = le.Uint32(b[sGeneration:])
	info.PID = le.Uint32(b[sPID:])
	info.WorkerID = le.Uint64(b[sWorkerID:])
	info.DPRank = le.Uint32(b[sDPRank:])
	info.BlockSize = int(bs)
	info.KVCapacityBlocks = le.Uint64(b[sKVCapacity:])
	info.Heartbeat = int64(le.Uint64(b[sHeartbeat:]))
	info.Registered = int64(le.Uint64(b[sRegistered:]))
	info.Model = string(b[sModel : sModel+ml])
	info.Endpoint = string(b[sEndpoint : sEndpoint+el])
	info.Role = workers.Role(le.Uint32(b[sRole:]))
	return nil
}

// Worker returns a consistent snapshot of one registry slot. ok is false
// for a free or claiming slot, a slot whose bytes are invalid, or one that
// kept changing while being read (ReadWorker says which).
func (s *Segment) Worker(slot workers.Slot) (WorkerInfo, bool) {
	info, err := s.ReadWorker(slot)
	return info, err == nil && info.State != StateFree && info.State != StateClaiming
}

// ReadWorker is Worker with the reason a slot holds no worker: a free or
// claiming slot yields a WorkerInfo with that State and no error; a slot
// whose bytes no publisher writes, a *SlotError wrapping ErrSlotCorrupt;
// one that kept changing while being read, ErrTorn. The registry poll
// logs the errors, which Worker's callers only skip.
func (s *Segment) ReadWorker(slot workers.Slot) (WorkerInfo, error) {
	if !slot.Valid() {
		return WorkerInfo{}, fmt.Errorf("cannot read registry slot %d: out of range", slot)
	}
	off := slotOff(int(slot))
	sw := s.u64(off + sState)
	var img [slotSize]byte
	for try := 0; try < 16; try++ {
		w1 := atomic.LoadUint64(sw)
		if st := stateOf(w1); st == StateFree || st == StateClaiming {
			return WorkerInfo{Slot: slot, State: st}, nil
		}
		copy(img[:], s.bytesAt(off, slotSize))
		// The heartbeat changes without a transition; take it atomically.
		binary.LittleEndian.PutUint64(img[sHeartbeat:], atomic.LoadUint64(s.u64(off+sHeartbeat)))
		if atomic.LoadUint64(sw) != w1 {
			continue
		}
		binary.LittleEndian.PutUint64(img[sState:], w1)
		var info WorkerInfo
		if err := decodeSlot(img[:], &info); err != nil {
			return WorkerInfo{}, &SlotError{Slot: int(slot), Reason: err.Error()}
		}
		info.Slot = slot
		return info, nil
	}
	return WorkerInfo{}, fmt.Errorf("cannot read registry slot %d: %w", slot, ErrTorn)
}

// Workers appends a snapshot of every registered (live, down, closed or
// reserved) slot to dst, in slot order.
func (s *Segment) Workers(dst []WorkerInfo) []WorkerInfo {
	for i := 0; i < workers.Max; i++ {
		if info, ok := s.Worker(workers.Slot(i)); ok {
			dst = append(dst, info)
		}
	}
	return dst
}

// SlotState returns the raw state and generation of a slot without
// copying its strings: the ingester polls this every few milliseconds.
func (s *Segment) SlotState(slot workers.Slot) (st WorkerState, gen uint32, heartbeat int64) {
	off := slotOff(int(slot) & (workers.Max - 1))
	w := atomic.LoadUint64(s.u64(off + sState))
	return stateOf(w), atomic.LoadUint32(s.u32(off + sGeneration)), int64(atomic.LoadUint64(s.u64(off + sHeartbeat)))
}

// MarkDown moves a live slot whose heartbeat is still lastBeat to Down, so
// that it is routed to no more and its publisher, if it was only paused,
// revives it on its next heartbeat. It reports whether the transition
// happened; it gives up rather than wait if a registration holds the
// registry lock.
func (s *Segment) MarkDown(slot workers.Slot, gen uint32, lastBeat int64) (bool, error) {
	return s.transition(slot, gen, lastBeat, StateLive, StateDown)
}

// ExpireClaim moves a slot stuck in Claiming (its publisher died while
// registering) to Down so that it can be reused.
func (s *Segment) ExpireClaim(slot workers.Slot) (bool, error) {
	unlock, ok, err := s.lockRegistry(false)
	if !ok {
		return false, err
	}
	defer unlock()
	// Holding the lock proves no live process is mid-claim: claims happen
	// entirely under it and fcntl locks die with their holder.
	sw := s.u64(slotOff(int(slot)) + sState)
	w := atomic.LoadUint64(sw)
	if stateOf(w) != StateClaiming {
		return false, nil
	}
	atomic.StoreUint64(sw, nextState(w, StateDown))
	return true, nil
}

func (s *Segment) transition(slot workers.Slot, gen uint32, lastBeat int64, from, to WorkerState) (bool, error) {
	if !slot.Valid() {
		return false, nil
	}
	unlock, ok, err := s.lockRegistry(false)
	if !ok {
		return false, err
	}
	defer unlock()
	off := slotOff(int(slot))
	sw := s.u64(off + sState)
	w := atomic.LoadUint64(sw)
	if stateOf(w) != from || atomic.LoadUint32(s.u32(off+sGeneration)) != gen ||
		int64(atomic.LoadUint64(s.u64(off+sHeartbeat))) != lastBeat {
		return false, nil
	}
	atomic.StoreUint64(sw, nextState(w, to))
	return true, nil
}

// liveHeartbeat is how recent a holder's heartbeat must be for its worker
// id to be withheld from another process: well over any publisher's
// period (the mock's 250 ms, the Python publisher's 1 s; the router marks
// a worker silent for its --heartbeat-grace, 5 s, down anyway).
const liveHeartbeat = 5 * time.Second

// holderState is what claim makes of the registration in a slot that a
// new one of the same worker id and rank would take over.
type holderState int

const (
	holderGone     holderState = iota // take it: closed, stale, this process's own, or its process gone
	holderPresumed                    // heartbeating recently, its process alive or out of sight: watch its heartbeat (Register)
)

// registrations are the slots this process holds, by segment file and
// slot, with their generation: a registration of this process is taken
// over at once (an engine of this process registering again), whatever
// pid the slot records, since another PID namespace's pid can be any
// number, this process's included.
var registrations sync.Map // regKey -> uint32

type regKey struct {
	dev, ino uint64
	slot     int
}

func (s *Segment) regKey(slot int) (regKey, bool) {
	st, err := s.f.Stat()
	if err != nil {
		return regKey{}, false
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return regKey{}, false
	}
	return regKey{dev: uint64(sys.Dev), ino: sys.Ino, slot: slot}, true
}

// holder judges the registration in the slot at off. A process that
// cannot be signalled (ESRCH) is taken for gone: in this PID namespace it
// died; an engine in another namespace (a container sharing /dev/shm but
// not its pids) cannot be told apart from a dead one, and waiting out
// every such holder would delay each restart after a crash by 5 s. A
// process that can be signalled (or a pid of 0) is
// presumed alive while it heartbeats: Register watches whether it does.
func (s *Segment) holder(slot, off int) (holder int, beat int64, st holderState) {
	if stateOf(atomic.LoadUint64(s.u64(off+sState))) != StateLive {
		return 0, 0, holderGone
	}
	holder = int(atomic.LoadUint32(s.u32(off + sPID)))
	beat = int64(atomic.LoadUint64(s.u64(off + sHeartbeat)))
	if key, ok := s.regKey(slot); ok {
		if gen, mine := registrations.Load(key); mine && gen.(uint32) == atomic.LoadUint32(s.u32(off+sGeneration)) {
			return holder, beat, holderGone
		}
	}
	if monoNow()-beat > liveHeartbeat.Nanoseconds() {
		return holder, beat, holderGone
	}
	if holder != 0 && unix.Kill(holder, 0) == unix.ESRCH {
		return holder, beat, holderGone
	}
	return holder, beat, holderPresumed
}

// holderPresumedError is claim's refusal while a presumed-live holder's
// heartbeat is watched; Register turns it into a wait, or ErrWorkerLive.
type holderPresumedError struct {
	slot, holder int
	beat         int64
	endpoint     string
}

func (e *holderPresumedError) Error() string {
	return fmt.Sprintf("slot %d is held by process %d (endpoint %q), heartbeating", e.slot, e.holder, e.endpoint)
}

// endpointAt is the endpoint registered in the slot at off, for messages.
func (s *Segment) endpointAt(off int) string {
	b := s.bytesAt(off, slotSize)
	n := int(binary.LittleEndian.Uint16(b[sEndptLen:]))
	return string(b[sEndpoint:][:min(n, slotSize-sEndpoint)])
}

// claim registers cfg under the registry lock and returns the slot and
// its new generation. Preference: the slot this (worker id, DP rank) held
// before, so a restarted engine keeps its slot and its generation grows;
// then a never-used slot; then one whose worker closed or went down. A
// slot a router reserved (StateReserved) is never claimed.
//
// stood, when not nil, is a holder claimWatching watched stand still for
// liveHeartbeat: if the slot still shows that heartbeat, it is taken over.
func (s *Segment) claim(cfg WorkerConfig, stood *holderPresumedError) (int, uint32, error) {
	unlock, _, err := s.lockRegistry(true)
	if err != nil {
		return 0, 0, err
	}
	defer unlock()
	pick := -1
	for _, want := range []func(st WorkerState, off int) bool{
		func(st WorkerState, off int) bool {
			return st != StateFree && st != StateReserved && atomic.LoadUint64(s.u64(off+sWorkerID)) == cfg.WorkerID &&
				atomic.LoadUint32(s.u32(off+sDPRank)) == cfg.DPRank
		},
		func(st WorkerState, _ int) bool { return st == StateFree },
		func(st WorkerState, _ int) bool { return st == StateClosed || st == StateClaiming },
		func(st WorkerState, _ int) bool { return st == StateDown },
	} {
		for i := 0; i < workers.Max && pick < 0; i++ {
			off := slotOff(i)
			if want(stateOf(atomic.LoadUint64(s.u64(off+sState))), off) {
				pick = i
			}
		}
		if pick >= 0 {
			break
		}
	}
	if pick < 0 {
		return 0, 0, fmt.Errorf("cannot register worker %d rank %d in %s: %w", cfg.WorkerID, cfg.DPRank, s.path, ErrRegistryFull)
	}
	off := slotOff(pick)
	if holder, beat, st := s.holder(pick, off); st == holderPresumed && (stood == nil || stood.slot != pick || stood.beat != beat) {
		return 0, 0, &holderPresumedError{slot: pick, holder: holder, beat: beat, endpoint: s.endpointAt(off)}
	}
	sw := s.u64(off + sState)
	w := nextState(atomic.LoadUint64(sw), StateClaiming)
	atomic.StoreUint64(sw, w)
	gen := atomic.LoadUint32(s.u32(off+sGeneration)) + 1
	if gen == 0 {
		gen = 1 // 0 means "never registered" to consumers
	}
	now := uint64(monoNow())
	atomic.StoreUint32(s.u32(off+sGeneration), gen)
	atomic.StoreUint32(s.u32(off+sPID), uint32(pid))
	atomic.StoreUint64(s.u64(off+sWorkerID), cfg.WorkerID)
	atomic.StoreUint32(s.u32(off+sDPRank), cfg.DPRank)
	atomic.StoreUint32(s.u32(off+sBlockSize), uint32(cfg.BlockSize))
	atomic.StoreUint64(s.u64(off+sKVCapacity), cfg.KVCapacityBlocks)
	atomic.StoreUint32(s.u32(off+sRole), uint32(cfg.Role))
	atomic.StoreUint64(s.u64(off+sHeartbeat), now)
	atomic.StoreUint64(s.u64(off+sRegistered), now)
	b := s.bytesAt(off, slotSize)
	binary.LittleEndian.PutUint16(b[sModelLen:], uint16(len(cfg.Model)))
	binary.LittleEndian.PutUint16(b[sEndptLen:], uint16(len(cfg.Endpoint)))
	clear(b[sModel:])
	copy(b[sModel:sEndpoint], cfg.Model)
	copy(b[sEndpoint:], cfg.Endpoint)
	atomic.StoreUint64(sw, nextState(w, StateLive))
	return pick, gen, nil
}
