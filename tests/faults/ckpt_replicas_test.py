#!/usr/bin/env python3
"""Node-local checkpoint directories with peer replicas (ckpt.replicas=1) under mpirun: 4 ranks stand in for
2 nodes x 2 (NODE_WRAPPER sets SHARDTRAIN_NODE_ID = rank / 2), each node with its own ckpt.dir through {node}.

usage: ckpt_replicas_test.py SHARDTRAIN NODE_WRAPPER MPIRUN CONFIG WORKDIR CASE

Runs train 12 steps, checkpoint every 4, with a constant learning rate after warm-up (optim.min_lr = optim.lr),
so that a run of 8 steps trains exactly the first 8 steps of a run of 12. Run A: 12 steps, the reference.
Run B: 8 steps into its own directories. Then the case damages B's directories and run C resumes them to step 12.
CASE:
  resume-async, resume-sync  node 1's directory is wiped: C restores it from node 0's replicas and resumes step 8;
                  its losses and its step-12 state (both nodes' copies) equal A's bit for bit (ckpt.async true/false).
  tcp             resume-async with dist.bootstrap=env instead of mpirun (4 processes, RANK and WORLD_SIZE set
                  each, MASTER_ADDR=127.0.0.1): the replicas go over TcpCommunicator's second mesh.
  reshard         node 1's directory is wiped and C runs 2 ranks, one a node: node 1 gets back the files its
                  rank's spans meet (rank_00002.h5, rank_00003.h5) and C's losses equal A's to rel 1e-5.
  fallback        node 0's replicas of node 1's step-8 files are deleted too: step 8 is lost, C warns naming the
                  lost files and resumes step 4; losses 5..12 and the step-12 state equal A's bit for bit.
  lost            node 0's replicas of node 1's files are deleted in steps 4 and 8: exit 2, naming the lost rank
                  files of both; nothing is restored.
  lost-named      as fallback, with ckpt.resume naming step 8: exit 2, naming its lost files and step 4 as the
                  newest complete checkpoint.
  enospc          rank 2's write of step 8 fails (SHARDTRAIN_FAULT=ckpt_enospc:2@8): its holder, rank 0, is told that
                  no replica comes, nothing hangs, the job exits 75, neither node commits step 8 or keeps a
                  temporary directory, and step 4 stays whole on both.
  verify          ckpt verify lists a node-local copy's primaries and replicas, and fails (exit 2) naming a
                  corrupted replica.
  shared-dir      ckpt.dir without {node} on the stand-in nodes of one host: both nodes in one directory, exit 2
                  naming both nodes.
  one-node        2 ranks on one node: exit 2 (nothing to replicate to).
  uneven          3 ranks as nodes of 2 and 1: exit 2 naming both counts.
  hybrid          dist.sharding=hybrid: exit 2 (only node 0's ranks would write).
"""
import json
import os
import shutil
import socket
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ckpt_state import losses, same_bits, shard_state  # noqa: E402

shardtrain, wrapper, mpirun, config, work, case = sys.argv[1:7]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
COMMON = ["train", "--config", config,
          "--model.n_layer=2", "--model.seq_len=32", "--train.global_batch=12", "--train.micro_batch=1",
          "--ckpt.every=4", "--ckpt.keep=0", "--train.eval_every=0", "--train.eval_batches=1",
          "--train.sample_tokens=0", "--optim.warmup_steps=2", "--optim.eps=1e-6", "--optim.lr=0.003",
          "--optim.min_lr=0.003", "--ckpt.replicas=1"]
ASYNC = "--ckpt.async=" + ("false" if case == "resume-sync" else "true")
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL: " + what)


def run(tag, n, extra, program=wrapper, env=None):
    cmd = [mpirun, "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader", "-np", str(n), program]
    cmd += COMMON + [ASYNC, f"--log.metrics={os.path.join(work, tag + '.jsonl')}"] + extra
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
                       stdin=subprocess.DEVNULL, env=dict(os.environ, **(env or {})))
    with open(os.path.join(work, tag + ".log"), "w") as f:
        f.write(" ".join(cmd) + "\n" + r.stdout)
    return r


