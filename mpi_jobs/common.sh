# shellcheck shell=bash
# Shared part of the launch scripts in mpi_jobs/: sourced, never run. It
#   * finds the repository root (HVD_FLEXCOMM_REPO, else the caller sets HVD_JOBS_REPO_GUESS),
#   * finds the virtual environment (HVD_FLEXCOMM_VENV, else the last line printed by
#     `bash scripts/install.sh`, run from the repository root; that builds it on first use),
#   * sets the defaults for a small machine (NP=2, OMP_NUM_THREADS=1),
#   * lets Open MPI run as root when the script runs as root (OMPI_ALLOW_RUN_AS_ROOT*),
#   * lists the variables every rank must see (for mpirun's -x),
#   * runs or, with DRY_RUN=1, only prints the final command.
#
# Variables read here (all optional):
#   HVD_FLEXCOMM_VENV   virtual environment with torch + horovod + hvd_flexcomm
#   HVD_FLEXCOMM_REPO   repository root (holds examples/train_fashion_mnist.py)
#   NP                  number of ranks (default 2)
#   OMP_NUM_THREADS     threads per rank for torch/OpenMP (default 1: ranks x threads <= cores)
#   DRY_RUN=1           print the launch command and exit 0 without running it

hvd_jobs_die() { echo "mpi_jobs: $*" >&2; exit 1; }

hvd_jobs_setup() {
  local guess=${HVD_JOBS_REPO_GUESS:-}
  REPO_ROOT=${HVD_FLEXCOMM_REPO:-$guess}
  [[ -n $REPO_ROOT && -f $REPO_ROOT/examples/train_fashion_mnist.py ]] \
    || hvd_jobs_die "repository root not found (looked at '${REPO_ROOT}'); set HVD_FLEXCOMM_REPO"
  REPO_ROOT=$(cd "$REPO_ROOT" && pwd)
  EXAMPLE=$REPO_ROOT/examples/train_fashion_mnist.py

  if [[ -z ${HVD_FLEXCOMM_VENV:-} ]]; then
    HVD_FLEXCOMM_VENV=$(cd "$REPO_ROOT" && bash scripts/install.sh | tail -n1) \
      || hvd_jobs_die "scripts/install.sh failed; set HVD_FLEXCOMM_VENV to a ready virtualenv"
  fi
  VENV=$HVD_FLEXCOMM_VENV
  [[ -x $VENV/bin/python ]] || hvd_jobs_die "no python in venv '$VENV' (HVD_FLEXCOMM_VENV)"
  export HVD_FLEXCOMM_VENV
  PYTHON=$VENV/bin/python
  # Put the venv first so horovodrun, and every rank's `python`, come from it.
  export PATH="$VENV/bin:$PATH"

  NP=${NP:-2}
  [[ $NP =~ ^[1-9][0-9]*$ ]] || hvd_jobs_die "NP must be a positive integer, not '$NP'"
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

  if [[ $(id -u) -eq 0 ]]; then
    # Open MPI refuses to start as root unless told twice.
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
}

# Names of the set variables that every rank needs: the paths, the thread count, Horovod's run-time
# knobs (HOROVOD_*), this project's (HVD_FLEXCOMM_*), and NCCL_* if any.
hvd_jobs_env_names() {
  local name
  for name in PATH LD_LIBRARY_PATH PYTHONPATH OMP_NUM_THREADS; do
    [[ -n ${!name+x} ]] && echo "$name"
  done
  compgen -e | grep -E '^(HOROVOD_|HVD_FLEXCOMM_|NCCL_)' | sort || true
}

# hvd_jobs_exec CMD...: print the command (always, to stderr, so logs show it), then replace the
# shell with it, unless DRY_RUN=1.
hvd_jobs_exec() {
  printf '+' >&2
  printf ' %q' "$@" >&2
  printf '\n' >&2
  [[ ${DRY_RUN:-0} == 1 ]] && exit 0
  exec "$@"
}

# Fills the array MPI_OPTS with the Open MPI options that mpirun.sh and slurm_train.sbatch share,
# from BIND, BTL, IFACES and the environment (see mpirun.sh for the meaning of each).
hvd_jobs_mpirun_options() {
  local name
  MPI_OPTS=()
  case ${BIND:-none} in
    none) MPI_OPTS+=(--bind-to none --map-by slot) ;;
    core) MPI_OPTS+=(--bind-to core --map-by socket) ;;
    *) hvd_jobs_die "BIND must be none or core, not '${BIND}'" ;;
  esac
  for name in $(hvd_jobs_env_names); do MPI_OPTS+=(-x "$name"); done
  MPI_OPTS+=(--mca pml ob1)
  case ${BTL:-tcp} in
    tcp) MPI_OPTS+=(--mca btl tcp,self) ;;
    vader|sm|shm) MPI_OPTS+=(--mca btl vader,self --mca btl_vader_single_copy_mechanism none) ;;
    *) MPI_OPTS+=(--mca btl "$BTL") ;;
  esac
  if [[ -n ${IFACES:-} ]]; then
    MPI_OPTS+=(--mca btl_tcp_if_include "$IFACES" --mca oob_tcp_if_include "$IFACES")
  fi
}
