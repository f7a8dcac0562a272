#!/usr/bin/env python3
"""Checkpoints cross between hybrid and full sharding (cpu backend, 4 ranks standing in for 2 nodes x 2).

A hybrid run writes one file per rank of a node (replica 0's ranks write, the other node's replicas hold the
same shards): its step-10 checkpoint has 2 files. Resumed with full sharding on the 4 ranks, and in one process,
steps 11-20 repeat the uninterrupted hybrid run (rel 1e-5 = 168 u, u = 2^-24: the worst-case bound on a sum of 168
float32 terms reordered, for reductions that run in another order over 10 steps at eps 1e-6). A full run's
step-10 checkpoint (4 files) resumed with hybrid sharding repeats the uninterrupted full run the same way.

usage: hybrid_checkpoint_test.py SHARDTRAIN_2_RANKS_PER_NODE MPIRUN WORKDIR CONFIG
"""
import json
import os
import shutil
import subprocess
import sys


def records(path):
    with open(path) as f:
        return {r["step"]: r for r in map(json.loads, f) if "loss" in r}


def losses(path):
    return {s: r["loss"] for s, r in records(path).items()}


def main():
    shardtrain, mpirun, work, config = sys.argv[1:5]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    failures = []

    def train(tag, ranks, sharding, ckpt_dir, resume_from=None):
        metrics = os.path.join(work, f"{tag}.jsonl")
        cmd = [shardtrain, "train", "--config", config, "--data.shuffle=false", "--train.sample_tokens=0",
               "--train.eval_every=0", "--train.steps=20", "--train.global_batch=12", "--train.micro_batch=1",
               "--model.seq_len=64", "--optim.lr=1e-3", "--optim.eps=1e-6", "--ckpt.every=10", "--ckpt.keep=0",
               f"--ckpt.dir={ckpt_dir}", f"--dist.sharding={sharding}", f"--log.metrics={metrics}"]
        if ranks > 1:
            cmd = [mpirun, "--oversubscribe", "-np", str(ranks), "--bind-to", "none", "--mca", "btl", "self,vader",
                   "-x", "OMP_NUM_THREADS"] + cmd
        if resume_from:
            os.makedirs(ckpt_dir)
            shutil.copytree(os.path.join(resume_from, "step_00000010"), os.path.join(ckpt_dir, "step_00000010"))
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        if r.returncode != 0:
            print(" ".join(cmd) + "\n" + r.stdout[-4000:])
            sys.exit(f"{tag} failed with exit code {r.returncode}")
        return losses(metrics)

    def compare(name, ref, got):
        worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in range(11, 21))
        print(f"{name}: steps 11-20, worst loss rel diff {worst:.2e}")
        if worst > 1e-5 or sorted(got) != list(range(11, 21)):
            failures.append(f"{name}: worst rel diff {worst:.2e} (steps {sorted(got)})")

    hyb = os.path.join(work, "hybrid")
    hybrid = train("hybrid", 4, "hybrid", hyb)
    with open(os.path.join(hyb, "step_00000010", "manifest.json")) as f:
        m = json.load(f)
    files = sorted(x for x in os.listdir(os.path.join(hyb, "step_00000010")) if x.endswith(".h5"))
    print(f"hybrid checkpoint: world_size {m['world_size']}, files {files}")
    if m["world_size"] != 2 or len(files) != 2:
        failures.append(f"hybrid 2x2 checkpoint should have 2 files (one per rank of a node): {m['world_size']}, {files}")
    compare("hybrid checkpoint resumed with full sharding on 4 ranks", hybrid,
            train("full_from_hybrid", 4, "full", os.path.join(work, "c1"), resume_from=hyb))
    compare("hybrid checkpoint resumed in one process", hybrid,
            train("solo_from_hybrid", 1, "full", os.path.join(work, "c2"), resume_from=hyb))
    full_dir = os.path.join(work, "full")
    full = train("full", 4, "full", full_dir)
    compare("full checkpoint resumed with hybrid sharding", full,
            train("hybrid_from_full", 4, "hybrid", os.path.join(work, "c3"), resume_from=full_dir))
    # Bytes across the node boundary per step and rank (the metrics' comm_cross_node_bytes). Hybrid: one
    # all-reduce per optimizer step of the accumulated gradient shard between the 2 nodes, 2(r-1)/r = 1 x 4 bytes x
    # the node shard's elements (mem_sharded_bytes / 16), however many micro-steps (here 3: 12 sequences / 4
    # ranks). Full over 2 nodes: every gather and reduce-scatter of every micro-step exchanges with the 2 ranks of
    # the other node, which comes to more.
    h = records(os.path.join(work, "hybrid.jsonl"))[5]
    f = records(os.path.join(work, "full.jsonl"))[5]
    want = 4 * h["mem_sharded_bytes"] // 16
    print(f"bytes across nodes per step: hybrid {h['comm_cross_node_bytes']} (expected {want}), "
          f"full {f['comm_cross_node_bytes']}")
    if h["comm_cross_node_bytes"] != want:
        failures.append(f"hybrid crossed {h['comm_cross_node_bytes']} bytes per step, expected {want}")
    if not f["comm_cross_node_bytes"] > h["comm_cross_node_bytes"]:
        failures.append(f"full sharding crossed {f['comm_cross_node_bytes']} bytes, not more than hybrid")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
