#!/usr/bin/env python3
"""shardtrain's LoRA on the CPU against a LoRA written here in PyTorch, on the same base, adapters and batches.

Runs parity_dump with lora.* set (under `MPIRUN -np N` when given). The dump holds the frozen base in the family's
names (init.h5, and final.h5 after training), the adapters before and after (adapters_init.h5, adapters_final.h5),
their step-0 gradients (grads0.h5) and, in trace.json, which layers carry adapters and the scale. Every B starts
non-zero there, so that every A has a step-0 gradient.

The PyTorch side is parity_test.py's GPT-2 or Llama with every parameter frozen and, on each adapted layer,
PEFT's update y += scale * (x A^T) B^T (q, k and v, gate and up each their own module, as Hugging Face's layers are);
AdamW (decay on every adapter) with the same schedule and global-norm clip over the adapters only. It runs in float64
(the reference) and float32 (the calibration), and shardtrain must hold:
  * every step's loss within rel 1e-6 of float64's;
  * every adapter's step-0 gradient within 1e-5 of that tensor's largest float64 magnitude;
  * the loss, the gradient norm, the step-0 gradients and the adapters after 5 steps within parity_test.py's
    calibrated bars (FACTOR x PyTorch float32's error + FLOOR);
  * the base bit-identical before and after training.

With lora.base_dtype = nf4 (QLoRA) the PyTorch side starts from the base as drawn, before quantisation
(init_unquantised.h5), and quantises it here: each block's linear layer whole, in shardtrain's layout, with nf4_test.py's
NumPy NF4 (QLoRA's paper: blocks of 64, double-quantised absmaxes), then dequantises it; embeddings, head, norms and
biases stay as drawn. shardtrain's base (init.h5) must equal that bit for bit, the bars above hold against PyTorch on
it, and PyTorch on the unquantised base must miss the loss bar (else the test could not tell NF4 from no
quantisation).

Needs Debian's python3-torch, python3-h5py, python3-numpy: run it with /usr/bin/python3.
usage: lora_parity_test.py [--mpirun MPIRUN --np N] PARITY_DUMP CONFIG WORKDIR [--section.key=value ...]
"""
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels"))
import nf4_test as nf4  # noqa: E402
import parity_test as pt  # noqa: E402

LOSS_REL = 1e-6
GRAD_REL = 1e-5
# lora.targets' names and the Hugging Face modules they adapt (PEFT's target_modules).
MODULES = {"llama": {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
                     "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"},
           "gpt2": {"qkv": "attn.c_attn", "proj": "attn.c_proj", "fc": "mlp.c_fc", "fc_proj": "mlp.c_proj"}}


def torch_name(trace, ours):
    """block.L.lora.TARGET.A -> (the Hugging Face module's full name, "A")."""
    _, layer, _, target, which = ours.split(".")
    prefix = "model.layers." if trace["arch"] == "llama" else "transformer.h."
    return f"{prefix}{layer}.{MODULES[trace['arch']][target]}", which


def mix64(x):
    """core/rng.h's SplitMix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def dropout_scale(trace, layer, target, first_seq, rows, T, width):
    """kernels/lora.h's dropout mask for one adapter over a batch of `rows` sequences from global sequence first_seq,
    as 0 or 1 / (1 - p) per element [rows * T, width]: element (n, c) is kept when the top 24 bits of
    random_bits_at(seed, 0x10DA0000 + 16 layer + the target's place in the family, (sequence * seq_len + position) *
    width + c), over 2^24, are at least p."""
    linear = list(MODULES[trace["arch"]]).index(target)
    stream = np.uint64(0x10DA0000 + 16 * layer + linear)
    with np.errstate(over="ignore"):
        key = mix64(np.uint64(trace["seed"]) ^ mix64(stream + np.uint64(0x632BE59BD9B4E019)))
        n = np.arange(rows * T, dtype=np.uint64)
        seq = np.uint64(first_seq) + n // np.uint64(T)
        base = (seq * np.uint64(trace["seq_len"]) + n % np.uint64(T)) * np.uint64(width)
        index = base[:, None] + np.arange(width, dtype=np.uint64)[None, :]
        bits = mix64(key + index)
    u = (bits >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)
    p = np.float32(trace["lora_dropout"])
    return np.where(u >= p, np.float32(1.0) / (np.float32(1.0) - p), np.float32(0.0))


def scale_of(trace):
    """PEFT's scaling: lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora."""
    r = trace["lora_rank"]
    return trace["lora_alpha"] / (math.sqrt(r) if trace["lora_rslora"] else r)


