#!/usr/bin/env python3
"""torch's AdamW on the CPU (fused=True where this torch has it, else foreach), the peer of bench_cpu_adamw.

    python3 bench/cpu_adamw_torch.py [--params 67108864] [--iters 7] [--threads 16]

One fp32 parameter tensor of --params elements with a gradient, weight decay 0.1; prints the median step time and
Gparam/s in the same units as bench_cpu_adamw.
"""
import argparse
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, default=1 << 26)
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--threads", type=int, default=16)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    p = torch.nn.Parameter(torch.full((a.params,), 0.01))
    p.grad = torch.full_like(p, 0.001)
    for kind in ("fused", "foreach"):
        try:
            opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.1, betas=(0.9, 0.95), **{kind: True})
            opt.step()  # warm-up: state allocation
        except (RuntimeError, TypeError) as e:
            print(f"torch {torch.__version__} AdamW {kind}: unavailable on CPU ({e})")
            continue
        times = []
        for _ in range(a.iters):
            t0 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
        s = statistics.median(times)
        print(f"torch {torch.__version__} AdamW {kind}=True, {a.threads} threads: {s * 1e3:.1f} ms, "
              f"{a.params / s / 1e9:.2f} Gparam/s")


if __name__ == "__main__":
    main()
