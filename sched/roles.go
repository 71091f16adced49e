package sched

import (
	"fmt"

	"github.com/kvfast/kvfast/workers"
)

// Role is the part a worker plays in disaggregated serving: it computes
// prompts for others (prefill), generates from prompts others computed
// (decode), does both (the zero value, every aggregated engine), or only
// encodes multimodal inputs for the others (encode: a vision or audio
// encoder whose embeddings reach the prefill engines through the
// engines' encoder-cache connector).
type Role uint8

const (
	RoleBoth Role = iota
	RolePrefill
	RoleDecode
	RoleEncode
)

// ParseRole reads a role's name: "prefill", "decode", "encode" or "both"
// ("" too).
func ParseRole(s string) (Role, error) {
	switch s {
	case "", "both":
		return RoleBoth, nil
	case "prefill":
		return RolePrefill, nil
	case "decode":
		return RoleDecode, nil
	case "encode":
		return RoleEncode, nil
	}
	return RoleBoth, fmt.Errorf("cannot use role %q: want prefill, decode, encode or both", s)
}

func (r Role) String() string {
	switch r {
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	case RoleEncode:
		return "encode"
	case RoleBoth:
		return "both"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

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
func (ws *workerSet) setRole(w workers.Slot, r Role) {
	bit := workers.SetOf(w)
	ws.onlyPrefill &^= bit
	ws.onlyDecode &^= bit
	ws.onlyEncode &^= bit
	switch r {
	case RolePrefill:
		ws.onlyPrefill |= bit
	case RoleDecode:
		ws.onlyDecode |= bit
	case RoleEncode:
		ws.onlyEncode |= bit
	}
}

// StageWorkers returns the present workers that can run stage, healthy or
// not: the front end asks whether a two-stage route exists at all.
func (s *Scheduler) StageWorkers(stage Stage) workers.Set {
	ws := s.workers.Load()
	return ws.present &^ ws.excluded(stage)
}
