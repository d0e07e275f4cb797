#!/usr/bin/env bash
# README command 2 (and .ci/run): install what is missing, lint, then run the whole test suite.
# Extra arguments go to pytest (e.g. -m "not slow" for the quick loop).
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$(bash "$REPO_ROOT/scripts/install.sh" | tail -n1)
cd "$REPO_ROOT"
export PATH="$VENV/bin:$PATH" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "[tests] ruff check"
"$VENV/bin/ruff" check hvd_flexcomm tests benchmarks examples
set +e
"$VENV/bin/python" -m pytest -q "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
  echo "[tests] pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$code"
