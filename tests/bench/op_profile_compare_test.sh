#!/usr/bin/env bash
# bench/op_profile_compare.py on two made-up training logs: each op's ms side by side, the ratios (plain and per
# token), ops missing from one log shown as "-", the step's fixed part from the totals; and a log without an op
# profile or bad arguments refused with exit status 2 and a message naming what is wrong.
#   op_profile_compare_test.sh SOURCE_DIR
set -uo pipefail
SRC=$1
fail() { echo "FAIL: $*"; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# The progress bar's carriage returns come before the profile, as in a real log.
printf 'step 1/4 | loss 11.0\r[####....] 2/4\rstep 4/4 | loss 10.9\n' >"$dir/a.log"
cat >>"$dir/a.log" <<'LOG'
op profile (GPU time per training step after the first, evaluations left out; SHARDTRAIN_PROFILE_OPS=1):
  bwd.matmul                   8.000 ms   40.0%    36.0 calls
  fwd.layernorm                2.000 ms   10.0%    25.8 calls
  optim.adamw                  1.000 ms    5.0%    15.1 calls
  total                       20.000 ms

I [rank 0/2 vm] memory per rank: sharded state 1068.39 MiB
LOG
cat >"$dir/b.log" <<'LOG'
op profile (GPU time per step after the first; SHARDTRAIN_PROFILE_OPS=1):
  bwd.matmul                  14.000 ms   38.9%    36.0 calls
  fwd.layernorm                4.000 ms   11.1%    25.8 calls
  comm_wait.step_end           0.500 ms    1.4%     1.1 calls
  total                       36.000 ms
LOG
py=${PYTHON:-python3}
out=$("$py" "$SRC/bench/op_profile_compare.py" --labels x16,x32 --tokens 16384,32768 "$dir/a.log" "$dir/b.log" 2>&1) ||
  fail "exit $?: $out"
echo "$out"
row() { awk -v op="$1" '$1 == op { $1 = ""; sub(/^ /, ""); print }' <<<"$out"; }
[[ $(row bwd.matmul) == "8.000 14.000 1.750 0.875" ]] || fail "bwd.matmul row: '$(row bwd.matmul)'"
[[ $(row fwd.layernorm) == "2.000 4.000 2.000 1.000" ]] || fail "fwd.layernorm row: '$(row fwd.layernorm)'"
[[ $(row optim.adamw) == "1.000 - - -" ]] || fail "an op only in the first log: '$(row optim.adamw)'"
[[ $(row comm_wait.step_end) == "- 0.500 - -" ]] || fail "an op only in the second log: '$(row comm_wait.step_end)'"
[[ $(row total) == "20.000 36.000 1.800 0.900" ]] || fail "total row: '$(row total)'"
# Ops in the first log's order of time, then those only in later logs.
order=$(awk 'NR > 1 && $1 != "total" && $1 != "fixed" { printf "%s ", $1 }' <<<"$out")
[[ $order == "bwd.matmul fwd.layernorm optim.adamw comm_wait.step_end " ]] || fail "row order: $order"
grep -qx "fixed part of a step, x16 and x32: 4.000 ms" <<<"$out" || fail "no fixed-part line"
# Without --tokens: no per-token columns and no fixed part; labels default to the file names.
out=$("$py" "$SRC/bench/op_profile_compare.py" "$dir/a.log" "$dir/b.log" 2>&1) || fail "exit $?: $out"
[[ $(row bwd.matmul) == "8.000 14.000 1.750" ]] || fail "bwd.matmul without --tokens: '$(row bwd.matmul)'"
grep -q "a.log ms" <<<"$out" || fail "default labels: $out"
grep -q "fixed part" <<<"$out" && fail "a fixed part without --tokens"
# Refusals, exit status 2.
printf 'step 1/4 | loss 11.0\n' >"$dir/none.log"
expect_refusal() {  # expect_refusal MESSAGE ARGS...
  local want=$1
  shift
  out=$("$py" "$SRC/bench/op_profile_compare.py" "$@" 2>&1)
  local rc=$?
  [[ $rc == 2 ]] || fail "exit $rc (want 2) for $*: $out"
  grep -qF -- "$want" <<<"$out" || fail "no '$want' for $*: $out"
}
expect_refusal "none.log: no op profile (run with SHARDTRAIN_PROFILE_OPS=1 on a GPU)" "$dir/a.log" "$dir/none.log"
expect_refusal "give two or more logs" "$dir/a.log"
expect_refusal "--labels has 1 names for 2 logs" --labels x "$dir/a.log" "$dir/b.log"
expect_refusal "--tokens needs 2 positive numbers, got '16384'" --tokens 16384 "$dir/a.log" "$dir/b.log"
expect_refusal "--tokens must be whole numbers, got '1k,2k'" --tokens 1k,2k "$dir/a.log" "$dir/b.log"
expect_refusal "missing.log: No such file or directory" "$dir/a.log" "$dir/missing.log"
echo PASS
