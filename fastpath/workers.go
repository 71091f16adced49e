package fastpath

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/kvfast/kvfast/feed"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/shm"
)

// regEntry remembers what the registry said about a slot last time, so
// that the poll only touches the scheduler and the engine pool on change.
type regEntry struct {
	present    bool
	generation uint32
	endpoint   string
	model      string
}

// addStatic gives configured engines the highest slots, counting down, so
// that they stay clear of the registry, which hands out slots from 0 up.
func (s *Server) addStatic(workers []StaticWorker) error {
	if len(workers) > radix.MaxWorkers {
		return fmt.Errorf("cannot configure %d static workers: at most %d", len(workers), radix.MaxWorkers)
	}
	for i, w := range workers {
		slot := radix.WorkerSlot(radix.MaxWorkers - 1 - i)
		addr, err := hostPort(w.Endpoint)
		if err != nil {
			return fmt.Errorf("cannot use static worker %d: %w", w.ID, err)
		}
		if err := s.sched.Upsert(sched.WorkerInfo{ID: w.ID, DPRank: w.DPRank, Slot: slot, Model: w.Model,
			Endpoint: addr, KVCapacityBlocks: w.KVBlocks}); err != nil {
			return fmt.Errorf("cannot add static worker %d rank %d: %w", w.ID, w.DPRank, err)
		}
		if _, err := s.engines.Add(slot, addr); err != nil {
			return err
		}
		s.static |= radix.SetOf(slot)
		if w.Events != "" {
			if w.Model == "" {
				return fmt.Errorf("cannot subscribe to static worker %d's events: it needs a model name, which seeds the block hashes", w.ID)
			}
			sub, err := feed.NewZMQSubscriber(s.index, feed.ZMQConfig{Endpoint: w.Events, Replay: w.Replay, Topic: w.Topic,
				Slot: slot, Model: w.Model, BlockSize: s.sched.BlockSize(),
				Logger: s.log.With("worker", w.ID, "dp_rank", w.DPRank)})
			if err != nil {
				return fmt.Errorf("cannot subscribe to static worker %d's events: %w", w.ID, err)
			}
			s.zmq[slot] = sub
		}
	}
	s.rebuildSeeds()
	return nil
}

// hostPort accepts "host:port" or an http URL and returns "host:port".
func hostPort(endpoint string) (string, error) {
	if strings.Contains(endpoint, "://") {
		u, err := url.Parse(endpoint)
		if err != nil {
			return "", fmt.Errorf("cannot parse endpoint %q: %w", endpoint, err)
		}
		if u.Scheme != "http" {
			return "", fmt.Errorf("cannot use endpoint %q: only http engines are supported", endpoint)
		}
		endpoint = u.Host
	}
	if _, _, err := net.SplitHostPort(endpoint); err != nil {
		return "", fmt.Errorf("cannot use endpoint %q: want host:port or http://host:port", endpoint)
	}
	return endpoint, nil
}

func (s *Server) registryLoop(ctx context.Context) {
	defer s.bg.Done()
	t := time.NewTicker(s.cfg.RegistryPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.syncRegistry()
		}
	}
}

