package mocker

import (
	"time"

	"github.com/kvfast/kvfast/shm"
)

// Test-only views of a request's progress and of the cache's structure.

// Output returns the tokens generated so far. The slice is valid until the
// next Step.
func (r *Request) Output() []uint32 { return r.tokens[len(r.Prompt):] }

// CachedTokens is how many prompt tokens were served from the prefix cache
// the first time the request was scheduled, or -1 if it has not been.
func (r *Request) CachedTokens() int { return r.cached }

// Finished reports whether the request generated all its tokens.
func (r *Request) Finished() bool { return r.state == stateFinished }

// Preemptions is how many times the request was preempted.
func (r *Request) Preemptions() int { return r.preemptions }

// Arrival, FirstToken and Finish are simulated times (Core.Now) at which
// the request was added, produced its first token, and finished.
func (r *Request) Arrival() time.Duration    { return r.arrival }
func (r *Request) FirstToken() time.Duration { return r.firstTok }
func (r *Request) Finish() time.Duration     { return r.finish }

// OutputSeed is the seed of the request's generated tokens (see OutputToken).
func (r *Request) OutputSeed() uint64 { return r.outSeed }

// NewShmPublisher wraps p. The caller keeps ownership of p.
func NewShmPublisher(p *shm.Publisher) *ShmPublisher { return &ShmPublisher{p: p} }

// checkInvariants panics with BUG if the lists, counts and map disagree. It
// is O(blocks) and meant for tests.
func (c *kvCache) checkInvariants() {
	onList := make([]uint8, len(c.blocks))
	walk := func(l *blockList, mark uint8) {
		n, prev := 0, int32(noBlock)
		for id := l.head; id != noBlock; id = c.blocks[id].next {
			if onList[id] != 0 {
				panic("BUG: mocker: block on two free lists")
			}
			if c.blocks[id].prev != prev {
				panic("BUG: mocker: broken prev link")
			}
			onList[id] = mark
			prev = id
			n++
		}
		if n != l.n || l.tail != prev {
			panic("BUG: mocker: free list count or tail is wrong")
		}
	}
	walk(&c.empty, 1)
	walk(&c.lru, 2)
	held := 0
	for id, b := range c.blocks {
		switch {
		case b.ref > 0:
			held++
			if onList[id] != 0 {
				panic("BUG: mocker: held block on a free list")
			}
		case b.cached && onList[id] != 2, !b.cached && onList[id] != 1:
			panic("BUG: mocker: free block on the wrong list")
		}
		if b.cached {
			if got, ok := c.byHash[b.hash]; !ok || got != int32(id) {
				panic("BUG: mocker: cached block not findable by its hash")
			}
		}
	}
	if held != c.held {
		panic("BUG: mocker: held count is wrong")
	}
	for _, b := range c.blocks {
		if b.inWindow && !b.cached || b.winRef < 0 || b.winRef > b.ref {
			panic("BUG: mocker: a block's sliding-window state disagrees with its references")
		}
	}
	if p := c.host; p != nil {
		n := 0
		for id := p.head; id != noBlock; id = p.entries[id].next {
			if got, ok := p.byHash[p.entries[id].hash]; !ok || got != id {
				panic("BUG: mocker: host copy not findable by its hash")
			}
			n++
		}
		if n != len(p.byHash) || n+len(p.free) != len(p.entries) {
			panic("BUG: mocker: host pool counts are wrong")
		}
	}
	for h, id := range c.byHash {
		if b := c.blocks[id]; !b.cached || b.hash != h {
			panic("BUG: mocker: hash map points at a block that does not cache it")
		}
	}
}
