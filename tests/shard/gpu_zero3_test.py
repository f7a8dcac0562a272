#!/usr/bin/env python3
"""ZeRO-3 on GPUs: N GPUs train what one GPU trains, and checkpoints cross world sizes and backends.

Cases (the first argument picks one; each exits 77, which ctest reports as skipped, when the machine has
fewer GPUs than the case needs):
  equivalence-fp32  50 steps on 1 GPU and on 2 GPUs (mpirun), same global batch, data.shuffle=false:
                    every step's loss agrees to rel 1e-5.
  equivalence-bf16  the same in bf16: the final loss agrees to rel 2e-2 and both runs fall by the same
                    trend (mean of the last 10 losses vs the first 10, within 2e-2).
  checkpoint        2 GPUs (fp32) train 20 steps with a checkpoint at 10. From that checkpoint:
                    1 GPU resumes to step 20 and matches the uninterrupted run to rel 1e-5; 3 CPU ranks
                    resume and match to rel 1e-4; and the CPU ranks' step-20 checkpoint loads on 1 GPU
                    (a 2-step continuation matches the CPU's own continuation to rel 1e-4). A 1-GPU bf16
                    run resumed from its step-10 checkpoint repeats the uninterrupted losses exactly: the
                    straight run timed its GEMMs (train.gemm_autotune), the resumed one takes the checkpoint's
                    picks and times none.
  fp16-overflow     2 GPUs in fp16; SHARDTRAIN_FAULT=grad_inf:1@3 makes rank 1's gradients of step 3
                    non-finite. Step 3 is skipped (rank 0 reports it: the norm is all-reduced), the loss
                    scale halves (65536 -> 32768 at step 4), and the weights after the 3-step run are
                    bit-identical to a 2-step run's (each run's final checkpoint exported to safetensors
                    with `shardtrain ckpt export`, compared value by value); so are those of the same faulty run
                    with a speculative offloaded optimizer (the dropped update restored).
  offload           2 GPUs in bf16, 50 steps (gradient accumulation 3, clipping on) with optim.offload none,
                    optimizer, optimizer+params and optimizer+params on half the parameters
                    (offload_fraction 0.5), not speculating: the host AdamW computes the GPU kernel's bits, so
                    every step's loss agrees to rel 1e-6. Speculating (optim.offload_speculative true, or auto, the
                    default, which must say it turned it on; the host AdamW started in the backward, unclipped):
                    optimizer and optimizer+params with the default clip (some steps redone, some kept; the test
                    checks both happen), and half offloaded with clipping off (all kept), each against no offload
                    to rel 1e-6. Checkpoints cross (default speculation): an offloaded run's step-10 checkpoint
                    resumed without offload, and a non-offloaded one's resumed with optimizer+params, repeat the
                    uninterrupted losses of steps 11-20 to rel 1e-6.
  hybrid            2 GPUs standing in for two workstations: SHARDTRAIN_NODE_ID = MPI rank (a wrapper sets it),
                    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 (sockets). dist.sharding=hybrid (each GPU holds the
                    whole state, gradient shards all-reduced between the "nodes") matches full sharding over NVLink
                    to rel 1e-5 for 30 fp32 steps; full sharding with NCCL_P2P_DISABLE=1 alone (the dual-4090
                    stand-in) matches too; dist.sharding=auto on the stand-in measures the sockets through NCCL,
                    chooses hybrid (saying why) and matches; on one node it says it shards fully. A run whose
                    start-up peer-copy check is made to fail (SHARDTRAIN_FAULT=p2p_broken:1) matches too, and
                    must say in the log that it set NCCL_P2P_DISABLE=1.
  comm-tuning       2 GPUs in bf16, 12 steps (3 micro-steps each): dist.prefetch_depth 0, 1 and 3 only move when
                    gathers are issued, so the losses are bit-identical; so are dist.gather_engine=sm,
                    dist.reduce_engine=sm (NCCL's kernels against the default copy-engine all-to-all),
                    dist.reduce_scatter_ctas 0 and 1, and reduce_engine=copy beside gather_engine=sm; the log
                    names the link kind (nvlink; pcie
                    with NCCL_P2P_DISABLE=1; network on the two-workstation stand-in) and its default depth. Hybrid
                    on the stand-in with dist.bucket_mb 0.5 (two units a call), 64 (the whole tiny model in one call)
                    and the default (one unit a call) sums the same elements: bit-identical losses again.
  hybrid-2x2        4 GPUs as 2 nodes x 2 (SHARDTRAIN_NODE_ID = rank / 2; NCCL over sockets between them): hybrid
                    sharding, whose node and replica NCCL communicators are split from the world's (ncclCommSplit),
                    matches full sharding over the 4 GPUs to rel 1e-5 for 30 fp32 steps, with the default bucket
                    and with dist.bucket_mb=0.5; each rank's sharded state is half the model (2-rank shards).
  fp8               train.fp8=tensorwise (fp32 compute) on 1 and on 2 GPUs, same global batch: the casts are per
                    micro-batch and per tensor and both runs cast the same micro-batches, so 30 steps' losses agree
                    to rel 1e-3 (a value the reductions' order moves across a rounding boundary flips an FP8 code; a
                    lost micro-batch is 1e-2 off or more). On 2 GPUs, dist.fp8_gather=true (the weights gathered as
                    E4M3 codes) repeats the losses of gathering in train.dtype bit for bit, in fp32 and in bf16.
  lora-hybrid       2 GPUs standing in for two workstations (as hybrid): LoRA (rank 4 on every linear layer, adapters
                    on a frozen base: wholly frozen embedding and head units, whose empty gradient shards join the
                    buckets summed across the nodes) with dist.sharding=hybrid over sockets matches full sharding over
                    NVLink to rel 1e-5 for 20 fp32 steps, with a bf16 base and with an NF4 base.
  async-kill        2 GPUs (fp32), saves in the background every 5 steps: SHARDTRAIN_FAULT=ckpt_mid_write:1@10 SIGKILLs
                    rank 1 half way through writing step 10's file while rank 0 trains on. mpirun fails, step 10 is
                    not committed (its temporary directory is left), step 5 is; a plain rerun (ckpt.resume=auto)
                    says it resumed from step 5, removes the leftover and repeats the uninterrupted run's losses of
                    steps 6-20 exactly (same world size: the same bits).
  watchdog          2 GPUs in bf16; SHARDTRAIN_FAULT=sigstop:1@3 stops rank 1 before step 3. Rank 0's next NCCL
                    collective passes dist.timeout_s=5: the watchdog names it (channel "nccl ...", op, sequence
                    number, the last completed op), aborts the NCCL communicators and mpirun exits 75.
  backends          1 GPU: a 1-GPU run's step-10 checkpoint resumed by 3 CPU ranks, and a 3-CPU-rank run's by 1 GPU
                    (fp32), each repeating the run it came from for steps 11-20 to rel 1e-4.
  memory-cap        1 GPU, GPT-2 124M-shaped (byte vocabulary) at micro_batch 96 under dist.max_gpu_mem_gib=24 (a stand-in
                    for an RTX 4090): exit code 2 before step 1, and the message gives the breakdown and the smallest
                    change that fits.

Where the bars come from (u = 2^-24, float32's unit roundoff): runs that differ only in the order of their reductions
(1 vs 2 GPUs, hybrid vs full, resumed vs straight on the same backend) agree to 1e-5 = 168 u relative, the worst-case
bound on reordering a sum of 168 terms, over 10-30 steps at lr 1e-3 and eps 1e-6 (docs/testing.md says why eps). Runs
across backends (cuBLAS vs OpenBLAS, fused vs unfused attention kernels) compute each term differently as well, and
get 10x that: 1e-4. Offloaded against on-device AdamW compute the same elementwise update in the same order: 1e-6.
A lost micro-batch or shard is off by 1e-2 or more.

usage: gpu_zero3_test.py CASE SHARDTRAIN GPU_COUNT_TOOL MPIRUN WORKDIR CONFIG
The data is a generated byte-level text (a repeated pattern with 20% noise, so the loss falls).
Only the standard library: it runs under whichever python3 the GPU machine has.
"""
import json
import os
import random
import re
import struct
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from killed_save import killed_save_failures, leftover_failures  # noqa: E402

