"""Training through a lossy, jittery emulated link (needs root: network namespaces)."""

import os
import shutil

import pytest

from tests.harness import run_parallel

pytestmark = [pytest.mark.slow, pytest.mark.root]

needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="needs root and iproute2 (network namespaces)")


@needs_root
@pytest.mark.timeout(300)
def test_flexible_trains_over_lossy_jittery_link_without_flapping():
    from hvd_flexcomm.netem import Emulator, LinkSpec

    link = LinkSpec(delay_ms=2.0, rate_mbit=200.0, loss=0.01, jitter_ms=1.0)
    with Emulator(n_hosts=2, link=link) as emu:
        results = run_parallel("tests.mp_bodies:flexible_training_on_lossy_link", np=2,
                               timeout=240, wrap=emu.horovodrun_argv, env=emu.env())
        stats = emu.relay_stats()
    assert stats["dropped_loss"] > 0, stats  # packets really were lost
    for r in results:
        assert r["params_agree"]
        assert r["last_loss"] < 0.9 * r["first_loss"], r
        assert r["switches"] <= 4, (r["paths"], r["exploring"])  # hysteresis: no flapping
    assert results[0]["paths"] == results[1]["paths"]
