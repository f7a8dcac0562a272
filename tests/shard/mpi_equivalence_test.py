#!/usr/bin/env python3
"""N MPI ranks train exactly what one process trains.

Runs `shardtrain train` once as a single process and once under `mpirun -np N`, both with
data.shuffle=false and the same global batch (so every optimizer step sees the same sequences; the N-rank
run splits them over ranks, the single process accumulates them), and asserts:
  * every step's loss agrees to rel 1e-5,
  * the final weights (ckpt.export) agree per tensor to ||diff|| / ||ref|| <= 1e-5,
  * the per-rank sharded state in the metrics is 16 bytes x sum over units of ceil(numel / N).
Summation order differs between the runs (ranks vs micro-steps), so the comparison is to rounding,
not bitwise. Two things would otherwise let rounding grow past 1e-5, and the ctest cases avoid them:
  * optim.eps = 1e-6: some gradients are exactly zero in exact arithmetic (the attention key bias:
    softmax ignores a constant added to every key) and fp32 noise in any order; Adam with eps = 1e-8
    turns that noise into +-lr steps. With 1e-6 such elements move by ~lr * 1e-3.
  * a moderate lr: in a regime with loss spikes, 1e-7 differences are amplified like any chaotic
    trajectory (seen at lr 3e-3, micro_batch 1: identical to 1e-7 for 18 steps, then 4e-4 at a spike).

usage: [SHARD_GROUP=G] mpi_equivalence_test.py SHARDTRAIN MPIRUN N WORKDIR CONFIG [--section.key=value ...]
CONFIG may be @gpt2-shaped: a 2-layer GPT-2-shaped model (vocab 50257) on a generated llm.c shard.
"""
import json
import os
import subprocess
import sys

import h5py
import numpy as np


def read_jsonl(path):
    steps, evals = [], []
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            (evals if "val_loss" in rec else steps).append(rec)
    return steps, evals


def read_h5(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, np.array(o)) if isinstance(o, h5py.Dataset) else None)
    return out


def write_llmc_shard(path, n_tokens, vocab, seed):
    rng = np.random.default_rng(seed)
    # A learnable stream: mostly a repeating pattern, some noise, so the loss moves.
    base = rng.integers(0, vocab, size=97)
    toks = np.resize(base, n_tokens)
    noise = rng.random(n_tokens) < 0.2
    toks[noise] = rng.integers(0, vocab, size=int(noise.sum()))
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520, 1, n_tokens]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(toks.astype(np.uint16).tobytes())


def main():
    shardtrain, mpirun, n, work, config = sys.argv[1:6]
    overrides = sys.argv[6:]
    n = int(n)
    os.makedirs(work, exist_ok=True)
    if config == "@gpt2-shaped":
        data = os.path.join(work, "tokens.bin")
        write_llmc_shard(data, 60000, 50257, 7)
        config = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "gpt2-124m.ini")
        overrides = ["--model.n_layer=2", "--model.n_embd=64", "--model.n_head=4", "--model.seq_len=32",
                     f"--data.path={data}", "--data.val_path=", "--train.eval_batches=2"] + overrides
    common = ["train", "--config", config, "--data.shuffle=false", "--train.sample_tokens=0",
              "--train.eval_every=0"] + overrides

    def run(tag, prefix):
        metrics = os.path.join(work, f"{tag}.jsonl")
        weights = os.path.join(work, f"{tag}.h5")
        cmd = prefix + [shardtrain] + common + [f"--log.metrics={metrics}", f"--ckpt.export={weights}"]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        if r.returncode != 0:
            print(" ".join(cmd) + "\n" + r.stdout)
            sys.exit(f"{tag} run failed with exit code {r.returncode}")
        return read_jsonl(metrics), read_h5(weights)

    (ref_steps, ref_evals), ref_w = run("ref", [])
    mpi = [mpirun, "--oversubscribe", "-np", str(n), "--bind-to", "none", "--mca", "btl", "self,vader"]
    (got_steps, got_evals), got_w = run(f"np{n}", mpi)

    failures = []
    if len(ref_steps) != len(got_steps):
        failures.append(f"{len(got_steps)} steps, expected {len(ref_steps)}")
    worst_loss = 0.0
    for a, b in zip(ref_steps, got_steps):
        rel = abs(a["loss"] - b["loss"]) / abs(a["loss"])
        worst_loss = max(worst_loss, rel)
        if rel > 1e-5:
            failures.append(f"step {a['step']}: loss {b['loss']} vs single-process {a['loss']} (rel {rel:.2e})")
    # A validation pass reads eval_batches micro-batches per rank, so only N = 1 reads the same windows.
    for a, b in zip(ref_evals, got_evals if n == 1 else []):
        if abs(a["val_loss"] - b["val_loss"]) > 1e-5 * abs(a["val_loss"]):
            failures.append(f"val_loss at step {a['step']}: {b['val_loss']} vs {a['val_loss']}")
    worst_w = 0.0
    for k, ref in ref_w.items():
        diff = np.linalg.norm((got_w[k] - ref).ravel()) / max(np.linalg.norm(ref.ravel()), 1e-30)
        worst_w = max(worst_w, diff)
        if diff > 1e-5:
            failures.append(f"{k}: ||diff||/||ref|| = {diff:.2e}, max|diff| = {np.abs(got_w[k] - ref).max():.2e}")
    # Memory: 16 bytes per element of every padded shard (param, grad, m, v), sharded over SHARD_GROUP ranks
    # (N; a node's ranks with dist.sharding=hybrid).
    g = int(os.environ.get("SHARD_GROUP", n))
    mem1 = ref_steps[0]["mem_sharded_bytes"]
    memn = got_steps[0]["mem_sharded_bytes"]
    if not (memn * g >= mem1 and memn * g <= mem1 + 16 * g * g * 64):
        failures.append(f"sharded state {memn} B per rank at N={n} vs {mem1} B at N=1: not 1/{g} plus padding")
    print(f"N={n}: {len(got_steps)} steps, worst loss rel diff {worst_loss:.2e}, worst weight rel diff {worst_w:.2e}, "
          f"sharded state per rank {memn} B (N=1: {mem1} B)")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures[:20]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
