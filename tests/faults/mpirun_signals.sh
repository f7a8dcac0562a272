#!/usr/bin/env bash
# A stop signal to launch/mpirun.sh: the job must exit 76 with a committed checkpoint at the step boundary after the
# signal, the checkpoint every rank agreed on.
#
#   tests/faults/mpirun_signals.sh TERM|INT SOURCE_DIR SHARDTRAIN_BINARY WORK_DIR
#
# To know exactly which step the signal lands in, rank 0 is stopped before step 4 (SHARDTRAIN_FAULT=sigstop:0@4):
# steps 1-3 are done, rank 1 waits in step 4 for it. The signal goes to the launcher; once it has reached rank 0
# (pending in /proc/PID/status while the rank is stopped), rank 0 is continued. Every rank must then stop after
# step 4, commit step_00000004, and the launcher exit 76. Exit 77: skipped (no mpirun).
set -u
if [[ $# -ne 4 ]]; then
  echo "usage: $0 TERM|INT SOURCE_DIR SHARDTRAIN_BINARY WORK_DIR" >&2
  exit 2
fi
sig=$1 src=$2 bin=$3 work=$4
if ! command -v mpirun >/dev/null; then
  echo "SKIPPED: mpirun is not installed"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work" || exit 1
log=$work/run.log
fail() {
  echo "mpirun_signals ($sig): FAIL: $*" >&2
  echo "--- $log" >&2
  cat "$log" >&2
  [[ -n ${launcher:-} ]] && kill -KILL -- "-$launcher" 2>/dev/null
  exit 1
}
# The deadline of every wait below.
deadline=$((SECONDS + 90))
in_time() { ((SECONDS < deadline)); }

# Job control: the launcher gets its own process group and, unlike a plain background job, does not ignore SIGINT.
set -m
SHARDTRAIN_FAULT=sigstop:0@4 "$src/launch/mpirun.sh" --gpus-per-host 2 -- "$bin" train --train.steps=40 \
  --train.global_batch=4 --train.micro_batch=2 --train.eval_every=0 --train.sample_tokens=0 \
  --ckpt.dir="$work/ckpt" >"$log" 2>&1 &
launcher=$!
set +m

# mpirun is the launcher itself (exec) or its child; the ranks are mpirun's children.
mpirun_pid=
while in_time && [[ -z $mpirun_pid ]]; do
  if [[ $(cat "/proc/$launcher/comm" 2>/dev/null) == mpirun ]]; then
    mpirun_pid=$launcher
  else
    mpirun_pid=$(pgrep -P "$launcher" -x mpirun)
  fi
  sleep 0.05
done
[[ -n $mpirun_pid ]] || fail "no mpirun process under the launcher"
rank0=
while in_time && [[ -z $rank0 ]]; do
  for p in $(pgrep -P "$mpirun_pid"); do
    [[ $(awk '{print $3}' "/proc/$p/stat" 2>/dev/null) == T ]] && rank0=$p
  done
  kill -0 "$launcher" 2>/dev/null || fail "the job ended before rank 0 stopped at step 4"
  sleep 0.05
done
[[ -n $rank0 ]] || fail "rank 0 did not stop before step 4"
grep -q "step      3/40" "$log" || fail "step 3 is not logged"

kill -s "$sig" "$launcher"
# SIGUSR1 (bit 10 of the pending mask) must reach the stopped rank before it goes on.
pending() { awk '/^ShdPnd:/ {print $2}' "/proc/$rank0/status" 2>/dev/null; }
while in_time && ! (((0x$(pending) >> 9) & 1)); do sleep 0.05; done
(((0x$(pending) >> 9) & 1)) || fail "the stop signal did not reach rank 0 (pending: $(pending))"
kill -CONT "$rank0"

while in_time && kill -0 "$launcher" 2>/dev/null; do sleep 0.1; done
kill -0 "$launcher" 2>/dev/null && fail "the job did not end within 90 s"
wait "$launcher"
rc=$?
[[ $rc -eq 76 ]] || fail "the launcher exited $rc, expected 76 (preempted)"
[[ -d $work/ckpt/step_00000004 ]] || fail "no checkpoint $work/ckpt/step_00000004"
[[ $(cat "$work/ckpt/latest") == step_00000004 ]] || fail "latest is '$(cat "$work/ckpt/latest")', not step_00000004"
ls "$work/ckpt" | grep -q -v -x -e latest -e step_00000004 && fail "other entries in $work/ckpt: $(ls "$work/ckpt")"
grep -q "preempted (a stop signal on 2 rank(s)) after step 4: checkpoint $work/ckpt/step_00000004 committed" "$log" ||
  fail "no 'preempted ... after step 4' line"
grep -q "step      5/40" "$log" && fail "step 5 ran after the signal"
echo "mpirun_signals ($sig): exit 76, checkpoint step_00000004 committed"
exit 0
