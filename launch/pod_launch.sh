#!/usr/bin/env bash
# Starts the local ranks of one pod (or machine) for shardtrain's env bootstrap (dist.bootstrap=env, README
# "Without mpirun"): LOCAL_WORLD_SIZE copies of COMMAND, the i-th with LOCAL_RANK=i exported.
#
#   launch/pod_launch.sh -- COMMAND [ARGS...]
#   LOCAL_WORLD_SIZE=2 WORLD_SIZE=4 JOB_COMPLETION_INDEX=1 MASTER_ADDR=shardtrain-0.shardtrain \
#       launch/pod_launch.sh -- ./build/shardtrain train --config configs/gpt2-124m.ini --train.device=cuda
#
# Each copy derives its rank from the environment (RANK, or JOB_COMPLETION_INDEX x LOCAL_WORLD_SIZE + LOCAL_RANK).
# SIGTERM and SIGINT are forwarded to every copy (shardtrain then checkpoints and exits 76), and the script waits
# for all of them. If a copy fails while no signal was forwarded, the others are killed (SIGKILL: with a peer gone
# they cannot go on). The exit code is the first failing copy's (2 bad input, 75 fault, 76 preempted), else 0, so
# the pod's exit code is the trainer's and a Kubernetes podFailurePolicy can act on it.
set -uo pipefail
if [[ $# -lt 2 || $1 != "--" ]]; then
  echo "usage: launch/pod_launch.sh -- COMMAND [ARGS...]   (LOCAL_WORLD_SIZE copies; see the header)" >&2
  exit 2
fi
shift
n=${LOCAL_WORLD_SIZE:-1}
if ! [[ $n =~ ^[1-9][0-9]*$ ]]; then
  echo "launch/pod_launch.sh: LOCAL_WORLD_SIZE='$n' is not a positive integer" >&2
  exit 2
fi
export LOCAL_WORLD_SIZE=$n

pids=()
signalled=0
forward() {
  signalled=1
  for p in "${pids[@]}"; do kill -s "$1" "$p" 2>/dev/null; done
}
trap 'forward TERM' TERM
trap 'forward INT' INT

for ((i = 0; i < n; i++)); do
  LOCAL_RANK=$i "$@" &
  pids+=($!)
done

rc=0
remaining=$n
while ((remaining > 0)); do
  unset finished
  wait -n -p finished
  status=$?
  if [[ -z ${finished:-} ]]; then
    [[ -z $(jobs -pr) ]] && break  # none left (the killed ones were reaped without reporting here)
    continue                       # a trapped signal interrupted the wait; the children are still running
  fi
  ((remaining--))
  if ((status != 0 && rc == 0)); then
    rc=$status
    echo "launch/pod_launch.sh: local rank process $finished exited with $status" >&2
    if ((signalled == 0)); then
      for p in "${pids[@]}"; do kill -s KILL "$p" 2>/dev/null; done
    fi
  fi
done
exit "$rc"
