package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/kvfast/kvfast/dispatch"
	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/feed"
	"github.com/kvfast/kvfast/internal/redact"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
)

// workerDownMessage is logged when a registered engine's heartbeat stops.
const workerDownMessage = "worker down: its heartbeat stopped; requests waiting on it go elsewhere, and its blocks are kept for a while in case it was only paused"

// regEntry remembers what the registry said about a slot last time, so
// that the poll only touches the scheduler and the engine pool on change.
type regEntry struct {
	present bool   // routable: in the scheduler and the engine pool
	refused bool   // this registration cannot be routed to; said once, not retried
	reason  string // why it was refused
	id      regIdentity
}

// regIdentity is what a registration says the worker is. A publisher
// writes it once, when it registers, under a new generation; within one
// generation it does not change.
type regIdentity struct {
	generation      uint32
	worker          uint64
	rank            uint32
	blockSize       int
	role            workers.Role
	endpoint, model string
}

func identityOf(info shm.WorkerInfo) regIdentity {
	return regIdentity{generation: info.Generation, worker: info.WorkerID, rank: info.DPRank, blockSize: info.BlockSize,
		role: info.Role, endpoint: info.Endpoint, model: info.Model}
}

// addStatic gives configured engines the highest slots, counting down.
// With a segment the slots are reserved in its registry (shm.Reserve),
// which then hands none of them to a registering engine: the registry's
// slots are the index's, and an engine registered into a static worker's
// slot had its blocks credited to the static worker.
func (n *Node) addStatic(static []StaticWorker) error {
	sharedEndpoint := map[string]int{}
	for _, w := range static {
		if addr, err := hostPort(w.Endpoint); err == nil {
			sharedEndpoint[addr]++
		}
	}
	slots, err := n.staticSlots(static)
	if err != nil {
		return err
	}
	for i, w := range static {
		slot := slots[i]
		addr, err := hostPort(w.Endpoint)
		if err != nil {
			return fmt.Errorf("cannot use static worker %d: %w", w.ID, err)
		}
		if err := n.sched.Upsert(sched.WorkerInfo{ID: w.ID, DPRank: w.DPRank, Slot: slot, Model: w.Model,
			Endpoint: addr, KVCapacityBlocks: w.KVBlocks, Role: w.Role, BootstrapPort: w.BootstrapPort}); err != nil {
			return fmt.Errorf("cannot add static worker %d rank %d: %w", w.ID, w.DPRank, err)
		}
		e, err := n.engines.Add(slot, addr)
		if err != nil {
			return err
		}
		e.SetEjectionGroup(uint32(w.Role))
		n.static |= workers.SetOf(slot)
		if w.Model == "" {
			// Learned from the engine's GET /v1/models (pollModels).
			n.unknownModel.Or(uint64(workers.SetOf(slot)))
		}
		if w.Events == "" {
			continue
		}
		if w.Model == "" {
			return fmt.Errorf("cannot subscribe to static worker %d's events: it needs a model name, which seeds the block hashes", w.ID)
		}
		sub, err := feed.NewZMQSubscriber(n.index, feed.ZMQConfig{Endpoint: w.Events, Replay: w.Replay, Topic: w.Topic,
			Slot: slot, Model: w.Model, BlockSize: n.sched.BlockSize(),
			// A rank that shares its endpoint is one of several behind it
			// (pinSharedRanks): its events must be its own rank's.
			DPRank: w.DPRank, CheckDPRank: sharedEndpoint[addr] > 1,
			Logger: n.log.With("worker", w.ID, "dp_rank", w.DPRank), Segment: n.seg})
		if err != nil {
			return fmt.Errorf("cannot subscribe to static worker %d's events: %w", w.ID, err)
		}
		n.zmq[slot] = sub
	}
	return nil
}

