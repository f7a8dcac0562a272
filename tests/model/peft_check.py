#!/usr/bin/env python3
"""shardtrain's LoRA against Hugging Face PEFT, on the machine whose python3 has transformers and peft.

For a Llama (grouped-query attention, tied head) and a Qwen2 (q/k/v biases, untied head), each random-initialised
by transformers and saved with save_pretrained (F32): LoRA (rank 4, alpha 12, rsLoRA off; Llama on every linear
layer, Qwen2 on q, v, up, down) trained for 20 steps from that directory (init.from), then
  * `ckpt export --adapter`: peft.PeftModel.from_pretrained(base, DIR) on the transformers model of the same
    directory; its fp32 loss on the evaluation windows equals `shardtrain eval`'s on the checkpoint to 1e-5 relative;
  * `ckpt export --merged`: transformers' from_pretrained of the merged directory gives that loss too;
  * greedy `shardtrain generate` from the checkpoint equals PEFT's greedy generate, token for token.
Exits 77 (skipped) where transformers or peft is missing.

usage: peft_check.py SHARDTRAIN WORKDIR [--train.device=cpu|cuda]
"""
import json
import os
import re
import shutil
import subprocess
import sys

try:
    import numpy as np
    import peft
    import torch
    import transformers
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_check_util import run, write_tokens  # noqa: E402

shardtrain, work = sys.argv[1:3]
device = sys.argv[3:] or ["--train.device=cpu"]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
T, V, B = 32, 1000, 4
failures = []

CASES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, "all",
              dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=V, max_position_embeddings=64, rope_theta=500000.0,
                   rms_norm_eps=1e-5, tie_word_embeddings=True)),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, "q,v,up,down",
              dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=4, vocab_size=V, max_position_embeddings=64, rope_theta=1000000.0,
                   rms_norm_eps=1e-6, tie_word_embeddings=False)),
}


def eval_loss(model, stream):
    losses = []
    with torch.no_grad():
        for b in range(4):  # shardtrain eval's windows: row j of batch b starts at token (b*B + j)*T
            rows = torch.tensor([stream[(b * B + j) * T:(b * B + j) * T + T + 1] for j in range(B)])
            losses.append(model(input_ids=rows, labels=rows).loss.item())
    return sum(losses) / len(losses)


for name, (Config, Model, targets, fields) in CASES.items():
    torch.manual_seed(0)
    base_dir = os.path.join(work, name + "_base")
    Model(Config(**fields, attn_implementation="eager")).float().save_pretrained(base_dir, safe_serialization=True)
    gen = torch.Generator().manual_seed(1)
    stream = torch.randint(0, V, (4096,), generator=gen).tolist()
    data = os.path.join(work, name + "_tokens.bin")
    write_tokens(data, stream)
    ini = os.path.join(work, name + ".ini")
    with open(ini, "w") as f:  # no [model]: the model keys come from config.json
        f.write(f"[train]\nsteps = 20\nglobal_batch = 4\nmicro_batch = 4\neval_every = 0\nsample_tokens = 0\n"
                f"[optim]\nlr = 1e-2\nwarmup_steps = 2\n[data]\npath = {data}\nformat = llmc\nval_holdout = 0.1\n"
                f"[lora]\nrank = 4\nalpha = 12\ntargets = {targets}\n")
    ckpt = os.path.join(work, name + "_ckpt")
    run([shardtrain, "train", "--config", ini, f"--model.seq_len={T}", f"--init.from={base_dir}", *device,
         "--train.dtype=fp32", f"--ckpt.dir={ckpt}", "--ckpt.every=20"])
    step = os.path.join(ckpt, "step_00000020")
    adapter, merged = os.path.join(work, name + "_adapter"), os.path.join(work, name + "_merged")
    run([shardtrain, "ckpt", "export", step, "--adapter", adapter])
    run([shardtrain, "ckpt", "export", step, "--merged", merged])
    print(f"{name}: adapter_config.json " + json.dumps(json.load(open(os.path.join(adapter, "adapter_config.json")))))
    evaluated = run([shardtrain, "eval", "--ckpt", step, f"--data.path={data}", "--train.eval_batches=4", *device,
                     "--train.dtype=fp32"])
    ours = float(re.findall(r"loss ([0-9.]+)", evaluated)[-1])

    base = Model.from_pretrained(base_dir, torch_dtype=torch.float32, attn_implementation="eager").eval()
    plain = eval_loss(base, stream)
    adapted = peft.PeftModel.from_pretrained(base, adapter).eval()
    theirs = eval_loss(adapted, stream)
    merged_model = Model.from_pretrained(merged, torch_dtype=torch.float32, attn_implementation="eager").eval()
    merged_loss = eval_loss(merged_model, stream)
    print(f"{name}: shardtrain eval {ours:.7f}; PEFT {theirs:.7f}; merged {merged_loss:.7f}; base alone {plain:.7f}")
    for what, value in (("PEFT", theirs), ("merged export", merged_loss)):
        if abs(ours - value) > 1e-5 * abs(value):
            failures.append(f"{name} {what} loss {value} vs shardtrain eval {ours}")
    if abs(plain - theirs) < 1e-4 * abs(plain):
        failures.append(f"{name}: the adapter changed nothing (base {plain}, adapted {theirs})")

    prompt = stream[:12]
    r = subprocess.run([shardtrain, "generate", "--ckpt", step, "--prompt-ids", ",".join(map(str, prompt)),
                        "--max-tokens", "16", "--temperature", "0", *device, "--train.dtype=fp32"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"generate: exit code {r.returncode}\n{r.stderr}")
    got = [int(t) for t in r.stdout.strip().split(",")]  # the generated ids, comma-separated
    with torch.no_grad():
        ref = adapted.generate(input_ids=torch.tensor([prompt]), max_new_tokens=16, do_sample=False)[0].tolist()
    ref = ref[len(prompt):]
    print(f"{name} greedy: shardtrain {got}\n{' ' * len(name)}         PEFT       {ref}")
    if got != ref:
        failures.append(f"{name} greedy tokens differ: shardtrain {got}, PEFT {ref}")

if failures:
    print("FAILED:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("PEFT check OK")
