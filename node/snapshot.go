package node

import (
	"slices"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
)

// Snapshot gathers the node's state from its owners (scheduler, index,
// ingester, ZMQ feeds, registry) into the one view that both
// /admin/workers and /metrics present. It reads counters and copies; it
// takes no lock the request path takes.
func (n *Node) Snapshot() fastpath.Snapshot {
	var v fastpath.Snapshot
	// A truncated segment file faults the reads of the index, rings and
	// registry below: caught, the segment is detached (shm/fault.go) and
	// this one snapshot is left partial.
	n.seg.Guard(func() { n.snapshot(&v) })
	return v
}

func (n *Node) snapshot(v *fastpath.Snapshot) {
	v.Policy = n.cfg.Policy
	if r := n.refusedRegs.Load(); r != nil {
		v.Refused = *r
	}
	if d := n.downRegs.Load(); d != nil {
		v.Down = *d
	}
	// After Close the segment may be unmapped: leave out what lives there
	// (the index, the rings' lag, the registry) rather than read freed
	// memory.
	n.releaseMu.RLock()
	defer n.releaseMu.RUnlock()
	mapped := !n.released
	var ix radix.Stats
	if mapped {
		ix = n.index.Stats()
	}
	v.Index = fastpath.IndexView{Entries: ix.Entries, Capacity: ix.Capacity, Overflow: ix.Overflow,
		MapEntries: ix.EngineMapEntries, MapCapacity: ix.EngineMapCapacity, MapOverflow: ix.EngineMapOverflow,
		SegmentRetired: n.seg != nil && mapped && (n.seg.Retired() || n.seg.Replaced() || n.seg.Lost() != "")}
	var lag [workers.Max]uint64
	if n.ingester != nil && mapped {
		fs := n.ingester.Stats()
		lag = fs.LagBytes
		v.Feed = &fs
	}
	st := n.sched.Stats()
	v.Queue = fastpath.QueueView{Waiting: st.Waiting, Refused: st.Refused, Booked: st.Booked, Released: st.Released}
	v.Tokenizers = n.prompts.Status()
	v.Workers = []fastpath.WorkerView{}
	auto := n.cfg.Sched.Cost != nil && n.cfg.Sched.Cost.AutoPrefillLoadScale
	v.PrefillLoadScale, v.PrefillLoadScaleAuto = n.sched.PrefillLoadScale(), auto
	var adapters [workers.Max][]string // each worker's, from one walk of the union
	if m := n.adapters.Load(); m != nil {
		for name, a := range *m {
			for w := range a.Workers.All() {
				adapters[w] = append(adapters[w], name)
			}
		}
		for w := range adapters {
			slices.Sort(adapters[w])
		}
	}
	for w := range n.sched.Workers().All() {
		info, ok := n.sched.Worker(w)
		if !ok {
			continue
		}
		ld := n.sched.Load(w)
		wv := fastpath.WorkerView{Slot: int(w), WorkerID: info.ID, DPRank: info.DPRank, Model: info.Model, Endpoint: info.Endpoint,
			Source: "registry", Role: info.Role.String(), Healthy: ld.Healthy, Stalled: ld.Stalled, KVCapacityBlocks: info.KVCapacityBlocks,
			ActiveBlocks: ld.ActiveBlocks, OutputBlocks: ld.OutputBlocks, PrefillTokens: ld.PrefillTokens, Requests: ld.Requests,
			EngineRunning: ld.EngineRunning, EngineWaiting: ld.EngineWaiting, EngineKVUsed: ld.EngineKVUsed, EngineKVTotal: ld.EngineKVTotal,
			IndexBlocks: ix.WorkerBlocks[w], IndexRefused: ix.WorkerRefused[w], FeedLagBytes: lag[w],
			Calibration: fastpath.NewCalibrationView(n.sched.Calibration(w), auto)}
		wv.ModelUnlisted = workers.Set(n.unlisted.Load()).Has(w)
		wv.KeyRefused = workers.Set(n.keyRefused.Load()).Has(w)
		wv.SGLangSpellings = workers.Set(n.sglang.Load()).Has(w)
		wv.Adapters = adapters[w]
		if e := n.engines.Engine(w); e != nil {
			o := e.Outlier()
			wv.Ejected, wv.EjectedSeconds, wv.Ejections = o.Ejected, o.Remaining.Seconds(), o.Ejections
			t := e.Throttle()
			wv.ThrottledSeconds, wv.Throttles = t.Remaining.Seconds(), t.Throttles
		}
		if n.static.Has(w) {
			wv.Source = "static"
			if sub := n.zmq[w]; sub != nil {
				zs := sub.Stats()
				wv.ZMQ = &zs
			}
		} else if n.seg != nil && mapped {
			if ri, ok := n.seg.Worker(w); ok && ri.State == shm.StateLive {
				wv.Generation = ri.Generation
			}
		}
		v.Workers = append(v.Workers, wv)
	}
}