// staticSlots picks the static workers' slots: reserved in the segment's
// registry, or without one the highest, counting down.
func (n *Node) staticSlots(static []StaticWorker) ([]workers.Slot, error) {
	if n.seg == nil || len(static) == 0 {
		slots := make([]workers.Slot, len(static))
		for i := range static {
			slots[i] = workers.Slot(workers.Max - 1 - i)
		}
		return slots, nil
	}
	rs := make([]shm.Reservation, len(static))
	for i, w := range static {
		rs[i] = shm.Reservation{WorkerID: w.ID, DPRank: w.DPRank, Model: w.Model, Endpoint: w.Endpoint,
			Role: w.Role, KVCapacityBlocks: w.KVBlocks}
	}
	var slots []workers.Slot
	var gens []uint32
	var err error
	if !n.seg.Guard(func() { slots, gens, err = n.seg.Reserve(rs) }) && err == nil {
		err = errors.New("the segment's file was truncated")
	}
	if err != nil {
		return nil, fmt.Errorf("cannot place the static workers in the segment's registry: %w", err)
	}
	for i, slot := range slots {
		n.reserved[slot] = gens[i]
	}
	return slots, nil
}

// keepReservations refreshes the static workers' registry reservations,
// and says so loudly if one was lost: another router found it stale (this
// one stopped for a minute) and released it, and a registering engine may
// now share the static worker's slot.
func (n *Node) keepReservations() {
	for slot := range n.static.All() {
		if gen := n.reserved[slot]; gen != 0 && !n.seg.KeepReserved(slot, gen) {
			n.throttle.Log(n.log, slog.LevelError, "reservation/"+strconv.Itoa(int(slot)),
				"a static worker's registry reservation was released by another router (this one was stopped for over a minute): restart this router to reserve it again",
				"slot", slot, "segment", n.seg.Path())
		}
	}
}

// silentStatic returns the static workers that publish no KV events.
func (n *Node) silentStatic() workers.Set {
	silent := n.static
	for w := range n.static.All() {
		if n.zmq[w] != nil {
			silent &^= workers.SetOf(w)
		}
	}
	return silent
}

// runZMQ runs one subscriber per static worker with an event socket. The
// index may live in a segment that several routers share, and only the
// elected ingester may write it, so with a segment the subscribers start
// once this process holds the ingester role (which it keeps until
// shutdown).
func (n *Node) runZMQ(ctx context.Context) {
	feeds := false
	for _, sub := range n.zmq {
		feeds = feeds || sub != nil
	}
	if !feeds {
		return
	}
	if n.ingester != nil {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for !n.ingester.Ingesting() {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}
	var wg sync.WaitGroup
	for _, sub := range n.zmq {
		if sub == nil {
			continue
		}
		wg.Go(func() {
			if err := sub.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				n.log.Error("ZMQ event feed stopped", "events", sub.Config().Endpoint, "err", err)
			}
		})
	}
	wg.Wait()
}

const retiredMessage = "the segment file was recreated by another router (--recreate-segment), deleted or replaced: " +
	"this router still reads the old file, which engines leave; restart it to attach to a new one"

const recreatedMessage = "formatted a fresh segment (--recreate-segment): the index, engine registrations and sticky-session " +
	"bindings of the file there before are dropped; engines register again, and the index refills from their next KV events"

const displacedMessage = "recreated the segment under a running router (--recreate-segment): that router reads the retired file " +
	"from now on, reports kvfast_segment_retired and must be restarted; engines move to the new file"

const retiredInPlaceMessage = "the segment file is marked retired but still in place (a stray write, or a recreate that " +
	"failed half-way): engines leave it and no successor will come; restart the router with --recreate-segment, then the engines' publishers"

const lostMessage = "the segment file was truncated or its header overwritten under the router: the router detached from it and " +
	"routes on without its index, registry and sessions, so registered engines are dropped while static and ZMQ-fed " +
	"workers stay; restart the router with --recreate-segment, then the engines' publishers (a file whose header was " +
	"overwritten or zeroed is no longer a kvfast segment, which --recreate-segment never overwrites: delete it first)"

