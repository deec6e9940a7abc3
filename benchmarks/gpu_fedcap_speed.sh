#!/usr/bin/env bash
# One device call for issue 28 §6's FedCAP speed on one GPU, in priority order under one deadline:
#   1. FedCAP Table III at 3 seeds (fedcap_tables.py, one vmapped program per cell), all 8 scenarios in one sitting
#      (issue 28's target: under 10 minutes on an H100); the GPU defaults: the stacked model pair
#      (engine.pair_forward=auto) and the folded conv kernel gradient (model.conv_impl=auto) since 2026-11-28
#   2. step_latency.py's formulations that matter for the conv kernel gradient (engine = the default, engine_xla /
#      engine_folded, grouped by hand, the model pair separate / stacked / stacked with xla)
#   3. one 100-round FedCAP CIFAR-10 run with the defaults (target under 30 s)
#   4. the same run with model.conv_impl=xla (the GPU default before), for a same-machine comparison
# Each run directory / JSON is kept under OUT_DIR (run dirs as one tarball: the device returns at most 8 files).
# Earlier orders of this script ran in two sessions on 2026-11-28 (H200): the 100-round runs, LF at 3 seeds, step
# latency, six and then all eight Table III cells at 3 seeds (conv xla), the folded step latency and run.
#
#   bash benchmarks/gpu_fedcap_speed.sh OUT_DIR DATA_DIR [DEADLINE_S]
#
# A CPU smoke run: SMOKE="--config.rounds=1 --config.client.epochs=1 --config.data.samples_per_class=40" \
#   SMOKE_TABLE="--rounds 1 --epochs 1 --set data.samples_per_class=40" SMOKE_STEP="--steps 2 --repeats 1" ...
set -uo pipefail
out="${1:?usage: gpu_fedcap_speed.sh OUT_DIR DATA_DIR [DEADLINE_S]}"
data="${2:?usage: gpu_fedcap_speed.sh OUT_DIR DATA_DIR [DEADLINE_S]}"
deadline="${3:-500}"
runs=/tmp/gpu_fedcap_speed
mkdir -p "$runs"
source "$(dirname "$0")/gpu_lib.sh"

fedcap_run() {  # fedcap_run NAME [extra run.py flags...]
  local name="$1"; shift
  $py experiments/run.py --config experiments/configs/fedcap_cifar10.py:none --config.data.data_dir="$data" \
    --config.output.dir="$runs" --config.output.name="$name" --config.output.plots=False \
    --config.output.progress=False ${SMOKE:-} "$@"
}
export -f fedcap_run
export py data runs SMOKE

table_budget=$((deadline - (SECONDS - start) - 130))
budgeted table3_seeds $((table_budget + 60)) 100 $py experiments/fedcap_tables.py --data_dir "$data" --seeds 0,1,2 \
  --scenarios none,sign_flip,label_flip,scaling,lie,ipm,min_max,min_sum --stop_after_s "$table_budget" \
  --out_dir "$runs/fedcap_cifar10_seeds" ${SMOKE_TABLE:-}
budgeted step_latency 90 40 $py benchmarks/step_latency.py --out "$out/step_latency_gpu.json" \
  --formulations engine@1,engine_xla,engine_folded,grouped,pair_separate,pair_stacked,pair_stacked_xla ${SMOKE_STEP:-}
budgeted fedcap100_auto 60 45 fedcap_run fedcap100_auto
budgeted fedcap100_xla 60 45 fedcap_run fedcap100_xla --config.model.conv_impl=xla
cp "$runs"/fedcap_cifar10_seeds/results*.json "$out/" 2>/dev/null
tar czf "$out/runs.tgz" --exclude=plots -C "$runs" . 2>/dev/null
echo "total $((SECONDS - start))s" | tee -a "$out/log.txt"
ls -la "$out"
