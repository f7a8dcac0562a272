#!/usr/bin/env bash
# `shardtrain tokenize` against its faults, driven through the binary: an --out whose directory cannot be made (a path
# under a regular file; a read-only file system, which binds root too), SIGINT and SIGTERM in the middle of a run
# (exit 130 or 143, one line saying so, nothing left behind), SIGKILL in the middle of a run (the leftovers are
# marked incomplete: a rerun and a training run on them are refused naming them), and empty inputs (refused naming
# the file, text and JSONL alike).
#
#   tokenize_faults.sh CASE SHARDTRAIN EXPECT_EXIT TOKENIZER.json CONFIG WORKDIR
#
# The signals land at a known point: SHARDTRAIN_FAULT=tokenize_sigstop:0@2 makes tokenize stop itself (SIGSTOP) once
# it has written 2 training shards of a run that writes about 30; the signal goes to the stopped process, which is
# then continued. Exit 0: the case passed; 77: skipped (the reason is printed); anything else: failed.
set -u
if [[ $# -ne 6 ]]; then
  echo "usage: $0 CASE SHARDTRAIN EXPECT_EXIT TOKENIZER.json CONFIG WORKDIR" >&2
  exit 2
fi
case_name=$1 bin=$2 expect_exit=$3 tok=$4 config=$5 work=$6
if [[ ! -f $tok ]]; then
  echo "SKIPPED: no tokenizer at $tok (npm ci --prefix tests/text/reference)"
  exit 77
fi
fail() {
  echo "tokenize_faults $case_name: FAIL: $*" >&2
  [[ -f $work/run.log ]] && { echo "--- $work/run.log" >&2; cat "$work/run.log" >&2; }
  [[ -n ${pid:-} ]] && kill -KILL "$pid" 2>/dev/null
  exit 1
}
rm -rf "$work" && mkdir -p "$work/in" "$work/out" || exit 1
deadline=$((SECONDS + 60))
in_time() { ((SECONDS < deadline)); }

# About 30,000 GPT-2 tokens in 1000-token shards: 3 copies of the GPL (10,000 tokens each).
big_input() {
  for i in 1 2 3; do cp /usr/share/common-licenses/GPL-3 "$work/in/gpl$i.txt"; done
}

# Runs tokenize into $work/out/d in the background, stopped after 2 shards; sets pid.
start_stopped() {
  big_input
  SHARDTRAIN_FAULT=tokenize_sigstop:0@2 "$bin" tokenize --tokenizer "$tok" --out "$work/out/d" --shard-tokens 1000 \
    --threads 2 "$work/in/gpl*.txt" >"$work/run.log" 2>&1 &
  pid=$!
  while in_time && [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != T ]]; do
    kill -0 "$pid" 2>/dev/null || fail "tokenize ended before it stopped after 2 shards"
    sleep 0.05
  done
  [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == T ]] || fail "tokenize did not stop after 2 shards"
  [[ -f $work/out/d_train_000001.bin ]] || fail "stopped without shard 1 written: $(ls "$work/out")"
  [[ -f $work/out/d_train_000005.bin ]] && fail "stopped after more than 2 shards: $(ls "$work/out")"
}

# Waits for the background run to end and returns its exit code.
finish() {
  while in_time && kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  kill -0 "$pid" 2>/dev/null && fail "tokenize did not end within 60 s"
  wait "$pid"
}

