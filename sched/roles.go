package sched

import (
	"github.com/kvfast/kvfast/workers"
)

// Stage restricts a request to the workers that can run one stage of a
// disaggregated request: StagePrefill keeps prefill and both, StageDecode
// keeps decode and both, StageEncode keeps encode only. StageAny (the
// zero value) keeps every role that generates: all but encode, since an
// encoder produces embeddings, not tokens.
type Stage uint8

const (
	StageAny Stage = iota
	StagePrefill
	StageDecode
	StageEncode
)

// excluded returns the workers of ws that cannot run stage.
func (ws *workerSet) excluded(stage Stage) workers.Set {
	switch stage {
	case StagePrefill:
		return ws.onlyDecode | ws.onlyEncode
	case StageDecode:
		return ws.onlyPrefill | ws.onlyEncode
	case StageEncode:
		return ws.present &^ ws.onlyEncode
	}
	return ws.onlyEncode
}

// setRole records w's role in the role sets.
func (ws *workerSet) setRole(w workers.Slot, r workers.Role) {
	bit := workers.SetOf(w)
	ws.onlyPrefill &^= bit
	ws.onlyDecode &^= bit
	ws.onlyEncode &^= bit
	switch r {
	case workers.RolePrefill:
		ws.onlyPrefill |= bit
	case workers.RoleDecode:
		ws.onlyDecode |= bit
	case workers.RoleEncode:
		ws.onlyEncode |= bit
	}
}

// RoleWorkers returns the present workers whose role is r, healthy or not:
// under SGLang's protocol a prefill must be an engine started in prefill
// mode, not any worker that can prefill (an aggregated engine ignores the
// bootstrap fields and generates the whole answer).
func (s *Scheduler) RoleWorkers(r workers.Role) workers.Set {
	ws := s.workers.Load()
	switch r {
	case workers.RolePrefill:
		return ws.present & ws.onlyPrefill
	case workers.RoleDecode:
		return ws.present & ws.onlyDecode
	case workers.RoleEncode:
		return ws.present & ws.onlyEncode
	}
	return ws.present &^ (ws.onlyPrefill | ws.onlyDecode | ws.onlyEncode)
}

// StageWorkers returns the present workers that can run stage, healthy or
// not: the front end asks whether a two-stage route exists at all.
func (s *Scheduler) StageWorkers(stage Stage) workers.Set {
	ws := s.workers.Load()
	return ws.present &^ ws.excluded(stage)
}
