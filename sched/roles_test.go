package sched

import (
	"context"
	"errors"
	"testing"

	"github.com/kvfast/kvfast/workers"
)

func TestStageFiltersByRole(t *testing.T) {
	s := newTestScheduler(t, 0, Config{})
	roles := []workers.Role{workers.RolePrefill, workers.RoleDecode, workers.RoleBoth, workers.RoleDecode, workers.RoleEncode}
	for i, r := range roles {
		if err := s.Upsert(WorkerInfo{ID: 100 + uint64(i), Slot: workers.Slot(i), Model: "m", Endpoint: "h:1", Role: r}); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		stage Stage
		want  workers.Set
	}{
		{StageAny, workers.SetOf(0) | workers.SetOf(1) | workers.SetOf(2) | workers.SetOf(3)},
		{StagePrefill, workers.SetOf(0) | workers.SetOf(2)},
		{StageDecode, workers.SetOf(1) | workers.SetOf(2) | workers.SetOf(3)},
		{StageEncode, workers.SetOf(4)},
	}
	for _, c := range cases {
		if got := s.StageWorkers(c.stage); got != c.want {
			t.Errorf("stage %d: workers %b, want %b", c.stage, got, c.want)
		}
		var sc Scores
		if _, err := s.Select(context.Background(), &Request{PromptTokens: 16, Stage: c.stage, QueryOnly: true, Scores: &sc}, nil); err != nil {
			t.Fatal(err)
		}
		if sc.Eligible != c.want {
			t.Errorf("stage %d: eligible %b, want %b", c.stage, sc.Eligible, c.want)
		}
	}
	for r, want := range map[workers.Role]workers.Set{workers.RolePrefill: workers.SetOf(0), workers.RoleDecode: workers.SetOf(1) | workers.SetOf(3),
		workers.RoleBoth: workers.SetOf(2), workers.RoleEncode: workers.SetOf(4)} {
		if got := s.RoleWorkers(r); got != want {
			t.Errorf("role %v: workers %b, want %b", r, got, want)
		}
	}
	// A role change on re-upsert moves the worker between the sets, and
	// removal clears it.
	if err := s.Upsert(WorkerInfo{ID: 100, Slot: 0, Model: "m", Endpoint: "h:1", Role: workers.RoleDecode}); err != nil {
		t.Fatal(err)
	}
	if s.StageWorkers(StagePrefill).Has(0) || !s.StageWorkers(StageDecode).Has(0) {
		t.Error("slot 0 kept its prefill role after becoming a decode worker")
	}
	// An encoder never answers a request of any other stage.
	if s.StageWorkers(StageAny).Has(4) || s.StageWorkers(StagePrefill).Has(4) || s.StageWorkers(StageDecode).Has(4) {
		t.Error("the encoder is a candidate of a generating stage")
	}
	if err := s.Upsert(WorkerInfo{ID: 104, Slot: 4, Model: "m", Endpoint: "h:1", Role: workers.RoleBoth}); err != nil {
		t.Fatal(err)
	}
	if s.StageWorkers(StageEncode) != 0 || !s.StageWorkers(StageAny).Has(4) {
		t.Error("slot 4 kept its encode role after becoming an aggregated worker")
	}
	s.Remove(4)
	s.Remove(2)
	if got := s.StageWorkers(StagePrefill); got != 0 {
		t.Errorf("prefill workers %b after the only one left", got)
	}
	var res Reservation
	_, err := s.Select(context.Background(), &Request{PromptTokens: 16, Stage: StagePrefill}, &res)
	if !errors.Is(err, ErrNoEligibleWorker) {
		t.Errorf("prefill stage with no prefill worker: %v, want ErrNoEligibleWorker", err)
	}
}

func TestParseRole(t *testing.T) {
	for in, want := range map[string]workers.Role{"": workers.RoleBoth, "both": workers.RoleBoth, "prefill": workers.RolePrefill, "decode": workers.RoleDecode, "encode": workers.RoleEncode} {
		if got, err := workers.ParseRole(in); err != nil || got != want {
			t.Errorf("workers.ParseRole(%q) = %v, %v; want %v", in, got, err, want)
		}
		if want.String() != in && in != "" {
			t.Errorf("%v.String() = %q, want %q", want, want.String(), in)
		}
	}
	if _, err := workers.ParseRole("vision"); err == nil {
		t.Error("ParseRole accepted an unknown role")
	}
}
