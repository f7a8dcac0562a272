#!/usr/bin/env python3
"""`shardtrain generate --split layers`: a model's layers split over the ranks print exactly what one rank prints.

  generate_split_test.py SHARDTRAIN MPIRUN WORKDIR CONFIG NP
  generate_split_test.py SHARDTRAIN MPIRUN WORKDIR CONFIG 2 --cuda GPU_COUNT

Trains CONFIG (a byte-level gpt2 or llama, model.seq_len 32) for 3 steps into a checkpoint and exports its weights
(gpt2: a GPT-2 file; llama: a Hugging Face directory), then trains a LoRA checkpoint on those weights. For each source
(the checkpoint, the export read as --init.from, the LoRA checkpoint), `generate` on one rank without a split and
under `mpirun -np NP --split layers` prints the same text, sampled (temperature 0.8, top-k 20, seed 5) and greedy, for
one prompt of 70 tokens (past model.seq_len: the window slides) and for a --prompts batch of 4 prompts decoded 3 at a
time; the split run exits 0, prints one summary line (rank 0's, which says the layers were split over NP ranks) and
logs the stages. A model with fewer blocks than NP ranks is refused (exit 2), naming model.n_layer.

With --cuda (2 GPUs; exits 77, which ctest reports as skipped, on fewer): the same comparison on train.device=cuda,
one GPU against two split ranks, for the checkpoint in fp32 and bf16, and for the export and the LoRA checkpoint in
bf16, greedy; then (gpt2's run) a GPT-2 124M-shaped model (byte vocabulary) under
dist.max_gpu_mem_gib caps read off the refusals: a cap the whole decoder passes the stages' and not its own makes
`--split auto` split (the text is one uncapped GPU's), and one rank alone refuses it; a cap below the largest stage is
refused with each stage's breakdown. Exits 0 when every check holds.
"""
import os
import re
import shutil
import subprocess
import sys

failures = []


def check(cond, what):
    if not cond:
        print("FAIL:", what)
        failures.append(what)


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


def main():
    shardtrain, mpirun, work, config, np = sys.argv[1:6]
    cuda = len(sys.argv) > 6 and sys.argv[6] == "--cuda"
    if cuda:
        gpus = int(subprocess.run([sys.argv[7]], stdout=subprocess.PIPE, text=True).stdout.strip() or 0)
        if gpus < 2:
            print(f"skipped: {gpus} GPU(s), the split needs 2")
            return 77
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    mpi = [mpirun, "--oversubscribe", "-np", np, "--bind-to", "none", "--mca", "btl", "self,vader"]
    llama = "llama" in os.path.basename(config)
    train = [shardtrain, "train", "--config", config, "--train.steps=3", "--model.seq_len=32",
             "--train.micro_batch=2", "--train.global_batch=4", "--train.eval_batches=1", "--train.sample_tokens=0"]

    # The sources: a checkpoint, its weights exported and read as init.from, a LoRA checkpoint on those.
    ckpt = os.path.join(work, "ckpt")
    base = os.path.join(work, "base" if llama else "base.h5")
    rc, out, err = run(train + ["--ckpt.dir=" + ckpt] + ([] if llama else ["--ckpt.export=" + base]))
    check(rc == 0, f"training exits 0: {out}{err}")
    step = os.path.join(ckpt, "step_00000003")
    if llama:
        rc, out, err = run([shardtrain, "ckpt", "export", step, "--out", base])
        check(rc == 0, f"the export exits 0: {out}{err}")
    lora = os.path.join(work, "lora")
    rc, out, err = run(train + ["--ckpt.dir=" + lora, "--init.from=" + base, "--lora.rank=4"])
    check(rc == 0, f"LoRA training exits 0: {out}{err}")
    sources = [["--ckpt", step], ["--init.from", base, "--model.seq_len=32"],
               ["--ckpt", os.path.join(lora, "step_00000003")]]
    prompts = os.path.join(work, "prompts.txt")
    with open(prompts, "w") as f:
        f.write("The \nOnce upon a time\nA\nWhat is it that\n")
    samplings = {"sampled": ["--temperature", "0.8", "--top-k", "20", "--seed", "5"], "greedy": ["--temperature", "0"]}
    forms = {"one prompt": ["--prompt", "The ", "--max-tokens", "70"],
             "a batch": ["--prompts", prompts, "--batch", "3", "--max-tokens", "40"]}
    dtypes = [["--train.device=cuda", "--train.dtype=fp32"], ["--train.device=cuda", "--train.dtype=bf16"]] if cuda \
        else [[]]
    # On GPUs the checkpoint in both dtypes and both samplings; the export (read in the decoder's own 16 bits) and the
    # LoRA checkpoint (merged as its units are handed over) in bf16, greedy.
    combos = [(source, device, sname) for source in sources for device in dtypes for sname in samplings
              if not cuda or source is sources[0] or (device[-1].endswith("bf16") and sname == "greedy")]
    for source, device, sname in combos:
        sampling = samplings[sname]
        for fname, form in forms.items():
            name = f"{' '.join(source + device)}, {sname}, {fname}"
            gen = [shardtrain, "generate"] + source + form + sampling + device
            rc1, one, err1 = run(gen)
            check(rc1 == 0 and len(one) > 40, f"{name}, 1 rank: exit 0 and text: {one!r} {err1}")
            rc2, split, err2 = run(mpi + gen + ["--split", "layers"])
            check(rc2 == 0, f"{name}, {np} split ranks: exit 0: {split!r} {err2}")
            check(split == one, f"{name}: {np} split ranks print the 1-rank text: {split!r} vs {one!r}")
            check(err2.count("generate: ") == 2 and f"its layers split over {np} ranks: load" in err2,
                  f"{name}: one summary line, rank 0's, saying the layers were split: {err2}")
            check(f"generate: the layers split over {np} ranks: rank 0: embedding .. block." in err2,
                  f"{name}: rank 0 logs the stages: {err2}")
            if "one prompt" in fname:
                check("the context slid" in err1, f"{name}: 70 tokens slide the window of 32: {err1}")

    # Fewer blocks than ranks: every rank refuses, naming the layer count.
    small = os.path.join(work, "small")
    rc, out, err = run(train + ["--model.n_layer=1", "--ckpt.dir=" + small])
    check(rc == 0, f"training a 1-layer model exits 0: {out}{err}")
    rc, out, err = run(mpi + [shardtrain, "generate", "--ckpt", os.path.join(small, "step_00000003"), "--prompt", "A",
                              "--split", "layers"] + dtypes[0])
    refused = f"a layer split over {np} ranks needs a block for each, and this model has 1 (model.n_layer 1)"
    check(rc == 2 and refused in err, f"1 block on {np} ranks: exit 2, refused naming the layers: {rc} {err}")

    if cuda and not llama:
        auto_split(shardtrain, mpi, work)
    if failures:
        return 1
    print(f"ok: {np} ranks with the layers split print one rank's text{' on cuda' if cuda else ''}")
    return 0


