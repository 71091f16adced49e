package invariants

import "testing"

// The race detector's build must check invariants: that is how the race
// suite exercises them without a separate tag.
func TestRaceImpliesInvariants(t *testing.T) {
	if raceEnabled && !Enabled {
		t.Fatal("a race build does not check invariants")
	}
}
