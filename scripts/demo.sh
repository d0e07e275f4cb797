#!/usr/bin/env bash
# The main demo: 2-process horovodrun training of LeNet-5 on the real Fashion-MNIST data set,
# first with Horovod's own DistributedOptimizer (dense), then with hvd_flexcomm's AR-Topk (STAR,
# CR 0.01) and AG-Topk (CR 0.01), and a side-by-side summary. About 3 minutes on 2 cores.
#   bash scripts/demo.sh [VENV]      (VENV defaults to what scripts/install.sh prints)
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${1:-$(bash "$REPO_ROOT/scripts/install.sh" | tail -n1)}
export PATH="$VENV/bin:$PATH" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
EPOCHS=${DEMO_EPOCHS:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cd "$REPO_ROOT"
for run in "horovod 1" "artopk 0.01" "agtopk 0.01"; do
  set -- $run
  echo "=== horovodrun -np 2 --gloo examples/train_fashion_mnist.py --compression $1 --cr $2 --epochs $EPOCHS"
  horovodrun -np 2 -H localhost:2 --gloo python examples/train_fashion_mnist.py \
    --compression "$1" --cr "$2" --epochs "$EPOCHS" --json "$out/$1.json" 2>&1 \
    | grep -E 'hvd_flexcomm|SUMMARY|final test' | sed -E 's/^\[[0-9]+\]<std(out|err)>://'
done
python - "$out" <<'PY'
import json, sys, pathlib
rows = [json.loads((pathlib.Path(sys.argv[1]) / f"{n}.json").read_text())
        for n in ("horovod", "artopk", "agtopk")]
base = rows[0]
print("\n=== Demo summary (2 ranks, Gloo, loopback; same seed and data order) ===")
print(f"{'method':<34}{'test acc':>9}{'vs dense':>10}{'wall s':>8}{'comm ms/step':>14}")
for r in rows:
    c = r["config"]
    name = ("hvd.DistributedOptimizer (dense)" if c["compression"] == "horovod"
            else f"{c['compression']} cr={c['cr']:g}")
    acc = 100 * r["final_test_accuracy"]
    print(f"{name:<34}{acc:>8.2f}%{acc - 100 * base['final_test_accuracy']:>+9.2f}p"
          f"{r['wall_s']:>8.1f}{r['mean_comm_ms']:>14.2f}")
print("(comm ms/step is measured by hvd_flexcomm; Horovod's own optimizer does not report it.)")
PY
