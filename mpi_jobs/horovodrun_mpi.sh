#!/usr/bin/env bash
# Train examples/train_fashion_mnist.py with horovodrun and Horovod's MPI controller (Open MPI).
#
#   mpi_jobs/horovodrun_mpi.sh [EXAMPLE ARGS...]
#   NP=2 mpi_jobs/horovodrun_mpi.sh --compression artopk --cr 0.05 --train-size 2000 --epochs 1
#   HOSTS=node1:2,node2:2 NP=4 IFACES=eth0 mpi_jobs/horovodrun_mpi.sh --compression dense
#
# Runs:  horovodrun -np $NP -H $HOSTS --mpi --mpi-args="$MPI_ARGS" [--network-interfaces $IFACES] \
#            $LAUNCHER_ARGS <venv>/bin/python examples/train_fashion_mnist.py "$@"
# horovodrun builds the mpirun line itself: it adds --allow-run-as-root, -bind-to none -map-by slot,
# -x for every exported variable, and, with --network-interfaces, -mca btl_tcp_if_include.
#
# Environment (all optional):
#   NP                   number of ranks (default 2)
#   HOSTS                horovodrun -H list "host:slots,..." (default localhost:$NP)
#   MPI_ARGS             extra mpirun options (default "--oversubscribe", so NP may exceed the
#                        cores Open MPI counts; add e.g. "--mca btl tcp,self" to force TCP, or
#                        "--mca btl_vader_single_copy_mechanism none" in containers without CMA)
#   IFACES               network interfaces, e.g. "eth0": --network-interfaces, which horovodrun
#                        turns into "-mca btl_tcp_if_include eth0"
#   OMP_NUM_THREADS      threads per rank (default 1)
#   HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME, HOROVOD_LOG_LEVEL, HOROVOD_TIMELINE,
#   HOROVOD_MPI_THREADS_DISABLE, HOROVOD_CACHE_CAPACITY, HVD_FLEXCOMM_*, ...
#                        passed to every rank (horovodrun adds -x NAME for each)
#   LAUNCHER_ARGS        extra horovodrun options, word-split (e.g. "--verbose")
#   HVD_FLEXCOMM_VENV    the venv (default: last line of `bash scripts/install.sh`)
#   HVD_FLEXCOMM_REPO    repository root (default: the parent of this script's directory)
#   DRY_RUN=1            print the command only
# As root, OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 are exported.
set -euo pipefail
HVD_JOBS_REPO_GUESS=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=mpi_jobs/common.sh
source "$HVD_JOBS_REPO_GUESS/mpi_jobs/common.sh"
hvd_jobs_setup

HOSTS=${HOSTS:-localhost:$NP}
MPI_ARGS=${MPI_ARGS---oversubscribe}
args=(horovodrun -np "$NP" -H "$HOSTS" --mpi)
[[ -n $MPI_ARGS ]] && args+=("--mpi-args=$MPI_ARGS")
[[ -n ${IFACES:-} ]] && args+=(--network-interfaces "$IFACES")
# shellcheck disable=SC2206  # LAUNCHER_ARGS is meant to be word-split
[[ -n ${LAUNCHER_ARGS:-} ]] && args+=($LAUNCHER_ARGS)
hvd_jobs_exec "${args[@]}" "$PYTHON" "$EXAMPLE" "$@"