const noModelMessage = "a worker registered with no model name: the router lists no model for it in /v1/models and routes " +
	"no request to it (a request naming its model gets 404); give its publisher the served model name " +
	"(the vLLM adapter's KVFAST_MODEL)"

// rememberRegisteredModels tells the front end the models of the
// registry's slots whose engines closed or went down before this router
// started, so that a request for one while they restart is a 503 that
// clients retry, not a 404 (fastpath.Server.RememberModels).
func (n *Node) rememberRegisteredModels() {
	if n.seg == nil {
		return
	}
	var names []string
	n.seg.Guard(func() {
		for i := range workers.Max {
			info, err := n.seg.ReadWorker(workers.Slot(i))
			if err == nil && (info.State == shm.StateClosed || info.State == shm.StateDown) && info.Model != "" {
				names = append(names, info.Model)
			}
		}
	})
	n.front.RememberModels(names)
}

// syncRegistry brings the worker set in line with the segment's registry
// and copies every live worker's load page into the scheduler.
func (n *Node) syncRegistry() {
	if n.seg == nil {
		return
	}
	// A truncated file faults whoever reads past its new end: found here
	// before anything else touches it, or caught by the guard below (and
	// the others around the mapping), the segment is detached and reads as
	// empty from then on (shm/fault.go).
	n.seg.CheckSize()
	n.seg.Guard(n.keepReservations)
	n.seg.Guard(n.scanRegistry)
	if why := n.seg.Lost(); why != "" {
		n.throttle.Log(n.log, slog.LevelError, "lost", lostMessage, "segment", n.seg.Path(), "cause", why)
	}
}

