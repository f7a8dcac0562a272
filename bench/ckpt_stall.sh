#!/usr/bin/env bash
# What checkpoints cost training: the same run without saves, with background saves (ckpt.async=true) and with
# saves that training waits for (ckpt.async=false), one after the other in one call.
#
#   bash bench/ckpt_stall.sh BUILD GPUS CONFIG CKPT_DIR [--section.key=value ...]
#   bash bench/ckpt_stall.sh build 1 configs/gpt2-124m.ini /tmp/stall --train.micro_batch=16 --data.path=tokens.bin
#
# A step's cost is the JSONL's ms + ckpt_ms: the step itself, then what the save after it took on the training
# thread (the snapshot; the whole save when synchronous). Reported per variant, after WARMUP steps (default 5):
#   median       median step cost over all steps (the target: async <= 1.03x none)
#   mean         mean step cost: throughput, waits for earlier saves included
#   save median  median cost of the steps that saved, without waiting for the save before (ckpt_wait_ms); the
#                budget beside it is the no-save median plus the rank's state bytes / 50 GB/s (a device-to-host
#                copy at 50 GB/s)
#   next median  median cost of the steps right after a save (a snapshot copy that held the step up shows here)
#   wait median  median ckpt_wait_ms of the saves: the wait for the previous save to commit (disk-bound when saves
#                come faster than the disk writes them)
#   commit s     median seconds from the save to its commit, from the log
# STEPS (default 100), EVERY (default 20) and KEEP (default 2) set the run length, ckpt.every and ckpt.keep. Runs and
# logs stay in CKPT_DIR.
set -uo pipefail
BUILD=$1 GPUS=$2 CONFIG=$3 DIR=$4
shift 4
STEPS=${STEPS:-100} EVERY=${EVERY:-20} WARMUP=${WARMUP:-5} KEEP=${KEEP:-2}
mkdir -p "$DIR"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [[ $GPUS -eq 0 ]]; then
  run=("$BUILD/shardtrain" train --config "$CONFIG" --train.device=cpu)
else
  run=(mpirun --bind-to none -np "$GPUS" -x NCCL_NVLS_ENABLE "$BUILD/shardtrain" train --config "$CONFIG"
       --train.device=cuda)
fi
common=(--train.steps="$STEPS" --train.eval_every=0 --train.eval_batches=1 --train.sample_tokens=0 --log.every=10)

printf '%-8s %10s %7s %9s %12s %12s %12s %12s %9s %14s\n' variant "median ms" ratio "mean ms" "save median" \
  "save budget" "next median" "wait median" "commit s" "bytes/rank"
base=""
for variant in none async sync; do
  m="$DIR/$variant.jsonl" log="$DIR/$variant.log"
  rm -rf "${DIR:?}/ckpt_$variant" "$m"
  extra=(--ckpt.dir=)  # none: no saves, whatever the config's ckpt.dir
  case $variant in
    async) extra=(--ckpt.dir="$DIR/ckpt_$variant" --ckpt.every="$EVERY" --ckpt.keep="$KEEP" --ckpt.async=true) ;;
    sync) extra=(--ckpt.dir="$DIR/ckpt_$variant" --ckpt.every="$EVERY" --ckpt.keep="$KEEP" --ckpt.async=false) ;;
  esac
  if ! "${run[@]}" "${common[@]}" --log.metrics="$m" "${extra[@]}" "$@" >"$log" 2>&1 </dev/null; then
    echo "$variant: FAILED, see $log"
    tail -5 "$log"
    continue
  fi
  row=$(python3 - "$m" "$log" "$WARMUP" "$EVERY" "$variant" "${base:-0}" <<'PY'
import json, re, statistics, sys
path, log, warmup, every, variant, base = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], float(sys.argv[6])
steps, waits = {}, {}
for line in open(path):
    r = json.loads(line)
    if "ms" in r:
        steps[r["step"]] = r["ms"] + r.get("ckpt_ms", 0.0)
        waits[r["step"]] = r.get("ckpt_wait_ms", 0.0)
last = max(steps)
keep = {s: t for s, t in steps.items() if s > warmup}
med = statistics.median(keep.values())
saves = [t - waits[s] for s, t in keep.items() if variant != "none" and s % every == 0 and s != last]
waited = [waits[s] for s in keep if variant != "none" and s % every == 0 and s != last]
mean = statistics.mean(keep.values())
after = [t for s, t in keep.items() if variant != "none" and s % every == 1 and s > every]
text = open(log).read()
commits = [float(x) for x in re.findall(r"checkpoint: saved step \d+ to \S+ \(\d+ files, \d+ bytes, ([0-9.e+-]+) s", text)]
sizes = [int(x) for x in re.findall(r"checkpoint: saved step \d+ to \S+ \((\d+) files, (\d+) bytes", text) for x in [x[1]]]
files = [int(x) for x in re.findall(r"checkpoint: saved step \d+ to \S+ \((\d+) files", text)]
per_rank = sizes[0] / files[0] if sizes else 0
ref = base if base > 0 else med
budget = ref + per_rank / 50e9 * 1e3 if per_rank else float("nan")
fmt = lambda xs: f"{statistics.median(xs):.2f}" if xs else "-"
ratio = f"{med / base:.3f}x" if base > 0 else "1x"
print(f"{variant:8s} {med:10.2f} {ratio:>7s} {mean:9.2f} {fmt(saves):>12s} {budget:12.2f} {fmt(after):>12s} {fmt(waited):>12s} {fmt(commits):>9s} {per_rank:14.0f}")
PY
)
  echo "$row"
  rm -rf "${DIR:?}/ckpt_$variant"  # the disk space, before the next variant
  [[ $variant == none ]] && base=$(awk '{print $2}' <<<"$row")
done
