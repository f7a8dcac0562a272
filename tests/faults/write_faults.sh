#!/bin/sh
# Failed writes, driven through the shardtrain binary: a save, `ckpt export` to .h5 and .safetensors, the
# trainer's ckpt.export, the metrics file and `plot --out` past the file-size limit (ulimit -f: write(2) fails
# with EFBIG), a save on a full private file system (ENOSPC), and an output path under a file. Each must exit
# as the README's table says, name the file and the OS's error text, and leave no committed checkpoint or file
# at the final path behind; the checkpoint committed before the fault must still verify.
#
#   write_faults.sh CASE SHARDTRAIN EXPECT_EXIT CONFIG WORKDIR
#
# Exit 0: the case passed; 77: skipped (the reason is printed); anything else: failed.
set -u
if [ "$#" -ne 5 ]; then
  echo "usage: $0 CASE SHARDTRAIN EXPECT_EXIT CONFIG WORKDIR" >&2
  exit 2
fi
case_name=$1
bin=$2
expect_exit=$3
config=$4
work=$5

# A one-layer model: a rank file of about 260 KiB, a step in well under a second.
model="--config $config --model.n_layer=1 --model.n_embd=32 --model.n_head=2 --model.seq_len=16
  --train.micro_batch=1 --train.global_batch=1 --train.eval_batches=1 --train.sample_tokens=0"
# 64 blocks of ulimit -f: 32 KiB under dash, 64 KiB under bash; a rank file needs about 260 KiB.
fsize_blocks=64

fail() {
  echo "write_faults $case_name: FAIL: $*" >&2
  exit 1
}

# A committed checkpoint of step 1 in $1.
commit_step1() {
  # shellcheck disable=SC2086
  "$bin" train $model --train.steps=1 --ckpt.dir="$1" >"$work/setup.log" 2>&1 ||
    { cat "$work/setup.log"; fail "setting up: the first run did not commit step 1"; }
  [ -f "$1/step_00000001/manifest.json" ] || fail "setting up: $1/step_00000001 was not committed"
}

# The checkpoint of step 1 is intact and the only one: no step 2, committed or temporary.
step1_only() {
  ckpt=$1
  left=$(ls "$ckpt" | grep -v -x -e latest -e step_00000001)
  [ -z "$left" ] || fail "$ckpt holds more than step 1 after the failed save: $left"
  [ "$(cat "$ckpt/latest")" = step_00000001 ] || fail "$ckpt/latest is '$(cat "$ckpt/latest")', expected step_00000001"
  "$bin" ckpt verify "$ckpt/step_00000001" || fail "$ckpt/step_00000001 no longer verifies"
}

no_file() {
  for f in "$@"; do
    [ ! -e "$f" ] || fail "$f exists after the failed write"
  done
}

rm -rf "$work"
mkdir -p "$work" || fail "cannot create $work"

