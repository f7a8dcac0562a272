#!/usr/bin/env bash
# The numeric tests (ctest label `numeric`: PyTorch parity, N ranks against one process, accumulation against one
# batch) once under each of OpenBLAS's core types Haswell, SkylakeX, Cooperlake, Zen and Prescott that this CPU can
# execute. OpenBLAS picks its kernels per CPU, and each kernel sums in its own order: a bar that holds under one and
# not another is a bug in the bar. A core type whose instructions the CPU lacks is skipped, and said so; so is one
# this OpenBLAS does not know (it would run another kernel instead).
#
# usage: tests/numeric_per_coretype.sh [--except-native] BUILD_DIR [CORETYPE ...]   (exit 0 when every run passes)
#   NUMERIC_JOBS: ctest -j (default 2).
#   --except-native: leave out the core type OpenBLAS picks by itself on this CPU (a full ctest run has run it).
set -uo pipefail
except_native=0
if [ "${1:-}" = --except-native ]; then
  except_native=1
  shift
fi
build=${1:?usage: numeric_per_coretype.sh [--except-native] BUILD_DIR [CORETYPE ...]}
shift
coretypes=("$@")
[ ${#coretypes[@]} -gt 0 ] || coretypes=(Haswell SkylakeX Cooperlake Zen Prescott)

flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
# The instructions each core type's kernels use (OpenBLAS's driver/others/dynamic.c and kernel/x86_64).
needs() {
  case $1 in
    Prescott) echo "sse3" ;;
    Haswell | Zen) echo "avx2 fma" ;;
    SkylakeX) echo "avx512f avx512cd avx512bw avx512dq avx512vl" ;;
    Cooperlake) echo "avx512f avx512cd avx512bw avx512dq avx512vl avx512_bf16" ;;
    *) return 1 ;;
  esac
}
has() { [ "$1" = sse3 ] && set -- pni; [[ $flags == *" $1 "* ]]; }

# The core OpenBLAS runs under OPENBLAS_CORETYPE=$1, asked of the library shardtrain links.
blas=$(ldd "$build/shardtrain" | awk '/libopenblas|libblas/ {print $3; exit}')
corename() {
  OPENBLAS_CORETYPE=$1 /usr/bin/python3 -c 'import ctypes, sys
lib = ctypes.CDLL(sys.argv[1]); lib.openblas_get_corename.restype = ctypes.c_char_p
print(lib.openblas_get_corename().decode())' "$blas" 2>/dev/null
}

native=$(corename "")  # an empty OPENBLAS_CORETYPE: OpenBLAS's own choice
status=0
summary=()
for ct in "${coretypes[@]}"; do
  if ! req=$(needs "$ct"); then
    echo "unknown core type $ct (known: Haswell SkylakeX Cooperlake Zen Prescott)" >&2
    exit 2
  fi
  missing=()
  for f in $req; do has "$f" || missing+=("$f"); done
  if [ ${#missing[@]} -gt 0 ]; then
    summary+=("$(printf '%-11s skipped: this CPU lacks %s' "$ct" "${missing[*]}")")
    continue
  fi
  if [ $except_native -eq 1 ] && [ "${native,,}" = "${ct,,}" ]; then
    summary+=("$(printf '%-11s left out: the core type OpenBLAS picks on this CPU, run by the full suite' "$ct")")
    continue
  fi
  got=$(corename "$ct")
  if [ "${got,,}" != "${ct,,}" ]; then
    summary+=("$(printf '%-11s skipped: %s runs %s kernels instead' "$ct" "$blas" "${got:-unknown}")")
    continue
  fi
  echo "== OPENBLAS_CORETYPE=$ct"
  start=$(date +%s)
  OPENBLAS_CORETYPE=$ct ctest --test-dir "$build" -L numeric -j"${NUMERIC_JOBS:-2}" -V >"$build/numeric_$ct.log" 2>&1
  rc=$?
  tail -n 4 "$build/numeric_$ct.log" | grep -E 'tests passed|tests failed' | sed 's/^/   /'
  line=$(grep -E 'tests passed|tests failed' "$build/numeric_$ct.log" | tail -1)
  # The parity and N-rank tests print each quantity's worst error / bar (a test fails above 1).
  worst=$(grep -E 'error / bar' "$build/numeric_$ct.log" | grep -oE '(loss|grad_norm|grads0|final|weights) [0-9.]+' |
    awk '$2 > m {m = $2} END {printf "%.3f", m}')
  summary+=("$(printf '%-11s %s; worst error / bar %s (%d s; log %s)' "$ct" "${line:-no ctest summary, exit $rc}" \
    "$worst" $(($(date +%s) - start)) "$build/numeric_$ct.log")")
  if [ $rc -ne 0 ]; then
    status=1
    grep -E '\*\*\*Failed|FAILED:' "$build/numeric_$ct.log" | head -20 | sed 's/^/   /'
  fi
done
echo "numeric tests per OpenBLAS core type ($(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')):"
printf '  %s\n' "${summary[@]}"
exit $status
