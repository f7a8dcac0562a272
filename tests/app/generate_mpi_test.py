#!/usr/bin/env python3
"""`shardtrain generate` under mpirun: every rank decodes, rank 0 prints, and the text is one process's.

  generate_mpi_test.py SHARDTRAIN MPIRUN WORKDIR CONFIG

Trains CONFIG (a byte-level model) for 3 steps twice, on 1 rank and on 2 ranks, each into a checkpoint. For each
checkpoint, `generate` with sampling (temperature 0.8, top-k 20, seed 5) and greedy, on 1 rank and under
`mpirun -np 2`: the 2-rank run exits 0 (every rank checks that it generated rank 0's tokens, and a rank that did not
fails the run) and prints exactly the 1-rank run's text, from a checkpoint read at the world size that wrote it and at
another; rank 0 logs that it loaded the checkpoint (a read, not a resume). The same for the first run's exported
weights read as --init.from, and for a LoRA checkpoint on them (rank 0 alone hashes the base). A --prompts batch of 3
prompts, as lines and as JSON lines with a stop string, prints on 2 ranks the 1-rank results. With the base replaced
by other weights, both ranks refuse it (exit 2, the file named once, by rank 0's message on each). Exits 0 when every
check holds.
"""
import os
import shutil
import subprocess
import sys


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


failures = []


def check(cond, what):
    if not cond:
        print("FAIL:", what)
        failures.append(what)


def main():
    shardtrain, mpirun, work, config = sys.argv[1:5]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    mpi = [mpirun, "--oversubscribe", "-np", "2", "--bind-to", "none", "--mca", "btl", "self,vader"]
    train = ["train", "--config", config, "--train.steps=3", "--model.seq_len=32", "--train.micro_batch=2",
             "--train.global_batch=4", "--train.eval_batches=1", "--train.sample_tokens=0"]
    base = os.path.join(work, "base.h5")
    sources = []  # (the --ckpt or --init.from arguments, what rank 0 logs of the load, once)
    for writers in (1, 2):
        ckpt = os.path.join(work, f"ckpt{writers}")
        prefix = mpi if writers == 2 else []
        export = ["--ckpt.export=" + base] if writers == 1 else []
        rc, out, err = run(prefix + [shardtrain] + train + ["--ckpt.dir=" + ckpt] + export)
        check(rc == 0, f"training on {writers} rank(s) exits 0: {out}{err}")
        step = os.path.join(ckpt, "step_00000003")
        sources.append((["--ckpt", step], lambda ranks, step=step, writers=writers:
                        f"checkpoint: loaded step 3 from {step} (written by {writers} rank(s), read by {ranks})\n"))
    sources.append((["--init.from", base, "--model.seq_len=32"],
                    lambda ranks: f"init.from: weights loaded from {base}\n"))
    lora = os.path.join(work, "lora")
    rc, out, err = run([shardtrain] + train + ["--ckpt.dir=" + lora, "--init.from=" + base, "--lora.rank=4"])
    check(rc == 0, f"LoRA training exits 0: {out}{err}")
    lora_step = os.path.join(lora, "step_00000003")
    sources.append((["--ckpt", lora_step], lambda ranks: f"checkpoint: LoRA base read from {base} (1 file(s)"))
    for source, logged in sources:
        for name, flags in (("sampled", ["--temperature", "0.8", "--top-k", "20", "--seed", "5"]),
                            ("greedy", ["--temperature", "0"])):
            name = f"{' '.join(source)}, {name}"
            gen = [shardtrain, "generate"] + source + ["--prompt", "The ", "--max-tokens", "60"] + flags
            rc1, one, err1 = run(gen)
            check(rc1 == 0 and len(one) > 60, f"{name}, 1 rank: exit 0 and 60 bytes of text: {one!r} {err1}")
            rc2, two, err2 = run(mpi + gen)
            check(rc2 == 0, f"{name}, 2 ranks: exit 0: {two!r} {err2}")
            check(two == one, f"{name}: 2 ranks print the 1-rank text: {two!r} vs {one!r}")
            check(err2.count("generate: ") == 1, f"{name}: one summary line, from rank 0: {err2}")
            for ranks, err in ((1, err1), (2, err2)):
                check(err.count(logged(ranks)) == 1 and "resumed from" not in err,
                      f"{name}, {ranks} rank(s): the log says it loaded the weights, once: {err}")
    # A batch: a prompts file, a result a line and as JSON lines with a stop string, on 2 ranks as on 1 (the ranks
    # check every token of every sequence together, and agree on where each one stops).
    prompts = os.path.join(work, "prompts.txt")
    with open(prompts, "w") as f:
        f.write("The \nOnce upon a time\n\nA\n")
    for extra in ([], ["--jsonl", "--stop", "e"]):
        gen = [shardtrain, "generate", "--ckpt", sources[0][0][1], "--prompts", prompts, "--max-tokens", "40",
               "--temperature", "0.8", "--seed", "9"] + extra
        name = "--prompts " + " ".join(extra)
        rc1, one, err1 = run(gen)
        check(rc1 == 0 and one.count("\n") == 3, f"{name}, 1 rank: exit 0 and 3 result lines: {one!r} {err1}")
        rc2, two, err2 = run(mpi + gen)
        check(rc2 == 0, f"{name}, 2 ranks: exit 0: {two!r} {err2}")
        check(two == one, f"{name}: 2 ranks print the 1-rank results: {two!r} vs {one!r}")
    check('"finish_reason":"stop"' in one, f"a stop string ended a result: {one!r}")
    # The base replaced by other weights: rank 0 finds it, and both ranks stop with its message.
    os.remove(base)
    rc, out, err = run([shardtrain] + train + ["--train.seed=7", "--ckpt.export=" + base])
    check(rc == 0, f"training the other base exits 0: {out}{err}")
    rc, out, err = run(mpi + [shardtrain, "generate", "--ckpt", lora_step, "--prompt", "The "])
    changed = f"the base file base.h5 in init.from {base} changed"
    check(rc == 2 and err.count(changed) == 2, f"a changed base: exit 2, named by both ranks: {rc} {err}")
    if failures:
        return 1
    print("ok: generate on 2 ranks prints the 1-rank text (sampled and greedy), from checkpoints of 1 and 2 ranks, "
          "init.from and a LoRA checkpoint, and a batch's results; a changed base stops both ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
