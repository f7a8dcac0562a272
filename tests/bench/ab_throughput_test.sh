#!/usr/bin/env bash
# bench/ab_throughput.sh on the CPU backend: every variant runs every case each round (rows in that order), the
# summary gives each case's median per variant with the first variant at exactly 1.000x, a variant's environment
# and flags reach its runs only, each run keeps its log in a folder of its own, and bad arguments are refused naming
# what is wrong.
#   ab_throughput_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
SRC=$1 BUILD=$2
fail() { echo "FAIL: $*"; exit 1; }
TT_DIR=$(mktemp -d)
export TT_DIR
trap 'rm -rf "$TT_DIR"' EXIT
out=$(AB_STEPS=4 bash "$SRC/bench/ab_throughput.sh" 2 "0:1:tiny 0:2:tiny" \
  one="$BUILD" two="$BUILD,SHARDTRAIN_LOG_LEVEL=warn" -- --data.val_holdout=0.1 2>&1) || fail "exit $?: $out"
echo "$out"
rows=$(grep -cE '^(one|two) +0:[12]:tiny +[12] +[0-9]+ ' <<<"$out")
[[ $rows == 8 ]] || fail "expected 8 rows (2 variants x 2 cases x 2 rounds), got $rows"
order=$(grep -E '^(one|two) ' <<<"$out" | awk '{print $1 $2 $3}' | tr '\n' ' ')
[[ $order == "one0:1:tiny1 two0:1:tiny1 one0:2:tiny1 two0:2:tiny1 one0:1:tiny2 two0:1:tiny2 one0:2:tiny2 two0:2:tiny2 " ]] ||
  fail "rows out of order: $order"
for c in 0:1:tiny 0:2:tiny; do
  grep -qE "^  $c +one [0-9,]+ \(1\.000x\) \[2 runs\], two [0-9,]+ \([0-9.]+x\) \[2 runs\]$" <<<"$out" ||
    fail "no summary line for $c"
done
# Each run's JSONL and log stay in a folder of their own under TT_DIR.
for v in one two; do
  for r in 1 2; do
    for c in 0 1; do
      ls "$TT_DIR"/ab*_r${r}_c${c}_$v/*.log >/dev/null 2>&1 || fail "no log for $v, round $r, case $c in $TT_DIR"
    done
  done
done
# A variant's environment goes to its runs only: without the built-in corpus, that variant's runs fail.
out=$(AB_STEPS=4 bash "$SRC/bench/ab_throughput.sh" 1 "0:2:tiny" ok="$BUILD" bad="$BUILD,SHARDTRAIN_FORTUNES_DIR=/no/such/dir" 2>&1)
grep -qE "^  0:2:tiny +ok [0-9,]+ \(1\.000x\) \[1 runs\], bad failed$" <<<"$out" || fail "a failing variant: $out"
# A variant's flags go to its runs only, after the common ones: with a data file that does not exist, that variant's
# runs fail and the other's do not.
out=$(AB_STEPS=4 bash "$SRC/bench/ab_throughput.sh" 1 "0:2:tiny" ok="$BUILD" bad="$BUILD,--data.path=/no/such/tokens.bin" \
  -- --data.val_holdout=0.1 2>&1)
grep -qE "^  0:2:tiny +ok [0-9,]+ \(1\.000x\) \[1 runs\], bad failed$" <<<"$out" || fail "a variant's flag: $out"
# A run past AB_TIMEOUT is stopped, its row says so, and the summary counts it as failed.
out=$(AB_STEPS=100000 AB_TIMEOUT=2 bash "$SRC/bench/ab_throughput.sh" 1 "0:2:tiny" slow="$BUILD" 2>&1)
grep -qE "^slow +0:2:tiny +1 +FAILED \(timed out after 2 s\)" <<<"$out" || fail "a run past AB_TIMEOUT: $out"
grep -qE "^  0:2:tiny +slow failed$" <<<"$out" || fail "a timed-out run in the summary: $out"
# Refusals.
out=$(bash "$SRC/bench/ab_throughput.sh" 1 "0:2:tiny" a="$BUILD/no-such-dir" 2>&1) && fail "a missing build ran"
grep -q "variant 'a': no $BUILD/no-such-dir/shardtrain" <<<"$out" || fail "missing build: $out"
out=$(bash "$SRC/bench/ab_throughput.sh" 1 "0:2:nosuchmodel" a="$BUILD" 2>&1) && fail "a missing config ran"
grep -q "case '0:2:nosuchmodel': no configs/gpt2-nosuchmodel.ini or configs/nosuchmodel.ini" <<<"$out" ||
  fail "missing config: $out"
out=$(bash "$SRC/bench/ab_throughput.sh" x "0:2:tiny" a="$BUILD" 2>&1) && fail "a bad ROUNDS ran"
grep -q "ROUNDS must be a positive integer, got 'x'" <<<"$out" || fail "bad rounds: $out"
out=$(AB_TIMEOUT=soon bash "$SRC/bench/ab_throughput.sh" 1 "0:2:tiny" a="$BUILD" 2>&1) && fail "a bad AB_TIMEOUT ran"
grep -q "AB_TIMEOUT must be whole seconds, got 'soon'" <<<"$out" || fail "bad timeout: $out"
out=$(bash "$SRC/bench/ab_throughput.sh" 1 "2:16" a="$BUILD" 2>&1) && fail "a malformed case ran"
grep -q "case '2:16' is not GPUS:MICRO_BATCH:MODEL" <<<"$out" || fail "malformed case: $out"
out=$(bash "$SRC/bench/ab_throughput.sh" 1 "0:2:tiny" a="$BUILD,NOEQUALS" 2>&1) && fail "a malformed variant ran"
grep -q "variant 'a': 'NOEQUALS' is not VAR=VALUE or --section.key=value" <<<"$out" || fail "malformed variant: $out"
out=$(bash "$SRC/bench/ab_throughput.sh" 1 "0:2:tiny" a="$BUILD,--steps" 2>&1) && fail "a malformed variant flag ran"
grep -q "variant 'a': '--steps' is not VAR=VALUE or --section.key=value" <<<"$out" || fail "malformed flag: $out"
echo PASS
