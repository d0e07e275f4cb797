"""The Horovod-operation cost benchmark's ``--quick`` mode on the network emulator (root only).

Checks that every kind was timed on a real 2-rank Gloo job and written out; the costs themselves
are reported by the benchmark, not asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .test_bench_flexible import REPO, _missing, _positive

KINDS = {"allreduce_tiny", "broadcast_f64", "broadcast_object", "allgather_same",
         "allgather_resized", "allgather_new_name"}


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.timeout(180)
def test_ops_quick_times_every_kind(tmp_path):
    missing = _missing()
    if missing:
        pytest.skip(missing)
    proc = subprocess.run([sys.executable, "benchmarks/bench_horovod_ops.py", "--quick", "--out",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=170,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    data = json.loads((tmp_path / "ops.json").read_text())
    assert data["raw"]["size"] == 2 and not data["raw"]["mpi"]
    rows = {r["kind"]: r for r in data["rows"]}
    assert set(rows) == KINDS
    assert rows["allreduce_tiny"]["ratio_to_baseline"] == 1.0
    for r in rows.values():
        assert r["n"] == 3 and _positive(r["median_ms"]) and r["min_ms"] <= r["median_ms"] <= r["max_ms"]
    assert "| broadcast_object |" in (tmp_path / "ops.md").read_text()
