#!/usr/bin/env bash
# One device call that runs ONE three-seed cell of each paper grid still waiting for a GPU (issues 29, 30, 32), so
# the next sessions can size those grids from stored timings (each cell is also a result: config, seeds, commit,
# command, device, wall time, per-round curves). In priority order under one deadline:
#   1. FedALC Table I, MNIST alpha = 0.1, FedALC at the paper's protocol (100 rounds x E = 1, PGD-10 training)
#   2. FedCC Table III, CIFAR-10 non-IID, Fang-Median f = 3, FedCC: the first 10 of the paper's 30 rounds
#   3. FedCAC Table 1, CIFAR-10 pathological, FedCAC (ResNet-8, 40 clients, E = 5): the first 20 of 500 rounds
#
#   bash benchmarks/gpu_papers.sh OUT_DIR DATA_DIR [DEADLINE_S]
#
# DATA_DIR needs mnist/ and cifar10_jpeg/ (carry them as .device/data). Extra arguments for a CPU smoke run go in
# $SMOKE_FEDALC, $SMOKE_FEDCC, $SMOKE_FEDCAC (e.g. "--rounds 1 --set data.num_clients=4").
set -uo pipefail
out="${1:?usage: gpu_papers.sh OUT_DIR DATA_DIR [DEADLINE_S]}"
data="${2:?usage: gpu_papers.sh OUT_DIR DATA_DIR [DEADLINE_S]}"
deadline="${3:-540}"
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
runs=/tmp/gpu_papers
mkdir -p "$out" "$runs"
start=$SECONDS
if ls .device/wheels/*.whl >/dev/null 2>&1; then
  $py -m pip install --no-index --no-deps -q .device/wheels/*.whl 2>&1 | tail -1
fi
$py -c "import jax; print(jax.devices(), jax.__version__)" 2>&1 | tee "$out/devices.txt"

# cell NAME CAP_S MIN_S cmd...: runs cmd under min(CAP_S, time left) unless less than MIN_S is left, then keeps
# the cell's results.json as OUT_DIR/NAME.json.
cell() {
  local name="$1" cap="$2" min="$3"; shift 3
  local left=$((deadline - (SECONDS - start)))
  if ((left < min)); then echo "== skip $name: ${left}s left" | tee -a "$out/log.txt"; return; fi
  local limit=$((cap < left ? cap : left))
  echo "== $name (limit ${limit}s): $*" | tee -a "$out/log.txt"
  local t0=$SECONDS
  timeout "$limit" "$@" --out_dir "$runs/$name" 2>&1 | grep -v -E "Warning|warn\(" | tail -15 | tee -a "$out/log.txt"
  echo "== $name rc=${PIPESTATUS[0]} in $((SECONDS - t0))s" | tee -a "$out/log.txt"
  cp "$runs/$name/results.json" "$out/$name.json" 2>/dev/null
}

cell fedalc_mnist_a01_seeds 220 90 $py experiments/fedalc_tables.py --data_dir "$data" --mode table1 \
  --datasets mnist --alphas 0.1 --methods fedalc --seeds 0,1,2 ${SMOKE_FEDALC:-}
cell fedcc_cifar10_fang_median_seeds 200 90 $py experiments/fedcc_tables.py --data_dir "$data" --mode table3 \
  --datasets cifar10 --dists noniid --attacks fang_median --rules fedcc --seeds 0,1,2 --rounds 10 ${SMOKE_FEDCC:-}
cell fedcac_cifar10_pathological_seeds 200 90 $py experiments/fedcac_tables.py --data_dir "$data" --mode table1 \
  --datasets cifar10 --methods fedcac --seeds 0,1,2 --rounds 20 ${SMOKE_FEDCAC:-}
echo "total $((SECONDS - start))s" | tee -a "$out/log.txt"
ls -la "$out"
