#!/usr/bin/env python3
"""Side by side: the op profiles of several training logs (SHARDTRAIN_PROFILE_OPS=1, GPU), one row per op.

    python3 bench/op_profile_compare.py [--labels A,B,...] [--tokens N,N,...] LOG LOG [LOG...]
    python3 bench/op_profile_compare.py --labels 2x16,2x32 --tokens 16384,32768 a.log b.log

Each LOG is a shardtrain train log (bench/train_throughput.sh leaves one per run in TT_DIR) whose op profile is
read. Columns: each log's ms a step, then each later log's ratio to the first. With --tokens (each run's tokens a
GPU a step), the ratio is also given per token (1.000 = that op costs the same per token; below 1 = cheaper per
token in that run), and a last line gives, for each later log, the step's fixed part: the intercept F of the line
ms = F + c * tokens through the two runs' totals, F = (s * ms_first - ms_k) / (s - 1) with s = tokens_k /
tokens_first, i.e. the time a step costs that does not grow with its tokens.
Ops are ordered by the first log's time; an op missing from a log shows "-". Exit status 2 names a log without
an op profile or a malformed argument.
"""
import argparse
import re
import sys

HEADER = re.compile(r"^op profile \(")
ROW = re.compile(r"^\s+(\S+)\s+([0-9.]+) ms\s+[0-9.]+%\s+[0-9.]+ calls\s*$")
TOTAL = re.compile(r"^\s+total\s+([0-9.]+) ms\s*$")


def die(message):
    print(f"op_profile_compare: {message}", file=sys.stderr)
    sys.exit(2)


def read_profile(path):
    """{op: ms a step} and the total from the last op profile in the log at path."""
    try:
        lines = open(path, errors="replace").read().replace("\r", "\n").splitlines()
    except OSError as e:
        die(f"{path}: {e.strerror}")
    starts = [i for i, line in enumerate(lines) if HEADER.match(line)]
    if not starts:
        die(f"{path}: no op profile (run with SHARDTRAIN_PROFILE_OPS=1 on a GPU)")
    ops, total = {}, None
    for line in lines[starts[-1] + 1:]:
        m = ROW.match(line)
        if m:
            ops[m.group(1)] = float(m.group(2))
            continue
        m = TOTAL.match(line)
        if m:
            total = float(m.group(1))
        break
    if not ops or total is None:
        die(f"{path}: the op profile has no rows or no total line")
    return ops, total


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--labels", help="comma-separated column names (default: the logs' file names)")
    p.add_argument("--tokens", help="comma-separated tokens a GPU a step, one per log")
    p.add_argument("logs", nargs="+")
    a = p.parse_args()
    if len(a.logs) < 2:
        die("give two or more logs")
    labels = a.labels.split(",") if a.labels else [path.rsplit("/", 1)[-1] for path in a.logs]
    if len(labels) != len(a.logs):
        die(f"--labels has {len(labels)} names for {len(a.logs)} logs")
    tokens = None
    if a.tokens:
        try:
            tokens = [int(t) for t in a.tokens.split(",")]
        except ValueError:
            die(f"--tokens must be whole numbers, got '{a.tokens}'")
        if len(tokens) != len(a.logs) or min(tokens) <= 0:
            die(f"--tokens needs {len(a.logs)} positive numbers, got '{a.tokens}'")
    profiles = [read_profile(path) for path in a.logs]
    first = profiles[0][0]
    ops = sorted(first, key=lambda op: -first[op])
    ops += sorted({op for prof, _ in profiles[1:] for op in prof} - set(first))

    cols = [f"{lab} ms" for lab in labels] + [f"{lab}/{labels[0]}" for lab in labels[1:]]
    if tokens:
        cols += [f"{lab}/{labels[0]} per token" for lab in labels[1:]]
    width = max(len(op) for op in ops + ["total"])
    print(f"{'op':<{width}}  " + "  ".join(f"{c:>{max(9, len(c))}}" for c in cols))

    def row(name, values):
        cells = [f"{v:.3f}" if v is not None else "-" for v in values]
        for v in values[1:]:
            cells.append(f"{v / values[0]:.3f}" if v is not None and values[0] else "-")
        if tokens:
            for k, v in enumerate(values[1:], 1):
                scale = tokens[k] / tokens[0]
                cells.append(f"{v / (values[0] * scale):.3f}" if v is not None and values[0] else "-")
        print(f"{name:<{width}}  " + "  ".join(f"{c:>{max(9, len(col))}}" for c, col in zip(cells, cols)))

    for op in ops:
        row(op, [prof.get(op) for prof, _ in profiles])
    row("total", [total for _, total in profiles])
    if tokens:
        for k in range(1, len(profiles)):
            scale = tokens[k] / tokens[0]
            if scale == 1:
                continue
            fixed = (scale * profiles[0][1] - profiles[k][1]) / (scale - 1)
            print(f"fixed part of a step, {labels[0]} and {labels[k]}: {fixed:.3f} ms")


if __name__ == "__main__":
    main()
