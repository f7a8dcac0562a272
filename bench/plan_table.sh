#!/usr/bin/env bash
# The table in docs/offload.md ("What fits on two 24 GiB cards"): `shardtrain plan` for each shipped config at world 2
# on one node of two 24 GiB cards, with 64 and 128 GiB of host memory. Host arithmetic only: no GPU needed.
#
#   bash bench/plan_table.sh BUILD [GPU_GIB] [HOST_GIB ...]       # defaults: 24, then 64 128
set -uo pipefail
BUILD=$1
GPU=${2:-24}
shift 2 2>/dev/null || shift $#
HOSTS=("${@:-64 128}")
[[ $# -eq 0 ]] && HOSTS=(64 128)
cd "$(dirname "$0")/.."
python3 - "$BUILD/shardtrain" "$GPU" "${HOSTS[@]}" <<'PY'
import glob, os, re, subprocess, sys
exe, gpu, hosts = sys.argv[1], sys.argv[2], sys.argv[3:]

def figures(lines):
    """(device total per rank, host total per node, the speculation's note) from a plan's device/host lines."""
    dev = re.search(r"total ([0-9.]+) GiB", next(l for l in lines if l.strip().startswith("device,"))).group(1)
    host_line = next(l for l in lines if l.strip().startswith("host,"))
    node = re.search(r"per node \(\d+ rank\(s\)\): ([0-9.]+) GiB", "\n".join(lines)).group(1)
    part = re.search(r"speculative copy [0-9.]+ GiB \((\d+) of (\d+) offloaded units\)", host_line)
    spec = f" (speculative: {part.group(1)} of {part.group(2)} units)" if part else (
        " (speculative)" if "speculative copy" in host_line else "")
    return dev, node, spec

def cell(config, host, extra):
    out = subprocess.run([exe, "plan", "--config", config, "--train.device=cuda", "--world", "2", "--ranks-per-node",
                          "2", "--gpu-mem", gpu, "--host-mem", host] + extra, capture_output=True, text=True)
    lines = out.stdout.splitlines()
    if out.returncode not in (0, 3):
        return f"error (exit {out.returncode}): {(out.stderr or out.stdout).strip()[:120]}"
    cut = next((i for i, l in enumerate(lines) if "the smallest change that fits" in l), None)
    dev, node, spec = figures(lines[:cut] if cut is not None else lines)
    shipped = f"{dev} GiB a GPU, {node}{spec} GiB host"
    if out.returncode == 0:
        return "fits: " + shipped
    if cut is None:
        return f"does not fit, and no single change of recompute, micro batch, offload or world size does (as shipped: {dev}, {node})"
    change = lines[cut].split("the smallest change that fits: ", 1)[1].strip()
    d2, n2, s2 = figures(lines[cut + 1:])
    return f"needs `{change}`: {d2} GiB a GPU, {n2}{s2} GiB host (as shipped: {dev}, {node})"

print("| config | " + " | ".join(f"{h} GiB host" for h in hosts) + " |")
print("|---" * (len(hosts) + 1) + "|")
for config in sorted(glob.glob("configs/*.ini")):
    name = os.path.basename(config)
    # The byte-level configs' global batch does not divide over two ranks as shipped: doubled.
    text = open(config).read()
    extra, note = [], ""
    gb = re.search(r"^global_batch\s*=\s*(\d+)", text, re.M)
    mb = re.search(r"^micro_batch\s*=\s*(\d+)", text, re.M)
    if gb and mb and int(gb.group(1)) % (2 * int(mb.group(1))) != 0:
        extra, note = [f"--train.global_batch={2 * int(gb.group(1))}"], " (global batch doubled)"
    print(f"| `{name}`{note} | " + " | ".join(cell(config, h, extra) for h in hosts) + " |")
PY
