#!/usr/bin/env python3
"""Pinned host <-> device copy bandwidth, one GPU and all GPUs at once, each direction alone and both together.

    python3 bench/host_copy_bandwidth.py [--gib 1] [--reps 5]

Prints GB/s per direction per GPU (medians are not needed: one timed batch of `reps` 1 GiB copies per stream after a
warm-up batch). It bounds an optimizer update of host-resident state (optim.offload): what the host's memory system
moves when every GPU copies both ways at once. Needs PyTorch with CUDA (the GPU machine's python3).
"""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    n = int(args.gib * (1 << 28))  # fp32 elements
    bufs = {}
    for d in range(torch.cuda.device_count()):
        bufs[d] = (torch.empty(n, dtype=torch.float32, pin_memory=True),
                   torch.empty(n, dtype=torch.float32, pin_memory=True),
                   torch.empty(n, dtype=torch.float32, device=d), torch.empty(n, dtype=torch.float32, device=d))

    def run(devs, h2d, d2h, reps):
        streams = {d: (torch.cuda.Stream(d), torch.cuda.Stream(d)) for d in devs}
        for d in devs:
            torch.cuda.synchronize(d)
        t = time.perf_counter()
        for _ in range(reps):
            for d in devs:
                up, down = streams[d]
                host_in, host_out, dev_in, dev_out = bufs[d]
                if h2d:
                    with torch.cuda.stream(up):
                        dev_in.copy_(host_in, non_blocking=True)
                if d2h:
                    with torch.cuda.stream(down):
                        host_out.copy_(dev_out, non_blocking=True)
        for d in devs:
            torch.cuda.synchronize(d)
        return reps * 4 * n / (time.perf_counter() - t) / 1e9

    all_gpus = list(bufs)
    for devs in ([0], all_gpus) if len(all_gpus) > 1 else ([0],):
        for h2d, d2h, what in ((1, 0, "host->device"), (0, 1, "device->host"), (1, 1, "both at once")):
            run(devs, h2d, d2h, 1)
            print(f"{len(devs)} GPU(s), {what:<13}: {run(devs, h2d, d2h, args.reps):6.1f} GB/s per direction per GPU")


if __name__ == "__main__":
    main()