case "$case_name" in
  save_fsize)
    commit_step1 "$work/ckpt"
    # The save of step 2 fails on its rank file; the message names it and the OS's text for EFBIG.
    # shellcheck disable=SC2086
    sh "$expect_exit" 75 "checkpoint of step 2 not committed: .*step_00000002\.tmp-[0-9a-f]+/rank_00000\.h5: File too large" -- \
      sh -c "ulimit -f $fsize_blocks; exec \"\$0\" \"\$@\"" "$bin" train $model --train.steps=2 \
      --ckpt.dir="$work/ckpt" --ckpt.resume=auto || fail "the save did not end as expected"
    step1_only "$work/ckpt"
    ;;
  save_fsize_sync)
    # The same with the save made while training waits (ckpt.async = false).
    commit_step1 "$work/ckpt"
    # shellcheck disable=SC2086
    sh "$expect_exit" 75 "checkpoint of step 2 not committed: .*step_00000002\.tmp-[0-9a-f]+/rank_00000\.h5: File too large" -- \
      sh -c "ulimit -f $fsize_blocks; exec \"\$0\" \"\$@\"" "$bin" train $model --train.steps=2 \
      --ckpt.dir="$work/ckpt" --ckpt.resume=auto --ckpt.async=false || fail "the save did not end as expected"
    step1_only "$work/ckpt"
    ;;
  save_fsize_warn)
    # ckpt.on_error = warn: both failed saves are logged, the run trains to its end and exits 0, and nothing but
    # step 1 is left in the directory.
    commit_step1 "$work/ckpt"
    # shellcheck disable=SC2086
    sh "$expect_exit" 0 "checkpoint of step 3 not committed: .*File too large.*; training goes on \(ckpt\.on_error = warn\)" -- \
      sh -c "ulimit -f $fsize_blocks; exec \"\$0\" \"\$@\"" "$bin" train $model --train.steps=3 --ckpt.every=1 \
      --ckpt.dir="$work/ckpt" --ckpt.resume=auto --ckpt.on_error=warn || fail "the run did not end as expected"
    step1_only "$work/ckpt"
    ;;
  export_h5_fsize | export_safetensors_fsize)
    commit_step1 "$work/ckpt"
    ext=h5
    [ "$case_name" = export_safetensors_fsize ] && ext=safetensors
    out="$work/out/model.$ext"
    mkdir -p "$work/out"
    sh "$expect_exit" 75 "model\.$ext\.tmp-[0-9]+: File too large" -- \
      sh -c "ulimit -f $fsize_blocks; exec \"\$0\" \"\$@\"" "$bin" ckpt export "$work/ckpt/step_00000001" \
      --out "$out" || fail "the export did not end as expected"
    no_file "$out" "$work/out/config.json"
    left=$(ls "$work/out")
    [ -z "$left" ] || fail "the failed export left $left"
    step1_only "$work/ckpt"
    ;;
  train_export_fsize)
    out="$work/final.h5"
    # shellcheck disable=SC2086
    sh "$expect_exit" 75 "final\.h5\.tmp-[0-9]+: File too large" -- \
      sh -c "ulimit -f $fsize_blocks; exec \"\$0\" \"\$@\"" "$bin" train $model --train.steps=1 \
      --ckpt.export="$out" || fail "the run's export did not end as expected"
    no_file "$out"
    left=$(ls "$work" | grep final)
    [ -z "$left" ] || fail "the failed export left $left"
    ;;
  save_enospc)
    # A private mount namespace (unshare -rm: no privilege needed where user namespaces are allowed) with a
    # 400 KiB tmpfs: room for step 1's checkpoint, not for step 2's.
    if ! unshare -rm sh -c "mount -t tmpfs -o size=400k tmpfs \"$work\"" 2>"$work/unshare.err"; then
      echo "write_faults $case_name: SKIPPED: no private tmpfs here (unshare -rm + mount): $(cat "$work/unshare.err")"
      exit 77
    fi
    # Everything that must see the small file system runs inside the namespace.
    # shellcheck disable=SC2016
    exec unshare -rm sh -c '
      set -u
      work=$1 bin=$2 expect_exit=$3; shift 3
      mount -t tmpfs -o size=400k tmpfs "$work" || exit 77
      ckpt=$work/ckpt
      "$bin" train "$@" --train.steps=1 --ckpt.dir="$ckpt" >"$work/setup.log" 2>&1 ||
        { cat "$work/setup.log"; echo "FAIL: the first run did not commit step 1" >&2; exit 1; }
      sh "$expect_exit" 75 "checkpoint of step 2 not committed: .*rank_00000\.h5: No space left on device" -- \
        "$bin" train "$@" --train.steps=2 --ckpt.dir="$ckpt" --ckpt.resume=auto || exit 1
      left=$(ls "$ckpt" | grep -v -x -e latest -e step_00000001)
      [ -z "$left" ] || { echo "FAIL: $ckpt holds more than step 1: $left" >&2; exit 1; }
      "$bin" ckpt verify "$ckpt/step_00000001" || { echo "FAIL: step 1 no longer verifies" >&2; exit 1; }
      echo "write_faults save_enospc: ok"
    ' sh "$work" "$bin" "$expect_exit" $model
    ;;
  metrics_fsize)
    # Each step's JSONL record is about 500 bytes: the second runs past a 1-block limit (512 or 1024 bytes).
    # shellcheck disable=SC2086
    sh "$expect_exit" 75 "log\.metrics: cannot write .*/metrics\.jsonl: File too large" -- \
      sh -c "ulimit -f 1; exec \"\$0\" \"\$@\"" "$bin" train $model --train.steps=4 \
      --log.metrics="$work/metrics.jsonl" || fail "the run did not end as expected"
    ;;
  plot_fsize)
    # shellcheck disable=SC2086
    "$bin" train $model --train.steps=2 --log.metrics="$work/metrics.jsonl" >"$work/setup.log" 2>&1 ||
      { cat "$work/setup.log"; fail "setting up: the run did not write its metrics"; }
    sh "$expect_exit" 75 "write to .*/chart\.svg\.tmp-[0-9]+ failed after .*: File too large" -- \
      sh -c "ulimit -f 1; exec \"\$0\" \"\$@\"" "$bin" plot "$work/metrics.jsonl" --out "$work/chart.svg" ||
      fail "the plot did not end as expected"
    no_file "$work/chart.svg"
    left=$(ls "$work" | grep chart)
    [ -z "$left" ] || fail "the failed plot left $left"
    ;;
  out_under_file)
    commit_step1 "$work/ckpt"
    : >"$work/afile"
    for ext in safetensors h5; do
      sh "$expect_exit" 2 "afile is a file, not a directory" -- \
        "$bin" ckpt export "$work/ckpt/step_00000001" --out "$work/afile/x.$ext" || fail "ckpt export to .$ext"
    done
    # The trainer refuses at start-up, not after the run.
    # shellcheck disable=SC2086
    sh "$expect_exit" 2 "ckpt\.export .*afile is a file, not a directory" -- \
      "$bin" train $model --train.steps=1 --ckpt.export="$work/afile/x.h5" || fail "train with ckpt.export"
    ;;
  *)
    echo "write_faults: unknown case $case_name" >&2
    exit 2
    ;;
esac
echo "write_faults $case_name: ok"
