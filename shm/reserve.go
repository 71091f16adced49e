package shm

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kvfast/kvfast/workers"
)

// Reserved slots.
//
// A router gives each engine it was configured with (--worker, routed
// statically and fed by ZMQ or by nothing) an index slot of its own. The
// index is the segment's, where the registry's slots are also the index
// slots of registered engines: a static engine's slot must therefore be
// one no publisher will claim, or a registering engine's blocks would be
// credited to the static one (and a closing one would wipe the static
// engine's). The router reserves those slots in the registry
// (StateReserved), which publishers skip, and refreshes their heartbeat
// while it runs. Routers that share a segment with the same --worker
// list share the reservations. A reservation nobody has refreshed for
// reservationStale is released (to StateClosed, so that the ingester
// drops its blocks) by the next router that reserves.

// Reservation is the engine a router reserves a slot for. Model and
// Endpoint are shown by kvfast inspect only, cut to their fields' size.
type Reservation struct {
	WorkerID         uint64
	DPRank           uint32
	Model            string
	Endpoint         string
	Role             workers.Role
	KVCapacityBlocks uint64
}

// reservationStale is how long a reservation stands unrefreshed before
// another router may release it: far beyond any registry poll (100 ms by
// default), so that only a router that is gone, or stopped for a minute,
// loses its slots.
const reservationStale = time.Minute

// Reserve reserves one registry slot for each of ws, in order, and returns
// them with their generations. A reservation already held for the same
// worker id and rank is kept, its generation too, so that the ingester
// does not empty it (its ZMQ feed, which starts by forgetting what the
// slot held, rebuilds it from the engine's replay); otherwise the highest slot that is free, closed, down, abandoned
// mid-claim, or reserved but stale is taken under a new generation. Stale
// reservations left over are released. The registry lock is waited for
// reserveLockWait at most.
func (s *Segment) Reserve(ws []Reservation) ([]workers.Slot, []uint32, error) {
	unlock, err := s.lockRegistryWithin(reserveLockWait)
	if err != nil {
		return nil, nil, err
	}
	defer unlock()
	now := monoNow()
	stale := func(off int) bool {
		return now-int64(atomic.LoadUint64(s.u64(off+sHeartbeat))) > reservationStale.Nanoseconds()
	}
	var taken workers.Set
	slots, gens := make([]workers.Slot, len(ws)), make([]uint32, len(ws))
	for i, w := range ws {
		pick, keep := -1, false
		for n := workers.Max - 1; n >= 0 && pick < 0; n-- {
			off := slotOff(n)
			if !taken.Has(workers.Slot(n)) && stateOf(atomic.LoadUint64(s.u64(off+sState))) == StateReserved &&
				atomic.LoadUint64(s.u64(off+sWorkerID)) == w.WorkerID && atomic.LoadUint32(s.u32(off+sDPRank)) == w.DPRank {
				pick, keep = n, true
			}
		}
		for n := workers.Max - 1; n >= 0 && pick < 0; n-- {
			off := slotOff(n)
			switch stateOf(atomic.LoadUint64(s.u64(off + sState))) {
			case StateFree, StateClosed, StateDown, StateClaiming: // claims are made under the lock held here: this one's claimer died
				pick = n
			case StateReserved:
				if stale(off) {
					pick = n
				}
			}
			if taken.Has(workers.Slot(n)) {
				pick = -1
			}
		}
		if pick < 0 {
			return nil, nil, fmt.Errorf("cannot reserve a registry slot for static worker %d rank %d in %s: %w", w.WorkerID, w.DPRank, s.path, ErrRegistryFull)
		}
		off := slotOff(pick)
		sw := s.u64(off + sState)
		word := atomic.LoadUint64(sw)
		gen := atomic.LoadUint32(s.u32(off + sGeneration))
		if !keep {
			word = nextState(word, StateClaiming)
			atomic.StoreUint64(sw, word)
			if gen++; gen == 0 {
				gen = 1
			}
			atomic.StoreUint32(s.u32(off+sGeneration), gen)
		}
		atomic.StoreUint32(s.u32(off+sPID), uint32(pid))
		atomic.StoreUint64(s.u64(off+sWorkerID), w.WorkerID)
		atomic.StoreUint32(s.u32(off+sDPRank), w.DPRank)
		atomic.StoreUint32(s.u32(off+sBlockSize), 0)
		atomic.StoreUint64(s.u64(off+sKVCapacity), w.KVCapacityBlocks)
		atomic.StoreUint32(s.u32(off+sRole), uint32(w.Role))
		atomic.StoreUint64(s.u64(off+sHeartbeat), uint64(now))
		if !keep {
			atomic.StoreUint64(s.u64(off+sRegistered), uint64(now))
			b := s.bytesAt(off, slotSize)
			model, endpoint := w.Model[:min(len(w.Model), MaxModelLen)], w.Endpoint[:min(len(w.Endpoint), MaxEndpointLen)]
			binary.LittleEndian.PutUint16(b[sModelLen:], uint16(len(model)))
			binary.LittleEndian.PutUint16(b[sEndptLen:], uint16(len(endpoint)))
			clear(b[sModel:])
			copy(b[sModel:sEndpoint], model)
			copy(b[sEndpoint:], endpoint)
			atomic.StoreUint64(sw, nextState(word, StateReserved))
		}
		taken |= workers.SetOf(workers.Slot(pick))
		slots[i], gens[i] = workers.Slot(pick), gen
	}
	for n := range workers.Max {
		off := slotOff(n)
		sw := s.u64(off + sState)
		if w := atomic.LoadUint64(sw); stateOf(w) == StateReserved && !taken.Has(workers.Slot(n)) && stale(off) {
			atomic.StoreUint64(sw, nextState(w, StateClosed))
		}
	}
	return slots, gens, nil
}

