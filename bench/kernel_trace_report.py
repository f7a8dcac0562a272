#!/usr/bin/env python3
"""Where a training step's device time goes, from a bench/trace kernel timeline (libst_kernel_trace.so).

    python3 bench/kernel_trace_report.py trace.csv [--marker REGEX] [--skip 3] [--top 25]

A step runs from one start of the marker kernel on the compute stream (default: the embedding's forward, the first
kernel of every micro-step; with gradient accumulation give a kernel that runs once a step) to the next. The compute
stream is the stream with the most kernel time. Steps before --skip and the last interval (the final evaluation
follows it) are left out; every figure is the median over the steps left.

Prints, per step: the wall time; the compute stream's busy time (the union of its kernels) and its idle time, cut
into gaps by length (many short gaps are launch latency; a few long ones are waits on another stream or the host);
what the gaps of 2 us or more have in them (another stream's kernels, a memset, or neither); the longest gaps with
the kernels on each side; every other stream's busy time and how much of it ran beside the compute stream's
kernels; and the kernels by time on the compute stream.

With API records in the trace (ST_KERNEL_TRACE_API=1), it also prints how far ahead of the device the host issued
the compute stream's kernels (a kernel's start less the start of the call that launched it), and which gaps the
host left: those whose next kernel's launch call started only after the previous kernel had ended. Their
host-late part (that call's start less the previous kernel's end) is a lower bound on the idle time the host
caused; the rest of the idle time is the device's (launch latency, waits on other streams).
"""
import argparse
import bisect
import csv
import re
import statistics
import sys
from collections import defaultdict