def needs(err, pattern):
    m = re.search(pattern, err)
    return float(m.group(1)) if m else None


def auto_split(shardtrain, mpi, work):
    """A GPT-2 124M-shaped model (byte vocabulary) under dist.max_gpu_mem_gib caps read off the refusals."""
    ckpt = os.path.join(work, "gpt2")
    shape = ["--model.n_layer=12", "--model.n_head=12", "--model.n_embd=768", "--model.vocab_size=256",
             "--model.seq_len=1024"]
    rc, out, err = run([shardtrain, "train"] + shape + ["--train.device=cuda", "--train.steps=1",
                                                        "--train.micro_batch=1", "--train.global_batch=1",
                                                        "--train.eval_batches=1", "--train.sample_tokens=0",
                                                        "--ckpt.dir=" + ckpt])
    check(rc == 0, f"training the 124M shape on a GPU exits 0: {out}{err}")
    gen = [shardtrain, "generate", "--ckpt", os.path.join(ckpt, "step_00000001"), "--prompt", "The ",
           "--max-tokens", "30", "--temperature", "0", "--train.device=cuda", "--train.dtype=fp32"]
    tiny = ["--dist.max_gpu_mem_gib=0.1"]
    rc, _, err = run(gen + tiny + ["--split", "none"])
    whole = needs(err, r"a decoder of 1 sequence\(s\) of 1024 positions needs ([0-9.]+) GiB")
    rc2, _, err2 = run(mpi + gen + tiny + ["--split", "layers"])
    stage = needs(err2, r"split over 2 GPUs needs ([0-9.]+) GiB on its largest stage \(rank 0 \(embedding \.\. ")
    check(rc == 2 and rc2 == 2 and whole and stage and stage + 0.05 < whole,
          f"the refusals give the whole decoder's and the largest stage's needs: {whole} {stage}: {err} {err2}")
    if not (whole and stage):
        return
    cap = [f"--dist.max_gpu_mem_gib={(whole + stage) / 2:.4f}"]
    rc, want, err = run(gen)
    check(rc == 0 and len(want) > 30, f"one uncapped GPU exits 0: {want!r} {err}")
    rc, got, err = run(mpi + gen + cap)
    check(rc == 0 and got == want, f"under {cap}, auto splits on 2 GPUs and prints one GPU's text: {got!r} {err}")
    check("its layers split over 2 ranks" in err, f"under {cap}, the summary says it split: {err}")
    rc, _, err = run(gen + cap)
    check(rc == 2 and "needs" in err, f"under {cap}, one GPU alone refuses the whole decoder: {rc} {err}")
    below = [f"--dist.max_gpu_mem_gib={stage - 0.05:.4f}"]
    rc, _, err = run(mpi + gen + below)
    check(rc == 2 and "on its largest stage (rank 0 (embedding .. block." in err and "; rank 1 (block." in err,
          f"under {below}, 2 GPUs refuse the split with each stage's breakdown: {rc} {err}")


if __name__ == "__main__":
    sys.exit(main())
