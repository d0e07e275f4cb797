import pytest

from tests.harness import run_parallel


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ag", "star", "var"])
def test_compressed_matches_reference_2(kind):
    results = run_parallel("tests.mp_bodies:compressed_matches_reference", np=2, kind=kind, cr=0.05)
    for r in results:
        assert r["max_err"] < 1e-5, r
        assert r["max_res_err"] < 1e-5, r
