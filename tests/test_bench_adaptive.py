"""End-to-end smoke test of ``benchmarks/bench_adaptive.py --quick`` (root: network emulator).

Runs the quick benchmark (N=2 on the emulator, Fashion-MNIST, 4 methods) and checks the shape of its
JSON: every method trained for a positive time, and Adaptive's per-step CRs start at 1.0 (warm-up)
and stay within ``[c_low, 1]``. No timing or accuracy assertions: the machine is shared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hvd_flexcomm.netem import namespaces

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "benchmarks", "bench_adaptive.py")
_NO_NETNS = namespaces.require_root_and_iproute()


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or _NO_NETNS is not None,
                    reason=f"needs root and the network emulator ({_NO_NETNS or 'not root'})")
@pytest.mark.timeout(300)
def test_quick_benchmark_end_to_end(tmp_path):
    out = tmp_path / "adaptive"
    proc = subprocess.run([sys.executable, BENCH, "--quick", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=290)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    with open(out / "adaptive.json") as fh:
        result = json.load(fh)
    for name in ("adaptive.md", "accuracy_vs_time.png", "adaptive_cr.png"):
        assert (out / name).stat().st_size > 0, name

    assert result["error"] is None
    assert 0 < result["dense_accuracy"] <= 1
    assert len(result["loadavg_start"]) == 3 and len(result["loadavg_end"]) == 3
    planned = [m["name"] for m in result["settings"]["methods"]]
    rows = {r["name"]: r for r in result["rows"]}
    assert list(rows) == planned
    for name, row in rows.items():
        assert row["steps"] > 0, name
        assert row["train_s"] > 0 and row["mean_step_ms"] > 0 and row["median_step_ms"] > 0, name
        assert row["time_to_target_s"] is None or row["time_to_target_s"] > 0, name
        assert 0 < row["final_accuracy"] <= 1, name
    assert {r["kind"] for r in rows.values()} >= {"dense", "ar", "flexible", "adaptive"}

    c_low = result["settings"]["adaptive_defaults"]["c_low"]
    records = [r for r in result["records"] if r["method"]["kind"] == "adaptive"]
    assert records
    for rec in records:
        crs = rec["per_step"]["cr"]
        assert len(crs) == rec["steps"] and crs[0] == 1.0, crs[:5]
        assert all(c_low <= c <= 1.0 for c in crs), sorted(set(crs))
        assert len(rec["per_step"]["collective"]) == len(crs)
