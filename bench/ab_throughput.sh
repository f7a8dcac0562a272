#!/usr/bin/env bash
# Two (or more) variants of shardtrain on the same cases in one run, interleaved round by round, so that a
# machine's drift and its power cap fall on every variant alike; then each case's median tokens/s per variant and
# the ratio to the first. Machines of one kind, and one machine from one start to the next, differ by a few per
# cent, more than most single changes gain: compare variants only within one run.
#
#   bash bench/ab_throughput.sh ROUNDS CASES VARIANT... [-- TRAIN_FLAGS...]
#   bash bench/ab_throughput.sh 2 "2:16:124m 2:16:350m" base=build-base new=build-device -- --data.path=tok.bin
#
# CASES: space-separated GPUS:MICRO_BATCH:MODEL (configs/gpt2-MODEL.ini; MODEL may also name any configs/*.ini
# stem, e.g. tiny), each run with --train.global_batch=GPUS*MICRO_BATCH. GPUS = 0 runs the CPU backend.
# VARIANT: NAME=BUILD[,VAR=VALUE...][,--section.key=value...]: the build folder, environment variables set for its
# runs only (an experiment's switch, NCCL_P2P_DISABLE=1, ...) and training flags for its runs only (e.g.
# sm=build,--dist.gather_engine=sm against copy=build: two settings of one binary, interleaved). TRAIN_FLAGS go to
# every run, after these defaults: --train.dtype=bf16 on GPUs, --train.steps=${AB_STEPS:-14}, --log.every=5 (a key
# may be given once: set the steps through AB_STEPS). Each run is one bench/train_throughput.sh row (3 warm-up
# steps, then medians); rows go to stdout as they finish, the summary last. A run still going after
# ${AB_TIMEOUT:-300} seconds is stopped and counted as failed (AB_TIMEOUT=0: no limit). With SHARDTRAIN_PROFILE_OPS=1
# (set for all, or in a variant's own variables) each run's op profile follows its row. Each run's JSONL and log stay
# in ${TT_DIR:-/tmp/train_throughput}/ab<pid>_r<round>_c<case>_<variant>.
#
# A build of another commit, beside the working tree (the GPU machine gets a copy of the tree, not the history):
#   git archive REV | (mkdir -p build-ab-src && tar -x -C build-ab-src)      # here; carry build-ab-src
#   cmake -S build-ab-src -B build-base -DCMAKE_BUILD_TYPE=Release && cmake --build build-base --target shardtrain
set -uo pipefail
if [[ $# -lt 3 ]]; then
  sed -n '2,20p' "$0" >&2
  exit 2
fi
ROUNDS=$1 CASES=$2
shift 2
variants=()
while [[ $# -gt 0 && $1 != -- ]]; do
  [[ $1 == *=* ]] || { echo "ab_throughput: variant '$1' is not NAME=BUILD[,VAR=VALUE...]" >&2; exit 2; }
  variants+=("$1")
  shift
done
[[ ${1:-} == -- ]] && shift
flags=("$@")
[[ ${#variants[@]} -ge 1 ]] || { echo "ab_throughput: no variant given" >&2; exit 2; }
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "ab_throughput: ROUNDS must be a positive integer, got '$ROUNDS'" >&2; exit 2; }
AB_TIMEOUT=${AB_TIMEOUT:-300}
[[ $AB_TIMEOUT =~ ^[0-9]+$ ]] || { echo "ab_throughput: AB_TIMEOUT must be whole seconds, got '$AB_TIMEOUT'" >&2; exit 2; }
cd "$(dirname "$0")/.."
# Everything is parsed and checked before the first run.
names=() builds=() envs_of=() flags_of=()  # variant i's VAR=VALUE list and its flags, each comma-separated
for v in "${variants[@]}"; do
  name=${v%%=*} rest=${v#*=}
  build=${rest%%,*} items="" envs="" vflags=""
  [[ $rest == *,* ]] && items=${rest#*,}
  [[ -x $build/shardtrain ]] || { echo "ab_throughput: variant '$name': no $build/shardtrain" >&2; exit 2; }
  IFS=, read -r -a list <<<"$items"
  for e in "${list[@]}"; do
    if [[ $e =~ ^--[a-z_]+\.[a-z0-9_]+= ]]; then
      vflags+=${vflags:+,}$e
    elif [[ $e =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; then
      envs+=${envs:+,}$e
    else
      echo "ab_throughput: variant '$name': '$e' is not VAR=VALUE or --section.key=value" >&2
      exit 2
    fi
  done
  names+=("$name") builds+=("$build") envs_of+=("$envs") flags_of+=("$vflags")
done
cases=() configs=()
for c in $CASES; do
  [[ $c =~ ^[0-9]+:[1-9][0-9]*:[A-Za-z0-9._-]+$ ]] ||
    { echo "ab_throughput: case '$c' is not GPUS:MICRO_BATCH:MODEL" >&2; exit 2; }
  model=${c##*:}
  config=configs/gpt2-$model.ini
  [[ -f $config ]] || config=configs/$model.ini
  [[ -f $config ]] || { echo "ab_throughput: case '$c': no configs/gpt2-$model.ini or configs/$model.ini" >&2; exit 2; }
  cases+=("$c") configs+=("$config")
done

results=$(mktemp)
trap 'rm -f "$results"' EXIT
printf '%-8s %-14s %-5s %s\n' variant case round \
  "tok/s  MFU  peak GiB/rank  step ms  compute ms  exposed comm ms  steps  SM MHz  W  power-capped"
for ((round = 1; round <= ROUNDS; ++round)); do
  for ci in "${!cases[@]}"; do
    IFS=: read -r gpus mb _ <<<"${cases[ci]}"
    dtype=()
    [[ $gpus -gt 0 ]] && dtype=(--train.dtype=bf16)
    for vi in "${!names[@]}"; do
      IFS=, read -r -a envs <<<"${envs_of[vi]}"
      IFS=, read -r -a vflags <<<"${flags_of[vi]}"
      tt=${TT_DIR:-/tmp/train_throughput}/ab$$_r${round}_c${ci}_${names[vi]}  # the run's JSONL and log
      out=$(env "${envs[@]}" TT_DIR="$tt" TT_TIMEOUT="$AB_TIMEOUT" bash bench/train_throughput.sh "${builds[vi]}" "$gpus" \
        "${configs[ci]}" "${dtype[@]}" --train.micro_batch="$mb" --train.global_batch=$((mb * (gpus > 0 ? gpus : 1))) \
        --train.steps="${AB_STEPS:-14}" --log.every=5 "${flags[@]}" "${vflags[@]}")
      row=$(tail -1 <<<"$out")
      # A failed run prints FAILED and the reason its log gives: all of it goes under the row.
      [[ $out == FAILED* ]] && row=$(head -1 <<<"$out") && out=$(tail -n +2 <<<"$out") || out=""
      printf '%-8s %-14s %-5s %s\n' "${names[vi]}" "${cases[ci]}" "$round" "$row"
      [[ -n $out ]] && sed 's/^/    /' <<<"$out"
      # SHARDTRAIN_PROFILE_OPS=1, for every variant or in one's own: the run's op profile under its row.
      if [[ ${SHARDTRAIN_PROFILE_OPS:-0} == 1 || ,${envs_of[vi]}, == *,SHARDTRAIN_PROFILE_OPS=1,* ]]; then
        awk '/op profile/ {on = 1} on {print "    " $0} on && / total / {exit}' "$tt"/*.log
      fi
      printf '%s\t%s\t%s\n' "${names[vi]}" "${cases[ci]}" "$row" >>"$results"
    done
  done
done

python3 - "$results" "${names[@]}" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
names = sys.argv[2:]
def tok(row):  # tok/s of a table row, None for a FAILED run's message
    try:
        return float(row.split()[0])
    except (IndexError, ValueError):
        return None
print(f"\nmedian tok/s per case (ratio to {names[0]}):")
for case in dict.fromkeys(r[1] for r in rows):
    runs = {n: [t for r in rows if r[0] == n and r[1] == case and (t := tok(r[2])) is not None] for n in names}
    first = statistics.median(runs[names[0]]) if runs[names[0]] else None
    cells = []
    for n in names:
        if not runs[n]:
            cells.append(f"{n} failed")
            continue
        med = statistics.median(runs[n])
        cells.append(f"{n} {med:,.0f}" + (f" ({med / first:.3f}x)" if first else "") + f" [{len(runs[n])} runs]")
    print(f"  {case:<14} " + ", ".join(cells))
PY
