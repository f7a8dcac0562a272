#!/usr/bin/env bash
# Training throughput of shardtrain for any config: median step time after a warm-up, tokens/s, MFU,
# peak device memory per rank, and the step split into compute and exposed communication (the time the
# computation waited for collectives: the JSONL's comm_exposed_ms).
#
#   bash bench/train_throughput.sh BUILD GPUS CONFIG [--section.key=value ...]
#   bash bench/train_throughput.sh build 2 configs/gpt2-124m.ini --train.micro_batch=32 --data.path=tokens.bin
#
# GPUS = 0 runs the CPU backend in one process. Prints one table row (see HEADER below) and leaves the
# JSONL and the log in ${TT_DIR:-/tmp/train_throughput}. WARMUP steps (default 3) are left out of the medians.
set -uo pipefail
BUILD=$1 GPUS=$2 CONFIG=$3
shift 3
TT_DIR=${TT_DIR:-/tmp/train_throughput}
WARMUP=${WARMUP:-3}
mkdir -p "$TT_DIR"
tag="g${GPUS}_$(basename "$CONFIG" .ini)_$$"
m="$TT_DIR/$tag.jsonl" log="$TT_DIR/$tag.log"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [[ $GPUS -eq 0 ]]; then
  cmd=("$BUILD/shardtrain" train --config "$CONFIG" --train.device=cpu)
else
  forward=()
  for v in NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS NCCL_P2P_DISABLE NCCL_SHM_DISABLE \
           SHARDTRAIN_NODE_ID; do
    [[ -n ${!v+x} ]] && forward+=(-x "$v")
  done
  cmd=(mpirun --bind-to none -np "$GPUS" "${forward[@]}" "$BUILD/shardtrain" train --config "$CONFIG" --train.device=cuda)
fi
"${cmd[@]}" --train.eval_every=0 --train.eval_batches=1 --train.sample_tokens=0 --log.metrics="$m" "$@" \
  >"$log" 2>&1 </dev/null
rc=$?
if [[ $rc != 0 ]]; then
  echo "FAILED (exit $rc): see $log"
  tail -5 "$log"
  exit $rc
fi
python3 - "$m" "$log" "$WARMUP" <<'PY'
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l][int(sys.argv[3]):]
if not rows:
    sys.exit("no steps after the warm-up")
med = lambda k: statistics.median(r[k] for r in rows)
ms, tok, comm = med("ms"), med("tokens_per_s"), med("comm_exposed_ms")
mfu = [r["mfu"] for r in rows if r.get("mfu") is not None]
mfu = f"{100 * statistics.median(mfu):5.1f}%" if mfu else "  n/a "
peak = re.findall(r"device in use ([0-9.]+) MiB", open(sys.argv[2]).read())
peak = f"{float(peak[-1]) / 1024:.1f}" if peak else "n/a"
# HEADER: tok/s  MFU  peak GiB/rank  step ms  compute ms  exposed comm ms  steps
print(f"{tok:10.0f} {mfu} {peak:>8} {ms:9.1f} {ms - comm:9.1f} {comm:8.2f} {len(rows):4d}")
PY
