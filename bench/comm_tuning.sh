#!/usr/bin/env bash
# The measurements behind default_comm_tuning() (src/shard/comm_tuning.cc): per link kind, tokens/s and exposed
# communication against dist.prefetch_depth and, for hybrid sharding, dist.bucket_mb. Two GPUs, GPT-2 at T=1024,
# bf16, random tokens, one bench/train_throughput.sh row per setting.
#
#   bash bench/comm_tuning.sh BUILD DATA [LINK ...]      LINK: nvlink pcie network hybrid (default: all four)
#   DEPTHS="0 1 2 3" BUCKETS="0 8 32 256" MODEL=124m MICRO=32 STEPS=15 bash bench/comm_tuning.sh build-device tok.bin
#
# nvlink   full sharding over NVLink (peer-to-peer on)
# pcie     full sharding with NCCL_P2P_DISABLE=1: NCCL copies through host memory, as on two RTX 4090s
# network  full sharding with each GPU its own "node" (SHARDTRAIN_NODE_ID = rank) and NCCL over sockets
#          (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1): two workstations on a LAN
# hybrid   the same stand-in with dist.sharding=hybrid: the bucket sizes of the all-reduce across nodes
set -uo pipefail
BUILD=$1 DATA=$2
shift 2
LINKS=${*:-nvlink pcie network hybrid}
DEPTHS=${DEPTHS:-0 1 2 3}
BUCKETS=${BUCKETS:-0 8 32 256}
MODEL=${MODEL:-124m} MICRO=${MICRO:-32} STEPS=${STEPS:-15}
cd "$(dirname "$0")/.."
build=$(cd "$BUILD" && pwd)
# A build directory whose `shardtrain` runs each MPI rank as its own node.
ws=$(mktemp -d)
printf '#!/bin/sh\nexport SHARDTRAIN_NODE_ID="${OMPI_COMM_WORLD_RANK:-0}"\nexec %s/shardtrain "$@"\n' "$build" >"$ws/shardtrain"
chmod +x "$ws/shardtrain"
common=(--train.dtype=bf16 --data.path="$DATA" --data.val_path= --data.val_holdout=0.01 --train.micro_batch="$MICRO"
        --train.global_batch=$((2 * MICRO)) --train.steps="$STEPS" --log.every=5 --optim.warmup_steps=5)
printf '%-8s %-26s %s\n' link setting "tok/s mfu peak_GiB median_ms compute_ms exposed_comm_ms ..."
row() {  # LINK SETTING ENV... -- ARGS...
  local link=$1 setting=$2 envs=() bin=$build
  shift 2
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  [[ $link == network || $link == hybrid ]] && bin=$ws
  printf '%-8s %-26s %s\n' "$link" "$setting" \
    "$(env "${envs[@]}" bash bench/train_throughput.sh "$bin" 2 "configs/gpt2-$MODEL.ini" "${common[@]}" "$@" | tail -1)"
}
sockets=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)
for link in $LINKS; do
  case $link in
    nvlink) for d in $DEPTHS; do row nvlink "prefetch_depth=$d" -- --dist.prefetch_depth="$d"; done ;;
    pcie) for d in $DEPTHS; do row pcie "prefetch_depth=$d" NCCL_P2P_DISABLE=1 -- --dist.prefetch_depth="$d"; done ;;
    network) for d in $DEPTHS; do row network "prefetch_depth=$d" "${sockets[@]}" -- --dist.prefetch_depth="$d"; done ;;
    hybrid) for b in $BUCKETS; do
              row hybrid "bucket_mb=$b" "${sockets[@]}" -- --dist.sharding=hybrid --dist.bucket_mb="$b"
            done ;;
    *) echo "unknown link '$link' (nvlink pcie network hybrid)"; exit 2 ;;
  esac
done
rm -rf "$ws"
