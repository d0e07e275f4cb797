#!/usr/bin/env bash
# README command 1: install everything (Debian packages, venv, cached Horovod build, this package
# in editable mode), then run the main demo.
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$(bash "$REPO_ROOT/scripts/install.sh" | tail -n1)
echo "[setup] environment ready: $VENV"
exec bash "$REPO_ROOT/scripts/demo.sh" "$VENV"