SKIP = 77


def read_records(path):
    with open(path) as f:
        return {r["step"]: r for r in map(json.loads, f) if "loss" in r}


def read_losses(path):
    return {s: r["loss"] for s, r in read_records(path).items()}


def speculation_counts(failures, tag, output):
    """(kept, redone) from the run's optim.offload_speculative log line."""
    m = re.search(r"optim.offload_speculative: of (\d+) speculative unit updates, (\d+) kept, (\d+) redone", output)
    if not m:
        failures.append(f"{tag}: no optim.offload_speculative summary in the log")
        return 0, 0
    print(f"{tag}: {m.group(0)}")
    return int(m.group(2)), int(m.group(3))


class Runner:
    def __init__(self, shardtrain, mpirun, work, config):
        self.shardtrain, self.mpirun, self.work, self.config = shardtrain, mpirun, work, config
        self.data = os.path.join(work, "text.txt")
        rng = random.Random(7)
        base = bytes(rng.randrange(32, 127) for _ in range(97))
        text = bytearray(base * 4000)
        for i in range(len(text)):
            if rng.random() < 0.2:
                text[i] = rng.randrange(32, 127)
        with open(self.data, "wb") as f:
            f.write(text)

    def train(self, tag, ranks, overrides, device="cuda", fault=None, env=None, binary=None, expect_rc=0):
        """The run's losses by step. expect_rc None: the run must fail, with any exit code (a killed rank)."""
        metrics = os.path.join(self.work, f"{tag}.jsonl")
        if os.path.exists(metrics):
            os.remove(metrics)
        cmd = [binary or self.shardtrain, "train", "--config", self.config, f"--train.device={device}",
               f"--data.path={self.data}", "--data.format=text",
               "--data.shuffle=false", "--train.sample_tokens=0", "--train.eval_every=0", "--train.eval_batches=1",
               "--model.seq_len=64", "--train.global_batch=12", "--train.micro_batch=2", "--optim.lr=1e-3",
               "--optim.eps=1e-6", "--optim.warmup_steps=5", f"--log.metrics={metrics}"] + overrides
        if ranks > 1 or device == "cpu":
            env_flags = []
            for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS", "OMP_NUM_THREADS",
                      "SHARDTRAIN_FAULT") + tuple(env or {}):
                env_flags += ["-x", k]
            cmd = [self.mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(ranks)] + env_flags + cmd
        env = dict(os.environ, SHARDTRAIN_FAULT=fault or "", **(env or {}))
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900,
                           stdin=subprocess.DEVNULL, env=env)
        if r.returncode == 0 if expect_rc is None else r.returncode != expect_rc:
            print(" ".join(cmd) + "\n" + r.stdout[-6000:])
            sys.exit(f"{tag} ended with exit code {r.returncode}, expected {'a failure' if expect_rc is None else expect_rc}")
        self.last_output = r.stdout
        return read_losses(metrics) if expect_rc == 0 else None


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        out[name] = struct.unpack(f"<{(hi - lo) // 4}f", data[lo:hi])
    return out


