package sched

import (
	"strconv"
	"strings"

	"github.com/kvfast/kvfast/workers"
)

// Policy is the rule that chooses among a request's candidates: the
// workers left after the filters (model, health, pin, allow-list) and the
// busy thresholds. Every policy books the same load and goes through the
// same filters and admission queue; only the choice differs.
type Policy uint8

const (
	// PolicyKV picks by the cost model (cache overlap against load), with
	// the temperature of the cost parameters. It is the zero value.
	PolicyKV Policy = iota
	// PolicyRoundRobin takes turns in slot order: the next candidate after
	// the one it picked last, wrapping around.
	PolicyRoundRobin
	// PolicyRandom picks uniformly among the candidates.
	PolicyRandom
	// PolicyLeastLoaded picks the candidate with the fewest in-flight
	// requests booked by the router, then the fewest active blocks, then
	// at random.
	PolicyLeastLoaded
	// PolicyAffinity picks the candidate with the longest cached prefix,
	// ignoring load but as a tie-break (affinity.go): the baseline of a
	// pure prefix-affinity router, such as vLLM production-stack's
	// prefixaware router, fed the router's own routing history.
	PolicyAffinity

	numPolicies
)

// PolicyNames returns the names ParsePolicy accepts, for flag help and
// error messages.
func PolicyNames() []string {
	return []string{"kv", "approx", "round-robin", "random", "least-loaded", "affinity"}
}

// String returns the policy's name as ParsePolicy reads it.
func (p Policy) String() string {
	switch p {
	case PolicyKV:
		return "kv"
	case PolicyRoundRobin:
		return "round-robin"
	case PolicyRandom:
		return "random"
	case PolicyLeastLoaded:
		return "least-loaded"
	case PolicyAffinity:
		return "affinity"
	}
	return "Policy(" + strconv.Itoa(int(p)) + ")"
}

// Validate reports whether p is one of the defined policies.
func (p Policy) Validate() error {
	if p >= numPolicies {
		return invalidf("cannot use routing policy %s", p)
	}
	return nil
}

// ParsePolicy reads a policy name: "kv", "approx", "round-robin",
// "random", "least-loaded" or "affinity". "approx" is PolicyKV with
// approx set, and "affinity" PolicyAffinity with approx set: the scheduler
// has no mode of its own for it, the caller feeds Request.Overlaps from an
// approximate index of its own routing decisions (radix.Approx) instead of
// the event-fed one. Any other name is an error wrapping ErrInvalidConfig
// that lists the valid ones.
func ParsePolicy(name string) (p Policy, approx bool, err error) {
	switch name {
	case "kv":
		return PolicyKV, false, nil
	case "approx":
		return PolicyKV, true, nil
	case "round-robin":
		return PolicyRoundRobin, false, nil
	case "random":
		return PolicyRandom, false, nil
	case "least-loaded":
		return PolicyLeastLoaded, false, nil
	case "affinity":
		return PolicyAffinity, true, nil
	}
	return 0, false, invalidf("cannot use routing policy %q: want one of %s", name, strings.Join(PolicyNames(), ", "))
}

func (s *Scheduler) policyFor(req *Request) (Policy, error) {
	if req.Policy == nil {
		return Policy(s.policy.Load()), nil
	}
	return *req.Policy, req.Policy.Validate()
}

// choose applies pol to free, the non-empty set of candidates that may
// take the request. costs are the cost model's, filled for every member of
// free. commit says the choice is a booking rather than a query: only a
// booking takes a round-robin turn, so a query answers with the worker the
// next request would get. The caller holds s.mu when committing, so two
// concurrent bookings cannot read the same last turn and take the same
// worker.
func (s *Scheduler) choose(pol Policy, req *Request, costs *[workers.Max]float64, free workers.Set, temperature float64, commit bool) workers.Slot {
	switch pol {
	case PolicyAffinity:
		return s.affinity(req, free)
	case PolicyRoundRobin:
		return s.roundRobin(free, commit)
	case PolicyRandom:
		return nth(free, s.rng.intn(free.Len()))
	case PolicyLeastLoaded:
		return s.leastLoaded(free)
	}
	return pick(costs, free, temperature, &s.rng)
}

// roundRobin picks the next member of free in slot order, cyclically,
// after the member of free that round-robin picked most recently (the
// lowest member if it never picked any). For a fixed set that is a cursor
// going round in slot order, skipping busy and unhealthy workers. Finding
// the last pick among the candidates, rather than keeping one cursor for
// everyone, keeps the rotation fair when requests with different filters
// interleave: with one cursor, a model on slots 0-3 alternating with one
// on slots 4-7 would find the cursor past its slots every time and wrap to
// slot 0 for ever.
func (s *Scheduler) roundRobin(free workers.Set, commit bool) workers.Slot {
	var last workers.Slot
	var newest uint64
	for w := range free.All() {
		if t := s.live[w].lastTurn.Load(); t > newest {
			last, newest = w, t
		}
	}
	next := free
	if newest != 0 {
		// Members above last; 2<<63 wraps to 0, leaving none above 63.
		if above := free &^ (workers.Set(2)<<last - 1); above != 0 {
			next = above
		}
	}
	w, _ := next.First()
	if commit {
		s.live[w].lastTurn.Store(s.turns.Add(1))
	}
	return w
}

// leastLoaded picks the member of free with the fewest in-flight requests,
// ties going to the fewest decode blocks (distinct in-flight prompt blocks
// plus tracked output blocks), remaining ties uniformly at random so that
// an idle cluster is not filled from slot 0 up.
func (s *Scheduler) leastLoaded(free workers.Set) workers.Slot {
	type load struct{ requests, units int64 }
	var best load
	var ties workers.Set
	for w := range free.All() {
		l := &s.live[w]
		cur := load{l.requests.Load(), l.activeBlocks.Load()*outputUnit + l.outputUnits.Load()}
		switch {
		case ties == 0 || cur.requests < best.requests || cur.requests == best.requests && cur.units < best.units:
			best, ties = cur, workers.SetOf(w)
		case cur == best:
			ties |= workers.SetOf(w)
		}
	}
	if ties&(ties-1) == 0 {
		w, _ := ties.First()
		return w
	}
	return nth(ties, s.rng.intn(ties.Len()))
}