case "$case_name" in
  out_under_file)
    : >"$work/afile"
    cp /usr/share/common-licenses/GPL-3 "$work/in/a.txt"
    for out in "$work/afile/d" "$work/afile/sub/d"; do
      sh "$expect_exit" 2 "^error: (\[[^]]*\] )?--out $out: .*afile" -- \
        "$bin" tokenize --tokenizer "$tok" --out "$out" "$work/in/a.txt" || fail "--out $out"
    done
    [[ -f $work/afile && ! -s $work/afile ]] || fail "$work/afile changed"
    ;;
  out_read_only)
    # A read-only tmpfs in a private mount namespace: EROFS stops root too (tests run as root here).
    if ! unshare -rm sh -c "mount -t tmpfs -o ro,size=64k tmpfs \"$work/out\"" 2>"$work/unshare.err"; then
      echo "tokenize_faults $case_name: SKIPPED: no private read-only tmpfs here (unshare -rm + mount): $(cat "$work/unshare.err")"
      exit 77
    fi
    cp /usr/share/common-licenses/GPL-3 "$work/in/a.txt"
    # shellcheck disable=SC2016
    unshare -rm sh -c '
      set -u
      work=$1 bin=$2 expect_exit=$3 tok=$4
      mount -t tmpfs -o ro,size=64k tmpfs "$work/out" || exit 77
      for out in "$work/out/d" "$work/out/sub/d"; do
        sh "$expect_exit" 2 "^error: (\[[^]]*\] )?--out $out: .*Read-only file system" -- \
          "$bin" tokenize --tokenizer "$tok" --out "$out" "$work/in/a.txt" || exit 1
      done
    ' sh "$work" "$bin" "$expect_exit" "$tok" || fail "a read-only --out"
    ;;
  sigint | sigterm)
    sig=INT code=130
    [[ $case_name == sigterm ]] && sig=TERM code=143
    start_stopped
    kill -s "$sig" "$pid"
    kill -CONT "$pid"
    finish
    rc=$?
    [[ $rc -eq $code ]] || fail "exit code $rc, expected $code"
    grep -q "^tokenize: interrupted by SIG$sig: removed every file it had written under $work/out/d_\*; nothing was written$" \
      "$work/run.log" || fail "no line saying it was interrupted and removed its output"
    left=$(ls -A "$work/out")
    [[ -z $left ]] || fail "left behind in $work/out: $left"
    ;;
  sigkill)
    start_stopped
    kill -KILL "$pid"
    finish
    [[ -e $work/out/d.incomplete ]] || fail "no $work/out/d.incomplete marker after SIGKILL: $(ls -A "$work/out")"
    # A rerun names the leftovers and says they are incomplete.
    sh "$expect_exit" 2 "^error: (\[[^]]*\] )?--out $work/out/d: .*d\.incomplete.* incomplete.*d_train_000000\.bin" -- \
      "$bin" tokenize --tokenizer "$tok" --out "$work/out/d" --shard-tokens 1000 "$work/in/gpl1.txt" >"$work/rerun.log" ||
      { cat "$work/rerun.log"; fail "the rerun"; }
    # Training on the leftovers is refused, naming the marker.
    sh "$expect_exit" 2 "llm.c data file $work/out/d_train_000000\.bin: .*incomplete.*$work/out/d\.incomplete" -- \
      "$bin" train --config "$config" --data.format=llmc --data.path="$work/out/d_train_*.bin" --model.vocab_size=50257 \
      --train.steps=1 >"$work/train.log" || { cat "$work/train.log"; fail "training on the leftovers"; }
    ;;
  empty_text | empty_jsonl)
    ext=txt
    [[ $case_name == empty_jsonl ]] && ext=jsonl
    cp /usr/share/common-licenses/GPL-3 "$work/in/a.txt"
    : >"$work/in/empty.$ext"
    sh "$expect_exit" 2 "^error: (\[[^]]*\] )?input $work/in/empty\.$ext is empty" -- \
      "$bin" tokenize --tokenizer "$tok" --out "$work/out/d" "$work/in/a.txt" "$work/in/empty.$ext" ||
      fail "an empty .$ext beside a text file"
    sh "$expect_exit" 2 "^error: (\[[^]]*\] )?input $work/in/empty\.$ext is empty" -- \
      "$bin" tokenize --tokenizer "$tok" --out "$work/out/d" "$work/in/empty.$ext" || fail "an empty .$ext alone"
    left=$(ls -A "$work/out")
    [[ -z $left ]] || fail "left behind in $work/out: $left"
    ;;
  *)
    echo "tokenize_faults: unknown case $case_name" >&2
    exit 2
    ;;
esac
echo "tokenize_faults $case_name: ok"
