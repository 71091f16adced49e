package guard

import "github.com/kvfast/kvfast/sched"

// A disaggregated request runs in two stages, each with a guard of its
// own from the same pool: the prefill stage's guard books the prompt on
// the prefill worker and completes when that worker's one-token answer
// is read; the decode stage's guard books the prompt's blocks and the
// output on the decode worker. Each releases its own booking exactly
// once, whatever happens to the other; the caller aborts both when the
// client leaves. The one thing a decode guard needs beyond a plain
// request is to learn, before dispatch, that another worker computes
// its prompt.

// PrefillRemote releases the prompt's prefill load booked on a Selected
// guard, because another worker computes the prompt and the selected one
// only receives its KV (the decode stage of a disaggregated request). The
// prompt's blocks stay booked: the KV arrives there. The selected worker
// owes no answer until AwaitDecode. It returns ErrAborted if the request
// was aborted meanwhile; the first output token later releases nothing
// more.
func (h Handle) PrefillRemote() error {
	return h.whileSelected((*sched.Reservation).RemotePrefillDone)
}

// AwaitDecode records that the decode stage, after PrefillRemote, is
// being sent to its worker, which owes it an answer from now on: the
// worker's stall detection counts from here, not from the selection, so
// the remote prefill's time is not held against it. It returns
// ErrAborted if the request was aborted meanwhile.
func (h Handle) AwaitDecode() error {
	return h.whileSelected((*sched.Reservation).AwaitDecode)
}

// whileSelected applies f to the booking of a Selected guard, holding off
// a concurrent abort's release until it returns.
func (h Handle) whileSelected(f func(*sched.Reservation)) error {
	g := h.g
	for {
		w, err := h.load()
		if err != nil {
			return err
		}
		switch s := stateOf(w); s {
		case Selected:
		case Aborted:
			return ErrAborted
		default:
			return &TransitionError{From: s, To: Selected}
		}
		// The busy bit makes a concurrent abort wait for the update, as
		// it waits for the relay's (OnItem).
		if g.word.CompareAndSwap(w, w|busyBit) {
			break
		}
	}
	f(&g.res)
	g.word.And(^busyBit)
	return nil
}
