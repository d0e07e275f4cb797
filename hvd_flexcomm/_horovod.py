"""Import guard for Horovod's PyTorch frontend.

``hvd_flexcomm`` imports without Horovod; the parts that communicate call :func:`require_horovod`,
which turns a missing or incomplete Horovod into one clear ``ImportError`` instead of a traceback
from deep inside Horovod.
"""

from __future__ import annotations

from types import ModuleType

INSTALL_HINT = (
    "Run `bash scripts/install.sh` from the hvd_flexcomm checkout: it builds Horovod 0.28.1 "
    "against the installed torch with PyTorch, MPI and Gloo support (see README, 'Installing')."
)


def require_horovod() -> ModuleType:
    """Return ``horovod.torch``, or raise ``ImportError`` saying what is missing and how to fix it."""
    try:
        import horovod
    except ImportError as exc:
        raise ImportError(f"hvd_flexcomm needs Horovod, which is not installed. {INSTALL_HINT}") from exc
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        version = getattr(horovod, "__version__", "?")
        raise ImportError(
            f"Horovod {version} is installed but its PyTorch extension is missing or does not load "
            f"({exc}); it was probably built without HOROVOD_WITH_PYTORCH=1 or against another "
            f"torch. {INSTALL_HINT}"
        ) from exc
    return hvd
