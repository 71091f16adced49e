package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvfast/kvfast/internal/redact"
	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
)

func init() {
	register("inspect", "print a shm segment: header, index, workers, load pages, rings", runInspect)
}

const inspectAbout = `Usage: kvfast inspect [flags]

Prints a shm segment without changing it: its header, the index's
occupancy per shard, the worker registry, every worker's load page and
event ring. It attaches read-only as far as the router is concerned (it
never ingests) and refuses a segment that does not exist.

Exit status: 0 when printed (and, with --verify, consistent), 1 when the
segment cannot be opened or fails verification, 2 for bad flags.

Flags:
`

func runInspect(args []string) int {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	segment := fs.String("segment", shm.DefaultPath("kvfast"), "the segment file to print, as kvfast serve --segment")
	verify := fs.Bool("verify", false, "also check the index's structural invariants; on a segment a live router writes, a check can meet a write in flight, so it is tried up to 5 times and failures that persist are reported as inconclusive")
	shards := fs.Bool("shards", true, "list entries per shard (--shards=false for the totals alone)")
	if err := parseFlags(fs, args, inspectAbout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "kvfast inspect: unexpected argument %q (the segment is --segment)\n", fs.Arg(0))
		return 2
	}
	// Inspect only reports, and trusts nothing it reads: it may look at a
	// segment the router would refuse to attach.
	if fi, err := os.Stat(*segment); err == nil && fi.IsDir() {
		// A bare "is a directory" from the open would not say what to give.
		fmt.Fprintf(os.Stderr, "kvfast inspect: --segment %s is a directory: give the segment file itself, as kvfast serve --segment names it (default %s)\n",
			*segment, shm.DefaultPath("kvfast"))
		return 2
	}
	seg, err := shm.Open(*segment, shm.Options{NoCreate: true, AllowForeign: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer seg.Close()
	if err := inspect(os.Stdout, seg, *shards); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if *verify {
		return verifyIndex(seg, os.Stdout, os.Stderr)
	}
	return 0
}

// verifyAttempts is how often --verify checks an index a live router
// writes before it gives up: each check meets the writes in flight of
// the moment, which read as damage.
const verifyAttempts = 5

// verifyIndex checks the index's invariants. Its shard locks are the
// inspecting process's own, so a router writing the index from its
// process is not stopped: on a live segment a check can catch an entry or
// a counter mid-write. There a failed check is tried again, and failures
// that never clear are reported as inconclusive, not as damage.
func verifyIndex(seg *shm.Segment, stdout, stderr io.Writer) int {
	pid := seg.Ingester().PID
	live, err := seg.IngesterHeld()
	if err != nil {
		fmt.Fprintln(stderr, "kvfast:", err)
		live = true // unknown: a failed check is then inconclusive, not damage
	}
	attempts := 1
	if live {
		attempts = verifyAttempts
	}
	for i := range attempts {
		if err = seg.Index().Verify(); err == nil {
			if i > 0 {
				fmt.Fprintf(stdout, "index verified: OK (on check %d of %d: router pid %d writes it)\n", i+1, attempts, pid)
			} else {
				fmt.Fprintln(stdout, "index verified: OK")
			}
			return 0
		}
		if i+1 < attempts {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if live {
		fmt.Fprintf(stderr, "kvfast: index verification inconclusive: router pid %d writes this index, and each of %d checks met a write in flight "+
			"(the last: %v); stop the router and verify again before acting on it\n", pid, attempts, err)
		return 1
	}
	fmt.Fprintln(stderr, "kvfast: index verification failed:", err)
	return 1
}

func inspect(out io.Writer, seg *shm.Segment, perShard bool) error {
	h := seg.Header()
	now := shm.MonotonicNow()
	fmt.Fprintf(out, "segment %s\n", seg.Path())
	fmt.Fprintf(out, "  layout version %d, id %016x, created %s\n", h.Version, h.SegmentID,
		time.Unix(0, h.CreatedUnix).UTC().Format(time.RFC3339))
	fmt.Fprintf(out, "  file %d bytes; %d worker slots; ring %d bytes each (stride %d, rings at %d); index at %d, %d bytes\n",
		h.FileSize, h.MaxWorkers, h.RingBytes, h.RingStride, h.RingsOffset, h.IndexOffset, h.IndexSize)
	if b := seg.Bindings(); b != nil {
		// Without the routers' TTL every stored binding counts; expired
		// ones leave lazily, on the routers' next lookup or bind.
		fmt.Fprintf(out, "  session bindings at %d, %d bytes: %d stored, capacity %d\n",
			h.BindingsOffset, h.BindingsSize, b.Live(b.Now(), math.MaxInt64), b.Capacity())
	}
	if seg.Retired() {
		fmt.Fprintln(out, "  RETIRED: a router recreated this segment; publishers must register again")
	}
	ing := seg.Ingester()
	if ing.Epoch == 0 {
		fmt.Fprintln(out, "  ingester: never held")
	} else {
		fmt.Fprintf(out, "  ingester: pid %d (last holder), held since %s ago, %d handovers\n",
			ing.PID, age(now, ing.Since), ing.Epoch)
	}

	st := seg.Index().Stats()
	fmt.Fprintf(out, "\nindex: %d/%d blocks (%.1f%%), overflow %d; engine map %d/%d, overflow %d, unresolved removals %d\n",
		st.Entries, st.Capacity, pct(st.Entries, st.Capacity), st.Overflow,
		st.EngineMapEntries, st.EngineMapCapacity, st.EngineMapOverflow, st.UnresolvedRemovals)
	fmt.Fprintf(out, "  region %d bytes: block table %d, engine map %d\n", st.RegionBytes, st.BlockTableBytes, st.EngineMapBytes)
	if perShard {
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "  shard\tentries\tlimit\toverflow\tmap entries\tmap limit\tmap overflow\t")
		for i, s := range st.Shards {
			fmt.Fprintf(tw, "  %d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", i, s.Entries, s.Limit, s.Overflow, s.MapEntries, s.MapLimit, s.MapOverflow)
		}
		tw.Flush()
	}

	fmt.Fprintln(out, "\nworkers:")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  slot\tstate\tgen\tworker\trank\tmodel\tblock\tkv cap\tblocks\tendpoint\tpid\theartbeat\t")
	registered := seg.Workers(nil)
	for _, w := range registered {
		// Model and endpoint are whatever a publisher wrote: printed
		// quoted, a newline or terminal escape in one cannot forge rows.
		fmt.Fprintf(tw, "  %d\t%s\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%s\t%d\t%s ago\t\n", w.Slot, w.State, w.Generation, w.WorkerID,
			w.DPRank, printable(w.Model), w.BlockSize, w.KVCapacityBlocks, st.WorkerBlocks[w.Slot], printable(redact.Endpoint(w.Endpoint)), w.PID, age(now, w.Heartbeat))
	}
	tw.Flush()
	if len(registered) == 0 {
		fmt.Fprintln(out, "  (none registered)")
	}
	for s := 0; s < workers.Max; s++ {
		if listed(registered, workers.Slot(s)) {
			continue
		}
		// A slot the router cannot read (a role or length no publisher
		// writes, bytes torn by a writer) is refused by it: say so here,
		// where an operator looks for a worker missing from the table.
		if _, err := seg.ReadWorker(workers.Slot(s)); err != nil {
			fmt.Fprintf(out, "  slot %d: unreadable registration (the router skips it): %s\n", s, printable(err.Error()))
		}
		if n := st.WorkerBlocks[s]; n != 0 {
			fmt.Fprintf(out, "  slot %d: %d blocks but no registration\n", s, n)
		}
	}

	fmt.Fprintln(out, "\nload and rings:")
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  slot\trunning\twaiting\tkv used/total\tload age\thead\ttail\tlag bytes\tpublished\tdropped\tconsumer gen\tlast seq\t")
	for _, w := range registered {
		r := seg.RingState(w.Slot)
		load := "torn"
		loadAge := "-"
		if l, err := seg.LoadOf(w.Slot); err == nil {
			load = fmt.Sprintf("%d\t%d\t%d/%d", l.Running, l.Waiting, l.KVUsedBlocks, l.KVTotalBlocks)
			if l.Updated != 0 {
				loadAge = age(now, l.Updated) + " ago"
			}
		} else {
			load += "\t-\t-"
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", w.Slot, load, loadAge, r.Head, r.Tail, r.Lag(), r.Published, r.Dropped, r.Gen, r.LastSeq)
	}
	return tw.Flush()
}

func listed(ws []shm.WorkerInfo, s workers.Slot) bool {
	for _, w := range ws {
		if w.Slot == s {
			return true
		}
	}
	return false
}

func age(now, then int64) string {
	if then == 0 || then > now {
		return "?"
	}
	return time.Duration(now - then).Round(time.Millisecond).String()
}

func pct(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

// printable is s as inspect prints a string a publisher wrote: as it is
// when it is printable and without spaces, else quoted with escapes.
func printable(s string) string {
	q := strconv.QuoteToGraphic(s)
	if q[1:len(q)-1] == s && !strings.ContainsAny(s, " \t") {
		return s
	}
	return q
}
