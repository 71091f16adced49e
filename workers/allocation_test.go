//go:build !race

package workers

import "testing"

func TestSetAllAllocations(t *testing.T) {
	set := SetOf(1) | SetOf(17) | SetOf(63)
	var sum int
	if n := testing.AllocsPerRun(100, func() {
		for w := range set.All() {
			sum += int(w)
		}
	}); n != 0 {
		t.Errorf("ranging over Set.All allocates %v times", n)
	}
	if sum == 0 {
		t.Fatal("the loop never ran")
	}
}