// scanRegistry is syncRegistry's reading of the segment.
func (n *Node) scanRegistry() {
	switch replaced := n.seg.Replaced(); {
	case replaced:
		// Publishers leave a retired segment for its successor, so this
		// router's workers go stale one by one and it ends up routing
		// nothing (/ready 503): say why, and what fixes it.
		n.throttle.Log(n.log, slog.LevelError, "retired", retiredMessage, "segment", n.seg.Path())
	case n.seg.Retired():
		// Marked retired, yet still the file under the path: no successor
		// will come, and a restart would attach to this file again.
		n.throttle.Log(n.log, slog.LevelError, "retired", retiredInPlaceMessage, "segment", n.seg.Path())
	}
	// down: slots whose heartbeat the ingester found stale; their engines
	// are presumed dead.
	var live, registered, down workers.Set
	// stale: live by the registry, dead by their heartbeat, and not yet
	// marked down (the registry lock is held elsewhere): routed as down.
	var stale workers.Set
	if n.ingester != nil {
		stale = n.ingester.Stale()
	}
	var downViews []fastpath.RegistrationView
	var refusedDown workers.Set // refused registrations the registry holds down
	// refusals: the set of refused registrations changed.
	changed, refusals := false, false
	for i := range workers.Max {
		slot := workers.Slot(i)
		if n.static.Has(slot) {
			continue
		}
		info, err := n.seg.ReadWorker(slot)
		if err != nil {
			// A corrupt slot routes nothing; say so, once a minute, since
			// every poll reads it again.
			n.throttle.Log(n.log, slog.LevelWarn, "slot/"+strconv.Itoa(i), "skipping an unreadable registry slot",
				"slot", slot, "segment", n.seg.Path(), "err", err)
			continue
		}
		if info.State == shm.StateDown || info.State == shm.StateLive && stale.Has(slot) {
			down |= workers.SetOf(slot)
			if e := &n.regState[slot]; e.refused && e.id == identityOf(info) {
				// A registration this router refused was never routed,
				// and never reported healthy: its death is no worker's.
				// Its refusal is kept while the registry holds it down,
				// or the next poll would forget it and report it.
				refusedDown |= workers.SetOf(slot)
			} else {
				downViews = append(downViews, fastpath.RegistrationView{Slot: i, WorkerID: info.WorkerID, DPRank: info.DPRank,
					Model: info.Model, Endpoint: redact.Endpoint(info.Endpoint), Generation: info.Generation})
			}
		}
		if info.State != shm.StateLive || stale.Has(slot) {
			continue
		}
		registered |= workers.SetOf(slot)
		e := &n.regState[slot]
		id := identityOf(info)
		same := e.id == id
		if e.refused && same {
			continue // refused once for this registration; a new one is tried again
		}
		if e.present && !same && e.id.generation == id.generation {
			// Rewritten in place: a publisher re-registering takes a new
			// generation, so this is some process writing over a live
			// slot (it had moved a worker's cache credit, and its clients'
			// credentials, to an endpoint of its choosing). The slot is
			// refused until it registers anew.
			n.throttle.Log(n.log, slog.LevelError, "rewritten/"+strconv.Itoa(i), "a live registration changed without re-registering: the slot is refused until a new registration",
				"slot", slot, "worker", info.WorkerID, "was_worker", e.id.worker, "endpoint", redact.Endpoint(info.Endpoint),
				"was_endpoint", redact.Endpoint(e.id.endpoint), "generation", info.Generation)
			n.approx.Forget(slot)
			n.sched.Remove(slot)
			n.engines.Remove(slot)
			*e = regEntry{refused: true, id: id, reason: "the live registration changed without re-registering (a new generation)"}
			changed, refusals = true, true
			continue
		}
		if !e.present || !same {
			if e.present {
				// A new engine in the slot: what the router sent the old
				// one is not in its cache.
				n.approx.Forget(slot)
			}
			if e.present && e.id.generation != info.Generation {
				// A new process: the old one's requests will not be
				// answered, and its ejection record is not the new one's.
				n.engines.Abandon(slot)
			}
			// The engine first, then the worker: selection may pick the
			// worker from the moment the scheduler has it (a request for
			// its model rebuilds the front end's table at once), and the
			// engine, with its rank pinned if it shares its endpoint, must
			// be there to take it.
			addr, err := registeredAddr(info.Endpoint)
			if err == nil {
				err = checkModelName(info.Model)
			}
			if err == nil && info.BlockSize == 0 {
				// A static worker may leave its block size to the router's;
				// a registration states it, as its records do: at 0 each
				// of them would be a mismatch, the worker routed to with
				// nothing of its cache ever indexed.
				err = fmt.Errorf("cannot add worker %d rank %d with block size 0: the router's --block-size is %d, and every engine's must equal it",
					info.WorkerID, info.DPRank, n.sched.BlockSize())
			}
			if err == nil {
				var e *dispatch.Engine
				if e, err = n.engines.Add(slot, addr); err == nil {
					// Passive health ejects at most a share of the
					// engines that can stand in for this one.
					e.SetEjectionGroup(uint32(info.Role))
				}
			}
			if err == nil {
				err = n.staticHolds(info.WorkerID, info.DPRank)
			}
			if err == nil {
				n.pinJoiningRank(slot, addr, info.DPRank)
				err = n.sched.Upsert(sched.WorkerInfo{ID: info.WorkerID, DPRank: info.DPRank, Slot: slot,
					Model: info.Model, Endpoint: addr, BlockSize: info.BlockSize, KVCapacityBlocks: info.KVCapacityBlocks,
					Role: workers.Role(info.Role), Generation: info.Generation})
			}
			if err != nil {
				// An engine that keeps re-registering with the same flaw
				// (a restart loop) is a new registration every time:
				// throttled by slot as well.
				n.throttle.Log(n.log, slog.LevelError, "refused/"+strconv.Itoa(i), "cannot route to registered worker", "slot", slot, "worker", info.WorkerID,
					"dp_rank", info.DPRank, "endpoint", redact.Endpoint(info.Endpoint), "generation", info.Generation, "err", err)
				// Neither the slot's previous registration nor an engine
				// added for the refused one may stay routable.
				n.sched.Remove(slot)
				n.engines.Remove(slot)
				changed = changed || e.present
				*e = regEntry{refused: true, id: id, reason: err.Error()}
				refusals = true
				continue
			}
			// Joins and leaves once a minute per slot: a publisher
			// registering in a loop logged thousands of lines a minute.
			// One key for both, so that the line Flush writes last is the
			// slot's state now.
			n.throttle.Log(n.log, slog.LevelInfo, "member/"+strconv.Itoa(i), "worker joined", "slot", slot, "worker", info.WorkerID, "dp_rank", info.DPRank,
				"model", info.Model, "endpoint", addr, "generation", info.Generation)
			if info.Model == "" {
				// Nothing else would say why the engine's model is missing
				// from /v1/models and its requests get 404. Throttled by
				// slot, for an engine in a restart loop.
				n.throttle.Log(n.log, slog.LevelWarn, "nomodel/"+strconv.Itoa(i), noModelMessage, "slot", slot,
					"worker", info.WorkerID, "dp_rank", info.DPRank, "endpoint", addr)
			}
			refusals = refusals || e.refused // a refused slot registered anew, and routable
			*e = regEntry{present: true, id: id}
			changed = true
		}
		live |= workers.SetOf(slot)
		if ld, err := n.seg.LoadOf(slot); err == nil {
			n.sched.SetEngineLoad(slot, uint32(min(ld.Running, 1<<31)), uint32(min(ld.Waiting, 1<<31)),
				ld.KVUsedBlocks, ld.KVTotalBlocks)
		}
	}
	for i := range workers.Max {
		slot := workers.Slot(i)
		e := &n.regState[slot]
		switch {
		case e.present && !live.Has(slot):
			if down.Has(slot) {
				// An engine presumed dead is an incident: its own key, so
				// that the join line a minute's throttle keeps per slot
				// (an engine in a restart loop) cannot hold it back.
				n.throttle.Log(n.log, slog.LevelWarn, "down/"+strconv.Itoa(i), workerDownMessage,
					"slot", slot, "worker", e.id.worker, "endpoint", redact.Endpoint(e.id.endpoint), "generation", e.id.generation)
			} else {
				n.throttle.Log(n.log, slog.LevelInfo, "member/"+strconv.Itoa(i), "worker left", "slot", slot, "endpoint", redact.Endpoint(e.id.endpoint))
			}
			n.approx.Forget(slot)
			n.sched.Remove(slot)
			if down.Has(slot) {
				// Its requests would wait out the first-byte or idle
				// timeout (minutes) for an engine presumed dead: fail
				// them now, so that those that sent nothing yet go to
				// another worker. A clean close keeps them: an engine
				// may drain after it leaves the registry.
				n.engines.Abandon(slot)
			} else {
				n.engines.Remove(slot)
			}
			*e = regEntry{}
			changed = true
		case e.refused && !registered.Has(slot) && !refusedDown.Has(slot):
			*e = regEntry{}
			refusals = true
		}
	}
	if refusals {
		n.publishRefusals()
	}
	if prev := n.downRegs.Load(); prev == nil || !slices.Equal(*prev, downViews) {
		n.downRegs.Store(&downViews)
		n.front.SetDown(downViews)
	}
	if changed {
		n.pinSharedRanks()
		n.front.WorkersChanged()
		select {
		case n.membersChanged <- struct{}{}:
		default: // a poll is due already
		}
	}
}

