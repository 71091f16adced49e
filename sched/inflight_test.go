package sched

import (
	"context"
	"testing"

	"github.com/kvfast/kvfast/workers"
)

// With CreditInFlight a prompt already booked on a worker counts as its
// cached prefix for a follow-up arriving before the engine reports the
// blocks stored; without it the follow-up sees no overlap anywhere.
func TestCreditInFlight(t *testing.T) {
	for _, tc := range []struct {
		name        string
		credit      bool
		wantOverlap uint32
	}{
		{"off: events only", false, 0},
		{"on: in-flight prefix credited", true, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cost := DefaultCostParams()
			cost.CreditInFlight = tc.credit
			s := newTestScheduler(t, 4, Config{Cost: &cost})
			p := prompt(7, 8, 0, 8)
			var first Reservation
			d1, err := s.Select(context.Background(), &Request{Hashes: p, PromptTokens: 8 * 16}, &first)
			if err != nil {
				t.Fatal(err)
			}
			// The first request is decoding (its engine computed the prefix
			// but has not reported it stored yet).
			first.PrefillDone()
			var sc Scores
			var no workers.Overlaps // the index has not heard of the prefix yet
			follow := append(append([]uint64(nil), p...), prompt(9, 0, 9, 4)...)
			d2, err := s.Select(context.Background(), &Request{Hashes: follow, PromptTokens: 12 * 16, Overlaps: &no,
				QueryOnly: true, Scores: &sc}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := sc.Workers[d1.Slot].OverlapBlocks; got != tc.wantOverlap {
				t.Fatalf("credited overlap on the busy worker %d, want %d", got, tc.wantOverlap)
			}
			if tc.credit && (d2.Slot != d1.Slot || d2.OverlapBlocks != 8) {
				t.Fatalf("follow-up went to slot %d with overlap %d; want slot %d, 8", d2.Slot, d2.OverlapBlocks, d1.Slot)
			}
			first.Release()
			requireZeroLoad(t, s)
		})
	}
}
