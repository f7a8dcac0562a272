"""nf4_quantize against a NumPy implementation of QLoRA's quantiser written here from the paper (Dettmers et al.,
2023: NF4 levels, blocks of 64 with an absmax, double quantisation of the absmaxes in blocks of 256 after subtracting
their mean), in the fixed float32 order shardtrain documents (include/shardtrain/kernels/nf4.h). Identical 4-bit codes,
absmax codes, scales and offset, and equal dequantised values, on random and adversarial tensors; non-finite weights
refused.
`reference` is importable: tests/model/lora_parity_test.py quantises a QLoRA base with it.

    python3 nf4_test.py NF4_CODES_BINARY WORKDIR
"""
import os
import subprocess
import sys

import numpy as np

f32 = np.float32

# The 16 levels of the paper's NF4 data type (float32, as bitsandbytes ships them).
LEVELS = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                   -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                   0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                   0.7229568362236023, 1.0], dtype=f32)


def reference(x):
    """QLoRA's NF4 of the float32 vector x: (packed 4-bit codes, absmax codes, group scales, offset, dequantised x)."""
    n = x.size
    blocks = -(-n // 64)
    groups = -(-blocks // 256)
    padded = np.zeros(blocks * 64, dtype=f32)
    padded[:n] = x
    absmax = np.abs(padded.reshape(blocks, 64)).max(axis=1).astype(f32)
    with np.errstate(invalid="ignore", divide="ignore"):
        scaled = (padded.reshape(blocks, 64) / absmax[:, None]).astype(f32)
    dist = np.abs(scaled[:, :, None] - LEVELS[None, None, :]).astype(f32)
    codes = np.argmin(dist, axis=2)  # the first of equal distances: the lower level
    codes[absmax == 0] = 7
    codes = codes.reshape(-1)[:n]
    # The offset: each group's absmaxes summed in order in double, the groups' sums in order, over the block count.
    total = 0.0
    for g in range(groups):
        s = 0.0
        for a in absmax[g * 256:(g + 1) * 256]:
            s += float(a)
        total += s
    offset = f32(total / blocks) if blocks else f32(0)
    centred = (absmax - offset).astype(f32)
    scales = np.zeros(groups, dtype=f32)
    q = np.zeros(blocks, dtype=np.int8)
    for g in range(groups):
        c = centred[g * 256:(g + 1) * 256]
        scales[g] = np.abs(c).max()
        if scales[g] != 0:
            q[g * 256:(g + 1) * 256] = np.clip(np.rint((c / scales[g]).astype(f32) * f32(127)), -127, 127)
    absmax_hat = ((q.astype(f32) / f32(127)).astype(f32) * np.repeat(scales, 256)[:blocks]).astype(f32) + offset
    back = (LEVELS[codes] * np.repeat(absmax_hat.astype(f32), 64)[:n]).astype(f32)
    packed = np.zeros(-(-n // 2), dtype=np.uint8)
    packed[:] = (codes[0::2] << 4).astype(np.uint8)
    packed[: n // 2] |= codes[1::2].astype(np.uint8)
    return packed, q, scales, offset, back


def run(tool, work, name, x):
    src, dst = os.path.join(work, name + ".in"), os.path.join(work, name + ".out")
    x.astype("<f4").tofile(src)
    r = subprocess.run([tool, src, dst], capture_output=True, text=True)
    return r, dst


def check(tool, work, failures, name, x):
    r, dst = run(tool, work, name, x)
    if r.returncode != 0:
        failures.append(f"{name}: exit {r.returncode}: {r.stderr.strip()}")
        return
    raw = open(dst, "rb").read()
    n, blocks, groups = np.frombuffer(raw[:24], dtype="<i8")
    offset = np.frombuffer(raw[24:28], dtype="<f4")[0]
    at = 28
    codes = np.frombuffer(raw[at:at + (n + 1) // 2], dtype=np.uint8); at += (n + 1) // 2
    qa = np.frombuffer(raw[at:at + blocks], dtype=np.int8); at += blocks
    scales = np.frombuffer(raw[at:at + 4 * groups], dtype="<f4"); at += 4 * groups
    back = np.frombuffer(raw[at:at + 4 * n], dtype="<f4")
    ref_codes, ref_q, ref_scales, ref_offset, ref_back = reference(x.astype(f32))
    for what, got, want in (("4-bit codes", codes, ref_codes), ("absmax codes", qa, ref_q),
                            ("absmax scales", scales, ref_scales)):
        if got.shape != want.shape or not np.array_equal(got, want):
            bad = np.flatnonzero(got != want)[:3] if got.shape == want.shape else "shape"
            failures.append(f"{name}: {what} differ (first at {bad})")
    if offset != ref_offset:
        failures.append(f"{name}: offset {offset!r} != {ref_offset!r}")
    if not np.array_equal(back, ref_back):
        failures.append(f"{name}: dequantised values differ at {np.flatnonzero(back != ref_back)[:3]}")
    print(f"{name}: n={n}, blocks={blocks}, groups={groups}: "
          f"{'ok' if not any(f.startswith(name + ':') for f in failures) else 'FAILED'}")


def main():
    tool, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    failures = []

    def case(name, x):
        check(tool, work, failures, name, x)

    rng = np.random.default_rng(2023)
    case("normal_1e5", rng.standard_normal(100_000).astype(f32) * f32(0.02))  # 1563 blocks: 7 groups, the last short
    case("uniform_odd", rng.uniform(-3, 3, 64 * 256 + 37).astype(f32))       # an odd count: a half-filled last byte
    case("tiny", np.array([0.5], dtype=f32))
    zeros = rng.standard_normal(64 * 300).astype(f32)
    zeros[64:192] = 0                                                          # two all-zero blocks
    case("zero_blocks", zeros)
    case("all_zero", np.zeros(1000, dtype=f32))
    huge = rng.standard_normal(64 * 20).astype(f32)
    huge[100] = f32(3e38)                                                      # one huge value: its block's others -> 0
    case("one_huge", huge)
    denormal = (rng.standard_normal(64 * 10) * 1e-39).astype(f32)              # below FLT_MIN: subnormal weights
    case("denormals", denormal)
    ties = np.tile(((LEVELS[:-1] + LEVELS[1:]) / 2).astype(f32), 8)            # float32 midpoints between the levels
    ties[::64] = 1.0                                                           # each block's absmax is 1
    case("midpoints", ties)
    case("equal_absmaxes", np.tile(np.linspace(-1, 1, 64, dtype=f32), 512))  # every absmax equal: scale 0

    for name, bad in (("nan", np.nan), ("inf", np.inf), ("-inf", -np.inf)):
        x = rng.standard_normal(200).astype(f32)
        x[130] = bad
        r, _ = run(tool, work, "refused_" + name, x)
        if (r.returncode != 2 or "weights: element 130 is" not in r.stderr
                or "NF4 quantises finite weights only" not in r.stderr):
            failures.append(f"{name}: expected exit 2 naming element 130, got {r.returncode}: {r.stderr.strip()}")
        else:
            print(f"refused_{name}: exit 2: {r.stderr.strip()}")

    if failures:
        print("\n".join(failures))
        return 1
    print("all equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
