"""Entry point of one rank under ``horovodrun`` (see ``tests/harness.py``)."""

from __future__ import annotations

import importlib
import json
import pickle
import sys
import traceback


def main() -> int:
    target, outdir, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    import horovod.torch as hvd
    import torch

    torch.set_num_threads(1)
    hvd.init()
    rank = hvd.rank()
    module_name, func_name = target.split(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
        outcome = ("ok", func(**kwargs))
        code = 0
    except BaseException:  # noqa: BLE001 - every failure is reported back to the test
        outcome = ("error", traceback.format_exc())
        code = 1
    with open(f"{outdir}/rank{rank}.pkl", "wb") as fh:
        pickle.dump(outcome, fh)
    if code and outcome[1]:
        sys.stderr.write(outcome[1])
    return code


if __name__ == "__main__":
    sys.exit(main())
