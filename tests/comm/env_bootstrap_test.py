#!/usr/bin/env python3
"""dist.bootstrap=env for real: shardtrain processes on 127.0.0.1 with the environment a pod or torchrun gives.

usage: env_bootstrap_test.py CASE SHARDTRAIN MPIRUN WORKDIR CONFIG [--section.key=value ...]

CASE:
  pod          2 "pods" x 2 local ranks through launch/pod_launch.sh (JOB_COMPLETION_INDEX=0/1, LOCAL_WORLD_SIZE=2,
               WORLD_SIZE=4, MASTER_ADDR=127.0.0.1), training CONFIG on the cpu backend: every step's loss and the
               exported weights equal an `mpirun -np 4` run's to rel 1e-6.
  torchrun     the same with RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE set per process, as torchrun does.
  missing_rank WORLD_SIZE=3 but only ranks 0 and 1 start (rendezvous timeout 2 s): both exit 75, rank 0 with
               "rendezvous on port P: 2 of 3 ranks arrived within 2 s (missing ranks: 2)", rank 1 with the same
               message as rank 0 reports it.
  wrong_port   rank 1 alone, MASTER_PORT nobody listens on: exit 75, "could not reach MASTER_ADDR=127.0.0.1:P within
               2 s (connection refused)".
  kill         3 ranks; rank 1 is SIGKILLed halfway through writing its checkpoint shard (SHARDTRAIN_FAULT): ranks 0
               and 2 exit 75 naming rank 1.
  fail         3 ranks; rank 1 alone cannot read the built-in corpus (its SHARDTRAIN_FORTUNES_DIR is wrong): rank 1
               exits 2 with its own message, ranks 0 and 2 exit 75 naming rank 1 (they see its closed connections).
  stopped      2 ranks; rank 1 stops itself with SIGSTOP before step 3 (a hung rank: its sockets stay open): rank 0's
               watchdog (dist.timeout_s=3) names the collective it waits in and exits 75.
Ports: each run binds port 0 to get a free one, so parallel ctest runs do not collide.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shard"))
from mpi_equivalence_test import read_h5  # noqa: E402  (the exported weights, tensor by tensor)

POD_LAUNCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "launch", "pod_launch.sh")
TIMEOUT = 300


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_COMM_WORLD", "PMIX_", "PMI_")) and k not in
           ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "JOB_COMPLETION_INDEX", "MASTER_ADDR",
            "MASTER_PORT", "SHARDTRAIN_FAULT", "SHARDTRAIN_NODE_ID")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def start_all(cmds_envs):
    """Starts every (cmd, env) at once; returns [(returncode, output)] in the same order."""
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for cmd, env in cmds_envs]
    out = []
    for p in procs:
        text, _ = p.communicate(timeout=TIMEOUT)
        out.append((p.returncode, text))
    return out


def read_losses(path):
    with open(path) as f:
        return [json.loads(line)["loss"] for line in f if "val_loss" not in line]


def train_args(config, overrides, work, tag):
    return ["train", "--config", config, "--data.shuffle=false", "--train.sample_tokens=0", "--train.eval_every=0",
            f"--log.metrics={work}/{tag}.jsonl", f"--ckpt.export={work}/{tag}.h5"] + overrides


def check(failures, cond, what):
    if not cond:
        failures.append(what)


def equivalence(case, shardtrain, mpirun, work, config, overrides):
    ref = [mpirun, "--oversubscribe", "-np", "4", "--bind-to", "none", "--mca", "btl", "self,vader", shardtrain]
    [(rc, text)] = start_all([(ref + train_args(config, overrides, work, "mpirun"), clean_env())])
    if rc != 0:
        sys.exit(f"mpirun -np 4 failed with exit code {rc}:\n{text}")
    port = free_port()
    base = dict(WORLD_SIZE=4, MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    args = train_args(config, overrides, work, case) + ["--dist.bootstrap=env", "--dist.rendezvous_timeout_s=60"]
    if case == "pod":
        runs = [([POD_LAUNCH, "--", shardtrain] + args, clean_env(JOB_COMPLETION_INDEX=i, LOCAL_WORLD_SIZE=2, **base))
                for i in range(2)]
    else:
        runs = [([shardtrain] + args, clean_env(RANK=r, LOCAL_RANK=r % 2, LOCAL_WORLD_SIZE=2, **base))
                for r in range(4)]
    results = start_all(runs)
    for i, (rc, text) in enumerate(results):
        if rc != 0:
            sys.exit(f"{case} process {i} failed with exit code {rc}:\n{text}")
    log = "".join(t for _, t in results)
    failures = []
    check(failures, "sharding: tcp communicator, 4 rank(s)" in log, "no 'sharding: tcp communicator, 4 rank(s)' line")
    ref_losses, got = read_losses(f"{work}/mpirun.jsonl"), read_losses(f"{work}/{case}.jsonl")
    check(failures, len(ref_losses) == len(got) and len(got) > 0, f"{len(got)} steps vs mpirun's {len(ref_losses)}")
    worst = 0.0
    for step, (a, b) in enumerate(zip(ref_losses, got), 1):
        rel = abs(a - b) / abs(a)
        worst = max(worst, rel)
        check(failures, rel <= 1e-6, f"step {step}: loss {b} vs mpirun {a} (rel {rel:.2e})")
    ref_w, got_w = read_h5(f"{work}/mpirun.h5"), read_h5(f"{work}/{case}.h5")
    check(failures, sorted(ref_w) == sorted(got_w), "exported tensors differ in names")
    worst_w = 0.0
    for k, ref_t in ref_w.items():
        d = np.linalg.norm((got_w[k] - ref_t).ravel()) / max(np.linalg.norm(ref_t.ravel()), 1e-30)
        worst_w = max(worst_w, d)
        check(failures, d <= 1e-6, f"{k}: ||diff||/||ref|| = {d:.2e}")
    print(f"{case}: {len(got)} steps, worst loss rel diff vs mpirun -np 4 {worst:.2e}, worst weight rel diff "
          f"{worst_w:.2e}")
    return failures


def expect(failures, results, rank, code, pattern):
    rc, text = results[rank]
    check(failures, rc == code, f"rank {rank}: exit code {rc}, expected {code}")
    check(failures, re.search(pattern, text) is not None, f"rank {rank}: no match for /{pattern}/ in:\n{text}")


def failure_case(case, shardtrain, work, config, overrides):
    port = free_port()
    args = [shardtrain] + train_args(config, overrides, work, case) + ["--dist.bootstrap=env",
                                                                        "--dist.rendezvous_timeout_s=2"]
    env = lambda r, world, **kw: clean_env(RANK=r, WORLD_SIZE=world, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **kw)
    failures = []
    if case == "missing_rank":
        res = start_all([(args, env(0, 3)), (args, env(1, 3))])
        msg = rf"rendezvous on port {port}: 2 of 3 ranks arrived within 2 s \(missing ranks: 2\)"
        expect(failures, res, 0, 75, r"rank 0/3 .*" + msg)
        expect(failures, res, 1, 75, r"rank 1/3 .*rank 0 reports: .*" + msg)
    elif case == "wrong_port":
        res = start_all([(args, env(1, 2))])
        expect(failures, res, 0, 75, rf"rank 1/2 .*could not reach MASTER_ADDR=127.0.0.1:{port} within 2 s "
                                     r"\(connection refused\)")
    elif case == "kill":
        args[-1] = "--dist.rendezvous_timeout_s=60"
        extra = [f"--ckpt.dir={work}/ckpt_kill", "--ckpt.every=2"]
        res = start_all([(args + extra, env(r, 3, SHARDTRAIN_FAULT="ckpt_mid_write:1@2")) for r in range(3)])
        check(failures, res[1][0] == -9, f"rank 1: exit {res[1][0]}, expected SIGKILL (-9) by the fault injection")
        for r in (0, 2):
            expect(failures, res, r, 75, rf"rank {r}/3 .*lost peer .*rank 1 on ")
    elif case == "fail":
        args[-1] = "--dist.rendezvous_timeout_s=60"
        res = start_all([(args, env(r, 3, **({"SHARDTRAIN_FORTUNES_DIR": f"{work}/no-such-dir"} if r == 1 else {})))
                         for r in range(3)])
        expect(failures, res, 1, 2, r"rank 1/3 .*SHARDTRAIN_FORTUNES_DIR")
        for r in (0, 2):
            expect(failures, res, r, 75, rf"rank {r}/3 .*lost peer .*rank 1 on ")
    elif case == "stopped":
        # Rank 1 stops itself (SIGSTOP) before step 3: rank 0's watchdog names the collective it waits in and
        # ends it with the fault code, within dist.timeout_s and a few seconds. Rank 1 stays stopped: killed here.
        args[-1] = "--dist.rendezvous_timeout_s=60"
        cmds = [(args + ["--dist.timeout_s=3"], env(r, 2, SHARDTRAIN_FAULT="sigstop:1@3")) for r in range(2)]
        procs = [subprocess.Popen(c, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for c, e in cmds]
        try:
            text0, _ = procs[0].communicate(timeout=60)
        finally:
            procs[1].kill()
        text1, _ = procs[1].communicate()
        res = [(procs[0].returncode, text0), (procs[1].returncode, text1)]
        expect(failures, res, 0, 75, r"rank 0/2 .*watchdog: rank 0: [a-z_]+ #\d+ on communicator 'world[^']*' "
                                     r"\(count \d+\) has not completed after \d+ s \(dist.timeout_s = 3\)")
    else:
        sys.exit(f"unknown case {case}")
    for i, (rc, text) in enumerate(res):
        print(f"--- process {i}: exit {rc}\n{text.strip()}")
    return failures


def main():
    case, shardtrain, mpirun, work, config = sys.argv[1:6]
    overrides = sys.argv[6:]
    shutil.rmtree(work, ignore_errors=True)  # ckpt.export writes only new files: start from an empty directory
    os.makedirs(work)
    if case in ("pod", "torchrun"):
        failures = equivalence(case, shardtrain, mpirun, work, config, overrides)
    else:
        failures = failure_case(case, shardtrain, work, config, overrides)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures[:20]))
        return 1
    print(f"{case}: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
