#!/usr/bin/env python3
"""shardtrain's CPU model against PyTorch on the same weights and batches.

Runs the parity_dump tool (under `MPIRUN -np N` when given: N ranks train their shares of each global batch),
loads its initial weights into a PyTorch model written out here (GPT-2, or Hugging Face's Llama: RMSNorm,
rotate-half RoPE with the llama3 frequency rule, grouped-query attention, SwiGLU, tied or untied head, q/k/v
biases), and trains it on the same batches with the same optimizer (AdamW, decay on block matrices only, global-norm
clip, warmup + cosine lr) twice: in float64, the reference, and in float32, the calibration. It compares
  * every step's loss and global gradient norm (relative error),
  * every step-0 gradient, per tensor (max|diff| / max|ref|),
  * every parameter after 5 steps, per tensor (max|diff| / max(1, max|ref|)),
and every step's learning rate (exactly, to 1e-6 x lr).

Where the bars come from. A float32 run differs from float64 by rounding whose size depends on the machine: the
BLAS kernels OpenBLAS picks for the CPU (OPENBLAS_CORETYPE) sum in other orders, and AdamW turns the rounding of
gradients near zero into parameter differences of up to lr x |dg| / eps. So the bars are measured, here and now:
the same PyTorch model in float32 on the same machine and BLAS is an honest float32 implementation, and its error
against float64 is the rounding this machine's float32 arithmetic makes on this model and data. shardtrain's error of
each quantity must stay within FACTOR (8) x PyTorch float32's error of the same quantity, plus a FLOOR of a few
float32 units (u = 2^-24) that keeps a bar from collapsing where PyTorch's rounding happens to cancel:
  * loss and grad norm: per step, against PyTorch's worst step; floor 8u;
  * gradients and parameters: per tensor, against PyTorch's error of that tensor or of the median tensor, whichever
    is larger; floor 8u for gradients, 2u a step for parameters (a step rounds the decayed parameter and the
    update's subtraction).
Measured on one AMD EPYC (Zen 4) under each of OpenBLAS's Haswell, SkylakeX, Cooperlake, Zen and Prescott kernels,
shardtrain's error is at most about 3x PyTorch's (docs/testing.md has the figures); the bugs these tests exist for
are 100-10,000x: docs/testing.md also records the mutations (AdamW without bias correction, eps inside the square
root, one head's RoPE a position off, the loss normaliser a token off) and the bars each one breaks.

--mask: the batches come with a random loss mask (parity_dump --mask: half the targets, and rank 0's whole
micro-batch of step 0's micro-step 1 masked). Here the masked targets are -100, and each step's loss is PyTorch's
F.cross_entropy(logits, targets, ignore_index=-100) with reduction mean over the whole global batch (every micro-step
of every rank in one call): the sum over the kept targets divided by their number.

Needs Debian's python3-torch, python3-h5py, python3-numpy: run it with /usr/bin/python3.
usage: parity_test.py [--mpirun MPIRUN --np N] [--mask] PARITY_DUMP CONFIG WORKDIR [--section.key=value ...]
"""
import json
import math
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float32)
torch.set_num_threads(1)  # deterministic, and no OpenMP team spinning against the ranks or another test


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

    def linear(self, x, name):
        return x @ self.w(name + ".weight") + self.w(name + ".bias")

    def forward(self, idx, tgt):
        B, T = idx.shape
        x = self.w("transformer.wte.weight")[idx] + self.w("transformer.wpe.weight")[:T]
        C = x.shape[-1]
        for l in range(self.n_layer):
            h = f"transformer.h.{l}."
            a = F.layer_norm(x, (C,), self.w(h + "ln_1.weight"), self.w(h + "ln_1.bias"), 1e-5)
            qkv = self.linear(a, h + "attn.c_attn")
            q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in qkv.split(C, 2))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.n_head)
            att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + self.linear(y, h + "attn.c_proj")
            m = F.layer_norm(x, (C,), self.w(h + "ln_2.weight"), self.w(h + "ln_2.bias"), 1e-5)
            m = F.gelu(self.linear(m, h + "mlp.c_fc"), approximate="tanh")
            x = x + self.linear(m, h + "mlp.c_proj")
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
        dtype = self.w("model.embed_tokens.weight").dtype  # the angles in float64, the tables in the model's dtype
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)

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


FACTOR = 8.0  # shardtrain's float32 error / PyTorch float32's, at most
U = 2.0 ** -24  # float32's unit roundoff
FLOOR = {"loss": 8 * U, "grad_norm": 8 * U, "grads0": 8 * U, "final": 2 * U}  # "final": per step
IGNORE = -100  # PyTorch's default ignore_index