// publishRefusals copies the refused registrations for Snapshot, which
// runs on other goroutines than the registry loop that owns regState.
func (n *Node) publishRefusals() {
	var out []fastpath.RefusedView
	for i := range n.regState {
		if e := &n.regState[i]; e.refused {
			out = append(out, fastpath.RefusedView{RegistrationView: fastpath.RegistrationView{Slot: i, WorkerID: e.id.worker, DPRank: e.id.rank,
				Model: e.id.model, Endpoint: redact.Endpoint(e.id.endpoint), Generation: e.id.generation}, Reason: e.reason})
		}
	}
	n.refusedRegs.Store(&out)
}

// pinJoiningRank pins the rank of a worker about to join at addr when a
// worker already there shares the endpoint; pinSharedRanks, after the
// scan, pins the others.
func (n *Node) pinJoiningRank(slot workers.Slot, addr string, rank uint32) {
	for w := range n.sched.Workers().All() {
		if info, ok := n.sched.Worker(w); ok && w != slot && info.Endpoint == addr {
			n.engines.PinRank(slot, int64(rank))
			return
		}
	}
}

// pinSharedRanks pins the data-parallel rank of every worker that shares
// its endpoint with another (one API server fronting several ranks, as
// vLLM and SGLang serve data parallelism with internal load balancing),
// so that each request reaches the rank it was routed to; a worker alone
// at its endpoint is sent no rank, which a server of one rank, or one per
// rank, does not need.
func (n *Node) pinSharedRanks() {
	byEndpoint := map[string]workers.Set{}
	for w := range n.sched.Workers().All() {
		if info, ok := n.sched.Worker(w); ok {
			byEndpoint[info.Endpoint] |= workers.SetOf(w)
		}
	}
	for _, set := range byEndpoint {
		for w := range set.All() {
			rank := int64(-1)
			if info, _ := n.sched.Worker(w); set.Len() > 1 {
				rank = int64(info.DPRank)
			}
			n.engines.PinRank(w, rank)
		}
	}
}

