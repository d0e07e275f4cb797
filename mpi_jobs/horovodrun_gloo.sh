#!/usr/bin/env bash
# Train examples/train_fashion_mnist.py with horovodrun and Horovod's Gloo controller (no MPI).
#
#   mpi_jobs/horovodrun_gloo.sh [EXAMPLE ARGS...]
#   NP=2 mpi_jobs/horovodrun_gloo.sh --compression artopk --cr 0.05 --train-size 2000 --epochs 1
#   HOSTS=node1:2,node2:2 NP=4 IFACES=eth0 mpi_jobs/horovodrun_gloo.sh --compression agtopk --cr 0.01
#
# Runs:  horovodrun -np $NP -H $HOSTS --gloo [--network-interfaces $IFACES] $LAUNCHER_ARGS \
#            <venv>/bin/python examples/train_fashion_mnist.py "$@"
# Everything after the script name goes to the example (--compression, --cr, --selector, --epochs,
# --train-size, --batch-size, --json FILE, ...); rank 0 prints the SUMMARY line.
#
# Environment (all optional):
#   NP                   number of ranks (default 2, one per core on a 2-core machine)
#   HOSTS                horovodrun -H list "host:slots,..." (default localhost:$NP). Remote hosts
#                        are reached by password-less ssh and need the same venv path.
#   IFACES               network interfaces for Gloo, e.g. "eth0" or "lo"; becomes
#                        --network-interfaces, which horovodrun hands to the ranks as
#                        HOROVOD_GLOO_IFACE (default: horovodrun picks the common routable ones)
#   OMP_NUM_THREADS      threads per rank (default 1)
#   HOROVOD_FUSION_THRESHOLD  tensor fusion buffer in bytes (Horovod's default 64 MiB)
#   HOROVOD_CYCLE_TIME   background cycle in ms (default 1 ms)
#   HOROVOD_LOG_LEVEL    trace|debug|info|warning|error|fatal
#   HOROVOD_GLOO_TIMEOUT_SECONDS, HOROVOD_TIMELINE=file.json, HOROVOD_CACHE_CAPACITY, ...
#                        every HOROVOD_* / HVD_FLEXCOMM_* variable set here reaches all ranks
#                        (horovodrun passes the whole environment to Gloo ranks)
#   LAUNCHER_ARGS        extra horovodrun options, word-split (e.g. "--verbose --start-timeout 60")
#   HVD_FLEXCOMM_VENV    the venv (default: last line of `bash scripts/install.sh`)
#   HVD_FLEXCOMM_REPO    repository root (default: the parent of this script's directory)
#   DRY_RUN=1            print the command only
set -euo pipefail
HVD_JOBS_REPO_GUESS=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=mpi_jobs/common.sh
source "$HVD_JOBS_REPO_GUESS/mpi_jobs/common.sh"
hvd_jobs_setup

HOSTS=${HOSTS:-localhost:$NP}
args=(horovodrun -np "$NP" -H "$HOSTS" --gloo)
[[ -n ${IFACES:-} ]] && args+=(--network-interfaces "$IFACES")
# shellcheck disable=SC2206  # LAUNCHER_ARGS is meant to be word-split
[[ -n ${LAUNCHER_ARGS:-} ]] && args+=($LAUNCHER_ARGS)
hvd_jobs_exec "${args[@]}" "$PYTHON" "$EXAMPLE" "$@"