def nf4_base(trace, drawn):
    """The base as lora.base_dtype = nf4 holds it: each block's linear layer quantised whole to NF4 and
    dequantised, in shardtrain's layout ([out, in]: GPT-2's Hugging Face Conv1D tensors, [in, out], are transposed
    for it); the embeddings, the head and every vector as drawn."""
    gpt2 = trace["arch"] == "gpt2"
    out = {}
    for k, v in drawn.items():
        if not (k.startswith("transformer.h." if gpt2 else "block.") and v.ndim == 2):
            out[k] = v
            continue
        ours = np.ascontiguousarray(v.T if gpt2 else v, dtype=np.float32)
        # Each Hugging Face layer on its own, as bitsandbytes quantises it: llama's stacked q/k/v (q: n_embd rows, k
        # and v half the rest each) and gate/up (half each); GPT-2's c_attn is one layer.
        rows, width = ours.shape
        layers = [rows]
        if not gpt2 and k.endswith("attn.qkv.weight"):
            layers = [width, (rows - width) // 2, (rows - width) // 2]
        elif not gpt2 and k.endswith("mlp.gate_up.weight"):
            layers = [rows // 2, rows // 2]
        cut = np.cumsum([0] + layers)
        back = np.concatenate([nf4.reference(ours[a:b].reshape(-1))[4].reshape(b - a, width)
                               for a, b in zip(cut[:-1], cut[1:])])
        out[k] = np.ascontiguousarray(back.T) if gpt2 else back
    return out


def torch_run(trace, init, adapters, tokens, targets, steps, dtype):
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    weights = {k: v.astype(np_dtype) for k, v in init.items()}
    model = pt.Llama(weights, trace) if trace["arch"] == "llama" else pt.Gpt2(weights, trace["n_head"])
    model.requires_grad_(False)
    params = {k: torch.nn.Parameter(torch.tensor(v.astype(np_dtype))) for k, v in adapters.items()}
    by_module = {}
    for k, p in params.items():
        module, which = torch_name(trace, k)
        by_module.setdefault(module, {})[which] = p
    scale = scale_of(trace)
    base_linear = model.linear

    def linear(x, name):
        y = base_linear(x, name)
        if name in by_module:
            a, b = by_module[name]["A"], by_module[name]["B"]
            if trace["lora_dropout"] > 0 and model.first_seq is not None:
                layer, target = int(name.split(".")[2]), modules_to_target[name.split(".", 3)[3]]
                mask = dropout_scale(trace, layer, target, model.first_seq, x.shape[0], x.shape[1], x.shape[2])
                x = x * torch.tensor(mask, dtype=x.dtype).view(x.shape)
            y = y + scale * ((x @ a.t()) @ b.t())
        return y

    model.linear = linear
    modules_to_target = {m: t for t, m in MODULES[trace["arch"]].items()}
    model.first_seq = None
    opt = torch.optim.AdamW(list(params.values()), lr=trace["lr"], betas=(trace["beta1"], trace["beta2"]),
                            eps=trace["eps"], weight_decay=trace["weight_decay"])
    accum = tokens.shape[1]
    losses, norms, grads0 = [], [], None
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for micro in range(accum):
            model.first_seq = (step * accum + micro) * tokens.shape[2]  # the batch's global sequences, in order
            loss = model(tokens[step, micro][:, :-1], targets[step, micro]) / accum
            loss.backward()
            loss_sum += loss.item()
        losses.append(loss_sum)
        if step == 0:
            grads0 = {k: p.grad.to(torch.float64, copy=True).numpy() for k, p in params.items()}
        if trace["grad_clip"] > 0:
            norm = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in params.values()))
            coef = min(1.0, trace["grad_clip"] / (norm + 1e-6))
            for p in params.values():
                p.grad.mul_(coef)
            norms.append(norm)
        for g in opt.param_groups:
            g["lr"] = pt.lr_at(trace, step)
        opt.step()
    final = {k: p.detach().to(torch.float64, copy=True).numpy() for k, p in params.items()}
    return {"loss": losses, "grad_norm": norms, "grads0": grads0, "final": final}


