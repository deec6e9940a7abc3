#!/usr/bin/env bash
# One device call (issue 28 §6): N seeds in one program vs N separate runs on FedCAP's CIFAR-10 setting, then the
# FedCAP Table I/III cells at 3 seeds (one vmapped program per cell), as many as the time budget allows.
#
#   bash benchmarks/gpu_seeds.sh OUT_DIR DATA_DIR [TABLE_BUDGET_S]
#
# On the lent GPU machine: ml_collections and friends come as wheels in .device/wheels, CIFAR-10 in .device/data.
# Extra arguments for a CPU smoke run go in $SMOKE (e.g. SMOKE="--rounds 1 --epochs 1 --set data.samples_per_class=40").
out="${1:?usage: gpu_seeds.sh OUT_DIR DATA_DIR [TABLE_BUDGET_S]}"
data="${2:?usage: gpu_seeds.sh OUT_DIR DATA_DIR [TABLE_BUDGET_S]}"
budget="${3:-240}"
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
py="${PYTHON:-python3}"
mkdir -p "$out" /tmp/gpu_seeds
if ls .device/wheels/*.whl >/dev/null 2>&1; then
  $py -m pip install --no-index --no-deps -q .device/wheels/*.whl 2>&1 | tail -1
fi
$py -c "import jax; print(jax.devices(), jax.__version__)" 2>&1 | tee "$out/devices.txt"
bench_rounds="${BENCH_ROUNDS:-5}"
timeout 240 $py benchmarks/seeds_vmap.py --config experiments/configs/fedcap_cifar10.py:none --seeds 3 \
  --rounds "$bench_rounds" --set data.data_dir="$data" ${SMOKE_BENCH:-} --out "$out/seeds_vmap_fedcap.json" 2>&1 \
  | grep -v Warning | tee "$out/seeds_vmap_fedcap.txt"
timeout $((budget + 200)) $py experiments/fedcap_tables.py --data_dir "$data" --seeds 0,1,2 \
  --scenarios none,scaling,lie,ipm,min_max,min_sum,sign_flip,label_flip --stop_after_s "$budget" \
  --out_dir /tmp/gpu_seeds/fedcap_cifar10_seeds ${SMOKE:-} 2>&1 | grep -v Warning | tee "$out/fedcap_seeds.txt"
cp /tmp/gpu_seeds/fedcap_cifar10_seeds/results*.json "$out/" 2>/dev/null
tar czf "$out/fedcap_cifar10_seeds_runs.tgz" -C /tmp/gpu_seeds fedcap_cifar10_seeds 2>/dev/null
ls -la "$out"
