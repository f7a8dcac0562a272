#!/usr/bin/env python3
"""`shardtrain generate` beside transformers' `generate`, on the same weights and prompt, in one call on a GPU machine.

A llama-family shape (Llama-3.2-1B by default) is random-initialised by transformers in bf16 (its init, std 0.08)
and saved with save_pretrained into WORKDIR/model (kept: a second run reuses it). Then, batch 1, greedy, a prompt of
PROMPT random token ids and NEW new tokens:
  * transformers: generate() with the dynamic and with the static cache, in bf16 on the GPU; the median over REPEATS
    runs after a warm-up of the new tokens per second, prefill included (as transformers users see it);
  * shardtrain: `shardtrain generate --init.from WORKDIR/model --prompt-ids ... --temperature 0 --train.device=cuda
    --train.dtype=bf16`, REPEATS runs after one that warms the page cache: the time to first token (process start to
    the first id on stdout), the wall time, and the load, prefill and decode figures of its summary line; medians;
  * the number of leading tokens on which the two greedy outputs agree;
  * with --batch B > 1, shardtrain's `--prompts FILE --batch B` with B prompts of PROMPT ids, decoded together (its
    summary's decode rate over every sequence's tokens);
  * with --sample, both sides once more drawing their tokens (temperature 0.8, top-k 50; transformers with its static
    cache);
  * with --ckpt, the same from a shardtrain checkpoint: WORKDIR/ckpt-SHAPE is made once by one training step at
    lr 1e-12 from the saved model (`shardtrain train --config configs/SHAPE.ini --init.from ...` on random tokens),
    then `shardtrain generate --ckpt` from its step: the time to first token and decode rate, and whether its greedy
    tokens equal those from the directory (printed after the main table);
  * with --profile, shardtrain's decoding steps under Nsight Compute (ncu on the PATH or in /usr/local/cuda/bin;
    caches and clocks left as they run): each kernel's share of the GPU time, launches, microseconds a launch and DRAM
    throughput, over PROFILE_LAUNCHES kernels from the 3000th launch on (past the prompt and the first steps).
Prints one table (markdown) on stdout, then the profile's.

usage: generate_bench.py SHARDTRAIN WORKDIR [--shape llama3.2-1b] [--prompt 128] [--new 256] [--repeats 3]
                         [--batch 32] [--sample] [--ckpt] [--profile] [--profile-launches 400]
"""
import argparse
import json
import os
import collections
import csv
import io
import re
import shutil
import statistics
import subprocess
import sys
import time

import torch
import transformers

SHAPES = {
    "llama3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
                        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                        rms_norm_eps=1e-5, tie_word_embeddings=True),
    "llama3.2-3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
                        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
                        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                        rms_norm_eps=1e-5, tie_word_embeddings=True),
    "llama3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                        rms_norm_eps=1e-5, tie_word_embeddings=False),
}

ap = argparse.ArgumentParser()
ap.add_argument("shardtrain")
ap.add_argument("workdir")
ap.add_argument("--shape", default="llama3.2-1b", choices=sorted(SHAPES))
ap.add_argument("--prompt", type=int, default=128)
ap.add_argument("--new", type=int, default=256)
ap.add_argument("--repeats", type=int, default=3)
ap.add_argument("--batch", type=int, default=1)
ap.add_argument("--seq-len", type=int, default=2048)
ap.add_argument("--sample", action="store_true")
ap.add_argument("--ckpt", action="store_true")
ap.add_argument("--profile", action="store_true")
ap.add_argument("--profile-launches", type=int, default=400)
args = ap.parse_args()
SAMPLE = dict(temperature=0.8, top_k=50)

model_dir = os.path.join(args.workdir, "model-" + args.shape)
os.makedirs(args.workdir, exist_ok=True)
torch.manual_seed(1234)
# initializer_range 0.08 rather than 0.02: logits peaked enough that bf16 rounding rarely flips a greedy choice.
config = transformers.LlamaConfig(**SHAPES[args.shape], initializer_range=0.08)
if not os.path.exists(os.path.join(model_dir, "config.json")):
    t0 = time.time()
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(model_dir)
    print(f"# saved {args.shape} to {model_dir} in {time.time() - t0:.1f} s", file=sys.stderr)
else:
    model = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda()
model.eval()
model.generation_config.eos_token_id = None  # random weights: every run generates all NEW tokens
model.generation_config.bos_token_id = None
gen = torch.Generator().manual_seed(7)
prompts = torch.randint(0, config.vocab_size, (max(1, args.batch), args.prompt), generator=gen)
prompt = prompts[0].tolist()


