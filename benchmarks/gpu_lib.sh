# Sourced by the device-call scripts (gpu_fedcap_speed.sh, gpu_papers.sh) after they set $out and $deadline: moves
# to the repository root, installs the carried wheels (.device/wheels), records the device, and defines
#   budgeted NAME CAP_S MIN_S cmd...   run cmd (a command or an exported function) under min(CAP_S, time left
#                                      before $deadline), unless less than MIN_S is left; log to $out/log.txt.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
mkdir -p "$out"
start=$SECONDS
if ls .device/wheels/*.whl >/dev/null 2>&1; then
  $py -m pip install --no-index --no-deps -q .device/wheels/*.whl 2>&1 | tail -1
fi
$py -c "import jax; print(jax.devices(), jax.__version__)" 2>&1 | tee "$out/devices.txt"

budgeted() {
  local name="$1" cap="$2" min="$3"; shift 3
  local left=$((deadline - (SECONDS - start)))
  if ((left < min)); then echo "== skip $name: ${left}s left" | tee -a "$out/log.txt"; return; fi
  local limit=$((cap < left ? cap : left))
  echo "== $name (limit ${limit}s): $*" | tee -a "$out/log.txt"
  local t0=$SECONDS
  timeout "$limit" bash -c '"$@"' _ "$@" 2>&1 | grep -v -E "Warning|warn\(" | tail -25 | tee -a "$out/log.txt"
  echo "== $name rc=${PIPESTATUS[0]} in $((SECONDS - t0))s" | tee -a "$out/log.txt"
}
