"""What the checkpoint tests compare, read from files: each step's loss from a metrics JSONL file, and a checkpoint's
full training state reassembled from its rank files (h5py). Imported by tests/ckpt/resume_faults_test.py and
tests/faults/ckpt_replicas_test.py."""
import json
import os

import h5py
import numpy as np


def losses(path):
    # The text of each loss as written (%.9g round-trips a float), keyed by step: equal numbers are equal bits.
    out = {}
    for line in open(path):
        rec = json.loads(line)
        if "loss" in rec:
            out[rec["step"]] = rec["loss"]
    return out


def shard_state(step_dir):
    """Full flat param / exp_avg / exp_avg_sq of every unit, reassembled from the rank files the manifest lists."""
    man = json.load(open(os.path.join(step_dir, "manifest.json")))
    out = {}
    for unit in man["units"]:
        for ds in ("param", "exp_avg", "exp_avg_sq"):
            full = np.zeros(unit["numel"], dtype=np.float32)
            for f in man["files"]:
                with h5py.File(os.path.join(step_dir, f["name"]), "r") as h:
                    g = h["units"][unit["name"]]
                    off, cnt = int(g.attrs["offset"]), int(g.attrs["count"])
                    full[off:off + cnt] = g[ds][:]
            out[(unit["name"], ds)] = full
    return out


def same_bits(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)) for k in a)