def main():
    args = sys.argv[1:]
    launch = []
    if args[0] == "--mpirun":
        launch = [args[1], "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader", "-np", args[3]]
        args = args[4:]
    tool, config, work = args[:3]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    steps = 5
    subprocess.run(launch + [tool, "--config", config, "--out", work, "--steps", str(steps)] + args[3:], check=True)
    trace = json.load(open(os.path.join(work, "trace.json")))
    if not trace["adapters"]:
        print("FAILED: the dump has no adapters (lora.rank must be > 0)")
        return 1
    base0, base1 = pt.load(os.path.join(work, "init.h5")), pt.load(os.path.join(work, "final.h5"))
    changed = [k for k in base0 if not np.array_equal(base0[k], base1[k])]
    if changed or base0.keys() != base1.keys():
        print(f"FAILED: the frozen base changed in training: {changed[:10]}")
        return 1
    adapters = pt.load(os.path.join(work, "adapters_init.h5"))
    expected = {f"block.{l}.lora.{a['name']}.{w}" for l in range(len({k.split('.')[1] for k in adapters}))
                for a in trace["adapters"] for w in "AB"}
    if set(adapters) != expected:
        print(f"FAILED: trainable tensors {sorted(adapters)} are not exactly the adapters {sorted(expected)}")
        return 1
    batches = pt.load(os.path.join(work, "batches.h5"))
    tokens = torch.tensor(batches["tokens"]).long()
    targets = tokens[..., 1:].clone()
    base = base0
    if trace["lora_base_dtype"] == "nf4":
        drawn = pt.load(os.path.join(work, "init_unquantised.h5"))
        base = nf4_base(trace, drawn)
        quantised = [k for k in base if base[k] is not drawn[k]]
        differ = [k for k in base if not np.array_equal(base[k], base0[k])]
        if base.keys() != base0.keys() or differ or not quantised:
            print(f"FAILED: shardtrain's NF4 base is not NumPy's NF4 round trip of the drawn base: {differ[:10]}, "
                  f"{len(quantised)} matrices quantised")
            return 1
        print(f"NF4 base: {len(quantised)} matrices, bit-identical to NumPy's round trip")
    ours = {"loss": [s["loss"] for s in trace["steps"]],
            "grad_norm": [s["grad_norm"] for s in trace["steps"]] if trace["grad_clip"] > 0 else [],
            "grads0": {k: v.astype(np.float64) for k, v in pt.load(os.path.join(work, "grads0.h5")).items()},
            "final": {k: v.astype(np.float64) for k, v in pt.load(os.path.join(work, "adapters_final.h5")).items()}}
    ref = torch_run(trace, base, adapters, tokens, targets, steps, torch.float64)
    t32 = torch_run(trace, base, adapters, tokens, targets, steps, torch.float32)

    failures = []
    for step, (a, b) in enumerate(zip(ours["loss"], ref["loss"])):
        if abs(a - b) > LOSS_REL * abs(b):
            failures.append(f"step {step} loss {a:.9g}, float64 {b:.9g}: rel {abs(a - b) / abs(b):.2e} > {LOSS_REL}")
    for k, r in ref["grads0"].items():
        top = np.abs(r).max()
        if top == 0 or np.abs(ours["grads0"][k] - r).max() > GRAD_REL * top:
            failures.append(f"{k} step-0 gradient: max|diff| {np.abs(ours['grads0'][k] - r).max():.3e}, "
                            f"max|ref| {top:.3e}")
    if base is not base0:
        # The same bars against PyTorch on the unquantised base: the loss must miss, so that they can tell the two.
        plain = torch_run(trace, drawn, adapters, tokens, targets, 1, torch.float64)["loss"][0]
        rel = abs(ours["loss"][0] - plain) / abs(plain)
        print(f"step 0 loss against PyTorch on the unquantised base: rel {rel:.2e} (bar {LOSS_REL})")
        if rel <= LOSS_REL:
            failures.append(f"step 0 loss {ours['loss'][0]:.9g} is within rel {LOSS_REL} of PyTorch's on the "
                            f"unquantised base, {plain:.9g}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures[:20]))
        return 1
    return pt.compare(pt.errors(ours, ref), pt.errors(t32, ref), steps,
                      f"{trace['arch']} {'QLoRA' if base is not base0 else 'LoRA'}, {len(trace['adapters'])} targets, "
                      f"{trace['world']} rank(s)")


if __name__ == "__main__":
    sys.exit(main())