def hf_generate(cache, sample=False):
    ids = torch.tensor([prompt], device="cuda")
    kw = dict(max_new_tokens=args.new, do_sample=sample, pad_token_id=0, **(SAMPLE if sample else {}))
    if cache == "static":
        kw["cache_implementation"] = "static"
    with torch.no_grad():
        out = model.generate(ids, **kw)  # warm-up (and the static cache's allocation)
        rates = []
        for _ in range(args.repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model.generate(ids, **kw)
            torch.cuda.synchronize()
            rates.append(args.new / (time.perf_counter() - t0))
    return statistics.median(rates), out[0, len(prompt):].tolist()


rows = []
hf_tokens = None
for cache in ("dynamic", "static"):
    rate, tokens = hf_generate(cache)
    hf_tokens = hf_tokens or tokens
    rows.append((f"transformers {cache} cache", "", "", "", f"{rate:,.1f}", ""))
if args.sample:
    rate, _ = hf_generate("static", sample=True)
    rows.append(("transformers static cache, sampled", "", "", "", f"{rate:,.1f}", ""))
# The same weights in fp32 on both sides: the greedy tokens must agree (bf16 may part where two logits nearly tie).
# The reference is a fresh model read from the directory in fp32, TF32 off, not the bf16 one converted in place after
# its static-cache runs (bench/results/2026-12-05-h200-generate.md says why).
del model
torch.cuda.empty_cache()
torch.backends.cuda.matmul.allow_tf32 = False
model = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
model.generation_config.eos_token_id = None
model.generation_config.bos_token_id = None
with torch.no_grad():
    hf_fp32 = model.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=32, do_sample=False,
                             pad_token_id=0)[0, len(prompt):].tolist()
    first_logits = model(torch.tensor([prompt], device="cuda")).logits[0, -1].float().cpu()
del model
torch.cuda.empty_cache()

SUMMARY = re.compile(r"load ([\d.]+) s, prefill (\d+) tokens in ([\d.]+) s \(([\d.]+) tokens/s\), decode (\d+) tokens "
                     r"in ([\d.]+) s \(([\d.]+) tokens/s\)")


def ours_command(extra, dtype="bf16", new=None, sample=False):
    how = ["--temperature", str(SAMPLE["temperature"]), "--top-k", str(SAMPLE["top_k"])] if sample else \
        ["--temperature", "0"]
    return [args.shardtrain, "generate", "--init.from", model_dir, "--max-tokens", str(new or args.new)] + how + \
        ["--train.device=cuda", f"--train.dtype={dtype}", f"--model.seq_len={args.seq_len}"] + extra


def ours(extra, dtype="bf16", new=None, sample=False):
    """One run from the directory: see timed_run."""
    return timed_run(ours_command(extra, dtype, new, sample))


