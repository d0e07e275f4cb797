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


def test_settings_of_names_every_option_describe_leaves_out():
    from hvd_flexcomm import Adaptive
    from hvd_flexcomm.compression import settings_of

    a, b = Adaptive(), Adaptive(span_settle_steps=7)
    assert a.describe() == b.describe()  # the log line is short ...
    diff = {k for k in settings_of(a) if settings_of(a)[k] != settings_of(b)[k]}
    assert diff == {"span_settle_steps"}  # ... the ranks' check is not
    assert settings_of(b)["span_settle_steps"] == "7" and settings_of(a)["weights"] == "(0.6, 0.4)"
    assert set(settings_of(ARTopk())) == {"cr", "granularity", "bucket_cap_mb", "selector"}
    assert settings_of(Dense()) == {"compressor": "None"}
    # an object without a repr of its own: its type, not its address (which differs by process)
    assert settings_of(Dense(compressor=object())) == {"compressor": "<object>"}


def test_package_exports_version():
    assert isinstance(hvd_flexcomm.__version__, str) and hvd_flexcomm.__version__.count(".") == 2
