//go:build !race

package guard

import (
	"context"
	"testing"

	"github.com/kvfast/kvfast/sched"
)

func TestLifecycleAllocatesNothing(t *testing.T) {
	cost := sched.DefaultCostParams()
	cost.TrackOutputBlocks = true
	var n int
	pool, s := newTestPool(t, 8, sched.Config{Cost: &cost}, Observer{Finished: func(Event) { n++ }})
	h0 := hashes(9, 64)
	ctx := context.Background()
	for name, fn := range map[string]func(){
		"complete": func() {
			h := pool.Acquire()
			req := sched.Request{Hashes: h0, PromptTokens: 64 * 16, ExpectedOutputTokens: 300}
			if _, err := h.Select(ctx, &req); err != nil {
				t.Fatal(err)
			}
			_ = h.Dispatched()
			for range 255 {
				_ = h.OnItem(1, FinishNone)
			}
			_ = h.OnItem(1, FinishStop)
			_ = h.Close()
			if err := h.Release(); err != nil {
				t.Fatal(err)
			}
		},
		"abort": func() {
			h := pool.Acquire()
			req := sched.Request{Hashes: h0, PromptTokens: 64 * 16}
			if _, err := h.Select(ctx, &req); err != nil {
				t.Fatal(err)
			}
			_ = h.Dispatched()
			_ = h.OnItem(4, FinishNone)
			_ = h.Abort(ReasonClientCancel)
			_ = h.Release()
		},
		"dispatch failed": func() {
			h := pool.Acquire()
			req := sched.Request{Hashes: h0, PromptTokens: 64 * 16}
			if _, err := h.Select(ctx, &req); err != nil {
				t.Fatal(err)
			}
			_ = h.DispatchFailed()
			_ = h.Release()
		},
		"acquire and release": func() {
			h := pool.Acquire()
			_ = h.Release()
		},
	} {
		if a := testing.AllocsPerRun(200, fn); a != 0 {
			t.Errorf("%s: %v allocs per lifecycle", name, a)
		}
	}
	if n == 0 {
		t.Fatal("observer never ran")
	}
	requireNoLoad(t, s)
}
