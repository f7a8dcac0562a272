#!/usr/bin/env bash
# ZeRO-3 on the CPU backend: tokens/s and per-rank memory for N = 1 and 2 ranks.
#   bench/sharded_cpu.sh [build-dir]
# Reads the JSONL metrics of real `shardtrain train` runs: median tokens/s over the steps after the first,
# this rank's sharded state (param + grad + m + v shards) and the peak of gathered full-size buffers.
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d)
summary() {
  /usr/bin/python3 - "$1" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
tps = statistics.median(r["tokens_per_s"] for r in recs[1:]) if len(recs) > 1 else recs[0]["tokens_per_s"]
print(f"{tps:10.0f} tok/s | sharded state {recs[-1]['mem_sharded_bytes'] / 2**20:9.1f} MiB/rank | "
      f"gathered peak {recs[-1]['mem_gathered_peak_bytes'] / 2**20:8.1f} MiB/rank | loss {recs[-1]['loss']:.4f}")
PY
}
# name config steps global_batch micro_batch extra
while read -r name config steps gb mb extra; do
  for n in 1 2; do
    threads=$(( $(nproc) / n )); [ "$threads" -ge 1 ] || threads=1
    OMP_NUM_THREADS=$threads mpirun --oversubscribe --bind-to none --mca btl self,vader -np "$n" \
      "$build/shardtrain" train --config "configs/$config" --train.steps="$steps" --train.global_batch="$gb" \
      --train.micro_batch="$mb" --train.eval_every=0 --train.eval_batches=1 --train.sample_tokens=0 \
      --data.path=@fortunes --data.format=text --ckpt.dir= --log.metrics="$out/$name.$n.jsonl" $extra \
      < /dev/null > "$out/$name.$n.log" 2>&1  # mpirun reads stdin: keep it off the case list
    echo "[$name] N=$n (OMP_NUM_THREADS=$threads): $(summary "$out/$name.$n.jsonl")"
  done
done <<'CASES'
tiny tiny.ini 20 16 8
gpt2-124m gpt2-124m.ini 4 2 1 --data.val_path=
CASES
rm -rf "$out"