def max_abs_diff(path_a, path_b):
    a, b = read_safetensors(path_a), read_safetensors(path_b)
    return max(max(abs(x - y) for x, y in zip(a[k], b[k])) for k in a)


def workstations_wrapper(work, shardtrain):
    """A `shardtrain` that runs each MPI rank as its own node (SHARDTRAIN_NODE_ID = rank): two workstations."""
    wrapper = os.path.join(work, "as_workstations.sh")
    with open(wrapper, "w") as f:
        f.write(f'#!/bin/sh\nexport SHARDTRAIN_NODE_ID="${{OMPI_COMM_WORLD_RANK:-0}}"\nexec {shardtrain} "$@"\n')
    os.chmod(wrapper, 0o755)
    return wrapper


def expect_in_log(failures, name, output, pattern):
    if not re.search(pattern, output):
        failures.append(f"{name}: the log has no line matching {pattern!r}")


def compare(failures, name, ref, got, steps, rtol):
    worst = 0.0
    for s in steps:
        if s not in got or s not in ref:
            failures.append(f"{name}: step {s} missing")
            continue
        rel = abs(got[s] - ref[s]) / abs(ref[s])
        worst = max(worst, rel)
        if rel > rtol:
            failures.append(f"{name}: step {s} loss {got[s]} vs {ref[s]} (rel {rel:.2e} > {rtol})")
    print(f"{name}: {len(steps)} steps, worst rel diff {worst:.2e} (tolerance {rtol})")


