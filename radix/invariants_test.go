package radix

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/internal/invariants"
)

// TestWritesVerifyTheIndex checks that invariant builds catch a corrupt
// index at the next write that is due a check, with a message naming it.
func TestWritesVerifyTheIndex(t *testing.T) {
	if !invariants.Enabled {
		t.Skip("needs -tags invariants or -race")
	}
	ix := newTestIndex(t, Config{Capacity: 100, Shards: 2})
	ix.Stored(1, []uint64{11, 12, 13})
	ix.shards[0].meta.workerBlocks[1].Add(1) // a counter the table disagrees with
	ix.unverified.Store(ix.verifyBudget())   // the next write is due a check
	msg := func() (msg string) {
		defer func() { msg = fmt.Sprint(recover()) }()
		ix.Stored(2, []uint64{21})
		return ""
	}()
	if !strings.HasPrefix(msg, "BUG: radix: index inconsistent after Stored") || !strings.Contains(msg, "worker 1: counter") {
		t.Fatalf("panic %q", msg)
	}
}
