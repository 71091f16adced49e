package workers

import (
	"slices"
	"testing"
)

func TestSetAll(t *testing.T) {
	for _, tc := range []struct {
		set  Set
		want []Slot
	}{
		{0, nil},
		{SetOf(0), []Slot{0}},
		{SetOf(63), []Slot{63}},
		{SetOf(1) | SetOf(5) | SetOf(40), []Slot{1, 5, 40}},
	} {
		var got []Slot
		for w := range tc.set.All() {
			got = append(got, w)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%#x.All() = %v, want %v", uint64(tc.set), got, tc.want)
		}
		if tc.set.Len() != len(tc.want) {
			t.Errorf("%#x.Len() = %d, want %d", uint64(tc.set), tc.set.Len(), len(tc.want))
		}
	}
	if n := AllSlots.Len(); n != Max {
		t.Errorf("AllSlots.Len() = %d, want %d", n, Max)
	}
}

func TestSetAllStopsEarly(t *testing.T) {
	var got []Slot
	for w := range (SetOf(2) | SetOf(3) | SetOf(9)).All() {
		got = append(got, w)
		if w == 3 {
			break
		}
	}
	if !slices.Equal(got, []Slot{2, 3}) {
		t.Errorf("break after 3 yielded %v", got)
	}
}