def load(path):
    """The device rows (kind, start, end, stream, bytes, name, correlation) sorted by start, and the start of each
    correlation id's first API call (empty for a trace without API records or correlation ids)."""
    rows, launched = [], {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            corr = int(r["correlation"]) if r.get("correlation") else None
            if r["kind"] == "api":
                start = int(r["start_ns"])
                launched[corr] = min(start, launched.get(corr, start))
                continue
            rows.append((r["kind"], int(r["start_ns"]), int(r["end_ns"]), int(r["stream"]), int(r["bytes"]), r["name"],
                         corr))
    if not rows:
        sys.exit(f"{path}: no records")
    return sorted(rows, key=lambda r: r[1]), launched


def short(name):
    """A kernel's name without its return type, arguments and our namespaces."""
    name = name.replace("(anonymous namespace)::", "")
    name = re.sub(r"\(.*", "", name)
    name = re.sub(r"^void |st::gpu::|kernels_internal::|cutlass::", "", name)
    return name[:72]


def overlap(a, b):
    """Length of time covered by both interval lists (each sorted, each its own union)."""
    total, i, j = 0, 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            total += e - s
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def merged(intervals):
    """The union of (start, end) intervals sorted by start, as disjoint [start, end] pairs."""
    out = []
    for s, e in intervals:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def covered(disjoint):
    return sum(e - s for s, e in disjoint)


GAP_BUCKETS = [(0, 2e3, "< 2 us"), (2e3, 5e3, "2-5 us"), (5e3, 20e3, "5-20 us"), (20e3, 100e3, "20-100 us"),
               (100e3, float("inf"), ">= 100 us")]

# What a gap of 2 us or more has in it, first match: another stream's kernels running through more than half of it
# (the compute stream's next kernel waited for SMs or for that stream), a memset on the compute stream (cuBLASLt and
# cuDNN issue one before many of their kernels: two launch gaps instead of one), or neither (launch to launch).
GAP_CAUSES = ["another stream's kernels over half of it", "a memset on the compute stream", "neither"]


def gap_cause(t0, t1, other_kernels, memset_starts):
    """GAP_CAUSES' index for the gap (t0, t1): other_kernels are disjoint sorted intervals, memset_starts sorted."""
    if overlap([(t0, t1)], other_kernels) * 2 > t1 - t0:
        return 0
    j = bisect.bisect_left(memset_starts, t0)
    return 1 if j < len(memset_starts) and memset_starts[j] < t1 else 2


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--marker", default=r"embedding_forward_kernel")
    ap.add_argument("--skip", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    rows, launched = load(a.trace)
    busy = defaultdict(int)
    for kind, s, e, stream, *_ in rows:
        if kind == "kernel":
            busy[stream] += e - s
    compute = max(busy, key=busy.get)
    marker = re.compile(a.marker)
    starts = [s for kind, s, _, stream, _, name, _ in rows
              if kind == "kernel" and stream == compute and marker.search(name)]
    steps = list(zip(starts, starts[1:]))[a.skip:-1]
    row_starts = [r[1] for r in rows]  # rows are sorted by start: each step's rows are one slice
    if not steps:
        sys.exit(f"{a.trace}: {len(starts)} marker kernels ({a.marker}) on stream {compute}; need more than --skip + 2")

    per = defaultdict(lambda: [0] * len(steps))  # metric -> its value in each step (ns, or a count)
    names = defaultdict(lambda: defaultdict(int))  # step index -> name -> ns
    counts = defaultdict(lambda: defaultdict(int))
    longest = []
    for i, (t0, t1) in enumerate(steps):
        inside = rows[bisect.bisect_left(row_starts, t0):bisect.bisect_left(row_starts, t1)]
        comp_m = merged([(s, min(e, t1)) for kind, s, e, st, *_ in inside if kind == "kernel" and st == compute])
        b = covered(comp_m)
        per["wall"][i] = t1 - t0
        per["compute busy"][i] = b
        per["compute idle"][i] = t1 - t0 - b
        ck = [r for r in inside if r[0] == "kernel" and r[3] == compute]
        other_kernels = merged([(s, e) for kind, s, e, st, *_ in inside if kind == "kernel" and st != compute])
        memset_starts = [s for kind, s, _, st, *_ in inside if kind == "memset" and st == compute]
        gaps = defaultdict(lambda: [0, 0])
        # The gap after each kernel, the last one's up to the next step's first.
        for prev, nxt in zip(ck, ck[1:] + [(None, t1, None, None, None, "the next step", None)]):
            g = nxt[1] - prev[2]
            if g <= 0:
                continue
            issued = launched.get(nxt[6])
            if issued is not None and issued > prev[2]:
                per["host-late gaps (count)"][i] += 1
                per["host-late gaps (time)"][i] += g
                per["host-late part"][i] += min(g, issued - prev[2])
            for lo, hi, label in GAP_BUCKETS:
                if lo <= g < hi:
                    gaps[label][0] += 1
                    gaps[label][1] += g
            if g >= 2e3:
                cause = GAP_CAUSES[gap_cause(prev[2], nxt[1], other_kernels, memset_starts)]
                per[f"cause {cause} (count)"][i] += 1
                per[f"cause {cause} (time)"][i] += g
            longest.append((g, i, short(prev[5]), short(nxt[5])))
        for _, _, label in GAP_BUCKETS:
            per[f"gaps {label} (count)"][i] = gaps[label][0]
            per[f"gaps {label} (time)"][i] = gaps[label][1]
        leads = []
        for kind, s, e, st, _, name, corr in inside:
            if kind == "kernel" and st == compute:
                names[i][short(name)] += e - s
                counts[i][short(name)] += 1
                if corr in launched:
                    leads.append(s - launched[corr])
        if leads:
            per["host lead (median)"][i] = statistics.median(leads)
            per["host lead (min)"][i] = min(leads)
        for st in sorted({r[3] for r in inside if r[3] != compute}):
            other = merged([(s, min(e, t1)) for kind, s, e, s2, *_ in inside if s2 == st])
            per[f"stream {st} busy"][i] = covered(other)
            per[f"stream {st} beside compute kernels"][i] = overlap(other, comp_m)

    def med(k):
        return statistics.median(per[k])

    print(f"# {a.trace}: {len(steps)} steps (after {a.skip} skipped), compute stream {compute}, medians a step")
    print(f"wall                          {med('wall') / 1e6:8.3f} ms")
    print(f"compute stream busy           {med('compute busy') / 1e6:8.3f} ms")
    print(f"compute stream idle           {med('compute idle') / 1e6:8.3f} ms")
    for _, _, label in GAP_BUCKETS:
        count, time = med(f"gaps {label} (count)"), med(f"gaps {label} (time)")
        print(f"  gaps {label:<10} {count:6.0f} gaps {time / 1e6:8.3f} ms")
    print("gaps of 2 us or more, by what is in them:")
    for cause in GAP_CAUSES:
        count, time = med(f"cause {cause} (count)"), med(f"cause {cause} (time)")
        print(f"  {cause:<41} {count:6.0f} gaps {time / 1e6:8.3f} ms")
    if launched:
        print(f"host lead, kernel start - launch call start: median {med('host lead (median)') / 1e3:8.1f} us, "
              f"least {med('host lead (min)') / 1e3:8.1f} us")
        print(f"gaps the host left            {med('host-late gaps (count)'):6.0f} gaps "
              f"{med('host-late gaps (time)') / 1e6:8.3f} ms, host-late part {med('host-late part') / 1e6:8.3f} ms")
    for k in sorted(per):
        if k.startswith("stream "):
            print(f"{k:<38} {med(k) / 1e6:8.3f} ms")
    print("\nlongest gaps on the compute stream (all steps):")
    for g, i, before, after in sorted(longest, reverse=True)[:10]:
        print(f"  {g / 1e3:8.1f} us  step {i + a.skip}: after {before} | before {after}")
    print(f"\ncompute stream kernels, ms a step (median), calls:")
    keys = {k for d in names.values() for k in d}
    table = []
    for k in keys:
        table.append((statistics.median(names[i].get(k, 0) for i in range(len(steps))) / 1e6,
                      statistics.median(counts[i].get(k, 0) for i in range(len(steps))), k))
    for ms, n, k in sorted(table, reverse=True)[:a.top]:
        print(f"  {ms:7.3f} {n:5.0f}  {k}")
    print(f"  {sum(t[0] for t in table):7.3f}        all {len(table)} kernels")


if __name__ == "__main__":
    main()
