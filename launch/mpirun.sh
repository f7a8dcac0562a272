#!/usr/bin/env bash
# Starts shardtrain with Open MPI's mpirun, one rank per GPU, on this box or on the boxes of a hostfile.
#
#   launch/mpirun.sh [--hostfile FILE] [--gpus-per-host N] [--iface IFACE] [--dry-run] -- COMMAND [ARGS...]
#   launch/mpirun.sh --gpus-per-host 2 -- ./build/shardtrain train --config configs/gpt2-124m.ini --train.device=cuda
#   launch/mpirun.sh --hostfile launch/hostfile.example --gpus-per-host 2 --iface enp5s0 -- \
#       ./build/shardtrain train --config configs/gpt2-124m.ini --train.device=cuda --dist.sharding=hybrid
#
# What it sets:
#   * -np = hosts x gpus-per-host, --map-by ppr:N:node (N ranks on each host, in hostfile order), --bind-to none
#     (shardtrain pins its own host threads; MPI's binding would squeeze them onto one core);
#   * -x for every NCCL_*, OMPI_MCA_* and SHARDTRAIN_* variable set here, and OMP_NUM_THREADS and
#     HDF5_USE_FILE_LOCKING, so that every rank on every host sees the same environment (ranks started through ssh,
#     as in an MPIJob, see nothing else of it);
#   * --iface IFACE (a LAN between workstations): NCCL_SOCKET_IFNAME=IFACE, NCCL_IB_DISABLE=1, and Open MPI's TCP
#     transport on the same interface (btl_tcp_if_include, oob_tcp_if_include).
# --gpus-per-host defaults to the GPUs nvidia-smi lists here (1 without nvidia-smi). It prints the mpirun line
# before running it; --dry-run only prints it.
#
# Stopping: send SIGTERM or SIGINT (Ctrl-C) to this script, not to mpirun. It passes the signal on to every rank
# as SIGUSR1, which mpirun forwards at once; the ranks stop at the next step boundary, commit a checkpoint and exit
# 76, and so do mpirun and this script. (mpirun itself, on SIGTERM or SIGINT, waits 1 s, sends the ranks SIGTERM,
# kills them 1 s later whether or not their checkpoint is written, and exits 1.) A second signal is passed on too:
# the ranks then exit 76 at once, without a checkpoint. mpirun runs in a process group of its own, so a Ctrl-C
# reaches it only through this script, and with stdin from /dev/null (shardtrain reads no input).
set -euo pipefail
hostfile="" gpus="" iface="" dry=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --hostfile) hostfile=$2; shift 2 ;;
    --gpus-per-host) gpus=$2; shift 2 ;;
    --iface) iface=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "launch/mpirun.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ $# -eq 0 ]]; then echo "launch/mpirun.sh: no command after --" >&2; exit 2; fi
if [[ -z $gpus ]]; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  [[ $gpus -ge 1 ]] || gpus=1
fi
if ! [[ $gpus =~ ^[1-9][0-9]*$ ]]; then echo "launch/mpirun.sh: --gpus-per-host must be a positive integer, got '$gpus'" >&2; exit 2; fi
hosts=1
args=()
if [[ -n $hostfile ]]; then
  if [[ ! -r $hostfile ]]; then echo "launch/mpirun.sh: cannot read hostfile '$hostfile'" >&2; exit 2; fi
  hosts=$(grep -cvE '^[[:space:]]*(#|$)' "$hostfile" || true)
  if [[ $hosts -lt 1 ]]; then echo "launch/mpirun.sh: hostfile '$hostfile' lists no host" >&2; exit 2; fi
  args+=(--hostfile "$hostfile")
fi
args+=(-np $((hosts * gpus)) --map-by "ppr:${gpus}:node" --bind-to none)
if [[ -n $iface ]]; then
  export NCCL_SOCKET_IFNAME=$iface NCCL_IB_DISABLE=1
  args+=(--mca btl_tcp_if_include "$iface" --mca oob_tcp_if_include "$iface")
fi
while IFS='=' read -r name _; do
  [[ $name =~ ^(NCCL_|OMPI_MCA_|SHARDTRAIN_) || $name == OMP_NUM_THREADS || $name == HDF5_USE_FILE_LOCKING ]] &&
    args+=(-x "$name")
done < <(env | sort)
echo "mpirun ${args[*]} $*"
[[ $dry -eq 1 ]] && exit 0
set -m  # job control: mpirun gets a process group of its own
mpirun "${args[@]}" "$@" </dev/null &
pid=$!
set +m +e
trap 'kill -USR1 "$pid" 2>/dev/null' TERM INT
trap 'kill -HUP "$pid" 2>/dev/null' HUP
# A trapped signal interrupts wait; wait again until mpirun has ended, then once more for its exit status.
while kill -0 "$pid" 2>/dev/null; do wait "$pid"; done
wait "$pid"
