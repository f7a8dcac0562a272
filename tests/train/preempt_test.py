#!/usr/bin/env python3
"""Preemption: SIGTERM mid-run commits a checkpoint and exits 76; resuming with ckpt.resume=auto gives the losses of
an uninterrupted run exactly. Under mpirun -np 2 the signal goes to one rank only: both stop at the same step.
(A second signal exiting at once is tests/core/preempt_test.cc: raise() makes it deterministic.)

usage: preempt_test.py SHARDTRAIN MPIRUN WORKDIR CONFIG
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

STEPS = 30
PREEMPTED = 76


def losses(path):
    with open(path) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


def ranks_of(marker):
    """The pids of shardtrain processes whose command line holds `marker` (not mpirun's)."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
        except OSError:
            continue
        if comm == "shardtrain" and marker in cmd:
            pids.append(int(pid))
    return sorted(pids)


def main():
    shardtrain, mpirun, work, config = sys.argv[1:5]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    failures = []

    def cmd(ckpt, metrics, ranks):
        c = [shardtrain, "train", "--config", config, f"--train.steps={STEPS}", "--train.sample_tokens=0",
             "--train.eval_every=0", "--train.global_batch=8", "--train.micro_batch=2", f"--ckpt.dir={ckpt}",
             "--ckpt.every=0", f"--log.metrics={metrics}"]
        if ranks > 1:
            c = [mpirun, "--oversubscribe", "-np", str(ranks), "--bind-to", "none", "--mca", "btl", "self,vader",
                 "-x", "OMP_NUM_THREADS"] + c
        return c

    def run(tag, ranks, signals=0):
        """Runs to the end, or (signals > 0) sends SIGTERM to one rank once 5 steps are logged."""
        ckpt, metrics = os.path.join(work, f"ck_{tag}"), os.path.join(work, f"{tag}.jsonl")
        p = subprocess.Popen(cmd(ckpt, metrics, ranks), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if signals:
            deadline = time.time() + 300
            while time.time() < deadline and (not os.path.exists(metrics) or len(losses(metrics)) < 5):
                time.sleep(0.05)
            pids = ranks_of(f"--ckpt.dir={ckpt}")
            target = pids[-1] if pids else None  # the highest pid: rank 1 under mpirun, usually
            for _ in range(signals):
                if target:
                    os.kill(target, signal.SIGTERM)
        out, _ = p.communicate(timeout=600)
        return p.returncode, out, ckpt, metrics

    for ranks in (1, 2):
        rc, out, _, ref_m = run(f"straight_np{ranks}", ranks)
        if rc != 0:
            print(out[-3000:])
            sys.exit(f"uninterrupted run at np {ranks} failed: {rc}")
        ref = losses(ref_m)
        rc, out, ckpt, m = run(f"preempted_np{ranks}", ranks, signals=1)
        stopped = max(losses(m)) if os.path.exists(m) else 0
        latest = open(os.path.join(ckpt, "latest")).read().strip() if os.path.exists(os.path.join(ckpt, "latest")) else ""
        print(f"np {ranks}: SIGTERM -> exit {rc}, stopped after step {stopped}, latest checkpoint {latest or 'none'}")
        if rc != PREEMPTED:
            failures.append(f"np {ranks}: preempted run exited {rc}, expected {PREEMPTED}\n{out[-2000:]}")
        if not (5 <= stopped < STEPS) or latest != f"step_{stopped:08d}":
            failures.append(f"np {ranks}: stopped after step {stopped} with checkpoint '{latest}'")
        rc2 = subprocess.run(cmd(ckpt, m, ranks), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=600).returncode
        got = losses(m)
        diff = [s for s in range(1, STEPS + 1) if got.get(s) != ref.get(s)]
        print(f"np {ranks}: resumed -> exit {rc2}; steps whose loss differs from the uninterrupted run: {diff}")
        if rc2 != 0 or diff:
            failures.append(f"np {ranks}: resume exit {rc2}, losses differ at steps {diff}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
