#!/usr/bin/env bash
# The GPU measurements benchmarks/README.md still lists as pending, in one place (a GPU session runs them and
# records the numbers there). Each part fits in one 10-minute device call on an H100.
#
#   bash benchmarks/gpu_pending.sh OUT_DIR [step_latency|conv_impl|fedcap|fedvsa|all]
#
#   step_latency  every default formulation of one local step, incl. FedCAP's pair separate vs stacked (~3 min)
#   conv_impl     FedAvg rounds/s, CIFAR-10 E=1 and E=5, vmap and shard_map, conv_impl xla vs patches (~4 min)
#   fedcap        FedCAP rounds/s, CIFAR-10 E=5, vmap / shard_map / plain loop, pair_forward separate vs stacked
#   fedvsa        FedVSA's round cost (Table 10) at the paper's scale: 100 clients, m = 10 (exact Shapley) and
#                 m = 30 (TMC), E = 5, LeNet-5 on MNIST (~5 min); then Table 3's MNIST sigma=900 cells for FedAvg and
#                 FedVSA, stopped at 95% (needs ../shared/data/mnist carried as .device/data/mnist)
set -euo pipefail
out="${1:?usage: gpu_pending.sh OUT_DIR [step_latency|conv_impl|fedcap|fedvsa|all]}"
part="${2:-all}"
case "$part" in step_latency|conv_impl|fedcap|fedvsa|all) ;; *) echo "unknown part: $part" >&2; exit 2 ;; esac
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$out"
run() { echo "+ $*" >&2; python "$@"; }
if [[ "$part" == step_latency || "$part" == all ]]; then
  run "$here/step_latency.py" --out "$out/step_latency_gpu.json" | tee "$out/step_latency_gpu.txt"
fi
if [[ "$part" == conv_impl || "$part" == all ]]; then
  for impl in xla patches; do
    run "$here/rounds_per_second.py" --workload fedcap_cifar10 --strategies vmap,shard_map --conv_impl "$impl" \
      --out "$out/rps_fedavg_${impl}_gpu.json" | tee "$out/rps_fedavg_${impl}_gpu.txt"
  done
fi
if [[ "$part" == fedcap || "$part" == all ]]; then
  run "$here/rounds_per_second.py" --workload fedcap_cifar10_e5 --algorithm fedcap \
    --strategies vmap,shard_map,reference --pair_forward separate --rounds 5 --max-time 120 \
    --out "$out/rps_fedcap_separate_gpu.json" | tee "$out/rps_fedcap_separate_gpu.txt"
  run "$here/rounds_per_second.py" --workload fedcap_cifar10_e5 --algorithm fedcap \
    --strategies vmap,shard_map --pair_forward stacked --rounds 5 \
    --out "$out/rps_fedcap_stacked_gpu.json" | tee "$out/rps_fedcap_stacked_gpu.txt"
fi
if [[ "$part" == fedvsa || "$part" == all ]]; then
  data="${FEDVSA_DATA_DIR:-.device/data}"
  run "$here/fedvsa_cost.py" --set data.data_dir="$data" --rounds 2 --out "$out/fedvsa_cost_gpu.json" \
    | tee "$out/fedvsa_cost_gpu.txt"
  run "$here/../experiments/fedvsa_tables.py" --mode table3 --datasets mnist --partitions sigma900 \
    --methods fedavg,fedvsa --data_dir "$data" --out_dir "$out/fedvsa_table3" | tee "$out/fedvsa_table3.md"
fi
