#!/usr/bin/env python3
"""Splits a router profile into where its CPU went, for part 6 of issue 15.

Reads `perf script -F tid,period,ip,sym,dso` (a `perf record -g` of
`kvfast serve` under wrk) on stdin and prints each part's share of the
sampled CPU. Each sample goes to exactly one part, decided by its whole
call chain, in this order:

  stages      a frame of the routing stages (openai, tokenizer, chat,
              radix, sched, fastpath's route encoder) under the request
              handler: the work the in-process stage benchmarks time;
              page faults and interrupts taken inside them count here too
  sysmon, gc  the runtime's monitor thread and the garbage collector
  kernel      the leaf is in the kernel: split by what the Go side was
              doing (socket read, socket write, netpoll, futex or
              sleep, anything else such as interrupts)
  scheduler   Go runtime frames only (schedule, findRunnable, park,
              netpoll): switching goroutines between connections
  framework   fasthttp and the standard library's net and poll code in
              user space: header parsing, response writing, deadlines,
              the connection loop
  glue        kvfast's own handler code outside the stages (metrics,
              hints, headers, pooling)
  background  other kvfast goroutines (the KV event feed, health polls)

"HTTP and framework" is framework plus glue: what the issue's target
names. Kernel socket work and the runtime are reported beside it, not
folded into it, so that a reader can add them as they see fit.
"""

import sys
from collections import Counter

KVFAST = "github.com/kvfast/kvfast/"
STAGE_PREFIXES = tuple(KVFAST + p for p in ("openai.", "tokenizer.", "chat.", "radix.", "sched."))
STAGE_FUNCS = ("fastpath.(*Server).appendRouteJSON",)
REQUEST_ROOT = KVFAST + "fastpath.(*Server).handle"
GC_FUNCS = ("runtime.gcBgMarkWorker", "runtime.bgsweep", "runtime.bgscavenge", "runtime.gcAssistAlloc", "runtime.gcStart")
FRAMEWORK_PREFIXES = ("github.com/valyala/fasthttp.", "net.", "internal/poll.", "bufio.", "crypto/tls.")


def is_stage(sym):
    return sym.startswith(STAGE_PREFIXES) or any(f in sym for f in STAGE_FUNCS)


def kernel_part(syms):
    """Names kernel work (and the Go side's syscall entry and exit) by
    what the Go code above it was doing."""
    for s in syms:
        if s.startswith(("internal/poll.(*FD).Read", "syscall.read")):
            return "kernel: socket read"
        if s.startswith(("internal/poll.(*FD).Write", "syscall.write")):
            return "kernel: socket write"
        if s.startswith("runtime.netpoll"):
            return "kernel: netpoll (epoll)"
        if s.startswith(("runtime.futex", "runtime.usleep", "runtime.nanosleep", "runtime.osyield")):
            return "kernel: futex and sleep (thread wake-ups)"
    return "kernel: other (interrupts, faults, timers)"


SYSCALL_FRAMES = ("syscall.Syscall", "syscall.RawSyscall", "internal/runtime/syscall.",
                  "runtime.entersyscall", "runtime.reentersyscall", "runtime.exitsyscall")


def classify(frames):
    syms = [s for s, _ in frames]
    # The stages' packages also run in the background (the feed applies
    # events to the index): only what a request's handler calls counts.
    if any(s.startswith(REQUEST_ROOT) for s in syms) and any(is_stage(s) for s in syms):
        return "stages"
    if any(s.startswith("runtime.sysmon") for s in syms):
        return "runtime: sysmon"
    if any(s.startswith(GC_FUNCS) for s in syms):
        return "runtime: gc"
    leaf_dso = frames[0][1] if frames else ""
    if leaf_dso.startswith("[kernel") or any(s.startswith(SYSCALL_FRAMES) for s in syms):
        return kernel_part(syms)
    # The leaf-most frame of an owner says whose work it was: the
    # standard library and the runtime (memmove, time.Now, utf8.Valid,
    # prometheus' histograms) count for the code that called them.
    for s in syms:
        if s.startswith(FRAMEWORK_PREFIXES):
            return "framework"
        if s.startswith(KVFAST + "fastpath."):
            return "glue"
        if s.startswith(KVFAST):
            return "background"
    if all(s.startswith(("runtime.", "internal/runtime/", "[unknown]")) or not s for s in syms):
        return "runtime: scheduler"
    return "other"


def samples(lines):
    frames, period = [], 1
    for line in lines:
        if not line.strip():
            if frames:
                yield frames, period
            frames, period = [], 1
            continue
        if line.startswith("\t"):  # a frame: address, symbol, (dso)
            parts = line.strip().split(None, 1)
            if len(parts) < 2:
                continue
            rest = parts[1]
            dso = ""
            if rest.endswith(")") and " (" in rest:
                rest, dso = rest.rsplit(" (", 1)
                dso = dso[:-1]
            frames.append((rest.split("+0x")[0], dso))
        else:  # a sample's header: tid, period
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                period = int(fields[1])
    if frames:
        yield frames, period


def main():
    parts = Counter()
    total = 0
    for frames, period in samples(sys.stdin):
        parts[classify(frames)] += period
        total += period
    if total == 0:
        sys.exit("perf-attribute: no samples on stdin")
    order = ["stages", "glue", "framework", "kernel: socket read", "kernel: socket write",
             "kernel: netpoll (epoll)", "kernel: futex and sleep (thread wake-ups)",
             "kernel: other (interrupts, faults, timers)", "runtime: scheduler", "runtime: sysmon",
             "runtime: gc", "background", "other"]
    for name in order + sorted(set(parts) - set(order)):
        print(f"share {name}: {100 * parts[name] / total:.1f}%")
    http = parts["glue"] + parts["framework"]
    kernel = sum(v for k, v in parts.items() if k.startswith("kernel"))
    runtime = sum(v for k, v in parts.items() if k.startswith("runtime"))
    print(f"share HTTP and framework (glue + framework): {100 * http / total:.1f}%")
    print(f"share kernel (all): {100 * kernel / total:.1f}%")
    print(f"share Go runtime (all): {100 * runtime / total:.1f}%")


if __name__ == "__main__":
    main()