def timed_run(cmd):
    """One `shardtrain generate` run: (time to first token, wall, load, prefill s, decode tok/s, tokens, stderr)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = p.stdout.read(1)
    ttft = time.perf_counter() - t0
    rest = p.stdout.read()  # the rest from the same buffered reader (communicate() would skip what it buffered)
    err = p.stderr.read().decode()
    p.wait()
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{err}")
    m = SUMMARY.search(err)
    if not m:
        sys.exit(f"no summary line in:\n{err}")
    text = (first + rest).decode()
    return ttft, wall, float(m.group(1)), float(m.group(3)), float(m.group(7)), text, err


single = ["--prompt-ids", ",".join(map(str, prompt))]
ours(single)  # warms the page cache
runs = [ours(single) for _ in range(args.repeats)]
med = lambda i: statistics.median(r[i] for r in runs)  # noqa: E731


def agreement(text, reference):
    tokens = [int(t) for t in re.split(r"[,\s]+", text.strip()) if t]
    same = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))
    return f"{same}/{len(reference)}"


agree = agreement(runs[0][5], hf_tokens)
ours32 = ours(single, "fp32", 32)[5]
agree32 = agreement(ours32, hf_fp32)
top = torch.topk(first_logits, 5)
mine = int(re.split(r"[,\s]+", ours32.strip())[0])
print(f"# fp32 first position: transformers' top 5 {top.indices.tolist()} {[round(v, 4) for v in top.values.tolist()]};"
      f" shardtrain's token {mine}, transformers' logit for it {first_logits[mine].item():.4f}, rank "
      f"{int((first_logits > first_logits[mine]).sum())}")
rows.append(("shardtrain generate", f"{med(0):.2f}", f"{med(1):.2f}", f"{med(2):.2f}", f"{med(4):,.1f}",
             f"{agree} (fp32: {agree32})"))
if args.sample:
    sampled = [ours(single, sample=True) for _ in range(args.repeats)]
    rows.append(("shardtrain generate, sampled", f"{statistics.median(r[0] for r in sampled):.2f}",
                 f"{statistics.median(r[1] for r in sampled):.2f}", f"{statistics.median(r[2] for r in sampled):.2f}",
                 f"{statistics.median(r[4] for r in sampled):,.1f}", ""))
if args.batch > 1:
    path = os.path.join(args.workdir, "prompts.jsonl")
    with open(path, "w") as f:
        for p in prompts.tolist():
            f.write(json.dumps({"prompt_ids": p}) + "\n")
    batch_runs = [ours(["--prompts", path, "--jsonl", "--batch", str(args.batch)]) for _ in range(args.repeats)]
    rows.append((f"shardtrain generate, {args.batch} prompts", "",
                 f"{statistics.median(r[1] for r in batch_runs):.2f}", "",
                 f"{statistics.median(r[4] for r in batch_runs):,.1f}", ""))
print(f"\n{args.shape}, bf16, batch 1 unless named, {args.prompt}-token prompt, {args.new} new tokens, greedy; "
      f"medians of {args.repeats}; {torch.cuda.get_device_name()}\n")
print("| generator | first token s | wall s | load s | decode tok/s | greedy tokens equal |")
print("|---|---|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(r) + " |")
print("\nshardtrain's summary line:\n" + runs[0][6].strip().splitlines()[-1])


def from_checkpoint():
    """generate from a checkpoint of the same weights: its first token, decode rate and greedy agreement."""
    ckpt_dir = os.path.join(args.workdir, "ckpt-" + args.shape)
    step = os.path.join(ckpt_dir, "step_00000001")
    if not os.path.exists(os.path.join(step, "manifest.json")):
        tokens = os.path.join(args.workdir, "tokens.bin")  # llm.c's shard format, ids below 65536
        header = [20240520, 1, 1 << 20] + [0] * 253
        ids = torch.randint(0, 65536, (1 << 20,), generator=torch.Generator().manual_seed(3), dtype=torch.int32)
        with open(tokens, "wb") as f:
            f.write(torch.tensor(header, dtype=torch.int32).numpy().tobytes())
            f.write(ids.to(torch.int32).numpy().astype("uint16").tobytes())
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        cmd = [args.shardtrain, "train", "--config", os.path.join(root, "configs", args.shape + ".ini"),
               "--init.from", model_dir, "--train.device=cuda", "--train.dtype=bf16", "--train.steps=1",
               "--train.micro_batch=1", "--train.global_batch=1", f"--model.seq_len={args.seq_len}",
               "--optim.lr=1e-12", "--optim.min_lr=0", "--optim.warmup_steps=0", "--optim.weight_decay=0",
               f"--data.path={tokens}", "--data.format=llmc", "--data.val_path=", "--data.val_holdout=0.01",
               f"--ckpt.dir={ckpt_dir}"]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-3000:]}")
        print(f"# made {step} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    cmd = [args.shardtrain, "generate", "--ckpt", step, "--max-tokens", str(args.new), "--temperature", "0",
           "--train.device=cuda", "--train.dtype=bf16", "--prompt-ids", ",".join(map(str, prompt))]
    timed_run(cmd)  # warms the page cache
    timed = [timed_run(cmd) for _ in range(args.repeats)]
    same = agreement(timed[0][5], [int(t) for t in re.split(r"[,\s]+", runs[0][5].strip()) if t])
    print(f"\nfrom the checkpoint (`generate --ckpt`), medians of {args.repeats}:\n")
    print("| generator | first token s | load s | decode tok/s | greedy tokens equal to the directory's |")
    print("|---|---|---|---|---|")
    print(f"| shardtrain generate --ckpt | {statistics.median(t[0] for t in timed):.2f} | "
          f"{statistics.median(t[2] for t in timed):.2f} | {statistics.median(t[4] for t in timed):,.1f} | {same} |")
    print("\nits summary line:\n" + timed[0][6].strip().splitlines()[-1])


def short_name(kernel):
    """`gemv_kernel<8, true, __nv_bfloat16>` from ncu's demangled signature."""
    name, depth = "", 0
    for ch in re.sub(r"^void ", "", kernel.replace("(anonymous namespace)::", "")):
        if ch == "(" and depth == 0:
            break
        depth += (ch == "<") - (ch == ">")
        name += ch
    return re.sub(r"^[\w:]*::", "", name)[:70]


def profile():
    """Per-kernel table of shardtrain's decoding steps under ncu."""
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    metrics = "gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed"
    cmd = [ncu, "--csv", "--cache-control", "none", "--clock-control", "none", "--metrics", metrics, "--launch-skip",
           "3000", "--launch-count", str(args.profile_launches)] + ours_command(single, new=64)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    time_ns, launches, dram = collections.Counter(), collections.Counter(), collections.defaultdict(list)
    header = None
    for r in csv.reader(io.StringIO(p.stdout)):
        if "Kernel Name" in r:
            header = r
            continue
        if header is None or len(r) != len(header):
            continue
        d = dict(zip(header, r))
        name = short_name(d["Kernel Name"])
        value = float(d["Metric Value"].replace(",", ""))
        if d["Metric Name"] == "gpu__time_duration.sum":
            time_ns[name] += value
            launches[name] += 1
        else:
            dram[name].append(value)
    total = sum(time_ns.values())
    print(f"\nncu, {sum(launches.values())} kernels of the decoding steps ({total / 1e3:,.1f} us of GPU time):\n")
    print("| kernel | share | launches | us a launch | DRAM % |")
    print("|---|---|---|---|---|")
    for name, t in time_ns.most_common(14):
        print(f"| `{name}` | {100 * t / total:.1f}% | {launches[name]} | {t / launches[name] / 1e3:.1f} | "
              f"{statistics.mean(dram[name]) if dram[name] else 0:.0f} |")


if args.ckpt:
    from_checkpoint()
if args.profile:
    profile()