// staticHolds refuses a registering engine whose worker id and rank a
// static --worker already has. The scheduler would refuse it too, naming
// slots; this says which flag to change, since a --worker without id=
// takes its position (0, 1, ...), the id an engine gets by default.
func (n *Node) staticHolds(id uint64, rank uint32) error {
	for w := range n.static.All() {
		if info, ok := n.sched.Worker(w); ok && info.ID == id && info.DPRank == rank {
			return fmt.Errorf("static --worker number %d (%s) is worker %d rank %d already: give it id=N unused by the segment's engines (without id= a --worker takes its position, 0, 1, ...), or start the engine with another worker id",
				workers.Max-int(w), info.Endpoint, id, rank)
		}
	}
	return nil
}

// PickEngine is the engine a remote prompt renderer asks for model's
// prompt ids (prompt.Engines): a healthy worker serving model, and the
// adapter the request names when it names one (by its name, or as
// SGLang's "model:adapter"), taken in turn so that rendering spreads over
// the model's engines. Encoders are not asked: they run for encoding
// alone (vLLM's --mm-encoder-only), and fetching and preprocessing a
// request's media there is work taken from the encoder pool.
func (n *Node) PickEngine(model string, requested []byte) (workers.Slot, string, bool) {
	only := workers.AllSlots
	if len(requested) > 0 && string(requested) != model {
		only = 0
		if m := n.adapters.Load(); m != nil {
			if a, ok := (*m)[string(requested)]; ok && a.Base == model {
				only = a.Workers
			} else if name, ok := bytes.CutPrefix(requested, []byte(model+":")); ok {
				// SGLang's spelling: only engines that read it.
				if a, ok := (*m)[string(name)]; ok && a.Base == model {
					only = a.Workers & a.SGLang
				}
			}
		}
	}
	only &^= n.sched.RoleWorkers(workers.RoleEncode)
	var serving workers.Set
	for w := range (n.sched.Workers() & only).All() {
		if info, ok := n.sched.Worker(w); ok && info.Model == model && n.sched.Load(w).Healthy {
			serving |= workers.SetOf(w)
		}
	}
	if serving == 0 {
		return 0, "", false
	}
	k := int(n.renderTurn.Add(1) % uint64(serving.Len()))
	for w := range serving.All() {
		if k == 0 {
			info, _ := n.sched.Worker(w)
			return w, info.Endpoint, true
		}
		k--
	}
	return 0, "", false // unreachable: k < serving.Len()
}
