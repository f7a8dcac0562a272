#!/usr/bin/env bash
# Peak host memory (RSS) of a CUDA run in each phase that holds state on the host: random initialisation and a
# step, a synchronous checkpoint save, a background one, a resume (checkpoint load), and init.from a Hugging Face
# directory exported from the checkpoint. One run per phase, each under bench/host_peak.sh; the difference between
# a phase's peak and the first row's is what that phase adds.
#
#   bash bench/host_phases.sh BUILD CONFIG DATA [--section.key=value ...]
#   bash bench/host_phases.sh build configs/llama3.2-1b.ini tokens.bin --optim.offload=optimizer
#
# HP_DEVICE=cpu measures the cpu backend instead. The checkpoints go to ${HP_DIR:-/tmp/host_phases} (removed at the start): a Llama-3.2-1B checkpoint is 15 GB.
set -uo pipefail
BUILD=$1 CONFIG=$2 DATA=$3
shift 3
dir=${HP_DIR:-/tmp/host_phases}
rm -rf "$dir" && mkdir -p "$dir"
common=(--config "$CONFIG" --train.device="${HP_DEVICE:-cuda}" --data.path="$DATA" --data.val_path= --data.val_holdout=0.01
        --train.eval_every=0 --train.eval_batches=1 --train.sample_tokens=0 --optim.warmup_steps=1 "$@")
here=$(cd "$(dirname "$0")" && pwd)
phase() {  # name, then the run's own flags
  local name=$1
  shift
  local log="$dir/${name// /_}.log"
  bash "$here/host_peak.sh" "$BUILD/shardtrain" train "${common[@]}" "$@" >"$log" 2>&1
  local rc=$? peak
  peak=$(grep '^host peak: ' "$log" | tail -1 | cut -d' ' -f3-4)
  printf '%-40s %s (exit %s)\n' "$name" "$peak" "$rc"
}
echo "phase                                    host peak"
phase "init + 1 step" --train.steps=1 --ckpt.dir=
phase "init + 1 step + synchronous save" --train.steps=1 --ckpt.dir="$dir/sync" --ckpt.every=1 --ckpt.async=false
phase "init + 1 step + background save" --train.steps=1 --ckpt.dir="$dir/async" --ckpt.every=1 --ckpt.async=true
step=$(ls -d "$dir"/sync/step_* | head -1)
phase "resume (load) + 1 step" --train.steps=2 --ckpt.dir= --ckpt.resume="$step"
hf=("$dir/hf" --dtype bf16)  # a Hugging Face directory for the llama family, an fp32 safetensors file for GPT-2
grep -Eq '^arch *= *llama' "$CONFIG" || hf=("$dir/hf.safetensors")
"$BUILD/shardtrain" ckpt export "$step" --out "${hf[@]}" >"$dir/export.log" 2>&1 || { echo "export failed"; tail -3 "$dir/export.log"; }
phase "init.from (exported weights) + 1 step" --train.steps=1 --ckpt.dir= --init.from="${hf[0]}"
rm -rf "$dir"/sync "$dir"/async
