#!/usr/bin/env bash
# Run a reproduction grid as one process per cell group on ONE accelerator, so that the XLA compilations of
# different cells overlap on the host's cores (on an H100: FedCAP's 8 scenarios in ~5 min, Table I's 42 cells in
# ~14 min), then merge the sharded results into <out_dir>/table.md.
#
#   bash experiments/parallel_grid.sh fedcap       ../shared/data runs/fedcap_cifar10      [extra flags...]
#   bash experiments/parallel_grid.sh baselines    ../shared/data runs/tableI              [extra flags...]
#   bash experiments/parallel_grid.sh ablation     ../shared/data runs/fedcap_ablation     [extra flags...]  # Table IV
#   bash experiments/parallel_grid.sh personalized ../shared/data runs/fedcap_personalized [extra flags...]  # Fig. 7
#   bash experiments/parallel_grid.sh ditto_agr    ../shared/data runs/fedcap_ditto_agr    [extra flags...]  # Fig. 8
#
# Extra flags go to every process (e.g. --rounds 20). Logs: <out_dir>/log_<shard>.txt.
# SHARDS="v1 v2" runs only those shards (to split a grid over several time-limited calls); the table is merged
# from every results.<shard>.json in <out_dir> each time, so the last call's table.md has them all.
set -euo pipefail
grid=${1:?fedcap|baselines|ablation|personalized|ditto_agr}; data_dir=${2:?data dir}; out_dir=${3:?out dir}; shift 3
here=$(cd "$(dirname "$0")" && pwd)
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # several processes share one GPU
mode=()
case "$grid" in
  fedcap) script=$here/fedcap_tables.py; flag=--scenarios
          shards="none label_flip sign_flip scaling lie min_max min_sum ipm" ;;
  baselines) script=$here/byzantine_baselines.py; flag=--rules
          shards="mean multi_krum median rfa trimmed_mean clustered fltrust rfa_vector" ;;
  ablation) script=$here/fedcap_tables.py; mode=(--mode ablation); flag=--variants
          shards="v1 v2 v3 v4 v5" ;;
  personalized) script=$here/fedcap_tables.py; mode=(--mode personalized); flag=--methods
          shards="local fedavg fedavg_ft ditto fedrod fedfomo fedcap" ;;
  ditto_agr) script=$here/fedcap_tables.py; mode=(--mode ditto_agr); flag=--methods
          shards="ditto ditto_clustered ditto_median ditto_trim fedcap" ;;
  *) echo "unknown grid '$grid' (fedcap | baselines | ablation | personalized | ditto_agr)" >&2; exit 2 ;;
esac
if [[ -n "${SHARDS:-}" ]]; then
  for s in $SHARDS; do
    [[ " $shards " == *" $s "* ]] || { echo "shard '$s' is not one of: $shards" >&2; exit 2; }
  done
  shards=$SHARDS
fi
mkdir -p "$out_dir"
pids=()
for s in $shards; do
  python "$script" ${mode[@]+"${mode[@]}"} --data_dir "$data_dir" --out_dir "$out_dir" --shard "$s" "$flag" "$s" "$@" \
      > "$out_dir/log_$s.txt" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
python "$script" ${mode[@]+"${mode[@]}"} --out_dir "$out_dir" --table_only "$@"
exit $status
