#!/usr/bin/env python3
"""shardtrain's CPU model against PyTorch on the same weights and batches.

Runs the parity_dump tool (under `MPIRUN -np N` when given: N ranks train their shares of each global batch),
loads its initial weights into a PyTorch model written out here in float64 (GPT-2, or Hugging Face's Llama:
RMSNorm, rotate-half RoPE with the llama3 frequency rule, grouped-query attention, SwiGLU, tied or untied head,
q/k/v biases), runs the same batches and the same optimizer, and asserts, per family:
  * every step's loss agrees to rel LOSS_TOL,
  * every step-0 gradient agrees to max|diff| / max|ref| <= GRAD_TOL (per tensor),
  * after all steps of AdamW (decay on block matrices only, global-norm clip, warmup+cosine lr), every
    parameter agrees to max|diff| <= PARAM_TOL * max(1, max|param|).
gpt2: 1e-5, 1e-4, 1e-5; llama: 1e-6, 1e-5, 2e-6; --tol LOSS,GRAD,PARAM sets them.

--mask: the batches come with a random loss mask (parity_dump --mask: half the targets, and rank 0's whole
micro-batch of step 0's micro-step 1 masked). Here the masked targets are -100, and each step's loss is PyTorch's
F.cross_entropy(logits, targets, ignore_index=-100) with reduction mean over the whole global batch (every micro-step
of every rank in one call): the sum over the kept targets divided by their number.

Needs Debian's python3-torch, python3-h5py, python3-numpy: run it with /usr/bin/python3.
usage: parity_test.py [--mpirun MPIRUN --np N] [--mask] [--tol L,G,P] PARITY_DUMP CONFIG WORKDIR [--section.key=value ...]
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
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=IGNORE)


class Llama(torch.nn.Module):
    """Hugging Face's LlamaForCausalLM (Qwen2ForCausalLM with q/k/v biases) written out with HF parameter names.

    The weights come in shardtrain's unit layout and are split here into HF's tensors: attn.qkv rows are q, then k,
    then v; mlp.gate_up rows are gate, then up; the vocabulary tables are cut to the real vocabulary."""

    def __init__(self, weights, t):
        super().__init__()
        self.t = t
        H, KV, V = t["n_head"], t["n_kv_head"], t["vocab_size"]
        C = weights["embedding.embed_tokens"].shape[1]
        D = C // H
        self.n_layer = len({k.split(".")[1] for k in weights if k.startswith("block.")})
        hf = {"model.embed_tokens.weight": weights["embedding.embed_tokens"][:V],
              "model.norm.weight": weights["head.norm.weight"]}
        if not t["tie_embeddings"]:
            hf["lm_head.weight"] = weights["head.lm_head"][:V]
        for l in range(self.n_layer):
            b, h = f"block.{l}.", f"model.layers.{l}."
            qkv = weights[b + "attn.qkv.weight"]
            hf[h + "self_attn.q_proj.weight"] = qkv[:H * D]
            hf[h + "self_attn.k_proj.weight"] = qkv[H * D:(H + KV) * D]
            hf[h + "self_attn.v_proj.weight"] = qkv[(H + KV) * D:]
            if b + "attn.qkv.bias" in weights:
                bias = weights[b + "attn.qkv.bias"]
                hf[h + "self_attn.q_proj.bias"] = bias[:H * D]
                hf[h + "self_attn.k_proj.bias"] = bias[H * D:(H + KV) * D]
                hf[h + "self_attn.v_proj.bias"] = bias[(H + KV) * D:]
            hf[h + "self_attn.o_proj.weight"] = weights[b + "attn.o.weight"]
            hf[h + "input_layernorm.weight"] = weights[b + "attn_norm.weight"]
            hf[h + "post_attention_layernorm.weight"] = weights[b + "mlp_norm.weight"]
            gate_up = weights[b + "mlp.gate_up.weight"]
            F_ = gate_up.shape[0] // 2
            hf[h + "mlp.gate_proj.weight"] = gate_up[:F_]
            hf[h + "mlp.up_proj.weight"] = gate_up[F_:]
            hf[h + "mlp.down_proj.weight"] = weights[b + "mlp.down.weight"]
        self.p = torch.nn.ParameterDict(
            {k.replace(".", "/"): torch.nn.Parameter(torch.tensor(np.ascontiguousarray(v))) for k, v in hf.items()})
        self.H, self.KV, self.D, self.C = H, KV, D, C
        self.inv_freq = self.rope_inv_freq()

    def rope_inv_freq(self):
        """Hugging Face's default and "llama3" RoPE frequencies (_compute_llama3_parameters), in float64."""
        t, D = self.t, self.D
        inv = 1.0 / (t["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
        if t["rope_scaling"] == "llama3":
            factor, low, high = t["rope_scaling_factor"], t["rope_scaling_low_freq_factor"], t["rope_scaling_high_freq_factor"]
            old = t["rope_scaling_original_max_position"]
            wavelen = 2 * math.pi / inv
            scaled = torch.where(wavelen > old / low, inv / factor, inv)
            smooth = (old / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = ~(wavelen < old / high) & ~(wavelen > old / low)
            inv = torch.where(medium, smoothed, scaled)
        return inv

    def w(self, name):
        return self.p[name.replace(".", "/")]

    def has(self, name):
        return name.replace(".", "/") in self.p

    def rms(self, x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.t["rms_norm_eps"]) * weight

    def linear(self, x, name):
        y = x @ self.w(name + ".weight").t()
        return y + self.w(name + ".bias") if self.has(name + ".bias") else y

    def forward(self, idx, tgt):
        B, T = idx.shape
        H, KV, D, C = self.H, self.KV, self.D, self.C
        freqs = torch.outer(torch.arange(T, dtype=torch.float64), self.inv_freq)
        emb = torch.cat((freqs, freqs), -1)
        cos, sin = emb.cos(), emb.sin()

        def rotate_half(x):
            return torch.cat((-x[..., D // 2:], x[..., :D // 2]), -1)

        x = self.w("model.embed_tokens.weight")[idx]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        for l in range(self.n_layer):
            h = f"model.layers.{l}."
            a = self.rms(x, self.w(h + "input_layernorm.weight"))
            q = self.linear(a, h + "self_attn.q_proj").view(B, T, H, D).transpose(1, 2)
            k = self.linear(a, h + "self_attn.k_proj").view(B, T, KV, D).transpose(1, 2)
            v = self.linear(a, h + "self_attn.v_proj").view(B, T, KV, D).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)  # HF's repeat_kv
            att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
            att = att.masked_fill(mask, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + self.linear(y, h + "self_attn.o_proj")
            m = self.rms(x, self.w(h + "post_attention_layernorm.weight"))
            m = F.silu(self.linear(m, h + "mlp.gate_proj")) * self.linear(m, h + "mlp.up_proj")
            x = x + self.linear(m, h + "mlp.down_proj")
        x = self.rms(x, self.w("model.norm.weight"))
        head = self.w("model.embed_tokens.weight" if self.t["tie_embeddings"] else "lm_head.weight")
        logits = x @ head.t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=IGNORE)

    def to_ours(self, tensors):
        """HF-named arrays (parameters or their gradients) back in shardtrain's layout, padded rows left out."""
        out = {"embedding.embed_tokens": tensors["model.embed_tokens.weight"], "head.norm.weight": tensors["model.norm.weight"]}
        if not self.t["tie_embeddings"]:
            out["head.lm_head"] = tensors["lm_head.weight"]
        for l in range(self.n_layer):
            b, h = f"block.{l}.", f"model.layers.{l}.self_attn."
            out[b + "attn.qkv.weight"] = np.concatenate([tensors[h + p + "_proj.weight"] for p in "qkv"])
            if h + "q_proj.bias" in tensors:
                out[b + "attn.qkv.bias"] = np.concatenate([tensors[h + p + "_proj.bias"] for p in "qkv"])
            out[b + "attn.o.weight"] = tensors[h + "o_proj.weight"]
            m = f"model.layers.{l}."
            out[b + "attn_norm.weight"] = tensors[m + "input_layernorm.weight"]
            out[b + "mlp_norm.weight"] = tensors[m + "post_attention_layernorm.weight"]
            out[b + "mlp.gate_up.weight"] = np.concatenate([tensors[m + "mlp.gate_proj.weight"], tensors[m + "mlp.up_proj.weight"]])
            out[b + "mlp.down.weight"] = tensors[m + "mlp.down_proj.weight"]
        return out


def lr_at(t, step):
    if step < t["warmup_steps"]:
        return t["lr"] * (step + 1) / t["warmup_steps"]
    span = max(1, t["total_steps"] - t["warmup_steps"])
    progress = min(1.0, (step - t["warmup_steps"]) / span)
    return t["min_lr"] + 0.5 * (1 + math.cos(math.pi * progress)) * (t["lr"] - t["min_lr"])


def decays(name):
    # shardtrain decays the blocks' matrices only (both families).
    if name.startswith("model.layers."):
        return name.endswith("_proj.weight")
    return name.startswith("transformer.h.") and name.endswith(".weight") and (".attn." in name or ".mlp." in name)


TOLERANCES = {"gpt2": (1e-5, 1e-4, 1e-5), "llama": (1e-6, 1e-5, 2e-6)}  # loss, grad, param
IGNORE = -100  # PyTorch's default ignore_index


def main():
    args = sys.argv[1:]
    launch = []
    if args[0] == "--mpirun":
        launch = [args[1], "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader", "-np", args[3]]
        args = args[4:]
    masked = args[0] == "--mask"
    if masked:
        args = args[1:]
    tol = None
    if args[0] == "--tol":
        tol = tuple(float(x) for x in args[1].split(","))
        args = args[2:]
    tool, config, work = args[:3]
    overrides = args[3:]
    os.makedirs(work, exist_ok=True)
    steps = 5
    subprocess.run(launch + [tool, "--config", config, "--out", work, "--steps", str(steps)] + (["--mask"] if masked else [])
                   + overrides, check=True)
    trace = json.load(open(os.path.join(work, "trace.json")))
    init = load(os.path.join(work, "init.h5"))
    batches = load(os.path.join(work, "batches.h5"))
    tokens = torch.tensor(batches["tokens"]).long()
    # targets[step, micro, row, t]: the next token, or IGNORE where the mask says it is not trained on.
    targets = tokens[..., 1:].clone()
    if masked:
        targets[torch.tensor(batches["mask"]) == 0] = IGNORE
        kept = (targets != IGNORE).sum(dim=(1, 2, 3))
        empty = ((targets[0, 1] != IGNORE).sum(dim=1) == 0).sum().item() if targets.shape[1] > 1 else 0
        print(f"masked: targets kept per step {kept.tolist()} of {targets[0].numel()}; rows of step 0's micro-step 1 "
              f"with no target: {empty}")
    grads0 = load(os.path.join(work, "grads0.h5"))
    final = load(os.path.join(work, "final.h5"))
    loss_tol, grad_tol, param_tol = tol or TOLERANCES[trace["arch"]]

    init64 = {k: v.astype(np.float64) for k, v in init.items()}
    if trace["arch"] == "llama":
        model = Llama(init64, trace)
        # Ours, in HF names: the torch model's tensors carry HF names, shardtrain's dumps its own.
        def ours(dump):
            V = trace["vocab_size"]
            return {k: (v[:V] if k in ("embedding.embed_tokens", "head.lm_head") else v) for k, v in dump.items()}
        to_ours = model.to_ours
    else:
        model = Gpt2(init64, trace["n_head"])
        ours = lambda dump: dump
        to_ours = lambda tensors: tensors
    grads0, final = ours(grads0), ours(final)
    named = {k.replace("/", "."): p for k, p in model.p.items()}
    groups = [{"params": [p for k, p in named.items() if decays(k)], "weight_decay": trace["weight_decay"]},
              {"params": [p for k, p in named.items() if not decays(k)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=trace["lr"], betas=(trace["beta1"], trace["beta2"]), eps=trace["eps"])
    failures = []
    accum = tokens.shape[1]
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        if masked:
            # The whole global batch in one call: the ignore_index mean over all of its kept targets.
            loss = model(tokens[step, :, :, :-1].reshape(-1, tokens.shape[-1] - 1), targets[step].reshape(-1, targets.shape[-1]))
            loss.backward()
            loss_sum = loss.item()
        for micro in range(0 if masked else accum):
            batch = tokens[step, micro]
            loss = model(batch[:, :-1], targets[step, micro]) / accum
            loss.backward()
            loss_sum += loss.item()
        mine = trace["steps"][step]["loss"]
        if abs(mine - loss_sum) > loss_tol * abs(loss_sum):
            failures.append(f"step {step} loss: shardtrain {mine:.9f} torch {loss_sum:.9f}")
        if step == 0:
            worst = 0.0
            for k, ref in to_ours({k: p.grad.numpy() for k, p in named.items()}).items():
                err = np.abs(grads0[k] - ref).max() / max(np.abs(ref).max(), 1e-30)
                worst = max(worst, err)
                if err > grad_tol:
                    failures.append(f"grad {k}: max|diff|/max|ref| = {err:.3e} > {grad_tol}")
            print(f"step 0: loss shardtrain {mine:.9f} torch {loss_sum:.9f}; worst grad rel err {worst:.3e}")
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), trace["grad_clip"]) if trace["grad_clip"] > 0 else None
        if norm is not None and abs(norm.item() - trace["steps"][step]["grad_norm"]) > 1e-4 * norm.item():
            failures.append(f"step {step} grad norm: shardtrain {trace['steps'][step]['grad_norm']} torch {norm.item()}")
        for g in opt.param_groups:
            g["lr"] = lr_at(trace, step)
        if abs(lr_at(trace, step) - trace["steps"][step]["lr"]) > 1e-6 * trace["lr"]:
            failures.append(f"step {step} lr: shardtrain {trace['steps'][step]['lr']} expected {lr_at(trace, step)}")
        opt.step()
    worst = 0.0
    for k, ref in to_ours({k: p.detach().numpy() for k, p in named.items()}).items():
        err = np.abs(final[k] - ref).max()
        tol = param_tol * max(1.0, np.abs(ref).max())
        worst = max(worst, err / tol)
        if err > tol:
            failures.append(f"param {k} after {steps} steps: max|diff| = {err:.3e} > {tol:.3e}")
    print(f"after {steps} AdamW steps: worst param diff / tolerance = {worst:.3f}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures[:20]))
        return 1
    print(f"parity OK over {len(named)} tensors ({trace['arch']}, {trace['world']} rank(s){', masked' if masked else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
