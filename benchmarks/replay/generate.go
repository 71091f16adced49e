package replay

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"time"
)

// GenConfig describes a synthetic Mooncake-format trace of multi-turn
// sessions: each session opens with one of a few shared system prompts
// and a first user turn of its own, and every later turn resends the
// whole conversation plus a few new blocks, as chat clients do. Reuse is
// set by how many turns a session has and how many sessions share a
// system prompt. Hash ids stand for DefaultTraceBlockSize tokens.
type GenConfig struct {
	Name     string
	Requests int
	Seed     uint64
	// Concurrent sessions are interleaved: each request continues one of
	// this many open sessions, drawn at random.
	Concurrent int
	// TurnsMin..TurnsMax is a session's length in requests.
	TurnsMin, TurnsMax int
	// SystemPrompts shared system prompts of SystemBlocks hash ids each;
	// sessions pick one with a Zipf-like skew (the first is the most
	// common).
	SystemPrompts, SystemBlocks int
	// A first turn adds FirstMin..FirstMax hash ids, a later turn
	// TurnMin..TurnMax.
	FirstMin, FirstMax int
	TurnMin, TurnMax   int
	// OutputLength is every request's output_length.
	OutputLength int
	// RatePerSec is the mean arrival rate (exponential gaps).
	RatePerSec float64
}

// GeneratedTraces are the named generated workloads: "low" reuse (short
// sessions, many system prompts, long unique first turns) and "high"
// reuse (long conversations over few system prompts). Their rates give
// about the uncached prefill work per second of the shipped trace.
var GeneratedTraces = map[string]GenConfig{
	"low": {Name: "low", Requests: 600, Seed: 1, Concurrent: 160, TurnsMin: 1, TurnsMax: 2,
		SystemPrompts: 48, SystemBlocks: 4, FirstMin: 8, FirstMax: 28, TurnMin: 2, TurnMax: 6,
		OutputLength: 32, RatePerSec: 4},
	"high": {Name: "high", Requests: 600, Seed: 2, Concurrent: 96, TurnsMin: 6, TurnsMax: 16,
		SystemPrompts: 6, SystemBlocks: 8, FirstMin: 6, FirstMax: 16, TurnMin: 1, TurnMax: 3,
		OutputLength: 32, RatePerSec: 5},
}

// GeneratedTraceNames lists GeneratedTraces' names, sorted.
func GeneratedTraceNames() []string {
	names := make([]string, 0, len(GeneratedTraces))
	for n := range GeneratedTraces {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Generate builds the trace cfg describes, deterministically from its
// seed. Its Source is "generated:NAME".
func Generate(cfg GenConfig) (*Trace, error) {
	if cfg.Requests < 1 || cfg.Concurrent < 1 || cfg.TurnsMin < 1 || cfg.TurnsMax < cfg.TurnsMin ||
		cfg.SystemPrompts < 1 || cfg.SystemBlocks < 0 || cfg.FirstMin < 1 || cfg.FirstMax < cfg.FirstMin ||
		cfg.TurnMin < 1 || cfg.TurnMax < cfg.TurnMin || cfg.OutputLength < 0 || !(cfg.RatePerSec > 0) {
		return nil, fmt.Errorf("cannot generate trace %q from %+v: a count, range or rate is out of bounds", cfg.Name, cfg)
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6b76666173742d67))
	between := func(lo, hi int) int { return lo + rng.IntN(hi-lo+1) }
	next := uint64(1) // hash ids, unique per new block
	fresh := func(ids []uint64, n int) []uint64 {
		for range n {
			ids = append(ids, next)
			next++
		}
		return ids
	}
	systems := make([][]uint64, cfg.SystemPrompts)
	for i := range systems {
		systems[i] = fresh(nil, cfg.SystemBlocks)
	}
	type session struct {
		ids  []uint64
		left int
	}
	open := func() *session {
		// Zipf-like: system prompt i with weight 1/(i+1).
		x, total := rng.Float64(), 0.0
		for i := range systems {
			total += 1 / float64(i+1)
		}
		x *= total
		k := 0
		for ; k < len(systems)-1; k++ {
			if x -= 1 / float64(k+1); x < 0 {
				break
			}
		}
		s := &session{ids: append([]uint64(nil), systems[k]...), left: between(cfg.TurnsMin, cfg.TurnsMax)}
		s.ids = fresh(s.ids, between(cfg.FirstMin, cfg.FirstMax))
		return s
	}
	live := make([]*session, cfg.Concurrent)
	for i := range live {
		live[i] = open()
	}
	t := &Trace{Source: "generated:" + cfg.Name, BlockSize: DefaultTraceBlockSize}
	var clock float64 // seconds
	for i := range cfg.Requests {
		clock += rng.ExpFloat64() / cfg.RatePerSec
		j := rng.IntN(len(live))
		s := live[j]
		ids := append([]uint64(nil), s.ids...)
		last := 1 + rng.IntN(DefaultTraceBlockSize)
		t.Records = append(t.Records, Record{
			Timestamp:    time.Duration(clock * float64(time.Second)).Truncate(time.Millisecond),
			InputLength:  (len(ids)-1)*DefaultTraceBlockSize + last,
			OutputLength: cfg.OutputLength,
			HashIDs:      ids,
			Line:         i + 1,
		})
		// The next turn resends this one, the reply included, and adds a
		// new user message: the partial last block is completed by new
		// content, so it becomes a new id.
		s.left--
		if s.left == 0 {
			live[j] = open()
			continue
		}
		s.ids = fresh(s.ids[:len(s.ids)-1], 1+between(cfg.TurnMin, cfg.TurnMax))
	}
	t.analysis = &prefixAnalysis{records: t.Records}
	return t, nil
}
