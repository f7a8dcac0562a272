#!/usr/bin/env bash
# One call on the GPU machine: build, run the gpu tests, benchmark shardtrain beside PyTorch FSDP2, and
# print a short table last. Full logs go to $OUT (the device tool brings them back).
#
#   bash bench/device_check.sh [all|build|test|bench|ckpt|generate]      # default all (generate: only when named)
#   BENCH_STEPS=20 BENCH_CASES="1:16 2:16 2:32 2:16:350m 2:32:124m:nop2p" bash bench/device_check.sh bench
#
# BENCH_CASES lists GPUS:MICRO_BATCH[:MODEL[:FLAGS]] cases, bf16, random tokens: MODEL a GPT-2 size at T=1024, 124m
# (default), 350m or 1.5b, or a llama-family shape at T=2048 (configs/MODEL.ini: llama3.2-1b, llama3.2-3b, qwen2.5-0.5b,
# smollm2-360m; token ids below 65536, the llm.c shard format's limit, with the classifier over the full vocabulary);
# FLAGS a '+'-joined list, each given to both trainers:
#   nop2p     NCCL_P2P_DISABLE=1 (the dual-RTX-4090 stand-in)
#   hybrid    two workstations on a LAN stand-in: each rank its own node (SHARDTRAIN_NODE_ID = its MPI rank), NCCL over
#             sockets (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1), --dist.sharding=hybrid; the peer shards fully over the
#             same sockets
#   offload   --optim.offload=optimizer / --offload
#   offparams --optim.offload=optimizer+params / --offload (the compute copy on the host too)
#   fracNN    ours only, with offload: --optim.offload_fraction=NN/100 (that share of the parameters' optimizer on the
#             host, the rest on the GPU; e.g. frac55)
#   cap24     --dist.max_gpu_mem_gib=24 / --mem-cap-gib 24 (a 24 GB card)
#   nospec    ours only, with offload: --optim.offload_speculative=false (no unit speculates)
#   noclip    ours only: --optim.grad_clip=0 (no step is clipped, so every speculative unit update is kept)
#   hostNN    ours only: --dist.max_host_mem_gib=NN (the host memory a rank plans for, within which
#             optim.offload_speculative=auto speculates; e.g. host64)
#   recompute --train.recompute=true / --recompute (without it ours runs --train.recompute=false whatever the config
#             says, as the peer does)
#   fp8t      --train.fp8=tensorwise (ours only: the peer stays bf16)
#   fp8r      --train.fp8=rowwise (ours only)
#   fp8d      --train.fp8=delayed (ours only: scales from the last steps' maxima)
#   fp8g      --train.fp8=tensorwise --dist.fp8_gather=true (ours only: the weights gathered as E4M3 codes)
#   gather8   --dist.fp8_gather=true (ours only; with fp8t or fp8d: the weights gathered as E4M3 codes)
#   keep8     --dist.fp8_gather=true --dist.fp8_gather_keep=true (ours only: the codes kept through a step)
#   pfN       --dist.prefetch_depth=N (ours only)
#   fp8fa     --train.fp8_fast_accum=true (with fp8t or fp8r: the forward GEMMs with cuBLASLt's fast accumulation)
#   compile   the peer's torch.compile (--compile; ours unchanged)
#   accN      ours accumulates N micro-batches a step (--train.global_batch = MICRO_BATCH x GPUS x N); the peer, which
#             has no accumulation, steps its optimizer every micro-batch
# e.g. BENCH_CASES="2:16:350m 2:16:350m:offload 2:4:1.5b:nop2p+cap24+recompute 2:4:1.5b:nop2p+cap24+recompute+offload".
# The peers, when present, are .peer/fsdp2_gpt2.py and .peer/fsdp2_llama.py: PyTorch FSDP2 training the same GPT-2,
# or transformers' Llama/Qwen2 (an ignored folder: carry it).
# BUILD_TARGETS, when set, builds only those targets (e.g. "shardtrain kernels_gpu_tests bench_fp8_linear").
# The bench stage also runs bench_gemm_shapes (each GEMM of a GPT-2 124M step through our cuBLASLt layer)
# and, with 2 GPUs, bench_collectives (NcclCommunicator vs raw NCCL busbw, and --exchange: the two reduce engines);
# BENCH_EXTRAS=0 skips both.
# The generate stage runs the GPU tests of decoding (ctest -R GEN_TESTS) and bench/generate_bench.py with GEN_ARGS
# (default --repeats 3 --batch 32 --sample --ckpt --profile) in GEN_DIR (default /tmp/genbench), then
# bench_decode_gemv (its step summary printed, the whole table in $OUT/decode_gemv.txt).
# The ckpt stage runs bench/ckpt_stall.sh for GPT-2 124M at micro batch 16 on two GPUs (one where there is one), with
# and without background saves every 20 steps (CKPT_STEPS steps, default 100).
# With SHARDTRAIN_PROFILE_OPS=1, each of our cases prints its op profile (GPU time per op and step) after the table.
# Each training run (ours or the peer's) still going after BENCH_TIMEOUT seconds (default 300; 0: no limit) is
# stopped and its row reads FAILED, so one hung case cannot spend the whole device call.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
STAGE=${1:-all}
OUT=${OUT:-/tmp/device_check}
BUILD=${BUILD:-build-device}
ARCHS=${ARCHS:-90}
BENCH_STEPS=${BENCH_STEPS:-20}
BENCH_CASES=${BENCH_CASES:-"1:16 1:32 2:16 2:32 2:16:350m 2:32:124m:nop2p 2:16:124m:hybrid"}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-300}
GEN_TESTS=${GEN_TESTS:-"MatmulGpu|DecodeStep|DecodeAttention|CudaDecoder|SampleGpu|Swiglu|Argmax|Rmsnorm|Rope"}
GEN_TESTS+="|enerate|transformers|peft"  # generate's CLI tests, the checks against transformers and PEFT
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
summary=()
# Libraries unpacked from .deps/ by the build stage (below); libicuuc loads libicudata itself, which no RPATH covers.
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

