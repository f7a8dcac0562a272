#!/usr/bin/env python3
"""`shardtrain ckpt` end to end: train 3 steps with a checkpoint and ckpt.export, then check that
`ckpt export` of the checkpoint equals ckpt.export's HDF5 bit for bit, that `ckpt verify` passes and then
fails (exit code 2, naming the file) on a flipped byte, and that `ckpt inspect` reports the step.
safetensors is parsed by hand (json + numpy): the safetensors package is not installed.

usage: export_test.py SHARDTRAIN SOURCE_DIR WORKDIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import h5py
import numpy as np

shardtrain, source_dir, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
ckpt_dir = os.path.join(work, "ckpt")
step_dir = os.path.join(ckpt_dir, "step_00000003")
reference = os.path.join(work, "E.h5")
out_dir = os.path.join(work, "export")
os.makedirs(out_dir)
exported = os.path.join(out_dir, "X.safetensors")
failures = []


def run(*args, expect=0):
    r = subprocess.run([shardtrain, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       stdin=subprocess.DEVNULL, timeout=300)
    if r.returncode != expect:
        print(" ".join([shardtrain, *args]) + "\n" + r.stdout)
        sys.exit(f"exit code {r.returncode}, expected {expect}")
    return r.stdout


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def read_safetensors(path):
    """name -> (shape, float32 array), plus the header length; checks the layout as it goes."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    check((8 + n) % 8 == 0, f"data section starts at {8 + n}, not 8-byte aligned")
    check(header.pop("__metadata__", None) == {"format": "pt"}, "__metadata__ is not {format: pt}")
    data = blob[8 + n:]
    out, end = {}, 0
    for name, t in header.items():  # json keeps the file's order: the data's order
        check(t["dtype"] == "F32", f"{name}: dtype {t['dtype']}")
        begin, stop = t["data_offsets"]
        check(begin == end, f"{name}: starts at {begin}, the previous tensor ended at {end}")
        count = int(np.prod(t["shape"], dtype=np.int64))
        check(stop - begin == 4 * count, f"{name}: {stop - begin} bytes for shape {t['shape']}")
        out[name] = np.frombuffer(data[begin:stop], dtype="<f4").reshape(t["shape"])
        end = stop
    check(end == len(data), f"the data section has {len(data)} bytes, the tensors {end}")
    return out


run("train", "--config", os.path.join(source_dir, "configs", "tiny.ini"), "--train.steps=3",
    "--train.sample_tokens=0", f"--ckpt.dir={ckpt_dir}", f"--ckpt.export={reference}")

# inspect
text = run("ckpt", "inspect", step_dir)
check("step 3" in text.splitlines(), "inspect does not print 'step 3':\n" + text)
check("world_size 1" in text.splitlines(), "inspect does not print 'world_size 1'")

# export == ckpt.export, bit for bit
text = run("ckpt", "export", step_dir, "--out", exported)
print(text.strip())
got = read_safetensors(exported)
with h5py.File(reference, "r") as h:
    want = {}
    h.visititems(lambda name, obj: want.__setitem__(name, obj[...]) if isinstance(obj, h5py.Dataset) else None)
check(sorted(got) == sorted(want), f"tensor names differ: {sorted(set(got) ^ set(want))}")
for name in want:
    if name not in got:
        continue
    a, b = got[name], want[name].astype("<f4", copy=False)
    if a.shape != b.shape:
        check(False, f"{name}: shape {a.shape}, ckpt.export has {b.shape}")
    else:
        check(np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{name}: values differ from ckpt.export")
check(got["transformer.wte.weight"].shape == (256, 128), "wte shape")
check(got["transformer.h.0.attn.c_attn.weight"].shape == (128, 384), "c_attn is not in Conv1D layout [C, 3C]")
print(f"{len(got)} tensors equal to ckpt.export's")

cfg = json.load(open(os.path.join(out_dir, "config.json")))
for key, value in {"n_embd": 128, "n_layer": 4, "n_head": 4, "vocab_size": 256, "n_positions": 128,
                   "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_inner": None,
                   "tie_word_embeddings": True}.items():
    check(cfg.get(key, "absent") == value, f"config.json {key} = {cfg.get(key, 'absent')}, expected {value}")
check(not any(n.startswith(os.path.basename(exported) + ".tmp") for n in os.listdir(os.path.dirname(exported))),
      "the temporary file was left behind")

# verify, then a flipped byte
text = run("ckpt", "verify", step_dir)
check(text.startswith(f"OK: {step_dir}: 1 files, "), "verify output: " + text)
rank_file = os.path.join(step_dir, "rank_00000.h5")
with open(rank_file, "r+b") as f:
    f.seek(os.path.getsize(rank_file) // 2)
    b = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([b[0] ^ 0x10]))
text = run("ckpt", "verify", step_dir, expect=2)
check(rank_file in text and "SHA-256 mismatch" in text, "verify error does not name the file:\n" + text)

if failures:
    sys.exit(f"{len(failures)} failure(s)")
print("ok")
