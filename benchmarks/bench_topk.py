"""Top-k selection cost against one elementwise pass (``g.abs()``) and ``torch.topk``.

    python benchmarks/bench_topk.py [--quick] [--json out.json]

For each tensor size (1M, 11.7M = ResNet-18, 25.6M = ResNet-50 float32 elements) and CR
(0.1, 0.01, 0.001) it times, best of ``--repeats`` runs on the same tensor in the same process:
``g.abs()``, ``torch.topk(g.abs(), k)`` and ``hvd_flexcomm.select_topk(g, k)`` with a reused
workspace (its first call, which allocates the workspace, is one extra repeat); it prints both as
ratios to the ``abs()`` pass and checks that ``select_topk`` returned the exact top-k magnitudes.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from hvd_flexcomm.topk import TopkWorkspace, k_for, select_topk

SIZES = {"1M": 1_000_000, "ResNet-18 (11.7M)": 11_689_512, "ResNet-50 (25.6M)": 25_557_032}
CRS = (0.1, 0.01, 0.001)


def best_ms(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return 1e3 * best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1M elements only, 2 repeats")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 = a rank)")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sizes = {"1M": SIZES["1M"]} if args.quick else SIZES
    repeats = 2 if args.quick else args.repeats
    rows = []
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), best of {repeats}")
    print(f"{'elements':<20}{'cr':>7}{'abs ms':>9}{'topk ms':>9}{'ours ms':>9}"
          f"{'topk/abs':>10}{'ours/abs':>10}{'speedup':>9}")
    for label, n in sizes.items():
        g = torch.randn(n, generator=torch.Generator().manual_seed(0))
        abs_ms = best_ms(lambda g=g: g.abs(), repeats)
        for cr in CRS:
            k = k_for(cr, n)
            topk_ms = best_ms(lambda g=g, k=k: torch.topk(g.abs(), k, sorted=False), repeats)
            ws = TopkWorkspace()  # as in the optimizer: one workspace per message, reused
            ours_ms = best_ms(lambda g=g, k=k, ws=ws: select_topk(g, k, workspace=ws), repeats + 1)
            idx = select_topk(g, k).long()
            exact = torch.equal(g.abs()[idx].sort().values,
                                torch.topk(g.abs(), k).values.sort().values)
            row = {"elements": n, "label": label, "cr": cr, "k": k, "abs_ms": abs_ms,
                   "topk_ms": topk_ms, "ours_ms": ours_ms, "topk_over_abs": topk_ms / abs_ms,
                   "ours_over_abs": ours_ms / abs_ms, "speedup_vs_topk": topk_ms / ours_ms,
                   "exact": exact}
            rows.append(row)
            print(f"{label:<20}{cr:>7g}{abs_ms:>9.1f}{topk_ms:>9.1f}{ours_ms:>9.1f}"
                  f"{row['topk_over_abs']:>10.2f}{row['ours_over_abs']:>10.2f}"
                  f"{row['speedup_vs_topk']:>8.1f}x" + ("" if exact else "  NOT EXACT"))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
