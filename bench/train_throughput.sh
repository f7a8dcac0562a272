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
# The run saves no checkpoint (the config's ckpt.dir is cleared) unless a flag names a --ckpt.dir.
# TT_TIMEOUT seconds (default 0: none) bound the run: a run still going then is stopped (SIGTERM, SIGKILL 15 s
# later) and reported as FAILED (exit 124), so that one hung variant cannot spend a whole device call.
# With GPUs, nvidia-smi samples every GPU every 200 ms during the run; the row ends with the median SM clock and
# power of the samples drawing over half the power limit (the training, not the start-up), and the share of those
# with the software power cap among the clock-event reasons ("-" without nvidia-smi).
set -uo pipefail
BUILD=$1 GPUS=$2 CONFIG=$3
shift 3
TT_DIR=${TT_DIR:-/tmp/train_throughput}
WARMUP=${WARMUP:-3}
TT_TIMEOUT=${TT_TIMEOUT:-0}
[[ $TT_TIMEOUT =~ ^[0-9]+$ ]] || { echo "train_throughput: TT_TIMEOUT must be whole seconds, got '$TT_TIMEOUT'" >&2; exit 2; }
mkdir -p "$TT_DIR"
tag="g${GPUS}_$(basename "$CONFIG" .ini)_$$"
m="$TT_DIR/$tag.jsonl" log="$TT_DIR/$tag.log"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# mpirun refuses root without these (containers run as root); libraries device_check.sh's build stage unpacked into
# /tmp/deps (an image without the tokenizer's ICU) are found as they are there.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[[ -d /tmp/deps/usr/lib/x86_64-linux-gnu ]] &&
  export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
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
smi="$TT_DIR/$tag.smi.csv" smi_pid=""
: >"$smi"
if [[ $GPUS -gt 0 ]] && command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,clocks.sm,power.draw,power.limit,clocks_event_reasons.active \
    --format=csv,noheader,nounits -lms 200 >"$smi" 2>/dev/null &
  smi_pid=$!
fi
limit=()
[[ $TT_TIMEOUT -gt 0 ]] && limit=(timeout --kill-after=15 "$TT_TIMEOUT")
start=$SECONDS
"${limit[@]}" "${cmd[@]}" --train.eval_every=0 --train.eval_batches=1 --train.sample_tokens=0 --ckpt.dir= --log.metrics="$m" \
  "$@" \
  >"$log" 2>&1 </dev/null
rc=$?
[[ -n $smi_pid ]] && kill "$smi_pid" 2>/dev/null
# A timed-out run's ranks can outlive the mpirun that timeout killed, holding the GPU and pinned host memory, and the
# next run would find neither (seen: an 8B run's ranks left 9.3 GiB of the GPU free): they are killed too, and waited
# for (at most 60 s).
if [[ $GPUS -gt 0 && ($rc == 124 || $rc == 137) ]]; then
  pkill -KILL -f "^$BUILD/shardtrain train " 2>/dev/null
  for _ in $(seq 60); do pgrep -f "^$BUILD/shardtrain train " >/dev/null || break; sleep 1; done
fi
# 124: stopped by SIGTERM; 137: by the SIGKILL after it (or killed otherwise, e.g. out of memory, before the limit).
if [[ $TT_TIMEOUT -gt 0 && ($rc == 124 || $rc == 137) && $((SECONDS - start)) -ge $TT_TIMEOUT ]]; then
  echo "FAILED (timed out after $TT_TIMEOUT s): see $log"
  exit 124
fi
if [[ $rc != 0 ]]; then
  echo "FAILED (exit $rc): see $log"
  # The first error a rank printed (a plan's refusal, an allocation that failed), else the log's end.
  grep -m3 -E "error: |does not fit|out of memory" "$log" || tail -5 "$log"
  exit $rc
fi
python3 - "$m" "$log" "$WARMUP" "$smi" <<'PY'
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
# index, SM MHz, W, limit W, clock-event reasons (hex; 0x4 = software power cap); odd lines (errors) are skipped.
hot = []
for line in open(sys.argv[4]):
    f = [x.strip() for x in line.split(",")]
    try:
        sm, w, limit, why = float(f[1]), float(f[2]), float(f[3]), int(f[4], 16)
    except (IndexError, ValueError):
        continue
    if w > limit / 2:
        hot.append((sm, w, why & 0x4 != 0))
gpu = (f"{statistics.median(h[0] for h in hot):6.0f} {statistics.median(h[1] for h in hot):5.0f} "
       f"{100 * sum(h[2] for h in hot) / len(hot):4.0f}%") if hot else "     -     -     -"
# HEADER: tok/s  MFU  peak GiB/rank  step ms  compute ms  exposed comm ms  steps  SM MHz  W  power-capped
print(f"{tok:10.0f} {mfu} {peak:>8} {ms:9.1f} {ms - comm:9.1f} {comm:8.2f} {len(rows):4d} {gpu}")
PY