def torch_run(trace, init, tokens, targets, masked, steps, dtype):
    """The torch model in `dtype` from shardtrain's initial weights, trained on the same batches with the same
    optimizer. Returns each step's loss and clipped-before global grad norm, the step-0 gradients and the final
    parameters, the last two in shardtrain's names and layout."""
    weights = {k: v.astype(np.float64 if dtype == torch.float64 else np.float32) for k, v in init.items()}
    if trace["arch"] == "llama":
        model = Llama(weights, trace)
        to_ours = model.to_ours
    else:
        model = Gpt2(weights, trace["n_head"])
        to_ours = lambda tensors: tensors
    named = {k.replace("/", "."): p for k, p in model.p.items()}
    groups = [{"params": [p for k, p in named.items() if decays(k)], "weight_decay": trace["weight_decay"]},
              {"params": [p for k, p in named.items() if not decays(k)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=trace["lr"], betas=(trace["beta1"], trace["beta2"]), eps=trace["eps"])
    accum = tokens.shape[1]
    losses, norms, grads0 = [], [], None
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        if masked:
            # The whole global batch in one call: the ignore_index mean over all of its kept targets.
            loss = model(tokens[step, :, :, :-1].reshape(-1, tokens.shape[-1] - 1),
                         targets[step].reshape(-1, targets.shape[-1]))
            loss.backward()
            loss_sum = loss.item()
        for micro in range(0 if masked else accum):
            loss = model(tokens[step, micro][:, :-1], targets[step, micro]) / accum
            loss.backward()
            loss_sum += loss.item()
        losses.append(loss_sum)
        if step == 0:
            grads0 = to_ours({k: p.grad.to(torch.float64, copy=True).numpy() for k, p in named.items()})
        if trace["grad_clip"] > 0:
            # torch.nn.utils.clip_grad_norm_'s rule, with the norm summed in float64: torch's float32 norm of a
            # 50304 x 768 table is off by ~1e-4 relative, an error of torch's reduction, not of float32 training.
            grads = [p.grad for p in named.values()]
            norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
            coef = min(1.0, trace["grad_clip"] / (norm + 1e-6))
            for g in grads:
                g.mul_(coef)
            norms.append(norm)
        for g in opt.param_groups:
            g["lr"] = lr_at(trace, step)
        opt.step()
    final = to_ours({k: p.detach().to(torch.float64, copy=True).numpy() for k, p in named.items()})
    return {"loss": losses, "grad_norm": norms, "grads0": grads0, "final": final}


def errors(run, ref):
    """run's error against ref: per step for the loss and grad norm (relative), per tensor for the step-0 gradients
    (max|diff| / max|ref|) and the final parameters (max|diff| / max(1, max|ref|))."""
    out = {"loss": [abs(a - b) / abs(b) for a, b in zip(run["loss"], ref["loss"])],
           "grad_norm": [abs(a - b) / abs(b) for a, b in zip(run["grad_norm"], ref["grad_norm"])]}
    out["grads0"] = {k: float(np.abs(run["grads0"][k] - r).max() / max(np.abs(r).max(), 1e-30))
                     for k, r in ref["grads0"].items()}
    out["final"] = {k: float(np.abs(run["final"][k] - r).max() / max(1.0, np.abs(r).max()))
                    for k, r in ref["final"].items()}
    return out


def main():
    args = sys.argv[1:]
    launch = []
    if args[0] == "--mpirun":
        launch = [args[1], "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader", "-np", args[3]]
        args = args[4:]
    masked = args[0] == "--mask"
    if masked:
        args = args[1:]
    tool, config, work = args[:3]
    overrides = args[3:]
    shutil.rmtree(work, ignore_errors=True)  # the dump writes only new weight files: start from an empty directory
    os.makedirs(work)
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
    V = trace["vocab_size"]
    padded = ("embedding.embed_tokens", "head.lm_head") if trace["arch"] == "llama" else ()
    cut = lambda dump: {k: (v[:V] if k in padded else v).astype(np.float64) for k, v in dump.items()}
    ours = {"loss": [s["loss"] for s in trace["steps"]],
            "grad_norm": [s["grad_norm"] for s in trace["steps"]] if trace["grad_clip"] > 0 else [],
            "grads0": cut(load(os.path.join(work, "grads0.h5"))), "final": cut(load(os.path.join(work, "final.h5")))}
    for step in range(steps):
        if abs(lr_at(trace, step) - trace["steps"][step]["lr"]) > 1e-6 * trace["lr"]:
            print(f"FAILED: step {step} lr: shardtrain {trace['steps'][step]['lr']} expected {lr_at(trace, step)}")
            return 1

    ref = torch_run(trace, init, tokens, targets, masked, steps, torch.float64)
    t32 = torch_run(trace, init, tokens, targets, masked, steps, torch.float32)
    return compare(errors(ours, ref), errors(t32, ref), steps, f"{trace['arch']}, {trace['world']} rank(s)"
                   f"{', masked' if masked else ''}")


def compare(e_ours, e_t32, steps, what):
    """Each of shardtrain's errors against float64 must be within FACTOR x PyTorch's float32 error of the same
    quantity on this machine, plus FLOOR (see the module docstring)."""
    failures, report, total = [], [], 0
    for metric in ("loss", "grad_norm", "grads0", "final"):
        ours, t32 = e_ours[metric], e_t32[metric]
        if isinstance(ours, list):  # per step: calibrated by the run's worst step
            ours, cal = dict(enumerate(ours)), {k: max(t32) for k in range(len(ours))}
        else:  # per tensor: calibrated by the tensor's own error, or the median tensor's where that is larger
            median = float(np.median(list(t32.values())))
            cal = {k: max(t32[k], median) for k in ours}
        floor = FLOOR[metric] * (steps if metric == "final" else 1)
        worst, worst_key = 0.0, None
        for k, err in ours.items():
            total += 1
            bar = FACTOR * cal[k] + floor
            if err / bar > worst:
                worst, worst_key = err / bar, k
            if err > bar:
                failures.append(f"{metric} {k}: error {err:.3e} > bar {bar:.3e} ({FACTOR} x torch float32's "
                                f"{cal[k]:.3e} + {floor:.1e})")
        if ours:
            report.append(f"{metric} {worst:.3f} ({worst_key}: {ours[worst_key]:.2e}, torch float32 {cal[worst_key]:.2e})")
    print("error / bar, worst of each: " + "; ".join(report))
    if failures:
        print(f"FAILED: {len(failures)} of {total} quantities over their bars:\n  " + "\n  ".join(failures[:20]))
        return 1
    print(f"parity OK ({what})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