// syncRegistry brings the worker set in line with the segment's registry
// and copies every live worker's load page into the scheduler.
func (s *Server) syncRegistry() {
	if s.seg == nil {
		return
	}
	var live radix.WorkerSet
	changed := false
	for i := range radix.MaxWorkers {
		slot := radix.WorkerSlot(i)
		if s.static.Has(slot) {
			continue
		}
		info, ok := s.seg.Worker(slot)
		if !ok || info.State != shm.StateLive {
			continue
		}
		e := &s.regState[slot]
		if !e.present || e.generation != info.Generation || e.endpoint != info.Endpoint || e.model != info.Model {
			addr, err := hostPort(info.Endpoint)
			if err == nil {
				err = s.sched.Upsert(sched.WorkerInfo{ID: info.WorkerID, DPRank: info.DPRank, Slot: slot,
					Model: info.Model, Endpoint: addr, BlockSize: info.BlockSize, KVCapacityBlocks: info.KVCapacityBlocks})
			}
			if err == nil {
				_, err = s.engines.Add(slot, addr)
			}
			if err != nil {
				if !e.present || e.generation != info.Generation {
					s.log.Error("cannot route to registered worker", "slot", slot, "worker", info.WorkerID,
						"dp_rank", info.DPRank, "endpoint", info.Endpoint, "err", err)
				}
				*e = regEntry{generation: info.Generation}
				continue
			}
			s.log.Info("worker joined", "slot", slot, "worker", info.WorkerID, "dp_rank", info.DPRank,
				"model", info.Model, "endpoint", addr, "generation", info.Generation)
			*e = regEntry{present: true, generation: info.Generation, endpoint: info.Endpoint, model: info.Model}
			changed = true
		}
		live |= radix.SetOf(slot)
		if ld, err := s.seg.LoadOf(slot); err == nil {
			s.sched.SetEngineLoad(slot, uint32(min(ld.Running, 1<<31)), uint32(min(ld.Waiting, 1<<31)),
				ld.KVUsedBlocks, ld.KVTotalBlocks)
		}
	}
	for i := range radix.MaxWorkers {
		slot := radix.WorkerSlot(i)
		if e := &s.regState[slot]; e.present && !live.Has(slot) {
			s.log.Info("worker left", "slot", slot, "endpoint", e.endpoint)
			s.sched.Remove(slot)
			s.engines.Remove(slot)
			*e = regEntry{}
			changed = true
		}
	}
	if changed {
		s.rebuildSeeds()
	}
}

// rebuildSeeds publishes the model → namespace-seed table the request path
// reads without locks. Keys are the served model names; an unknown model
// is refused before any routing work.
func (s *Server) rebuildSeeds() {
	m := map[string]modelNamespace{}
	for set := s.sched.Workers(); set != 0; {
		var w radix.WorkerSlot
		w, set = set.First()
		if info, ok := s.sched.Worker(w); ok {
			m[info.Model] = modelNamespace{name: info.Model, seed: radix.NamespaceSeed(info.Model, "", "")}
		}
	}
	s.seeds.Store(&m)
}

type modelNamespace struct {
	name string
	seed uint64
}

var errUnknownModel = &RequestError{Status: 404, Type: invalidRequest, Param: "model", Code: "model_not_found",
	Message: "no worker serves the requested model"}

// namespace resolves the request's model to the name the workers use and to
// the seed of its block hashes. A missing model routes among all workers
// (with the first model's seed only if there is exactly one model).
func (s *Server) namespace(r *ParsedRequest) (model string, seed uint64, _ *RequestError) {
	seeds := *s.seeds.Load()
	if r.Model == nil {
		if len(seeds) != 1 {
			return "", radix.NamespaceSeed("", "", string(r.CacheSalt)), nil
		}
		for _, ns := range seeds {
			model, seed = ns.name, ns.seed
		}
	} else {
		// The entry carries the name as a string already, so the body's
		// bytes are never converted (which would allocate).
		ns, ok := seeds[string(r.Model)]
		if !ok {
			return "", 0, errUnknownModel
		}
		model, seed = ns.name, ns.seed
	}
	if len(r.CacheSalt) > 0 {
		// Salted requests are rare and get their own namespace; computing
		// it allocates the strings, which is acceptable off the common path.
		seed = radix.NamespaceSeed(model, "", string(r.CacheSalt))
	}
	return model, seed, nil
}

// eligible is the set of workers selection may use right now.
func (s *Server) eligible() radix.WorkerSet {
	var set radix.WorkerSet
	for all := s.sched.Workers(); all != 0; {
		var w radix.WorkerSlot
		w, all = all.First()
		if s.sched.Load(w).Healthy {
			set |= radix.SetOf(w)
		}
	}
	return set
}

func (s *Server) approxLoop(ctx context.Context) {
	defer s.bg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.approx.Expire(now)
		}
	}
}
