#!/usr/bin/env bash
# One device call for issue 28 §6's two FedCAP targets on one GPU, in priority order under one deadline:
#   1. one 100-round FedCAP CIFAR-10 run alone (run.py; target: under 30 s), engine.pair_forward=separate (default)
#   2. the same run with pair_forward=stacked (one batched forward of the model pair; GPU comparison pending)
#   3. the Table III cell still missing at 3 seeds (label_flip, one vmapped program, fedcap_tables.py)
#   4. the 100-round run with model.conv_impl=canonical (the CPU's conv; unmeasured on a GPU)
#   5. step_latency.py's default formulations with whatever time is left
# Each run directory / JSON is kept under OUT_DIR (run dirs as one tarball: the device returns at most 8 files).
#
#   bash benchmarks/gpu_fedcap_speed.sh OUT_DIR DATA_DIR [DEADLINE_S]
#
# A CPU smoke run: SMOKE="--config.rounds=1 --config.client.epochs=1 --config.data.samples_per_class=40" \
#   SMOKE_TABLE="--rounds 1 --epochs 1 --set data.samples_per_class=40" SMOKE_STEP="--steps 2 --repeats 1" ...
set -uo pipefail
out="${1:?usage: gpu_fedcap_speed.sh OUT_DIR DATA_DIR [DEADLINE_S]}"
data="${2:?usage: gpu_fedcap_speed.sh OUT_DIR DATA_DIR [DEADLINE_S]}"
deadline="${3:-500}"
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
runs=/tmp/gpu_fedcap_speed
mkdir -p "$out" "$runs"
start=$SECONDS
if ls .device/wheels/*.whl >/dev/null 2>&1; then
  $py -m pip install --no-index --no-deps -q .device/wheels/*.whl 2>&1 | tail -1
fi
$py -c "import jax; print(jax.devices(), jax.__version__)" 2>&1 | tee "$out/devices.txt"

# item NAME CAP_S MIN_S cmd...: runs cmd under min(CAP_S, time left) unless less than MIN_S is left.
item() {
  local name="$1" cap="$2" min="$3"; shift 3
  local left=$((deadline - (SECONDS - start)))
  if ((left < min)); then echo "== skip $name: ${left}s left" | tee -a "$out/log.txt"; return; fi
  local limit=$((cap < left ? cap : left))
  echo "== $name (limit ${limit}s): $*" | tee -a "$out/log.txt"
  local t0=$SECONDS
  timeout "$limit" bash -c '"$@"' _ "$@" 2>&1 | grep -v -E "Warning|warn\(" | tail -25 | tee -a "$out/log.txt"
  echo "== $name rc=${PIPESTATUS[0]} in $((SECONDS - t0))s" | tee -a "$out/log.txt"
}
fedcap_run() {  # fedcap_run NAME [extra run.py flags...]
  local name="$1"; shift
  $py experiments/run.py --config experiments/configs/fedcap_cifar10.py:none --config.data.data_dir="$data" \
    --config.output.dir="$runs" --config.output.name="$name" --config.output.plots=False \
    --config.output.progress=False ${SMOKE:-} "$@"
}
export -f fedcap_run
export py data runs SMOKE

item fedcap100_separate 150 40 fedcap_run fedcap100_separate
item fedcap100_stacked 150 40 fedcap_run fedcap100_stacked --config.engine.pair_forward=stacked
item table3_label_flip_seeds 200 100 $py experiments/fedcap_tables.py --data_dir "$data" --seeds 0,1,2 \
  --scenarios label_flip --out_dir "$runs/fedcap_cifar10_seeds" ${SMOKE_TABLE:-}
cp "$runs"/fedcap_cifar10_seeds/results*.json "$out/" 2>/dev/null
item fedcap100_canonical 120 40 fedcap_run fedcap100_canonical --config.model.conv_impl=canonical
item step_latency 240 45 $py benchmarks/step_latency.py --out "$out/step_latency_gpu.json" ${SMOKE_STEP:-}
tar czf "$out/runs.tgz" -C "$runs" . 2>/dev/null
echo "total $((SECONDS - start))s" | tee -a "$out/log.txt"
ls -la "$out"
