#!/usr/bin/env bash
# session 5 call 4: speculative offload (tests + bench), env bootstrap on cuda, hybrid rerun.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
sed -i 's/-j16/-j32/' bench/device_check.sh
OUT=$OUT bash bench/device_check.sh build || { grep -E "error" $OUT/build.log | head; exit 1; }
python3 - <<'PY'
import random
rng = random.Random(7); base = bytes(rng.randrange(32, 127) for _ in range(97)); t = bytearray(base * 4000)
for i in range(len(t)):
    if rng.random() < 0.2: t[i] = rng.randrange(32, 127)
open("/tmp/text.txt", "wb").write(bytes(t))
import sys, numpy as np
n = 1 << 24
h = np.zeros(256, dtype=np.int32); h[:3] = [20240520, 1, n]
with open("/tmp/tok.bin", "wb") as f:
    f.write(h.tobytes()); f.write(np.random.default_rng(0).integers(0, 50257, n, dtype=np.uint16).tobytes())
PY
common="--config configs/tiny.ini --train.device=cuda --train.dtype=fp32 --data.path=/tmp/text.txt --data.format=text --data.shuffle=false --train.sample_tokens=0 --train.eval_every=0 --model.seq_len=64 --train.global_batch=12 --train.micro_batch=2 --train.steps=10"
for r in 0 1; do WORLD_SIZE=2 RANK=$r LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 build-device/shardtrain train $common --log.metrics=/tmp/env.jsonl > $OUT/env_r$r.log 2>&1 & done; wait
mpirun --bind-to none -np 2 build-device/shardtrain train $common --log.metrics=/tmp/mpi.jsonl > $OUT/mpi_ref.log 2>&1
python3 - <<'PY'
import json
a=[json.loads(l)["loss"] for l in open("/tmp/env.jsonl") if '"loss"' in l]
b=[json.loads(l)["loss"] for l in open("/tmp/mpi.jsonl") if '"loss"' in l]
print("env bootstrap on cuda vs mpirun: steps", len(a), len(b), "worst rel", max(abs(x-y)/abs(y) for x,y in zip(a,b)) if a and len(a)==len(b) else "MISMATCH")
PY
grep -h "communicator\|error" $OUT/env_r0.log | head -3
timeout 330 ctest --test-dir build-device -R "gpu.zero3.(offload|fp16-overflow|hybrid)" --output-on-failure > $OUT/ctest4.log 2>&1; echo "ctest rc $?"
grep -E "Test +#|worst rel|clipped|max \|weight|FAILED|failed|expected" $OUT/ctest4.log | head -40
b350="--train.dtype=bf16 --data.path=/tmp/tok.bin --data.val_path= --data.val_holdout=0.01 --train.micro_batch=16 --train.global_batch=32 --train.steps=10 --log.every=5 --optim.warmup_steps=5"
for v in "none" "optimizer" "optimizer --optim.offload_speculative=true" "optimizer+params --optim.offload_speculative=true"; do
  row=$(TT_DIR=$OUT/tt bash bench/train_throughput.sh build-device 2 configs/gpt2-350m.ini $b350 --optim.offload=$v)
  echo "350m 2x16 offload=$v: $row"
done
b15="--data.path=/tmp/tok.bin --data.val_path= --data.val_holdout=0.01 --train.micro_batch=4 --train.global_batch=8 --train.recompute=true --dist.max_gpu_mem_gib=24 --train.steps=8 --log.every=4 --optim.warmup_steps=5"
for v in "optimizer" "optimizer --optim.offload_speculative=true"; do
  row=$(NCCL_P2P_DISABLE=1 TT_DIR=$OUT/tt bash bench/train_throughput.sh build-device 2 configs/gpt2-1.5b.ini $b15 --optim.offload=$v)
  echo "1.5b 2x4 cap24 nop2p offload=$v: $row"
done
