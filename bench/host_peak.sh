#!/usr/bin/env bash
# Runs a command and prints, on its last line of stderr, the peak resident memory of the largest process it started
# (getrusage's RUSAGE_CHILDREN ru_maxrss: every descendant that was waited for, mpirun's ranks and torchrun's workers
# included). Exits with the command's status.
#
#   bash bench/host_peak.sh bash bench/train_throughput.sh build 1 configs/llama3.1-8b.ini ...
#   -> "host peak: 97.31 GiB (the largest process of: bash bench/train_throughput.sh ...)"
exec python3 - "$@" <<'PY'
import resource, subprocess, sys
rc = subprocess.call(sys.argv[1:])
kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(f"host peak: {kib / 2**20:.2f} GiB (the largest process of: {' '.join(sys.argv[1:])[:200]})", file=sys.stderr)
sys.exit(rc)
PY
