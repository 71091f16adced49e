package sched

import "github.com/kvfast/kvfast/workers"

// affinity picks the member of free with the longest cached prefix for
// req, as Request.Overlaps reports it, and breaks ties as leastLoaded
// does. It is what a pure prefix-affinity router does (vLLM
// production-stack's prefixaware router keeps a trie of its own decisions
// and sends each request to the longest match): load never outweighs a
// longer match, so a hot prefix stays on one worker however busy it gets,
// and a request no worker has seen goes to the least loaded one.
func (s *Scheduler) affinity(req *Request, free workers.Set) workers.Slot {
	n := len(req.Hashes)
	var best uint32
	var ties workers.Set
	for w := range free.All() {
		switch o := overlapOf(req, w, n); {
		case ties == 0 || o > best:
			best, ties = o, workers.SetOf(w)
		case o == best:
			ties |= workers.SetOf(w)
		}
	}
	if ties&(ties-1) == 0 {
		w, _ := ties.First()
		return w
	}
	return s.leastLoaded(ties)
}
