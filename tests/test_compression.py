import math

import pytest

import hvd_flexcomm
from hvd_flexcomm import AGTopk, ARTopk, Dense, validate_cr


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.0001, 2, math.nan, math.inf, -math.inf])
def test_cr_out_of_range_names_the_value(bad):
    with pytest.raises(ValueError, match=r"cr must be in \(0, 1\]"):
        AGTopk(cr=bad)
    with pytest.raises(ValueError, match=repr(bad) if not math.isnan(bad) else "nan"):
        ARTopk(cr=bad)


@pytest.mark.parametrize("bad", ["0.1", None, True, [0.1]])
def test_cr_of_wrong_type(bad):
    with pytest.raises(TypeError, match="cr must be a number"):
        validate_cr(bad)


def test_selector_and_granularity_validation():
    with pytest.raises(ValueError, match="selector must be one of .*'random'"):
        ARTopk(cr=0.1, selector="random")
    with pytest.raises(ValueError, match="granularity must be one of"):
        AGTopk(cr=0.1, granularity="layer")
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        AGTopk(cr=0.1, bucket_cap_mb=0)
    assert ARTopk(cr=0.1, selector="VAR").selector == "var"


def test_modes_describe_and_defaults():
    assert AGTopk(cr=0.01).collective == "allgather"
    assert ARTopk(cr=0.01).collective == "allreduce"
    assert ARTopk().selector == "star" and ARTopk().granularity == "model"
    assert Dense().cr == 1.0
    assert "cr=0.01" in ARTopk(cr=0.01).describe()
    assert AGTopk(cr=1).cr == 1.0


def test_package_exports_version():
    assert isinstance(hvd_flexcomm.__version__, str) and hvd_flexcomm.__version__.count(".") == 2
