"""End-to-end runs of the synthetic benchmarks' ``--quick`` modes (``benchmarks/bench_synthetic.py``,
``benchmarks/bench_table6.py``): they finish and their outputs exist and are well-formed (positive
times, one winner per cell). No timing assertions: the machine is small and shared.

The exact-size MLP check runs anywhere; the rest are slow (multi-process, horovodrun); the
emulator ones also need root (network namespaces) and skip otherwise.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "benchmarks")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import synthetic_models  # noqa: E402

from hvd_flexcomm.netem import namespaces  # noqa: E402

_NO_NETNS = namespaces.require_root_and_iproute()
needs_netns = pytest.mark.skipif(_NO_NETNS is not None, reason=f"emulator {_NO_NETNS}")
_HOROVODRUN = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "horovodrun")
needs_horovodrun = pytest.mark.skipif(not os.path.exists(_HOROVODRUN),
                                      reason="horovodrun is not next to this interpreter")


def _horovod_ok() -> bool:
    try:
        import horovod.torch  # noqa: F401
    except ImportError:
        return False
    return True


needs_horovod = pytest.mark.skipif(not _horovod_ok(), reason="horovod.torch is not importable")


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


# -- anywhere --------------------------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", ["resnet18", "resnet50", "alexnet", "small", "tiny"])
def test_exact_mlp_has_the_named_parameter_count(name):
    target = synthetic_models.size_of(name)
    shape = synthetic_models.exact_mlp_shape(target)
    assert shape.numel == target
    if target <= 30_000_000:  # building AlexNet's 61M parameters is needlessly slow here
        model = synthetic_models.build_mlp(shape)
        assert sum(p.numel() for p in model.parameters()) == target


@pytest.mark.timeout(30)
def test_table6_paper_winners_and_bandwidth_matching():
    import bench_table6 as t6

    assert t6.paper_gbps_for([1000, 500, 100]) == {1000: 10, 500: 5, 100: 1}
    assert t6.paper_gbps_for([1000, 100]) == {1000: 10, 100: 1}
    # a few cells of the paper's Table VI (method.md §7)
    assert t6.paper_cell("resnet18", 10, 0.1)["winner"] == "AR"
    assert t6.paper_cell("resnet18", 10, 0.01)["winner"] == "AG"
    assert t6.paper_cell("resnet18", 1, 0.01)["winner"] == "AR"
    assert t6.paper_cell("resnet50", 5, 0.01)["winner"] == "AR"  # ART-Tree 24.2 < AG 28.1
    assert t6.paper_cell("alexnet", 1, 0.001)["winner"] == "AR"
    assert t6.paper_cell("resnet50", 1, 0.001)["winner"] == "AG"
    n_cells = sum(len(v) for v in t6.PAPER_TABLE6.values())
    assert n_cells == 36


# -- multi-process ---------------------------------------------------------------------------------


def _check_synthetic(out: str, expect_networks: int) -> dict:
    for name in ("synthetic.json", "synthetic.md", "synthetic.png"):
        path = os.path.join(out, name)
        assert os.path.exists(path) and os.path.getsize(path) > 0, name
    with open(os.path.join(out, "synthetic.json")) as fh:
        result = json.load(fh)
    meta, runs = result["meta"], result["runs"]
    assert len(meta["loadavg_start"]) == 3 and len(meta["loadavg_end"]) == 3
    assert all(j["rc"] == 0 for j in meta["jobs"]), meta["jobs"]
    labels = {r["network"]["label"] for r in runs}
    assert len(labels) == expect_networks
    methods = {r["method"] for r in runs}
    assert methods == {"horovod", "dense", "agtopk", "artopk-star", "artopk-var", "flexible", "adaptive"}
    for r in runs:
        assert r["N"] == meta["N"]
        assert len(r["img_sec"]) == r["num_iters"] and all(_positive(x) for x in r["img_sec"])
        assert _positive(r["step_ms_mean"]) and _positive(r["total_img_sec"])
        if r["method"] != "horovod":
            assert _positive(r["comm_ms_median"])
        if r["method"] in ("agtopk", "artopk-star", "artopk-var"):
            expected = {"agtopk": "allgather"}.get(r["method"], "allreduce")
            assert set(r["collectives"]) == {expected}
            assert r["k_median"] == round(r["cr"] * r["numel"])
    h = result["headlines"]
    assert h["flexible_vs_best_fixed"] and all(_positive(x["ratio"]) for x in h["flexible_vs_best_fixed"])
    assert all(_positive(x["speedup"]) for x in h["artopk_vs_dense"] + h["agtopk_vs_dense"])
    with open(os.path.join(out, "synthetic.md")) as fh:
        md = fh.read()
    assert "Headline ratios" in md and "| network | method |" in md
    return result


@pytest.mark.slow
@needs_horovod
@needs_horovodrun
@pytest.mark.timeout(300)
def test_bench_synthetic_worker_prints_horovod_lines(tmp_path):
    out = tmp_path / "w.jsonl"
    argv = [_HOROVODRUN, "--gloo", "-np", "2", "-H", "localhost:2", sys.executable,
            os.path.join(BENCH, "bench_synthetic.py"), "--model", "tiny", "--method", "artopk-star",
            "--cr", "0.01", "--num-warmup-batches", "1", "--num-iters", "2", "--num-batches-per-iter", "1",
            "--json", str(out)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PATH"] = os.pathsep.join([os.path.dirname(_HOROVODRUN), env.get("PATH", "")])
    res = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=280)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for text in ("Iter #0:", "Iter #1:", "img/sec per rank", "Img/sec per rank:",
                 "Total img/sec on 2 rank(s):"):
        assert text in res.stdout, text
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 1 and records[0]["method"] == "artopk-star" and records[0]["N"] == 2


@pytest.mark.slow
@pytest.mark.root
@needs_netns
@needs_horovod
@needs_horovodrun
@pytest.mark.timeout(420)
def test_bench_synthetic_quick_sweep_end_to_end(tmp_path):
    out = str(tmp_path / "synthetic")
    res = _run([os.path.join(BENCH, "bench_synthetic.py"), "--sweep", "--quick", "--out", out], timeout=400)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    result = _check_synthetic(out, expect_networks=2)
    assert result["meta"]["N"] == 2
    assert "Img/sec per rank:" in res.stdout
    # re-rendering from the JSON alone works and gives the same table
    with open(os.path.join(out, "synthetic.md")) as fh:
        before = fh.read()
    res2 = _run([os.path.join(BENCH, "bench_synthetic.py"), "--render", os.path.join(out, "synthetic.json")],
                timeout=120)
    assert res2.returncode == 0, res2.stderr[-3000:]
    with open(os.path.join(out, "synthetic.md")) as fh:
        assert fh.read() == before


@pytest.mark.slow
@pytest.mark.root
@needs_netns
@needs_horovod
@needs_horovodrun
@pytest.mark.timeout(420)
def test_bench_table6_quick_end_to_end(tmp_path):
    out = str(tmp_path / "table6")
    res = _run([os.path.join(BENCH, "bench_table6.py"), "--quick", "--out", out], timeout=400)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    for name in ("table6.json", "table6.md", "table6.png"):
        path = os.path.join(out, name)
        assert os.path.exists(path) and os.path.getsize(path) > 0, name
    with open(os.path.join(out, "table6.json")) as fh:
        result = json.load(fh)
    meta, rows = result["meta"], result["rows"]
    assert len(meta["loadavg_start"]) == 3 and len(meta["loadavg_end"]) == 3
    n_cells = len(meta["models"]) * len(meta["bandwidths_mbit"]) * len(meta["crs"])
    assert len(rows) == n_cells
    keys = {(r["model"], r["rate_mbit"], r["cr"]) for r in rows}
    assert len(keys) == n_cells  # one row, hence one winner, per cell
    for r in rows:
        assert _positive(r["ag_comm_ms"]) and _positive(r["ar_comm_ms"])
        assert r["winner"] in ("AG", "AR")
        assert r["winner"] == ("AG" if r["ag_comm_ms"] <= r["ar_comm_ms"] else "AR")
        assert r["paper"] is not None and r["paper"]["winner"] in ("AG", "AR")
        assert r["agree"] == (r["winner"] == r["paper"]["winner"])
    assert result["agreement"]["cells"] == n_cells
    assert len(result["probes"]) == len(meta["bandwidths_mbit"])
    for p in result["probes"]:
        assert all(_positive(p[k]) for k in ("allreduce_ms", "allgather_ms", "broadcast_ms"))
    shutil.rmtree(out, ignore_errors=True)
