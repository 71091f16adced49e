package guard

import "fmt"

// legalFrom[to] is the set of states a guard may move to `to` from: the
// diagram in doc.go, plus Free → Acquired at Acquire and a terminal state
// → Free at Release.
var legalFrom = [...]uint8{
	Free:       1<<Completed | 1<<Aborted,
	Acquired:   1 << Free,
	Selected:   1 << Acquired,
	Dispatched: 1 << Selected,
	Completed:  1 << Dispatched,
	Aborted:    1<<Acquired | 1<<Selected | 1<<Dispatched,
}

// checkTransition asserts that moving the guard word from old to new, on
// behalf of a handle of generation gen, is legal: the states are an edge
// of the lifecycle, old belongs to the handle's generation and new keeps
// it (Release alone moves to the next one), a terminal move does not cut
// into a progress update, and only a cleaned-up, claimed guard is freed.
// Callers run it only when internal/invariants.Enabled, so production
// builds carry none of it.
func checkTransition(old, new uint64, gen uint32) {
	from, to := stateOf(old), stateOf(new)
	wantGen := gen
	if to == Free {
		wantGen = gen + 1
	}
	var bad string
	switch {
	case int(to) >= len(legalFrom) || legalFrom[to]&(1<<from) == 0:
		bad = "not an edge of the lifecycle"
	case genOf(old) != gen || genOf(new) != wantGen:
		bad = "generation mismatch"
	case to.Terminal() && old&busyBit != 0:
		bad = "terminal move during a progress update"
	case to == Free && old&(cleanedBit|releasingBit) != cleanedBit|releasingBit:
		bad = "freed before its load was released and Release claimed it"
	default:
		return
	}
	badTransition(bad, old, new, gen)
}

//go:noinline
func badTransition(why string, old, new uint64, gen uint32) {
	panic(fmt.Sprintf("BUG: guard: illegal transition %s → %s (%s): word %#x → %#x, handle generation %d",
		stateOf(old), stateOf(new), why, old, new, gen))
}
