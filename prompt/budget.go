package prompt

import "sync/atomic"

// builtinBudget bounds the bytes of request bodies the built-in renderers
// work on at once, over every model of a router. Rendering and tokenizing
// cost CPU in proportion to the prompt (a 1 MiB prompt of random letters
// took 0.1-0.3 s), and each runs on the goroutine of its request: 200
// such requests at once kept a 2-core router busy for 12 s, long enough
// for a health check's goroutine to miss its deadline behind them and
// mark a healthy engine down. Past the budget a request is not rendered
// but routed approximately (ErrBusy), which costs a hash of its text.
//
// Bytes rather than calls, so that small prompts, which cost microseconds,
// are not refused while a few large ones are rendered unless those fill
// the budget. A request is always admitted when nothing else is being
// rendered, so a budget below --tokenize-max-bytes still renders the
// largest prompts when they come alone (beside others they route
// approximately).
type builtinBudget struct {
	limit    int64
	inFlight atomic.Int64
}

// acquire takes n bytes of the budget, reporting false (and taking
// nothing) when they do not fit.
func (b *builtinBudget) acquire(n int64) bool {
	for {
		cur := b.inFlight.Load()
		if cur > 0 && cur+n > b.limit {
			return false
		}
		if b.inFlight.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// release gives back what acquire took.
func (b *builtinBudget) release(n int64) { b.inFlight.Add(-n) }
