#!/usr/bin/env python3
"""shardtrain's CPU model against PyTorch on the same weights and batches.

Runs the parity_dump tool, loads its initial weights (Hugging Face GPT-2 names) into a PyTorch GPT-2,
runs the same batches and the same optimizer, and asserts:
  * step-0 loss agrees to rel 1e-5,
  * every step-0 gradient agrees to max|diff| / max|ref| <= 1e-4 (per tensor),
  * after all steps of AdamW (decay on block matrices only, global-norm clip, warmup+cosine lr), every
    parameter agrees to max|diff| <= 1e-5 * max(1, max|param|), and the per-step losses to rel 1e-5.

Needs Debian's python3-torch, python3-h5py, python3-numpy: run it with /usr/bin/python3.
usage: parity_test.py PARITY_DUMP CONFIG WORKDIR [--section.key=value ...]
"""
import json
import math
import os
import subprocess
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float32)
torch.set_num_threads(2)


def load(path):
    with h5py.File(path, "r") as f:
        out = {}
        f.visititems(lambda name, obj: out.__setitem__(name, np.array(obj)) if isinstance(obj, h5py.Dataset) else None)
        return out


class Gpt2(torch.nn.Module):
    """GPT-2 with HF parameter names and Conv1D layouts ([in, out]), LM head tied to wte."""

    def __init__(self, weights, n_head):
        super().__init__()
        self.n_head = n_head
        self.p = torch.nn.ParameterDict(
            {k.replace(".", "/"): torch.nn.Parameter(torch.tensor(v)) for k, v in weights.items()})
        self.n_layer = len({k.split(".")[2] for k in weights if k.startswith("transformer.h.")})

    def w(self, name):
        return self.p[name.replace(".", "/")]

    def forward(self, idx, tgt):
        B, T = idx.shape
        x = self.w("transformer.wte.weight")[idx] + self.w("transformer.wpe.weight")[:T]
        C = x.shape[-1]
        for l in range(self.n_layer):
            h = f"transformer.h.{l}."
            a = F.layer_norm(x, (C,), self.w(h + "ln_1.weight"), self.w(h + "ln_1.bias"), 1e-5)
            qkv = a @ self.w(h + "attn.c_attn.weight") + self.w(h + "attn.c_attn.bias")
            q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in qkv.split(C, 2))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.n_head)
            att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + y @ self.w(h + "attn.c_proj.weight") + self.w(h + "attn.c_proj.bias")
            m = F.layer_norm(x, (C,), self.w(h + "ln_2.weight"), self.w(h + "ln_2.bias"), 1e-5)
            m = F.gelu(m @ self.w(h + "mlp.c_fc.weight") + self.w(h + "mlp.c_fc.bias"), approximate="tanh")
            x = x + m @ self.w(h + "mlp.c_proj.weight") + self.w(h + "mlp.c_proj.bias")
        x = F.layer_norm(x, (C,), self.w("transformer.ln_f.weight"), self.w("transformer.ln_f.bias"), 1e-5)
        logits = x @ self.w("transformer.wte.weight").t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))


def lr_at(t, step):
    if step < t["warmup_steps"]:
        return t["lr"] * (step + 1) / t["warmup_steps"]
    span = max(1, t["total_steps"] - t["warmup_steps"])
    progress = min(1.0, (step - t["warmup_steps"]) / span)
    return t["min_lr"] + 0.5 * (1 + math.cos(math.pi * progress)) * (t["lr"] - t["min_lr"])


def decays(name):
    # shardtrain decays the blocks' matrices only.
    return name.startswith("transformer.h.") and name.endswith(".weight") and (".attn." in name or ".mlp." in name)


def main():
    tool, config, work = sys.argv[1:4]
    overrides = sys.argv[4:]
    os.makedirs(work, exist_ok=True)
    steps = 5
    subprocess.run([tool, "--config", config, "--out", work, "--steps", str(steps)] + overrides, check=True)
    trace = json.load(open(os.path.join(work, "trace.json")))
    init = load(os.path.join(work, "init.h5"))
    tokens = torch.tensor(load(os.path.join(work, "batches.h5"))["tokens"]).long()
    grads0 = load(os.path.join(work, "grads0.h5"))
    final = load(os.path.join(work, "final.h5"))

    model = Gpt2({k: v.astype(np.float64) for k, v in init.items()}, trace["n_head"])
    named = {k.replace("/", "."): p for k, p in model.p.items()}
    groups = [{"params": [p for k, p in named.items() if decays(k)], "weight_decay": trace["weight_decay"]},
              {"params": [p for k, p in named.items() if not decays(k)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=trace["lr"], betas=(trace["beta1"], trace["beta2"]), eps=trace["eps"])
    failures = []
    accum = tokens.shape[1]
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for micro in range(accum):
            batch = tokens[step, micro]
            loss = model(batch[:, :-1], batch[:, 1:]) / accum
            loss.backward()
            loss_sum += loss.item()
        ours = trace["steps"][step]["loss"]
        if abs(ours - loss_sum) > 1e-5 * abs(loss_sum):
            failures.append(f"step {step} loss: shardtrain {ours:.8f} torch {loss_sum:.8f}")
        if step == 0:
            worst = 0.0
            for k, p in named.items():
                ref = p.grad.numpy()
                err = np.abs(grads0[k] - ref).max() / max(np.abs(ref).max(), 1e-30)
                worst = max(worst, err)
                if err > 1e-4:
                    failures.append(f"grad {k}: max|diff|/max|ref| = {err:.3e} > 1e-4")
            print(f"step 0: loss shardtrain {ours:.8f} torch {loss_sum:.8f}; worst grad rel err {worst:.3e}")
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), trace["grad_clip"]) if trace["grad_clip"] > 0 else None
        if norm is not None and abs(norm.item() - trace["steps"][step]["grad_norm"]) > 1e-4 * norm.item():
            failures.append(f"step {step} grad norm: shardtrain {trace['steps'][step]['grad_norm']} torch {norm.item()}")
        for g in opt.param_groups:
            g["lr"] = lr_at(trace, step)
        if abs(lr_at(trace, step) - trace["steps"][step]["lr"]) > 1e-6 * trace["lr"]:
            failures.append(f"step {step} lr: shardtrain {trace['steps'][step]['lr']} expected {lr_at(trace, step)}")
        opt.step()
    worst = 0.0
    for k, p in named.items():
        ref = p.detach().numpy()
        err = np.abs(final[k] - ref).max()
        tol = 1e-5 * max(1.0, np.abs(ref).max())
        worst = max(worst, err / tol)
        if err > tol:
            failures.append(f"param {k} after {steps} steps: max|diff| = {err:.3e} > {tol:.3e}")
    print(f"after {steps} AdamW steps: worst param diff / tolerance = {worst:.3f}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures[:20]))
        return 1
    print(f"parity OK over {len(named)} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
