#!/usr/bin/env bash
# shardtrain's CPU step against PyTorch CPU (Debian's python3-torch) on the same model, in one run.
#   bench/cpu_train.sh [build-dir]
# Prints both lines and the ratio for each model size.
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
tps() { sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p' <<<"$1"; }
# name  layers dim heads vocab T B
while read -r name L C H V T B; do
  ours=$("$build/bench_cpu_train" --config configs/tiny.ini --model.n_layer="$L" --model.n_embd="$C" \
         --model.n_head="$H" --model.vocab_size="$V" --model.seq_len="$T" --train.micro_batch="$B" \
         --train.global_batch="$B")
  echo "[$name] $ours"
  # PyTorch at 1 thread and at all cores: on a small shared machine its own pool can lose to 1 thread,
  # so the ratio is taken against the faster of the two.
  best=0
  for threads in 1 "$(nproc)"; do
    peer=$(/usr/bin/python3 bench/cpu_train_torch.py --layers "$L" --dim "$C" --heads "$H" --vocab "$V" --T "$T" \
           --B "$B" --threads "$threads")
    echo "[$name] $peer"
    best=$(awk -v a="$best" -v b="$(tps "$peer")" 'BEGIN { print (b > a ? b : a) }')
  done
  echo "[$name] shardtrain / best pytorch tokens/s = $(ratio "$(tps "$ours")" "$best")"
done <<'CASES'
tiny 4 128 4 256 128 16
small-gpt2-vocab 2 256 4 50257 128 4
CASES
