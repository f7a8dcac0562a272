#!/usr/bin/env bash
# LoRA / QLoRA throughput on one GPU: shardtrain beside transformers + PEFT (.peer/peft_lora.py, an ignored folder
# carried to the GPU machine), same shape, micro batch, T = 2048, rank-16 adapters (alpha 32) on every linear layer,
# random tokens. Each side prints its tokens/s and peak memory; the logs go to $OUT.
#
#   bash bench/lora_throughput.sh SHAPE B [recompute] [cap24] [nf4]
#   STEPS=20 PEER=0 bash bench/lora_throughput.sh llama3.1-8b 4 recompute cap24 nf4
#
# SHAPE names configs/SHAPE.ini (configs/SHAPE-lora.ini when it exists). recompute: --train.recompute=true /
# --recompute; cap24: --dist.max_gpu_mem_gib=24 / --mem-cap-gib 24 (an RTX 4090's memory); nf4: a QLoRA base
# (--lora.base_dtype=nf4; the peer has no 4-bit base here: run it with PEER=0). PEER=0 runs shardtrain alone.
set -u
S=$1; B=$2; shift 2
BIN=${BIN:-build-device/shardtrain}
R=${OUT:-/tmp/out}; mkdir -p $R
ours=(); peer=(); tag=${S}_$B
for f in "$@"; do
  case $f in
    recompute) ours+=(--train.recompute=true); peer+=(--recompute); tag+=_rc;;
    cap24) ours+=(--dist.max_gpu_mem_gib=24); peer+=(--mem-cap-gib 24); tag+=_cap24;;
    nf4) ours+=(--lora.base_dtype=nf4); tag+=_nf4;;
  esac
done
[[ " $* " == *" recompute "* ]] || ours+=(--train.recompute=false)
[[ -e /tmp/tok.bin ]] || python3 - /tmp/tok.bin <<'PY'
import sys, numpy as np
n = 1 << 22
h = np.zeros(256, dtype=np.int32); h[:3] = [20240520, 1, n]
with open(sys.argv[1], "wb") as f:
    f.write(h.tobytes()); f.write(np.random.default_rng(0).integers(0, 49152, n, dtype=np.uint16).tobytes())
PY
cfg=configs/$S.ini; [[ -e configs/$S-lora.ini ]] && cfg=configs/$S-lora.ini
$BIN train --config $cfg --train.device=cuda --lora.rank=16 --lora.alpha=32 --lora.targets=all --optim.offload=none \
  --train.micro_batch=$B --train.global_batch=$B --model.seq_len=2048 --data.path=/tmp/tok.bin --data.format=llmc \
  --data.val_path= --train.steps=${STEPS:-20} --train.eval_every=0 --train.sample_tokens=0 --log.every=5 --ckpt.dir= \
  "${ours[@]}" > $R/ours_$tag.log 2>&1
echo "ours $tag: $(grep -E "done:|error|memory per rank" $R/ours_$tag.log | tail -2 | tr '\n' ' ')"
[[ ${PEER:-1} == 1 ]] && { timeout 600 python3 .peer/peft_lora.py --shape $S --B $B --T 2048 "${peer[@]}" > $R/peer_$tag.log 2>&1; echo "peer $tag: $(tail -1 $R/peer_$tag.log)"; }
true