def run_tcp(tag, n, extra):
    """The same as run() with the env bootstrap: n processes started at once, rank r with SHARDTRAIN_NODE_ID r / 2."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args = COMMON + [ASYNC, "--dist.bootstrap=env", f"--log.metrics={os.path.join(work, tag + '.jsonl')}"] + extra
    procs = []
    for rank in range(n):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
        env.update(WORLD_SIZE=str(n), RANK=str(rank), LOCAL_RANK=str(rank % 2), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), SHARDTRAIN_NODE_ID=str(rank // 2))
        procs.append(subprocess.Popen([shardtrain] + args, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    with open(os.path.join(work, tag + ".log"), "w") as f:
        f.write("".join(outs))
    return subprocess.CompletedProcess(args, max(p.returncode for p in procs), "".join(outs))


def train(tag, steps, dirs, extra=()):
    launch = run_tcp if case == "tcp" else run
    r = launch(tag, 4, [f"--train.steps={steps}", f"--ckpt.dir={dirs}/node{{node}}"] + list(extra))
    if r.returncode != 0:
        print(r.stdout)
        sys.exit(f"{tag}: exit code {r.returncode}")
    return r


def step_dir(dirs, node, step):
    return os.path.join(work, dirs, f"node{node}", f"step_{step:08d}")


def node_local(dirs, node, step):
    return json.load(open(os.path.join(step_dir(dirs, node, step), "manifest.json")))["node_local"]


def drop_replicas_of_node1(step):
    for name in ("rank_00002.h5", "rank_00003.h5"):
        os.remove(os.path.join(step_dir("B", 0, step), name))


def expect_resumed_like_a(c, from_step):
    la, lc = losses(os.path.join(work, "A.jsonl")), losses(os.path.join(work, "C.jsonl"))
    check(sorted(lc) == list(range(from_step + 1, 13)), f"C trained steps {sorted(lc)}, expected {from_step + 1}..12")
    check(all(lc[s] == la[s] for s in lc), f"C's losses differ from A's: {[(s, la[s], lc[s]) for s in lc]}")
    check(f"resumed from {os.path.join(work, 'B', 'node0', f'step_{from_step:08d}')} (step {from_step}" in c.stdout,
          f"C did not log its resume from step {from_step}")
    ref = shard_state(step_dir("A", 0, 12))
    for node in (0, 1):
        check(same_bits(ref, shard_state(step_dir("B", node, 12))), f"node {node}'s step-12 state differs from A's")


def expect_exit(r, code, needles):
    check(r.returncode == code, f"exit code {r.returncode}, expected {code}")
    for n in needles:
        check(n in r.stdout, f"output lacks: {n}")


if case in ("resume-async", "resume-sync", "tcp", "reshard", "fallback", "lost", "lost-named", "verify"):
    if case not in ("lost", "lost-named", "verify"):
        train("A", 12, os.path.join(work, "A"))
    train("B", 8, os.path.join(work, "B"))
    for node in (0, 1):
        nl = node_local("B", node, 8)
        check(nl == {"node": node, "nodes": 2, "primaries": [2 * node, 2 * node + 1],
                     "replicas": [2 - 2 * node, 3 - 2 * node]}, f"B's node {node} step 8 node_local: {nl}")
    C = ["--train.steps=12", f"--ckpt.dir={os.path.join(work, 'B')}/node{{node}}"]

    if case in ("resume-async", "resume-sync", "tcp"):
        shutil.rmtree(os.path.join(work, "B", "node1"))
        c = (run_tcp if case == "tcp" else run)("C", 4, C)
        expect_exit(c, 0, [f"checkpoint: restored {step_dir('B', 1, 8)} on node 1 from the other nodes' copies: "
                           "rank_00000.h5, rank_00001.h5, rank_00002.h5, rank_00003.h5"])
        expect_resumed_like_a(c, 8)
        check(node_local("B", 1, 8) == {"node": 1, "nodes": 2, "primaries": [2, 3], "replicas": [0, 1]},
              "the restored copy's node_local")
        v = subprocess.run([shardtrain, "ckpt", "verify", step_dir("B", 1, 8)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        expect_exit(v, 0, ["node-local copy of node 1 of 2 (ckpt.replicas=1): primaries rank_00002.h5, rank_00003.h5; "
                           "replicas rank_00000.h5, rank_00001.h5"])

    elif case == "reshard":
        one_per_node = os.path.join(work, "one_rank_per_node.sh")
        with open(one_per_node, "w") as f:
            f.write(f'#!/bin/sh\nexport SHARDTRAIN_NODE_ID=${{OMPI_COMM_WORLD_RANK:-0}}\nexec "{shardtrain}" "$@"\n')
        os.chmod(one_per_node, 0o755)
        shutil.rmtree(os.path.join(work, "B", "node1"))
        c = run("C", 2, C, program=one_per_node)
        expect_exit(c, 0, [f"checkpoint: restored {step_dir('B', 1, 8)} on node 1 from the other nodes' copies: "
                           "rank_00002.h5, rank_00003.h5 (",
                           "(step 8, written by 4 rank(s), loaded by 2)"])
        la, lc = losses(os.path.join(work, "A.jsonl")), losses(os.path.join(work, "C.jsonl"))
        check(sorted(lc) == [9, 10, 11, 12], f"C trained steps {sorted(lc)}")
        check(all(abs(lc[s] - la[s]) <= 1e-5 * abs(la[s]) for s in lc), f"C's losses vs A's: {la} {lc}")

    elif case == "fallback":
        drop_replicas_of_node1(8)
        shutil.rmtree(os.path.join(work, "B", "node1"))
        c = run("C", 4, C)
        expect_exit(c, 0, ["checkpoint: step_00000008 has lost rank_00002.h5, rank_00003.h5 (2 of its 4 rank files are "
                           "in no node's directory, as a primary or a replica; node(s) 0 hold the rest). Resuming from "
                           "step_00000004 instead",
                           f"checkpoint: restored {step_dir('B', 1, 4)} on node 1"])
        expect_resumed_like_a(c, 4)

    elif case == "lost":
        drop_replicas_of_node1(4)
        drop_replicas_of_node1(8)
        shutil.rmtree(os.path.join(work, "B", "node1"))
        c = run("C", 4, C)
        expect_exit(c, 2, ["ckpt.resume=auto: no checkpoint in the node-local ckpt.dirs is complete: step_00000008 has "
                           "lost rank_00002.h5, rank_00003.h5", "step_00000004 has lost rank_00002.h5, rank_00003.h5",
                           "start from step 0 with ckpt.resume=none"])
        check(not os.path.exists(step_dir("B", 1, 4)) and not os.path.exists(step_dir("B", 1, 8)),
              "node 1 got a step directory although nothing could be restored")

    elif case == "lost-named":
        drop_replicas_of_node1(8)
        shutil.rmtree(os.path.join(work, "B", "node1"))
        named = os.path.join(work, "B", "node{node}", "step_00000008")
        c = run("C", 4, C + [f"--ckpt.resume={named}"])
        expect_exit(c, 2, [f"ckpt.resume '{named}': step_00000008 has lost rank_00002.h5, rank_00003.h5",
                           "the newest complete checkpoint is step_00000004 (ckpt.resume=auto resumes from it)"])

    elif case == "verify":
        v = subprocess.run([shardtrain, "ckpt", "verify", step_dir("B", 0, 8)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        expect_exit(v, 0, ["4 files", "node-local copy of node 0 of 2 (ckpt.replicas=1): primaries rank_00000.h5, "
                           "rank_00001.h5; replicas rank_00002.h5, rank_00003.h5"])
        replica = os.path.join(step_dir("B", 0, 8), "rank_00002.h5")
        with open(replica, "r+b") as f:
            f.seek(4000)
            b = f.read(1)
            f.seek(4000)
            f.write(bytes([b[0] ^ 0xFF]))
        v = subprocess.run([shardtrain, "ckpt", "verify", step_dir("B", 0, 8)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        expect_exit(v, 2, [f"{replica} (a replica: another node's file, kept in node 0's copy): SHA-256 mismatch"])

elif case == "enospc":
    r = run("B", 4, ["--train.steps=12", f"--ckpt.dir={os.path.join(work, 'B')}/node{{node}}"],
            env={"SHARDTRAIN_FAULT": "ckpt_enospc:2@8"})
    expect_exit(r, 75, ["checkpoint of step 8 not committed: rank(s) 2 failed to write",
                        "(injected by SHARDTRAIN_FAULT)"])
    for node in (0, 1):
        names = sorted(os.listdir(os.path.join(work, "B", f"node{node}")))
        check(names == [".lock", "latest", "step_00000004"], f"node {node}'s directory holds {names}")
        v = subprocess.run([shardtrain, "ckpt", "verify", step_dir("B", node, 4)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        expect_exit(v, 0, ["4 files"])
elif case == "shared-dir":
    r = run("S", 4, ["--train.steps=1", f"--ckpt.dir={os.path.join(work, 'shared')}"])
    expect_exit(r, 2, [f"ckpt.dir '{os.path.join(work, 'shared')}' is one directory for node ", "node 0 (ranks 0-1)",
                       "node 1 (ranks 2-3)", "a replica in the same directory as its source protects nothing"])
elif case == "one-node":
    r = run("S", 2, ["--train.steps=1", f"--ckpt.dir={os.path.join(work, 'ck')}/node{{node}}"], program=shardtrain)
    expect_exit(r, 2, ["but this run has one node (2 rank(s)): a replica on the same disk protects nothing"])
elif case == "uneven":
    r = run("S", 3, ["--train.steps=1", f"--ckpt.dir={os.path.join(work, 'ck')}/node{{node}}"])
    expect_exit(r, 2, ["every node needs the same number of ranks: node 0 has 2, node 1 has 1"])
elif case == "hybrid":
    r = run("S", 4, ["--train.steps=1", "--dist.sharding=hybrid", f"--ckpt.dir={os.path.join(work, 'ck')}/node{{node}}"])
    expect_exit(r, 2, ["ckpt.replicas=1 needs every rank to write its own file (dist.sharding=full)"])
else:
    sys.exit(f"unknown case {case}")

if failures:
    sys.exit(f"{case}: {len(failures)} check(s) failed (logs in {work})")
print(f"{case}: OK")