def main():
    case, shardtrain, gpu_count_tool, mpirun, work, config = sys.argv[1:7]
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    gpus = int(subprocess.run([gpu_count_tool], stdout=subprocess.PIPE, text=True).stdout.strip() or 0)
    need = {"memory-cap": 1, "backends": 1, "hybrid-2x2": 4}.get(case, 2)
    if gpus < need:
        print(f"SKIPPED: {case} needs {need} GPUs, {gpus} visible")
        return SKIP
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    run = Runner(shardtrain, mpirun, work, config)
    failures = []
    if case.startswith("equivalence"):
        dtype = case.split("-")[1]
        common = [f"--train.dtype={dtype}", "--train.steps=50"]
        one = run.train("np1", 1, common)
        two = run.train("np2", 2, common)
        steps = sorted(one)
        if len(steps) != 50:
            failures.append(f"{len(steps)} steps logged, expected 50")
        if dtype == "fp32":
            compare(failures, "2 GPUs vs 1 GPU (fp32)", one, two, steps, 1e-5)
        else:
            compare(failures, "2 GPUs vs 1 GPU (bf16), final loss", one, two, steps[-1:], 2e-2)
            trend = [sum(r[s] for s in steps[-10:]) / sum(r[s] for s in steps[:10]) for r in (one, two)]
            print(f"trend (mean of last 10 / first 10): 1 GPU {trend[0]:.4f}, 2 GPUs {trend[1]:.4f}")
            if not (trend[0] < 0.98 and abs(trend[0] - trend[1]) <= 2e-2 * trend[0]):
                failures.append(f"loss trends differ or do not fall: {trend}")
            # cuDNN's attention backward with dQ by atomics: the log says so, and it trains what the deterministic
            # backward trains (to the bf16 tolerance; its bits may differ from run to run).
            nondet = run.train("np2_nondeterministic", 2, common + ["--train.deterministic=false"])
            expect_in_log(failures, "train.deterministic=false", run.last_output, r"nondeterministic backward: dQ by atomics")
            compare(failures, "2 GPUs, train.deterministic=false vs true (bf16), final loss", two, nondet, steps[-1:], 2e-2)
    elif case == "backends":
        # One GPU and 3 CPU ranks (fp32) each resume the other's step-10 checkpoint and repeat its steps 11-20.
        common = ["--train.dtype=fp32", "--train.steps=20", "--ckpt.every=10", "--ckpt.keep=0"]
        for src, src_ranks, src_device, dst, dst_ranks, dst_device in (("gpu1", 1, "cuda", "cpu3", 3, "cpu"),
                                                                       ("cpu3", 3, "cpu", "gpu1", 1, "cuda")):
            a = os.path.join(work, f"ckpt_{src}")
            straight = run.train(f"{src}_straight", src_ranks, common + [f"--ckpt.dir={a}"], device=src_device)
            d = os.path.join(work, f"ckpt_{src}_to_{dst}")
            os.makedirs(d)
            shutil.copytree(os.path.join(a, "step_00000010"), os.path.join(d, "step_00000010"))
            got = run.train(f"{src}_to_{dst}", dst_ranks, common + [f"--ckpt.dir={d}"], device=dst_device)
            compare(failures, f"{dst} resuming the {src} step-10 checkpoint", straight, got, range(11, 21), 1e-4)
    elif case == "checkpoint":
        a = os.path.join(work, "ckpt_a")
        common = ["--train.dtype=fp32", "--train.steps=20", "--ckpt.every=10", "--ckpt.keep=0"]
        straight = run.train("gpu2_straight", 2, common + [f"--ckpt.dir={a}"])
        for tag, ranks, device, rtol in (("gpu1_resume", 1, "cuda", 1e-5), ("cpu3_resume", 3, "cpu", 1e-4)):
            d = os.path.join(work, f"ckpt_{tag}")
            os.makedirs(d)
            shutil.copytree(os.path.join(a, "step_00000010"), os.path.join(d, "step_00000010"))
            flags = ["--train.dtype=fp32", "--train.steps=20", "--ckpt.every=10", f"--ckpt.dir={d}"]
            got = run.train(tag, ranks, flags, device=device)
            compare(failures, f"{tag} from the 2-GPU step-10 checkpoint", straight, got, range(11, 21), rtol)
        # Back: the 3 CPU ranks' step-20 checkpoint continues on 1 GPU as it does on the CPU.
        back = os.path.join(work, "ckpt_cpu3_resume")
        cpu_more = run.train("cpu3_more", 3, ["--train.steps=22", f"--ckpt.dir={back}", "--ckpt.every=0",
                                              "--ckpt.keep=0"], device="cpu")
        shutil.rmtree(os.path.join(back, "step_00000022"))
        with open(os.path.join(back, "latest"), "w") as f:
            f.write("step_00000020\n")
        gpu_more = run.train("gpu1_more", 1, ["--train.dtype=fp32", "--train.steps=22", f"--ckpt.dir={back}"])
        compare(failures, "1 GPU continuing the 3-CPU-rank checkpoint", cpu_more, gpu_more, [21, 22], 1e-4)
        # bf16: resuming repeats the uninterrupted trajectory (the bf16 copy is re-derived from the master).
        b = os.path.join(work, "ckpt_bf16")
        bf = ["--train.dtype=bf16", "--train.steps=20", "--ckpt.every=10", "--ckpt.keep=0", f"--ckpt.dir={b}",
              "--train.gemm_autotune=16"]
        # The GEMMs' candidates are timed (train.gemm_autotune); the checkpoint keeps the picks and the resumed run
        # takes them instead of timing again, which could pick others.
        bf_straight = run.train("bf16_straight", 1, bf)
        expect_in_log(failures, "bf16 straight", run.last_output, r"GEMM tuning \(train\.gemm_autotune=16\): [1-9]")
        with open(os.path.join(b, "step_00000010", "manifest.json")) as f:
            plans = json.load(f)["gemm_algorithms"]["plans"].splitlines()
        shutil.rmtree(os.path.join(b, "step_00000020"))
        with open(os.path.join(b, "latest"), "w") as f:
            f.write("step_00000010\n")
        bf_resumed = run.train("bf16_resumed", 1, bf)
        expect_in_log(failures, "bf16 resumed", run.last_output, rf"GEMM algorithms: {len(plans)} from the checkpoint")
        if "GEMM tuning" in run.last_output:
            failures.append("bf16 resumed: timed GEMMs the checkpoint had picked")
        compare(failures, "bf16 1 GPU resumed at step 10", bf_straight, bf_resumed, range(11, 21), 0)
    elif case == "offload":
        common = ["--train.dtype=bf16", "--train.steps=50", "--optim.offload_threads=4"]
        ref = run.train("offload_none", 2, common)
        for mode, fraction in (("optimizer", 1), ("optimizer+params", 1), ("optimizer+params", 0.5)):
            got = run.train(f"offload_{mode}_{fraction}", 2, common + [f"--optim.offload={mode}",
                                                                      f"--optim.offload_fraction={fraction}",
                                                                      "--optim.offload_speculative=false"])
            compare(failures, f"optim.offload={mode} (fraction {fraction}) vs none (bf16)", ref, got, range(1, 51),
                    1e-6)
        # optim.offload_speculative: each unit's host AdamW starts in the backward, unclipped. With the default clip
        # some steps are clipped (redone when speculated; the step after one does not speculate) and some not (kept);
        # with clipping off every one is kept. The default, auto,
        # turns it on here (the host has the memory) and says so.
        for mode, spec in (("optimizer", "true"), ("optimizer+params", "auto")):
            tag = f"spec_{mode}"
            got = run.train(tag, 2, common + [f"--optim.offload={mode}", f"--optim.offload_speculative={spec}"])
            if spec == "auto" and "optim.offload_speculative=auto: on (second copy" not in run.last_output:
                failures.append(f"{tag}: optim.offload_speculative=auto did not say it turned speculation on")
            compare(failures, f"speculative optim.offload={mode} vs none (bf16)", ref, got, range(1, 51), 1e-6)
            kept, redone = speculation_counts(failures, tag, run.last_output)
            if not (kept > 0 and redone > 0):
                failures.append(f"{tag}: the run did not exercise both kept and redone updates")
        ref0 = run.train("offload_none_noclip", 2, common + ["--optim.grad_clip=0"])
        got0 = run.train("spec_noclip", 2, common + ["--optim.grad_clip=0", "--optim.offload=optimizer",
                                                     "--optim.offload_speculative=true", "--optim.offload_fraction=0.5"])
        compare(failures, "speculative, no clipping, half offloaded vs none (bf16)", ref0, got0, range(1, 51), 1e-6)
        kept, redone = speculation_counts(failures, "spec_noclip", run.last_output)
        if not (kept > 0 and redone == 0):
            failures.append("spec_noclip: without clipping every speculative update must be kept")
        for first, second in (("optimizer", "none"), ("none", "optimizer+params")):
            d = os.path.join(work, f"ckpt_{first}_{second}")
            flags = ["--train.dtype=bf16", "--train.steps=20", "--ckpt.every=10", "--ckpt.keep=0", f"--ckpt.dir={d}",
                     "--optim.offload_threads=4"]
            straight = run.train(f"straight_{first}", 2, flags + [f"--optim.offload={first}"])
            shutil.rmtree(os.path.join(d, "step_00000020"))
            with open(os.path.join(d, "latest"), "w") as f:
                f.write("step_00000010\n")
            resumed = run.train(f"resumed_{second}", 2, flags + [f"--optim.offload={second}"])
            compare(failures, f"offload={first} checkpoint resumed with offload={second}", straight, resumed,
                    range(11, 21), 1e-6)
    elif case == "hybrid":
        wrapper = workstations_wrapper(work, shardtrain)
        common = ["--train.dtype=fp32", "--train.steps=30"]
        ref = run.train("full_nvlink", 2, common)
        print("\n".join(l for l in run.last_output.splitlines() if "peer access" in l))
        sockets = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}
        hyb = run.train("hybrid_sockets", 2, common + ["--dist.sharding=hybrid"], env=sockets, binary=wrapper)
        compare(failures, "hybrid over sockets vs full over NVLink (fp32)", ref, hyb, range(1, 31), 1e-5)
        # dist.sharding=auto there: NCCL measures the sockets; with one GPU per "workstation" replicating moves the
        # fewest bytes across them, so it picks hybrid, says why, and trains the same.
        auto = run.train("auto_sockets", 2, common + ["--dist.sharding=auto"], env=sockets, binary=wrapper)
        why = [l for l in run.last_output.splitlines() if "dist.sharding=auto" in l]
        print("\n".join(why))
        if not any("hybrid: estimated communication per step" in l and "all-reduce across the 2 nodes" in l
                   for l in why):
            failures.append("dist.sharding=auto on the two-workstation stand-in did not choose hybrid, saying why")
        compare(failures, "auto over sockets vs full over NVLink (fp32)", ref, auto, range(1, 31), 1e-5)
        run.train("auto_one_node", 2, ["--train.dtype=fp32", "--train.steps=2", "--dist.sharding=auto"])
        if "full: one node, where hybrid is full sharding (dist.sharding=auto)" not in run.last_output:
            failures.append("dist.sharding=auto on one node did not say it shards fully")
        nop2p = run.train("full_nop2p", 2, common, env={"NCCL_P2P_DISABLE": "1"})
        compare(failures, "full with NCCL_P2P_DISABLE=1 vs full (fp32)", ref, nop2p, range(1, 31), 1e-5)
        # A machine whose GPUs report peer access they cannot do: rank 1's start-up copy check fails, every rank
        # sets NCCL_P2P_DISABLE=1 before NCCL starts, the log says so, and training goes on unchanged.
        broken = run.train("full_p2p_broken", 2, common, fault="p2p_broken:1")
        compare(failures, "full after the peer-copy check failed (fp32)", ref, broken, range(1, 31), 1e-5)
        print("\n".join(l for l in run.last_output.splitlines() if "peer access" in l))
        if "NCCL_P2P_DISABLE=1 for this run" not in run.last_output:
            failures.append("the failed peer-copy check was not reported in the log")
    elif case == "comm-tuning":
        wrapper = workstations_wrapper(work, shardtrain)
        common = ["--train.dtype=bf16", "--train.steps=12"]
        sockets = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}

        def comm_line():
            return next((l[l.index("communication:"):] for l in run.last_output.splitlines()
                         if "communication:" in l), "")

        def same(name, ref, got):
            diff = [s for s in ref if got.get(s) != ref[s]]
            print(f"{name}: {len(ref)} steps, {len(diff)} differ")
            if diff or sorted(got) != sorted(ref):
                failures.append(f"{name}: steps {diff[:5]} differ (e.g. {[(ref[s], got.get(s)) for s in diff[:2]]})")

        def expect_line(want):
            line = comm_line()
            print(line)
            if want not in line:
                failures.append(f"expected '{want}' in the log's communication line: '{line}'")

        ref = run.train("depth_default", 2, common)
        expect_line("prefetch depth 1 (default for nvlink)")
        expect_line("gathers on the copy engines (default for nvlink)")
        expect_line("reduce-scatters on the copy engines (default for nvlink)")
        # An all-gather copies: on the copy engines or on NCCL's kernels, the same bits.
        same("gather_engine=sm vs the default", ref, run.train("gather_sm", 2, common + ["--dist.gather_engine=sm"]))
        expect_line("gathers on NCCL's kernels (dist.gather_engine)")
        # The default's reduce-scatters are a copy-engine all-to-all whose owner adds the two slices and rounds to
        # bf16: the one addition and rounding NCCL's kernel makes, so NCCL's kernels give the same bits, on any
        # number of CTAs (an explicit cap takes them under reduce_engine=auto).
        same("reduce_engine=sm vs the default", ref, run.train("reduce_sm", 2, common + ["--dist.reduce_engine=sm"]))
        expect_line("reduce-scatters on NCCL's kernels (dist.reduce_engine)")
        expect_line("block reduce-scatters on at most 4 CTAs (default for nvlink)")
        for c in (0, 1):
            same(f"reduce_scatter_ctas={c} vs the default", ref,
                 run.train(f"rs_ctas_{c}", 2, common + [f"--dist.reduce_scatter_ctas={c}"]))
        expect_line("block reduce-scatters on at most 1 CTAs (dist.reduce_scatter_ctas)")
        # Both copy engines' paths with the gathers on NCCL's kernels (the zero-CTA communicator then serves the
        # reduce-scatters alone).
        same("reduce_engine=copy, gather_engine=sm vs the default", ref,
             run.train("reduce_copy_gather_sm", 2, common + ["--dist.reduce_engine=copy", "--dist.gather_engine=sm"]))
        expect_line("reduce-scatters on the copy engines (dist.reduce_engine)")
        for d in (0, 3):
            same(f"prefetch_depth={d} vs the default", ref, run.train(f"depth_{d}", 2, common + [f"--dist.prefetch_depth={d}"]))
            expect_line(f"prefetch depth {d} (dist.prefetch_depth)")
        one_step = ["--train.dtype=bf16", "--train.steps=1"]
        run.train("pcie", 2, one_step, env={"NCCL_P2P_DISABLE": "1"})
        expect_line("prefetch depth 2 (default for pcie)")
        expect_line("block reduce-scatters on NCCL's choice of CTAs (default for pcie)")
        expect_line("gathers on NCCL's kernels (default for pcie)")
        # Copy-engine gathers asked for without peer-to-peer: refused before training, naming the key and the link.
        run.train("pcie_copy", 2, one_step + ["--dist.gather_engine=copy"], env={"NCCL_P2P_DISABLE": "1"}, expect_rc=2)
        if "dist.gather_engine = copy needs" not in run.last_output or "its link is pcie" not in run.last_output:
            failures.append("dist.gather_engine=copy without peer-to-peer was not refused with the key and the link")
        run.train("pcie_reduce_copy", 2, one_step + ["--dist.reduce_engine=copy"], env={"NCCL_P2P_DISABLE": "1"},
                  expect_rc=2)
        if "dist.reduce_engine = copy needs" not in run.last_output or "its link is pcie" not in run.last_output:
            failures.append("dist.reduce_engine=copy without peer-to-peer was not refused with the key and the link")
        run.train("network", 2, one_step, env=sockets, binary=wrapper)
        expect_line("prefetch depth 1 (default for network)")
        hyb = run.train("hybrid_default", 2, common + ["--dist.sharding=hybrid"], env=sockets, binary=wrapper)
        expect_line("all-reduce across nodes in buckets of one unit (default for network)")
        for b in ("0.5", "64"):
            same(f"hybrid dist.bucket_mb={b} vs the default", hyb,
                 run.train(f"hybrid_{b}", 2, common + ["--dist.sharding=hybrid", f"--dist.bucket_mb={b}"], env=sockets,
                           binary=wrapper))
    elif case == "hybrid-2x2":
        wrapper = os.path.join(work, "two_nodes_of_two.sh")
        with open(wrapper, "w") as f:
            f.write(f'#!/bin/sh\nexport SHARDTRAIN_NODE_ID="$(( ${{OMPI_COMM_WORLD_RANK:-0}} / 2 ))"\n'
                    f'exec {shardtrain} "$@"\n')
        os.chmod(wrapper, 0o755)
        common = ["--train.dtype=fp32", "--train.steps=30"]
        ref = run.train("full_4", 4, common)
        full_state = read_records(os.path.join(work, "full_4.jsonl"))[1]["mem_sharded_bytes"]
        sockets = {"NCCL_SHM_DISABLE": "1"}
        for extra in ([], ["--dist.bucket_mb=0.5"]):
            tag = "hybrid_2x2" + ("_bucket" if extra else "")
            got = run.train(tag, 4, common + ["--dist.sharding=hybrid"] + extra, env=sockets, binary=wrapper)
            compare(failures, f"hybrid 2 x 2 {' '.join(extra)} vs full over 4 GPUs (fp32)", ref, got, range(1, 31), 1e-5)
            state = read_records(os.path.join(work, f"{tag}.jsonl"))[1]["mem_sharded_bytes"]
            print(f"{tag}: sharded state {state} B per rank, full sharding {full_state} B")
            if not 1.9 * full_state <= state <= 2.1 * full_state:
                failures.append(f"{tag}: sharded state {state} B per rank, expected about twice full's {full_state} B")
    elif case == "fp8":
        common = ["--train.dtype=fp32", "--train.steps=30", "--train.fp8=tensorwise"]
        one = run.train("fp8_np1", 1, common)
        two = run.train("fp8_np2", 2, common)
        compare(failures, "2 GPUs vs 1 GPU (fp32, train.fp8=tensorwise)", one, two, range(1, 31), 1e-3)
        for dtype, steps in (("fp32", 30), ("bf16", 10)):
            args = [f"--train.dtype={dtype}", f"--train.steps={steps}", "--train.fp8=tensorwise"]
            plain = two if dtype == "fp32" else run.train("fp8_bf16_np2", 2, args)
            codes = run.train(f"fp8_gather_{dtype}_np2", 2, args + ["--dist.fp8_gather=true"])
            compare(failures, f"2 GPUs, dist.fp8_gather=true vs false ({dtype}): the same bits", plain, codes,
                    range(1, steps + 1), 0)
    elif case == "lora-hybrid":
        wrapper = workstations_wrapper(work, shardtrain)
        sockets = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}
        for base in ("bf16", "nf4"):
            common = ["--train.dtype=fp32", "--train.steps=20", "--lora.rank=4", "--lora.alpha=8",
                      f"--lora.base_dtype={base}"]
            ref = run.train(f"lora_{base}_full", 2, common)
            hyb = run.train(f"lora_{base}_hybrid", 2, common + ["--dist.sharding=hybrid"], env=sockets, binary=wrapper)
            compare(failures, f"LoRA ({base} base) hybrid over sockets vs full over NVLink (fp32)", ref, hyb,
                    range(1, 21), 1e-5)
    elif case == "async-kill":
        common = ["--train.dtype=fp32", "--train.steps=20", "--ckpt.every=5", "--ckpt.keep=0", "--ckpt.async=true"]
        straight = run.train("straight", 2, common + [f"--ckpt.dir={os.path.join(work, 'ckpt_straight')}"])
        d = os.path.join(work, "ckpt_killed")
        run.train("killed", 2, common + [f"--ckpt.dir={d}"], fault="ckpt_mid_write:1@10", expect_rc=None)
        if "SHARDTRAIN_FAULT: ckpt_mid_write on rank 1" not in run.last_output:
            failures.append("the injected kill did not fire:\n" + run.last_output[-2000:])
        failures += killed_save_failures(d, 10, 5)
        resumed = run.train("rerun", 2, common + [f"--ckpt.dir={d}"])
        expect_in_log(failures, "rerun", run.last_output, r"resumed from \S*step_00000005 \(step 5")
        failures += leftover_failures(d)
        if sorted(resumed) != list(range(6, 21)):
            failures.append(f"the rerun logged steps {sorted(resumed)}, expected 6..20")
        for step in sorted(resumed):
            if resumed[step] != straight.get(step):
                failures.append(f"step {step}: loss {resumed[step]!r} after the kill and resume, "
                                f"{straight.get(step)!r} straight through")
        print(f"async-kill: {len(resumed)} resumed steps compared with the uninterrupted run")
    elif case == "watchdog":
        run.train("watchdog", 2, ["--train.dtype=bf16", "--train.steps=8", "--dist.timeout_s=5"],
                  fault="sigstop:1@3", expect_rc=75)
        lines = [l for l in run.last_output.splitlines() if "watchdog: rank 0:" in l]
        print("\n".join(lines))
        if not any(re.search(r"watchdog: rank 0: [a-z_]+ #\d+ on communicator '[^']+' \(count \d+\) has not "
                             r"completed after \d+ s \(dist.timeout_s = 5\); last completed there: #\d+ [a-z_]+", l)
                   for l in lines):
            failures.append("no watchdog message naming the op, its sequence number and the last completed one")
    elif case == "memory-cap":
        cmd = [shardtrain, "train", "--config", os.path.join(os.path.dirname(config), "gpt2-124m.ini"),
               "--train.device=cuda", "--train.micro_batch=96", "--train.global_batch=96",
               "--dist.max_gpu_mem_gib=24", f"--data.path={run.data}", "--data.format=text", "--data.val_path=",
               "--model.vocab_size=256", "--ckpt.dir="]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        print(f"exit code {r.returncode}: " + r.stdout.strip().splitlines()[-1][:400])
        if r.returncode != 2:
            failures.append(f"exit code {r.returncode}, expected 2 (bad input)")
        # The smallest change that fits, as `shardtrain plan` finds it: 6 of the 12 blocks recomputed.
        for part in ("sharded state", "gather buffers", "activations", "workspace", "dist.max_gpu_mem_gib caps it at 24",
                     "it fits with --train.recompute=true --train.recompute_blocks=6"):
            if part not in r.stdout:
                failures.append(f"'{part}' missing from the error")
        if "step 1" in r.stdout or "step      1" in r.stdout:
            failures.append("training started before the memory check failed")
    elif case == "fp16-overflow":
        def final_weights(tag, steps, fault=None, extra=()):
            d = os.path.join(work, f"ckpt_{tag}")
            run.train(tag, 2, ["--train.dtype=fp16", f"--train.steps={steps}", f"--ckpt.dir={d}"] + list(extra),
                      fault=fault)
            os.makedirs(os.path.join(work, f"{tag}_export"))  # an export's config.json is new: a directory each
            out = os.path.join(work, f"{tag}_export", "model.safetensors")
            subprocess.run([shardtrain, "ckpt", "export", os.path.join(d, f"step_{steps:08d}"), "--out", out],
                           check=True, stdout=subprocess.DEVNULL)
            return out

        w3 = final_weights("fp16_fault", 3, fault="grad_inf:1@3")
        rec = read_records(os.path.join(work, "fp16_fault.jsonl"))
        w2 = final_weights("fp16_clean", 2)
        run.train("fp16_more", 2, ["--train.dtype=fp16", "--train.steps=4"], fault="grad_inf:1@3")
        more = read_records(os.path.join(work, "fp16_more.jsonl"))
        print("skipped per step:", {s: r["skipped"] for s, r in rec.items()},
              "loss scale per step:", {s: r["loss_scale"] for s, r in more.items()})
        if [rec[s]["skipped"] for s in (1, 2, 3)] != [False, False, True]:
            failures.append("step 3 was not skipped alone: " + str({s: r["skipped"] for s, r in rec.items()}))
        if [more[s]["loss_scale"] for s in (1, 2, 3, 4)] != [65536, 65536, 65536, 32768]:
            failures.append("loss scale did not halve after the overflow: " + str([more[s]["loss_scale"] for s in more]))
        w2b = final_weights("fp16_clean2", 2)
        # The skipped step with a speculative offloaded update already on its way: dropped, the device copy restored.
        w3s = final_weights("fp16_fault_spec", 3, fault="grad_inf:1@3",
                            extra=["--optim.offload=optimizer", "--optim.offload_speculative=true",
                                   "--optim.offload_threads=4"])
        for name, other in (("a second 2-step run", w2b), ("the run whose step 3 was skipped", w3),
                            ("the speculative offloaded run whose step 3 was skipped", w3s)):
            diff = max_abs_diff(w2, other)
            print(f"2-step run vs {name}: max |weight diff| {diff}")
            if diff != 0.0:
                failures.append(f"weights differ from {name} by up to {diff}")
    else:
        sys.exit(f"unknown case {case}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures[:20]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
