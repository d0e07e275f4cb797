"""The package imports without Horovod, and says clearly when Horovod is missing or incomplete."""

import subprocess
import sys
import textwrap

import pytest


def _run(code: str, tmp_path=None, extra_path=None):
    env = None
    if extra_path is not None:
        import os
        env = dict(os.environ, PYTHONPATH=f"{extra_path}:{os.environ.get('PYTHONPATH', '')}")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=120)


def test_import_does_not_touch_horovod():
    r = _run("""
        import sys, hvd_flexcomm
        assert 'horovod' not in sys.modules, 'importing hvd_flexcomm imported horovod'
        print(hvd_flexcomm.__version__, hvd_flexcomm.ARTopk(cr=0.1).describe())
    """)
    assert r.returncode == 0, r.stderr
    assert "ARTopk(cr=0.1" in r.stdout


def test_clear_error_when_horovod_is_missing():
    r = _run("""
        import sys
        sys.modules['horovod'] = None   # as if not installed
        import hvd_flexcomm, torch
        hvd_flexcomm.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1))
    """)
    assert r.returncode != 0
    assert "ImportError: hvd_flexcomm needs Horovod, which is not installed" in r.stderr
    assert "scripts/install.sh" in r.stderr


def test_clear_error_when_horovod_has_no_pytorch(tmp_path):
    fake = tmp_path / "horovod"
    fake.mkdir()
    (fake / "__init__.py").write_text("__version__ = '0.28.1'\n")
    (fake / "torch").mkdir()
    (fake / "torch" / "__init__.py").write_text(
        "raise ImportError('Extension horovod.torch has not been built')\n")
    r = _run("import hvd_flexcomm, torch; "
             "hvd_flexcomm.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1))",
             extra_path=tmp_path)
    assert r.returncode != 0
    assert "Horovod 0.28.1 is installed but its PyTorch extension is missing" in r.stderr


@pytest.mark.parametrize("name", ["nope", "Flexible2"])
def test_unknown_attribute(name):
    import hvd_flexcomm

    with pytest.raises(AttributeError, match=name):
        getattr(hvd_flexcomm, name)
