#!/bin/sh
# Entrypoint of an MPIJob worker pod (k8s/mpijob.yaml): runs sshd for the launcher's mpirun, and on SIGTERM
# (preemption, eviction, kubectl delete) passes the signal on to the trainer ranks, which sshd started and which
# the kubelet's SIGTERM to this PID 1 would not reach. Each rank then finishes its step, the ranks commit a
# checkpoint together and exit 76; this waits for them (within terminationGracePeriodSeconds) before ending.
set -u
/usr/sbin/sshd -De &
sshd_pid=$!
stopping=0
stop() {
  stopping=1
  pkill -TERM -x shardtrain
  while pgrep -x shardtrain >/dev/null; do sleep 1; done
  kill -TERM "$sshd_pid" 2>/dev/null
}
trap stop TERM INT
wait "$sshd_pid"   # a trapped signal ends this wait early; stop() then runs
rc=$?
if [ "$stopping" -eq 1 ]; then
  wait "$sshd_pid"
  rc=0
fi
exit "$rc"
