#!/usr/bin/env bash
# One device call for the paper grids still waiting for a GPU (issues 29, 30, 32): the cells that size them, each
# also a result (config, seeds, commit, command, device, wall time, per-round curves). In priority order under one
# deadline:
#   1. ResNet-8 (FedCAC's CIFAR-10 model, 40 clients, E = 5) whole rounds with model.conv_impl xla and folded: the
#      folded kernel gradient (the GPU's `auto` since 2026-11-28) was measured on FedAvgCNN only
#   2. FedALC Table I, MNIST alpha = 0.1, FedAvg-AT and FedProx-AT at the paper's protocol (100 rounds x E = 1,
#      PGD-10 training), 3 seeds: beside the stored FedALC 3-seed cell (fedalc_mnist_a01_seeds_h200.json, 88 s)
#   3. FedCC Table III, CIFAR-10 non-IID, Fang-Median f = 3, FedCC: the first 10 of the paper's 30 rounds
#      (2026-11-28: not done in 96 s)
#   4. FedCAC Table 1, CIFAR-10 pathological, FedCAC (ResNet-8, 40 clients, E = 5): the first 20 of 500 rounds
# 2026-11-28 (H200, 190 s) ran an earlier order: FedALC alpha = 0.1 at 3 seeds (stored), FedCC (timed out).
#
#   bash benchmarks/gpu_papers.sh OUT_DIR DATA_DIR [DEADLINE_S]
#
# DATA_DIR needs mnist/ and cifar10_jpeg/ (carry them as .device/data). Extra arguments for a CPU smoke run go in
# $SMOKE_COST, $SMOKE_FEDALC, $SMOKE_FEDCC, $SMOKE_FEDCAC (e.g. "--rounds 1 --set data.num_clients=4").
set -uo pipefail
out="${1:?usage: gpu_papers.sh OUT_DIR DATA_DIR [DEADLINE_S]}"
data="${2:?usage: gpu_papers.sh OUT_DIR DATA_DIR [DEADLINE_S]}"
deadline="${3:-540}"
runs=/tmp/gpu_papers
mkdir -p "$runs"
source "$(dirname "$0")/gpu_lib.sh"

# cell NAME CAP_S MIN_S cmd...: a budgeted grid command writing into its own out_dir; its results.json is kept as
# OUT_DIR/NAME.json.
cell() {
  local name="$1"; shift
  rm -rf "${runs:?}/$name"  # a skipped cell must not hand back an earlier call's results
  budgeted "$name" "$@" --out_dir "$runs/$name"
  cp "$runs/$name/results.json" "$out/$name.json" 2>/dev/null
}

for impl in xla folded; do
  budgeted "resnet8_rounds_$impl" 120 60 $py benchmarks/fedcac_cost.py --skip_server --strategies vmap --rounds 3 \
    --set data.data_dir="$data" --set model.conv_impl="$impl" --out "$out/resnet8_rounds_$impl.json" ${SMOKE_COST:-}
done
cell fedalc_mnist_a01_baselines_seeds 220 90 $py experiments/fedalc_tables.py --data_dir "$data" --mode table1 \
  --datasets mnist --alphas 0.1 --methods fedavg,fedprox --seeds 0,1,2 ${SMOKE_FEDALC:-}
cell fedcc_cifar10_fang_median_seeds 200 120 $py experiments/fedcc_tables.py --data_dir "$data" --mode table3 \
  --datasets cifar10 --dists noniid --attacks fang_median --rules fedcc --seeds 0,1,2 --rounds 10 ${SMOKE_FEDCC:-}
cell fedcac_cifar10_pathological_seeds 200 90 $py experiments/fedcac_tables.py --data_dir "$data" --mode table1 \
  --datasets cifar10 --methods fedcac --seeds 0,1,2 --rounds 20 ${SMOKE_FEDCAC:-}
echo "total $((SECONDS - start))s" | tee -a "$out/log.txt"
ls -la "$out"
