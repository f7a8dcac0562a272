#!/usr/bin/python3
"""A Hugging Face llama directory of random bf16 weights (config.json and one model.safetensors), written with NumPy
alone, for timing loads without a GPU or transformers: `shardtrain generate --init.from DIR` reads it as it reads a
downloaded model. Norm weights are near 1, the rest N(0, 0.02).

  /usr/bin/python3 bench/random_hf_llama.py /tmp/llama1b            # Llama-3.2-1B's shape, 2.47 GB
  /usr/bin/python3 bench/random_hf_llama.py /tmp/llama3b --shape llama3.2-3b
"""
import argparse
import json
import os
import struct

import numpy as np

SHAPES = {  # hidden, intermediate, layers, heads, key/value heads, vocabulary, tied head
    "llama3.2-1b": (2048, 8192, 16, 32, 8, 128256, True),
    "llama3.2-3b": (3072, 8192, 28, 24, 8, 128256, True),
    "llama3.1-8b": (4096, 14336, 32, 32, 8, 128256, False),
}

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("out")
ap.add_argument("--shape", default="llama3.2-1b", choices=sorted(SHAPES))
ap.add_argument("--seed", type=int, default=0)
args = ap.parse_args()
H, I, L, NH, KV, V, tied = SHAPES[args.shape]
hd = H // NH
os.makedirs(args.out, exist_ok=False)
config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": H,
          "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": KV,
          "head_dim": hd, "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
          "rope_theta": 500000.0, "tie_word_embeddings": tied, "torch_dtype": "bfloat16", "attention_bias": False,
          "mlp_bias": False, "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
with open(os.path.join(args.out, "config.json"), "w") as f:
    json.dump(config, f, indent=2)

tensors = [("model.embed_tokens.weight", (V, H))]
for l in range(L):
    p = f"model.layers.{l}."
    tensors += [(p + "input_layernorm.weight", (H,)), (p + "post_attention_layernorm.weight", (H,)),
                (p + "self_attn.q_proj.weight", (H, H)), (p + "self_attn.k_proj.weight", (KV * hd, H)),
                (p + "self_attn.v_proj.weight", (KV * hd, H)), (p + "self_attn.o_proj.weight", (H, H)),
                (p + "mlp.gate_proj.weight", (I, H)), (p + "mlp.up_proj.weight", (I, H)),
                (p + "mlp.down_proj.weight", (H, I))]
tensors.append(("model.norm.weight", (H,)))
if not tied:
    tensors.append(("lm_head.weight", (V, H)))
header, offset = {}, 0
for name, shape in tensors:
    size = 2 * int(np.prod(shape))
    header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
    offset += size
text = json.dumps(header).encode()
text += b" " * ((8 - len(text) % 8) % 8)
rng = np.random.default_rng(args.seed)
with open(os.path.join(args.out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    for name, shape in tensors:
        x = rng.standard_normal(int(np.prod(shape)), dtype=np.float32)
        x = 1.0 + 0.02 * x if name.endswith("norm.weight") else 0.02 * x
        f.write((x.view(np.uint32) >> 16).astype(np.uint16).tobytes())  # bf16 by truncation
print(f"{args.out}: {args.shape}, {offset / 1e9:.2f} GB of bf16 weights")
