#!/usr/bin/env python3
"""Checkpoints with real processes: bit-exact resume, resharding, and faults injected through
SHARDTRAIN_FAULT (the test-only seam in src/ckpt/checkpoint.cc).

usage: resume_faults_test.py SHARDTRAIN MPIRUN WORKDIR CASE [CONFIG]   (CONFIG: configs/tiny.ini by default)
CASE:
  resume-N        run A: 12 steps at N ranks, checkpoint every 4 (shuffle on); run B: resume A's step 4 at
                  the same N into another directory. Per-step losses and the final weights, m and v must
                  be identical to the bit.
  reshard-N-M     resume A's (N ranks) step 4 at M ranks: losses equal A's to rel 1e-5.
  kill-mid-write  2 ranks; rank 1 is SIGKILLed half way through writing step 8. mpirun must fail, step 8
                  must have no manifest, and a plain rerun resumes from step 4 and ends with the same
                  weights as an uninterrupted run.
  kill-before-rename  the same with rank 0 killed after the manifest's fsync, before the rename.
  enospc          3 ranks; rank 1's write of step 8 fails with ENOSPC: every rank reports it, the job
                  exits with the fault code 75, step 8 is not committed and leaves no temporary directory,
                  step 4 is intact (verified by resuming from it and matching an uninterrupted run).
Saves run in the background (ckpt.async = true, the default): the kills land in a background write while the other
ranks train on. A CASE ending in -sync runs the same with ckpt.async = false.
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from ckpt_state import losses, same_bits, shard_state  # noqa: E402
from killed_save import killed_save_failures, leftover_failures  # noqa: E402

shardtrain, mpirun, work, case = sys.argv[1:5]
sync = case.endswith("-sync")
case = case[: -len("-sync")] if sync else case
config = sys.argv[5] if len(sys.argv) > 5 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "tiny.ini")
os.makedirs(work, exist_ok=True)
COMMON = ["train", "--config", config,
          "--model.n_layer=2", "--model.seq_len=32", "--train.global_batch=12", "--train.micro_batch=1",
          "--train.steps=12", "--ckpt.every=4", "--ckpt.keep=0", "--train.eval_every=0", "--train.eval_batches=1",
          "--train.sample_tokens=0", "--optim.warmup_steps=2", "--optim.eps=1e-6",
          f"--ckpt.async={'false' if sync else 'true'}"]


def run(tag, n, extra, env=None, expect_ok=True):
    metrics = os.path.join(work, tag + ".jsonl")
    cmd = [mpirun, "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader", "-np", str(n), shardtrain]
    cmd += COMMON + [f"--log.metrics={metrics}"] + extra
    e = dict(os.environ, **(env or {}))
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e, timeout=600,
                       stdin=subprocess.DEVNULL)
    if expect_ok and r.returncode != 0:
        print(" ".join(cmd) + "\n" + r.stdout)
        sys.exit(f"{tag}: exit code {r.returncode}")
    return r, metrics


failures = []
if case.startswith("resume-") or case.startswith("reshard-"):
    parts = case.split("-")
    n = int(parts[1])
    m = int(parts[2]) if case.startswith("reshard-") else n
    a_dir, b_dir = os.path.join(work, "A"), os.path.join(work, "B")
    shutil.rmtree(a_dir, ignore_errors=True)
    shutil.rmtree(b_dir, ignore_errors=True)
    _, a_metrics = run("A", n, [f"--ckpt.dir={a_dir}"])
    _, b_metrics = run("B", m, [f"--ckpt.dir={b_dir}", f"--ckpt.resume={os.path.join(a_dir, 'step_00000004')}"])
    la, lb = losses(a_metrics), losses(b_metrics)
    if sorted(lb) != list(range(5, 13)):
        failures.append(f"resumed run reported steps {sorted(lb)}, expected 5..12")
    for step in lb:
        if case.startswith("resume-") and lb[step] != la[step]:
            failures.append(f"step {step}: loss {lb[step]!r} after resume, {la[step]!r} straight through")
        if case.startswith("reshard-") and abs(lb[step] - la[step]) > 1e-5 * abs(la[step]):
            failures.append(f"step {step}: loss {lb[step]} at {m} ranks, {la[step]} at {n}")
    if case.startswith("resume-"):
        if not same_bits(shard_state(os.path.join(a_dir, "step_00000012")), shard_state(os.path.join(b_dir, "step_00000012"))):
            failures.append("final weights or moments differ between the straight and the resumed run")
    print(f"{case}: {len(lb)} resumed steps compared")
elif case in ("kill-mid-write", "kill-before-rename"):
    point = "ckpt_mid_write:1@8" if case == "kill-mid-write" else "ckpt_before_rename:0@8"
    ref_dir, dir_ = os.path.join(work, "ref"), os.path.join(work, "run")
    shutil.rmtree(ref_dir, ignore_errors=True)
    shutil.rmtree(dir_, ignore_errors=True)
    run("ref", 2, [f"--ckpt.dir={ref_dir}"])
    r, _ = run("killed", 2, [f"--ckpt.dir={dir_}"], env={"SHARDTRAIN_FAULT": point}, expect_ok=False)
    if r.returncode == 0:
        failures.append("mpirun exited 0 although a rank was killed")
    if "SHARDTRAIN_FAULT" not in r.stdout:
        failures.append("the injected fault did not fire:\n" + r.stdout[-2000:])
    failures += killed_save_failures(dir_, 8, 4)
    r2, m2 = run("rerun", 2, [f"--ckpt.dir={dir_}"])
    if "resumed from" not in r2.stdout or "step 4" not in r2.stdout:
        failures.append("the rerun did not resume from step 4:\n" + r2.stdout[-2000:])
    failures += leftover_failures(dir_)
    if not same_bits(shard_state(os.path.join(ref_dir, "step_00000012")), shard_state(os.path.join(dir_, "step_00000012"))):
        failures.append("the interrupted-and-resumed run ends with other weights than the uninterrupted one")
    print(f"{case}: killed run exit code {r.returncode}, rerun resumed and matched")
elif case == "enospc":
    ref_dir, dir_ = os.path.join(work, "ref"), os.path.join(work, "run")
    shutil.rmtree(ref_dir, ignore_errors=True)
    shutil.rmtree(dir_, ignore_errors=True)
    run("ref", 3, [f"--ckpt.dir={ref_dir}"])
    r, _ = run("failed", 3, [f"--ckpt.dir={dir_}"], env={"SHARDTRAIN_FAULT": "ckpt_enospc:1@8"}, expect_ok=False)
    if r.returncode != 75:
        failures.append(f"exit code {r.returncode}, expected the fault code 75")
    for rank in range(3):
        if f"[rank {rank}/3" not in r.stdout or "rank(s) 1 failed to write" not in r.stdout:
            failures.append(f"rank {rank} did not report the failed save:\n" + r.stdout[-3000:])
            break
    if os.path.exists(os.path.join(dir_, "step_00000008", "manifest.json")):
        failures.append("step 8 was committed although rank 1's write failed")
    left = sorted(n for n in os.listdir(dir_) if ".tmp-" in n)
    if left:
        failures.append(f"the failed save left its temporary directory: {left}")
    r2, _ = run("rerun", 3, [f"--ckpt.dir={dir_}"])
    if "step 4" not in r2.stdout:
        failures.append("the rerun did not resume from step 4")
    if not same_bits(shard_state(os.path.join(ref_dir, "step_00000012")), shard_state(os.path.join(dir_, "step_00000012"))):
        failures.append("resuming from the intact step 4 did not reproduce the uninterrupted run")
    print(f"{case}: failed save exit code {r.returncode}; step 4 intact and resumable")
else:
    sys.exit(f"unknown case {case}")

if failures:
    print("FAILED:\n  " + "\n  ".join(failures[:20]))
    sys.exit(1)
