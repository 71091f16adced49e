package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/kvfast/kvfast/benchmarks/soak"
)

func init() {
	register("soak", "run a node under client, engine and router faults for a while, then check nothing leaked", runSoak)
}

const soakAbout = `Usage: kvfast soak [flags]

Runs a whole node in one process for --duration: a router on a fresh shm
segment, --engines mock engines registered there, and three sick engines
as static workers (one never answers, one answers every request 500 while
passing /health, one answers streams with garbage). --clients clients
send streaming and non-streaming completions over shared prefixes and
cancel a tenth of them at random times. Every --fault-every, one fault is
injected: an engine killed and replaced, the router restarted on the same
segment, a flood of 8 MiB bodies, or a flood of idle connections.

When the time is up the load stops, and the soak waits (up to 90 s each)
for: no load booked on any worker, every booking released (also at each
router restart), goroutines back within 16 plus --clients of their
baseline (idle connections that close late), resident memory under
--rss-bound, and the index holding exactly the blocks each live engine
caches. It prints what ran and what was seen, and exits 1 if any check
failed. make soak runs it for SOAK_DURATION (default 30m); make test runs
a two-minute version.

Flags:
`

func runSoak(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return soakCommand(ctx, args, os.Stdout, os.Stderr)
}

func soakCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg soak.Config
	var rssMiB uint64
	logLevel := "warn"
	fs.DurationVar(&cfg.Duration, "duration", 2*time.Minute, "how long load and faults run")
	fs.IntVar(&cfg.Engines, "engines", 4, "healthy mock engines")
	fs.IntVar(&cfg.Clients, "clients", 12, "concurrent clients")
	fs.DurationVar(&cfg.FaultEvery, "fault-every", 5*time.Second, "pause between two injected faults")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the clients' and the faults' choices")
	fs.Uint64Var(&rssMiB, "rss-bound", 500, "resident memory, in MiB, the process must be back under at the end (router, engines and clients share it)")
	fs.StringVar(&logLevel, "log-level", logLevel, "log level: debug, info, warn or error")
	fs.Func("eviction-weight", "the router's eviction weight, as kvfast serve --eviction-weight (default: serve's, 30); 0 turns the term off", func(v string) error {
		w, err := strconv.ParseFloat(v, 64)
		if err != nil || w < 0 || math.IsNaN(w) || math.IsInf(w, 0) {
			return fmt.Errorf("cannot use eviction weight %q: want a finite number >= 0", v)
		}
		cfg.EvictionWeight = &w
		return nil
	})
	if err := parseFlags(fs, args, soakAbout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kvfast soak: %s\n", extraArgument(fs))
		return 2
	}
	log, err := newLogger(stderr, logLevel, "text")
	if err != nil {
		fmt.Fprintf(stderr, "kvfast soak: %v\n", err)
		return 2
	}
	cfg.Logger = log
	cfg.RSSBound = rssMiB << 20
	rep, err := soak.Run(ctx, cfg)
	fmt.Fprint(stdout, rep)
	if err != nil {
		fmt.Fprintf(stderr, "kvfast soak: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, "leaks: none")
	return 0
}
