#!/usr/bin/env bash
# Install everything hvd_flexcomm needs, idempotently, on Debian 12 + Python 3.11 as root (or with sudo).
#
#   bash scripts/install.sh          # prints the path of the virtual environment on its last line
#
# What it does (each step is skipped when already done):
#   1. Debian packages: Open MPI (libopenmpi-dev, openmpi-bin), the Fashion-MNIST data set
#      (dataset-fashion-mnist), iproute2 / iptables / iputils-ping for the network emulator.
#   2. A virtual environment OUTSIDE the clone, keyed by the Horovod, torch and Python versions:
#         ${HVD_FLEXCOMM_CACHE:-~/.cache/hvd_flexcomm}/hvd<H>-torch<T>-py<P>/venv
#      with torch (CPU), numpy, scipy, mpi4py, pymoo, matplotlib, pytest, hypothesis, ruff.
#   3. A Horovod wheel built once from the PyPI sdist and cached beside the venv (about 7 min on
#      2 cores). Horovod 0.28.1 (the last release, June 2023) does not build against torch >= 2.1
#      as released, so the sdist is patched here, and the patch is checked:
#        - CMAKE_CXX_STANDARD 14 -> 17 in CMakeLists.txt and horovod/torch/CMakeLists.txt
#          (PyTorch 2.x headers need C++17); the script fails loudly if those lines are missing;
#        - CMAKE_POLICY_VERSION_MINIMUM=3.5 in the environment, because pip's CMake 4.x refuses the
#          bundled gloo's old cmake_minimum_required.
#   4. hvd_flexcomm itself, in editable mode, from this clone.
set -euo pipefail

HOROVOD_VERSION=0.28.1
TORCH_VERSION=2.13.0
MPI4PY_VERSION=4.1.2
PYMOO_VERSION=0.6.2
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
PY_TAG=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
CACHE_ROOT=${HVD_FLEXCOMM_CACHE:-$HOME/.cache/hvd_flexcomm}
KEY=hvd${HOROVOD_VERSION}-torch${TORCH_VERSION}-py${PY_TAG}
CACHE_DIR=$CACHE_ROOT/$KEY
VENV=$CACHE_DIR/venv
WHEEL_DIR=$CACHE_DIR/wheels
LOG_DIR=$CACHE_DIR/logs
mkdir -p "$WHEEL_DIR" "$LOG_DIR"

say() { printf '[install] %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# ---- 1. Debian packages -------------------------------------------------------------------
DEB_PACKAGES=(libopenmpi-dev openmpi-bin dataset-fashion-mnist iproute2 iptables iputils-ping)
missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "apt-get install ${missing[*]}"
  as_root apt-get update -qq >"$LOG_DIR/apt.log" 2>&1
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    >>"$LOG_DIR/apt.log" 2>&1 || { tail -20 "$LOG_DIR/apt.log" >&2; exit 1; }
fi

# ---- 2. virtual environment ---------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
stamp=$CACHE_DIR/.deps-v1
if [ ! -f "$stamp" ]; then
  say "installing Python dependencies into the venv (torch $TORCH_VERSION CPU, mpi4py, pymoo, ...)"
  "${PIP[@]}" install --upgrade pip setuptools wheel >"$LOG_DIR/pip.log" 2>&1
  "${PIP[@]}" install "torch==$TORCH_VERSION" numpy scipy "mpi4py==$MPI4PY_VERSION" "pymoo==$PYMOO_VERSION" \
    matplotlib pytest pytest-timeout hypothesis ruff cmake packaging psutil pyyaml cloudpickle \
    >>"$LOG_DIR/pip.log" 2>&1 || { tail -30 "$LOG_DIR/pip.log" >&2; exit 1; }
  touch "$stamp"
fi

# ---- 3. Horovod wheel (built once, cached) ------------------------------------------------
wheel=$(ls "$WHEEL_DIR"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
  say "building Horovod $HOROVOD_VERSION against torch $TORCH_VERSION (about 7 minutes; log: $LOG_DIR/horovod-build.log)"
  build=$(mktemp -d)
  trap 'rm -rf "$build"' EXIT
  "${PIP[@]}" download --no-deps --no-binary :all: -d "$build" "horovod==$HOROVOD_VERSION" \
    >"$LOG_DIR/horovod-build.log" 2>&1
  tar -xzf "$build"/horovod-"$HOROVOD_VERSION".tar.gz -C "$build"
  src=$build/horovod-$HOROVOD_VERSION
  for f in CMakeLists.txt horovod/torch/CMakeLists.txt; do
    if ! grep -q 'set(CMAKE_CXX_STANDARD 14)' "$src/$f"; then
      say "ERROR: $f in the Horovod $HOROVOD_VERSION sdist no longer contains 'set(CMAKE_CXX_STANDARD 14)';"
      say "       the C++17 patch does not apply. Check the sdist and update scripts/install.sh."
      exit 1
    fi
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/$f"
    grep -q 'set(CMAKE_CXX_STANDARD 17)' "$src/$f"
  done
  (
    export PATH="$VENV/bin:$PATH"
    export CMAKE_POLICY_VERSION_MINIMUM=3.5
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
    export HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=${HOROVOD_CPU_OPERATIONS:-}
    export MAKEFLAGS="-j$(nproc)"
    cd "$src"
    "$VENV/bin/python" -m pip wheel --no-build-isolation --no-deps -w "$WHEEL_DIR" . \
      >>"$LOG_DIR/horovod-build.log" 2>&1
  ) || { tail -40 "$LOG_DIR/horovod-build.log" >&2; say "Horovod build failed"; exit 1; }
  wheel=$(ls "$WHEEL_DIR"/horovod-"$HOROVOD_VERSION"-*.whl | head -n1)
fi
if ! "$VENV/bin/python" -c "import horovod, sys; sys.exit(horovod.__version__ != '$HOROVOD_VERSION')" 2>/dev/null; then
  say "installing $(basename "$wheel")"
  "${PIP[@]}" install "$wheel" >>"$LOG_DIR/pip.log" 2>&1 || { tail -30 "$LOG_DIR/pip.log" >&2; exit 1; }
fi

# ---- 4. this package, editable --------------------------------------------------------------
"${PIP[@]}" install --no-deps --no-build-isolation -e "$REPO_ROOT" >>"$LOG_DIR/pip.log" 2>&1 \
  || { tail -30 "$LOG_DIR/pip.log" >&2; exit 1; }
echo "$VENV"
