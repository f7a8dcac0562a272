#!/usr/bin/env python3
"""The PyTorch CPU peer of bench_cpu_train: the same GPT-2 (fp32, tied head, tanh GELU, pre-LN), the
same batch, the same AdamW step, timed the same way (median over iters after warmup).

  /usr/bin/python3 bench/cpu_train_torch.py --layers 4 --dim 128 --heads 4 --vocab 256 --T 128 --B 16
"""
import argparse
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--layers", type=int, default=4)
p.add_argument("--dim", type=int, default=128)
p.add_argument("--heads", type=int, default=4)
p.add_argument("--vocab", type=int, default=256)
p.add_argument("--T", type=int, default=128)
p.add_argument("--B", type=int, default=16)
p.add_argument("--warmup", type=int, default=3)
p.add_argument("--iters", type=int, default=10)
p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads (default: all cores)")
a = p.parse_args()
torch.set_num_threads(a.threads)


class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__()
        s.h = h
        s.ln1, s.qkv, s.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        s.ln2, s.fc, s.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        s.register_buffer("mask", torch.triu(torch.ones(a.T, a.T, dtype=torch.bool), 1), persistent=False)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, s.h, C // s.h).transpose(1, 2) for t in s.qkv(s.ln1(x)).split(C, 2))
        if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # Debian 12's torch 1.13
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // s.h))
            att = att.masked_fill(s.mask[:T, :T], float("-inf")).softmax(-1)
            y = att @ v
        y = y.transpose(1, 2).reshape(B, T, C)
        x = x + s.proj(y)
        return x + s.fc2(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(a.vocab, a.dim), nn.Embedding(a.T, a.dim)
        s.blocks = nn.ModuleList(Block(a.dim, a.heads) for _ in range(a.layers))
        s.lnf = nn.LayerNorm(a.dim)

    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1]))
        for b in s.blocks:
            x = b(x)
        logits = F.linear(s.lnf(x), s.wte.weight)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))


torch.manual_seed(0)
model = GPT()
for m in model.modules():  # GPT-2 init, as shardtrain: N(0, 0.02) weights, zero biases
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)
    if isinstance(m, nn.Linear):
        nn.init.zeros_(m.bias)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
times = []
for i in range(a.warmup + a.iters):
    x = torch.randint(0, a.vocab, (a.B, a.T + 1))
    t0 = time.perf_counter()
    loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if i >= a.warmup:
        times.append(time.perf_counter() - t0)
med = sorted(times)[len(times) // 2]
n = sum(p.numel() for p in model.parameters())
print(f"system=pytorch-cpu-{torch.__version__} params={n} L={a.layers} C={a.dim} T={a.T} B={a.B} "
      f"median_step_ms={med * 1e3:.2f} tokens_per_s={a.B * a.T / med:.0f} loss={loss.item():.4f} "
      f"threads={torch.get_num_threads()}")
