#!/usr/bin/env bash
# Train examples/train_fashion_mnist.py with plain Open MPI mpirun (no horovodrun); Horovod picks its
# MPI controller because it finds itself started by mpirun.
#
#   mpi_jobs/mpirun.sh [EXAMPLE ARGS...]
#   NP=2 mpi_jobs/mpirun.sh --compression artopk --cr 0.05 --train-size 2000 --epochs 1
#   BTL=vader BIND=core mpi_jobs/mpirun.sh --compression agtopk --cr 0.01      # shared memory, pinned
#   HOSTS=node1:2,node2:2 NP=4 IFACES=eth0 mpi_jobs/mpirun.sh --compression dense
#
# Runs (defaults shown):
#   mpirun -np 2 -H localhost:2 --bind-to none --map-by slot \
#          -x PATH -x LD_LIBRARY_PATH -x PYTHONPATH -x OMP_NUM_THREADS -x HOROVOD_... -x HVD_FLEXCOMM_... \
#          --mca pml ob1 --mca btl tcp,self [--mca btl_tcp_if_include $IFACES --mca oob_tcp_if_include $IFACES] \
#          $MPI_ARGS <venv>/bin/python examples/train_fashion_mnist.py "$@"
#
# Environment (all optional):
#   NP                 number of ranks (default 2)
#   HOSTS              mpirun -H list "host:slots,..." (default localhost:$NP); remote hosts are
#                      started over ssh and need the same venv path
#   BTL                byte transfer layer between ranks, with the ob1 PML:
#                        tcp    (default) "--mca btl tcp,self": TCP sockets even on one machine, the
#                               same path a multi-node job takes, and what network emulation shapes
#                        vader  "--mca btl vader,self": shared memory, single node only (plus
#                               btl_vader_single_copy_mechanism=none, which containers without
#                               ptrace/CMA need)
#                        anything else is used verbatim, e.g. BTL=self,vader,tcp
#   BIND               process binding:
#                        none   (default) "--bind-to none --map-by slot": threads float; right for
#                               OMP_NUM_THREADS>1 or oversubscribed machines
#                        core   "--bind-to core --map-by socket": one core per rank, ranks spread
#                               over sockets; NP must not exceed the cores
#   IFACES             interfaces for MPI traffic, e.g. "eth0" or "lo": --mca btl_tcp_if_include and
#                      --mca oob_tcp_if_include (Open MPI's runtime); a comma list or CIDR works too
#   OMP_NUM_THREADS    threads per rank (default 1)
#   HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME, HOROVOD_LOG_LEVEL, HOROVOD_TIMELINE,
#   HOROVOD_MPI_THREADS_DISABLE, HOROVOD_CACHE_CAPACITY, HVD_FLEXCOMM_*, NCCL_*
#                      each one that is set is forwarded with -x NAME (mpirun does not forward the
#                      environment to remote ranks on its own)
#   MPI_ARGS           extra mpirun options, word-split (e.g. "--oversubscribe --report-bindings")
#   HVD_FLEXCOMM_VENV  the venv (default: last line of `bash scripts/install.sh`)
#   HVD_FLEXCOMM_REPO  repository root (default: the parent of this script's directory)
#   DRY_RUN=1          print the command only
# As root, OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 are exported.
set -euo pipefail
HVD_JOBS_REPO_GUESS=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=mpi_jobs/common.sh
source "$HVD_JOBS_REPO_GUESS/mpi_jobs/common.sh"
hvd_jobs_setup

HOSTS=${HOSTS:-localhost:$NP}
args=(mpirun -np "$NP" -H "$HOSTS")
hvd_jobs_mpirun_options
args+=("${MPI_OPTS[@]}")
# shellcheck disable=SC2206  # MPI_ARGS is meant to be word-split
[[ -n ${MPI_ARGS:-} ]] && args+=($MPI_ARGS)
hvd_jobs_exec "${args[@]}" "$PYTHON" "$EXAMPLE" "$@"