// reserveLockWait bounds Reserve's wait for the registry lock: a
// registration holds it for microseconds, and one that holds it longer is
// a publisher stopped or hung while registering, which must not keep the
// router from starting, silent, and deaf to SIGTERM.
const reserveLockWait = 10 * time.Second

// lockRegistryWithin takes the registry lock, trying without blocking
// until d has passed.
func (s *Segment) lockRegistryWithin(d time.Duration) (unlock func(), err error) {
	deadline := time.Now().Add(d)
	for {
		unlock, ok, err := s.lockRegistry(false)
		switch {
		case err != nil:
			return nil, err
		case ok:
			return unlock, nil
		case time.Now().After(deadline):
			return nil, fmt.Errorf("cannot lock the registry of %s: another process has held it for %v "+
				"(a publisher stopped or hung while registering: find it with fuser %s, and stop it)", s.path, d, s.path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ReleaseStale releases slot's reservation if nobody has refreshed it for
// reservationStale (its router is gone): to closed, which the ingester
// empties and a publisher may claim. The ingester calls it for every
// reserved slot it scans, so that reservations a router left do not hold
// registry slots for ever once no router reserves any more. It gives up
// rather than wait when the registry lock is held.
func (s *Segment) ReleaseStale(slot workers.Slot) (bool, error) {
	if !slot.Valid() {
		return false, nil
	}
	off := slotOff(int(slot))
	if stateOf(atomic.LoadUint64(s.u64(off+sState))) != StateReserved ||
		monoNow()-int64(atomic.LoadUint64(s.u64(off+sHeartbeat))) <= reservationStale.Nanoseconds() {
		return false, nil
	}
	unlock, ok, err := s.lockRegistry(false)
	if !ok {
		return false, err
	}
	defer unlock()
	sw := s.u64(off + sState)
	w := atomic.LoadUint64(sw)
	if stateOf(w) != StateReserved || monoNow()-int64(atomic.LoadUint64(s.u64(off+sHeartbeat))) <= reservationStale.Nanoseconds() {
		return false, nil
	}
	atomic.StoreUint64(sw, nextState(w, StateClosed))
	return true, nil
}

// KeepReserved refreshes the reservation of slot under gen (Reserve's)
// and reports whether it still stands: false once another router released
// it as stale, after which a publisher may claim the slot.
func (s *Segment) KeepReserved(slot workers.Slot, gen uint32) bool {
	if !slot.Valid() {
		return false
	}
	off := slotOff(int(slot))
	if stateOf(atomic.LoadUint64(s.u64(off+sState))) != StateReserved || atomic.LoadUint32(s.u32(off+sGeneration)) != gen {
		return false
	}
	atomic.StoreUint64(s.u64(off+sHeartbeat), uint64(monoNow()))
	return true
}
