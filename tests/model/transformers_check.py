#!/usr/bin/env python3
"""shardtrain against Hugging Face transformers on the llama family, on a GPU machine.

For a Llama (grouped-query attention, llama3 RoPE scaling, tied head) and a Qwen2 (q/k/v biases, untied head), each
random-initialised by transformers and saved with save_pretrained (F32, and BF16):
  * logits: shardtrain initialised from the F32 directory (init.from) on cuda in fp32, and on cpu, against
    transformers' fp32 logits on the same tokens: max|diff| <= 1e-4 x max|logits|;
  * bf16: shardtrain from the BF16 directory in bf16 on cuda against transformers' model in bf16 on the GPU: the
    mean cross-entropy of the two sets of logits to 1e-2 relative;
  * train, export, load: 20 steps on cuda in fp32 from the F32 directory, the checkpoint exported (`ckpt export
    --dtype f32`), loaded by transformers' from_pretrained; its loss on the evaluation windows equals `shardtrain
    eval`'s on the same checkpoint to 1e-5 relative.
Exits 77 (skipped) where transformers or a CUDA device is missing.

usage: transformers_check.py SHARDTRAIN LOGITS_DUMP WORKDIR
"""
import json
import os
import re
import shutil
import subprocess
import sys

try:
    import numpy as np
    import torch
    import transformers
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)
if not torch.cuda.is_available():
    print("skipped: no CUDA device")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_check_util import run, write_tokens  # noqa: E402

shardtrain, logits_dump, work = sys.argv[1:4]
# Every run starts from an empty WORKDIR: a second run would otherwise resume the first's checkpoint (ckpt.resume=auto,
# nothing left to train) and export into its non-empty directory, which `ckpt export` refuses.
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
T, V = 32, 1000
failures = []

CASES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
              dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=V, max_position_embeddings=64, rope_theta=500000.0,
                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                   rms_norm_eps=1e-5, tie_word_embeddings=True)),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=4, vocab_size=V, max_position_embeddings=64, rope_theta=1000000.0,
                   rms_norm_eps=1e-6, tie_word_embeddings=False)),
}


def ours_logits(config, tokens, *overrides):
    out = os.path.join(work, "logits.f32")
    run([logits_dump, "--config", config, "--tokens", ",".join(map(str, tokens)), "--out", out, *overrides])
    return torch.tensor(np.fromfile(out, dtype=np.float32).reshape(len(tokens), V), dtype=torch.float64)


def ce(logits, tokens):
    return torch.nn.functional.cross_entropy(logits[:-1].double(), torch.tensor(tokens[1:])).item()


for name, (Config, Model, fields) in CASES.items():
    torch.manual_seed(0)
    model = Model(Config(**fields, attn_implementation="eager")).float().eval()
    f32_dir, bf16_dir = os.path.join(work, name + "_f32"), os.path.join(work, name + "_bf16")
    model.save_pretrained(f32_dir, safe_serialization=True)
    saved = json.load(open(os.path.join(f32_dir, "config.json")))
    print(f"{name}: transformers {transformers.__version__} wrote RoPE as " +
          ", ".join(f"{k}={saved[k]}" for k in ("rope_theta", "rope_scaling", "rope_parameters") if k in saved))
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, V, (T,), generator=gen).tolist()
    with torch.no_grad():  # before the bf16 copy below rounds the weights
        ref = model(torch.tensor([tokens])).logits[0].double()
    model.to(torch.bfloat16).save_pretrained(bf16_dir, safe_serialization=True)
    stream = torch.randint(0, V, (4096,), generator=gen).tolist()
    data = os.path.join(work, name + "_tokens.bin")
    write_tokens(data, stream)
    ini = os.path.join(work, name + ".ini")
    with open(ini, "w") as f:  # no [model]: the model keys come from config.json
        f.write(f"[train]\nsteps = 20\nglobal_batch = 4\nmicro_batch = 4\neval_every = 0\nsample_tokens = 0\n"
                f"[optim]\nlr = 1e-3\nwarmup_steps = 2\n[data]\npath = {data}\nformat = llmc\nval_holdout = 0.1\n")
    common = [f"--model.seq_len={T}", f"--init.from={f32_dir}"]

    scale = ref.abs().max().item()
    for device in ("cuda", "cpu"):
        got = ours_logits(ini, tokens, *common, f"--train.device={device}", "--train.dtype=fp32")
        err = (got - ref).abs().max().item() / scale
        print(f"{name} {device} fp32 logits: max|diff| / max|logits| = {err:.2e}")
        if err > 1e-4:
            failures.append(f"{name} {device} fp32 logits: {err:.2e} > 1e-4")

    with torch.no_grad():
        ref16 = model.cuda()(torch.tensor([tokens]).cuda()).logits[0].double().cpu()  # bf16 weights, bf16 compute
    got16 = ours_logits(ini, tokens, f"--model.seq_len={T}", f"--init.from={bf16_dir}", "--train.device=cuda",
                        "--train.dtype=bf16")
    l_ref, l_got = ce(ref16, tokens), ce(got16, tokens)
    print(f"{name} bf16 loss: shardtrain {l_got:.5f} transformers {l_ref:.5f}")
    if abs(l_got - l_ref) > 1e-2 * abs(l_ref):
        failures.append(f"{name} bf16 loss: shardtrain {l_got} transformers {l_ref}")

    ckpt = os.path.join(work, name + "_ckpt")
    run([shardtrain, "train", "--config", ini, *common, "--train.device=cuda", "--train.dtype=fp32",
         f"--ckpt.dir={ckpt}", "--ckpt.every=20"])
    step = os.path.join(ckpt, "step_00000020")
    export = os.path.join(work, name + "_export")
    run([shardtrain, "ckpt", "export", step, "--out", export, "--dtype", "f32"])
    evaluated = run([shardtrain, "eval", "--ckpt", step, f"--data.path={data}", "--train.eval_batches=4",
                     "--train.device=cuda", "--train.dtype=fp32"])
    ours = float(re.findall(r"loss ([0-9.]+)", evaluated)[-1])
    trained = Model.from_pretrained(export, torch_dtype=torch.float32, attn_implementation="eager").eval()
    B, losses = 4, []
    with torch.no_grad():
        for b in range(4):  # shardtrain eval's windows: row j of batch b starts at token (b*B + j)*T
            rows = torch.tensor([stream[(b * B + j) * T:(b * B + j) * T + T + 1] for j in range(B)])
            losses.append(trained(rows, labels=rows).loss.item())
    theirs = sum(losses) / len(losses)
    print(f"{name} after 20 steps: shardtrain eval {ours:.7f}, transformers {theirs:.7f}")
    if abs(ours - theirs) > 1e-5 * abs(theirs):
        failures.append(f"{name} trained loss: shardtrain eval {ours} transformers {theirs}")

if failures:
    print("FAILED:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("transformers check OK")