if [[ $STAGE == all || $STAGE == build ]]; then
  t0=$(date +%s)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/gpus.txt" 2>&1
  # An image with Boost 1.83's headers but no Boost.ProgramOptions library builds with Debian's 1.83 packages
  # carried in .boost/ (apt-get download libboost-program-options1.83-dev libboost-program-options1.83.0).
  extra=()
  if [[ -d .boost ]] && ! ls /usr/lib/x86_64-linux-gnu/libboost_program_options.so >/dev/null 2>&1; then
    for f in .boost/*.deb; do dpkg -x "$f" /tmp/boost_po; done
    cp /usr/lib/x86_64-linux-gnu/cmake/BoostDetectToolset-*.cmake /tmp/boost_po/usr/lib/x86_64-linux-gnu/cmake/ 2>/dev/null
    [[ -e /tmp/boost_po/usr/include ]] || ln -s /usr/include /tmp/boost_po/usr/include  # the image's 1.83 headers
    extra+=(-Dboost_program_options_DIR=/tmp/boost_po/usr/lib/x86_64-linux-gnu/cmake/boost_program_options-1.83.0)
  fi
  # An image without the tokenizer's ICU and PCRE2 development files builds with Debian 12's packages carried in .deps/
  # (apt-get download libicu-dev libicu72 icu-devtools libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0
  # libpcre2-posix3), unpacked and found through CMAKE_PREFIX_PATH and LD_LIBRARY_PATH (set above for every stage).
  if [[ -d .deps ]] && ! { [[ -e /usr/include/pcre2.h ]] && ls /usr/include/unicode/uchar.h >/dev/null 2>&1; }; then
    for f in .deps/*.deb; do dpkg -x "$f" /tmp/deps; done
    extra+=(-DCMAKE_PREFIX_PATH=/tmp/deps/usr)
  fi
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" "${extra[@]}" \
    >"$OUT/configure.log" 2>&1 &&
    cmake --build "$BUILD" -j"$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS} >"$OUT/build.log" 2>&1
  rc=$?
  summary+=("build: rc $rc in $(( $(date +%s) - t0 )) s ($(head -1 "$OUT/gpus.txt"), x$(wc -l <"$OUT/gpus.txt"))")
  if [[ $rc != 0 ]]; then grep -E "error|Error" "$OUT/build.log" | head -30; printf '%s\n' "${summary[@]}"; exit 1; fi
fi

if [[ $STAGE == all || $STAGE == test ]]; then
  t0=$(date +%s)
  # Tests that read the whole device's memory in use carry RUN_SERIAL: ctest runs them alone.
  ctest --test-dir "$BUILD" -L gpu -V -j4 >"$OUT/ctest_gpu.log" 2>&1
  rc=$?
  grep -E "tests passed|tests failed|\*\*\*Failed|Not Run|\*\*\*Skipped" "$OUT/ctest_gpu.log" | head -30
  summary+=("gpu tests: rc $rc in $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed' "$OUT/ctest_gpu.log")")
fi

data=/tmp/shardtrain_random_tokens.bin
make_data() {
  [[ -f $data ]] && return
  python3 - "$data" <<'PY'
import sys, numpy as np
n = 1 << 24  # 16.8M random tokens, llm.c .bin shard format; below 49152, the smallest vocabulary benchmarked (SmolLM2)
h = np.zeros(256, dtype=np.int32); h[:3] = [20240520, 1, n]
with open(sys.argv[1], "wb") as f:
    f.write(h.tobytes()); f.write(np.random.default_rng(0).integers(0, 49152, n, dtype=np.uint16).tobytes())
PY
}

if [[ $STAGE == all || $STAGE == bench ]]; then
  make_data
  # A build directory whose `shardtrain` runs each MPI rank as a node of its own (the hybrid flag).
  nodes_build=$(mktemp -d)
  printf '#!/bin/sh\nexport SHARDTRAIN_NODE_ID="${OMPI_COMM_WORLD_RANK:-0}"\nexec %s/shardtrain "$@"\n' \
    "$(cd "$BUILD" && pwd)" >"$nodes_build/shardtrain"
  chmod +x "$nodes_build/shardtrain"
  profiles=()
  declare -A peer_runs=()
  table=("$(printf '%-22s %-13s %-10s %-7s %-14s %-10s %-11s %-9s %-10s %s' case system tok/s mfu "peak GiB/rank" \
    "median ms" "compute ms" "comm ms" "ours/fsdp2" "SM MHz / W / power-capped (ours)")")
  for c in $BENCH_CASES; do
    IFS=: read -r g b model flags <<<"$c"
    model=${model:-124m}
    config="configs/gpt2-$model.ini" peer=.peer/fsdp2_gpt2.py seq=()
    case $model in
      124m) peer_model=(--layers 12 --dim 768 --heads 12) ;;
      350m) peer_model=(--layers 24 --dim 1024 --heads 16) ;;
      1.5b) peer_model=(--layers 48 --dim 1600 --heads 25) ;;
      llama3.2-1b | llama3.2-3b | llama3.1-8b | qwen2.5-0.5b | smollm2-360m)
        config="configs/$model.ini" peer=.peer/fsdp2_llama.py peer_model=(--shape "$model" --T 2048)
        seq=(--model.seq_len=2048) ;;
      *) echo "BENCH_CASES: unknown model '$model' in '$c' (124m, 350m, 1.5b, llama3.2-1b, llama3.2-3b, llama3.1-8b, qwen2.5-0.5b, smollm2-360m)"; exit 2 ;;
    esac
    link_env=() ours_flags=() peer_flags=() ours_build=$BUILD recompute=false acc=1
    IFS=+ read -ra flag_list <<<"$flags"
    for f in "${flag_list[@]}"; do
      case $f in
        nop2p) link_env=(NCCL_P2P_DISABLE=1) ;;
        hybrid) link_env=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1); ours_flags+=(--dist.sharding=hybrid)
                ours_build=$nodes_build ;;
        offload) ours_flags+=(--optim.offload=optimizer); peer_flags+=(--offload) ;;
        offparams) ours_flags+=(--optim.offload=optimizer+params); peer_flags+=(--offload) ;;
        cap24) ours_flags+=(--dist.max_gpu_mem_gib=24); peer_flags+=(--mem-cap-gib 24) ;;
        nospec) ours_flags+=(--optim.offload_speculative=false) ;;
        noclip) ours_flags+=(--optim.grad_clip=0) ;;
        host[0-9]*) [[ ${f#host} =~ ^[0-9]+$ ]] || { echo "BENCH_CASES: '$f' in '$c' is not hostNN (GiB)"; exit 2; }
                    ours_flags+=(--dist.max_host_mem_gib=${f#host}) ;;
        recompute) recompute=true; peer_flags+=(--recompute) ;;
        fp8t) ours_flags+=(--train.fp8=tensorwise) ;;
        fp8r) ours_flags+=(--train.fp8=rowwise) ;;
        fp8d) ours_flags+=(--train.fp8=delayed) ;;
        fp8g) ours_flags+=(--train.fp8=tensorwise --dist.fp8_gather=true) ;;
        gather8) ours_flags+=(--dist.fp8_gather=true) ;;
        keep8) ours_flags+=(--dist.fp8_gather=true --dist.fp8_gather_keep=true) ;;
        fp8fa) ours_flags+=(--train.fp8_fast_accum=true) ;;
        pf[0-9]*) [[ ${f#pf} =~ ^[0-9]+$ ]] || { echo "BENCH_CASES: '$f' in '$c' is not pfN (prefetch depth)"; exit 2; }
                  ours_flags+=(--dist.prefetch_depth=${f#pf}) ;;
        compile) peer_flags+=(--compile) ;;
        frac[0-9]*) [[ ${f#frac} =~ ^[0-9]+$ ]] || { echo "BENCH_CASES: '$f' in '$c' is not fracNN (NN percent)"; exit 2; }
                    ours_flags+=(--optim.offload_fraction=$(awk -v p="${f#frac}" 'BEGIN { print p / 100 }')) ;;
        acc[1-9]*) acc=${f#acc}
                   [[ $acc =~ ^[0-9]+$ ]] || { echo "BENCH_CASES: '$f' in '$c' is not accN with N a count"; exit 2; } ;;
        *) echo "BENCH_CASES: unknown flag '$f' in '$c' (nop2p, hybrid, offload, offparams, fracNN, cap24, nospec, noclip, hostNN, recompute, fp8t, fp8r, fp8d, fp8g, gather8, keep8, fp8fa, pfN, compile, accN)"
           exit 2 ;;
      esac
    done
    ours_flags+=(--train.recompute=$recompute)
    tag="${model}_g${g}_b${b}${flags:+_${flags//+/-}}"
    row=$(env "${link_env[@]}" TT_DIR="$OUT/tt" TT_TIMEOUT="$BENCH_TIMEOUT" bash bench/train_throughput.sh "$ours_build" "$g" \
      "$config" "${seq[@]}" --train.dtype=bf16 --data.path="$data" --data.val_path= --data.val_holdout=0.01 --train.micro_batch="$b" \
      --train.global_batch=$((b * g * acc)) --train.steps="$BENCH_STEPS" --log.every=5 --optim.warmup_steps=5 \
      "${ours_flags[@]}")
    if [[ $row == FAILED* ]]; then table+=("$(printf '%-22s %-13s %s' "$tag" shardtrain "$row")"); continue; fi
    read -r tok mfu peak ms compute comm _ sm watts capped _ <<<"$row"
    if [[ ${SHARDTRAIN_PROFILE_OPS:-0} == 1 ]]; then
      profiles+=("$tag:" "$(awk '/op profile/ {on = 1} on {print} on && / total / {exit}' "$(ls -t "$OUT"/tt/*.log | head -1)")")
    fi
    table+=("$(printf '%-22s %-13s %-10s %-7s %-14s %-10s %-11s %-9s %-10s %s' "$tag" shardtrain "$tok" "$mfu" "$peak" \
      "$ms" "$compute" "$comm" "" "$sm / $watts / $capped")")
    if [[ -f $peer ]]; then
      # Cases that differ only in our flags (fp8t, fp8g, ...) share one peer run: its arguments are the key.
      key="$g ${link_env[*]} ${peer_model[*]} $b ${peer_flags[*]}"
      j=${peer_runs[$key]:-"$OUT/fsdp2_$tag.json"}
      if [[ -z ${peer_runs[$key]:-} ]]; then
        peer_runs[$key]=$j
        peer_limit=()
        [[ $BENCH_TIMEOUT -gt 0 ]] && peer_limit=(timeout --kill-after=15 "$BENCH_TIMEOUT")
        env "${link_env[@]}" "${peer_limit[@]}" torchrun --nproc_per_node="$g" "$peer" "${peer_model[@]}" \
          --B "$b" --steps "$BENCH_STEPS" "${peer_flags[@]}" --json "$j" >"${j%.json}.log" 2>&1 </dev/null
      fi
      if [[ -f $j ]]; then
        table+=("$(python3 - "$j" "$tag" "$tok" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
ours = float(sys.argv[3])
print(f"{sys.argv[2]:<22} {'pytorch-fsdp2':<13} {r['tokens_per_s']:<10.0f} {r['mfu'] * 100:5.1f}%  "
      f"{r['peak_mem_gib']:<14.2f} {r['median_step_ms']:<10.1f} {'':<11} {'':<9} {ours / r['tokens_per_s']:.2f}x")
PY
)")
      else
        table+=("$(printf '%-22s %-13s FAILED' "$tag" pytorch-fsdp2)"); tail -5 "${j%.json}.log"
      fi
    fi
  done
  printf '%s\n' "${table[@]}" | tee "$OUT/bench_table.txt"
  [[ ${#profiles[@]} -gt 0 ]] && printf '%s\n' "${profiles[@]}"
  [[ ${BENCH_EXTRAS:-1} == 1 ]] && "$BUILD/bench_gemm_shapes" --rows 16384 --n-embd 768 2>&1 | tee "$OUT/gemm_shapes.txt"
  if [[ ${BENCH_EXTRAS:-1} == 1 && $(nvidia-smi -L | wc -l) -ge 2 ]]; then
    mpirun --bind-to none -np 2 -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS \
      "$BUILD/bench_collectives" --dtype bf16 --max-mib 1024 --iters 20 --exchange </dev/null 2>&1 | tee "$OUT/collectives.txt"
  fi
fi
if [[ $STAGE == all || $STAGE == ckpt ]]; then
  make_data
  t0=$(date +%s)
  g=$(( $(nvidia-smi -L | wc -l) >= 2 ? 2 : 1 ))
  STEPS=${CKPT_STEPS:-100} EVERY=20 bash bench/ckpt_stall.sh "$BUILD" "$g" configs/gpt2-124m.ini "$OUT/ckpt_stall" \
    --data.path="$data" --data.val_path= --data.val_holdout=0.01 --train.dtype=bf16 --train.micro_batch=16 \
    --train.global_batch=$((16 * g)) 2>&1 | grep -v '^\[' | tee "$OUT/ckpt_stall.txt"
  summary+=("ckpt stall: $g GPU(s) in $(( $(date +%s) - t0 )) s: $(grep -E '^async' "$OUT/ckpt_stall.txt" | tr -s ' ')")
fi
if [[ $STAGE == generate ]]; then
  # The decoding kernels' and decoders' GPU tests, then generate beside transformers (GEN_ARGS: generate_bench's flags).
  t0=$(date +%s)
  ctest --test-dir "$BUILD" -L gpu -R "$GEN_TESTS" -j4 >"$OUT/ctest_generate.log" 2>&1
  rc=$?
  grep -E "tests passed|\*\*\*Failed|Failed  " "$OUT/ctest_generate.log" | head -30
  summary+=("generate tests: rc $rc in $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed' "$OUT/ctest_generate.log")")
  gen_args=${GEN_ARGS:-"--repeats 3 --batch 32 --sample --ckpt --profile"}
  # shellcheck disable=SC2086
  python3 bench/generate_bench.py "$BUILD/shardtrain" "${GEN_DIR:-/tmp/genbench}" $gen_args \
    2>&1 | grep -v -E "Loading weights|Writing model shards|UserWarning|warnings.warn" | tee "$OUT/generate_bench.txt"
  "$BUILD/bench_decode_gemv" 2>&1 | tee "$OUT/decode_gemv.txt" | sed -n '/a step.s products/,$p'
fi
printf '%s\n' "${summary[@]}"
