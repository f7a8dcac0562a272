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
  peer=$(/usr/bin/python3 bench/cpu_train_torch.py --layers "$L" --dim "$C" --heads "$H" --vocab "$V" --T "$T" --B "$B")
  echo "[$name] $ours"
  echo "[$name] $peer"
  echo "[$name] shardtrain / pytorch tokens/s = $(ratio "$(tps "$ours")" "$(tps "$peer")")"
done <<'CASES'
tiny 4 128 4 256 128 16
small-gpt2-vocab 2 256 4 50257 128 4
CASES
