# Shared by launch/torchrun.sh and launch/torchrun_multinode.sh (sourced, not run).
#
# Environment they read (all optional):
#   INFIR_CMD        program each rank runs (default: infir-train, or `$PYTHON -m infir.train.cli` from a checkout
#                    where the package is only on PYTHONPATH); word-split, e.g. "python my_script.py"
#   NPROC_PER_NODE   ranks on this node (default: number of GPUs, or 1 without GPUs)
#   INFIR_LOG_DIR    root of the per-rank logs (default: outputs/logs)
#   PYTHON           interpreter for the launcher (default: python)
#   MAX_RESTARTS     torchrun restarts of the whole worker group before giving up (default: 0, fail fast;
#                    a restart resumes from the last checkpoint, so >0 rides over transient faults)
# NCCL/PyTorch settings below are defaults only: anything already exported wins. NVLink multicast
# (NCCL_NVLS_ENABLE) is left as the host sets it.

INFIR_LAUNCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# megatron's tensor/sequence-parallel overlap needs kernels issued in order on one hardware queue.
export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-1}"
# NCCL's warnings (not its INFO flood) land in each rank's log.
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
# A hung collective is a dead peer: let the watchdog tear the rank down so torchrun sees a failure...
export TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}"
# ...after dumping its flight recorder (the last collectives of each rank) to show who stopped where.
export TORCH_FR_BUFFER_SIZE="${TORCH_FR_BUFFER_SIZE:-2000}"
export TORCH_NCCL_DUMP_ON_TIMEOUT="${TORCH_NCCL_DUMP_ON_TIMEOUT:-1}"
# Rank threads share the node's cores; torchrun would set 1 anyway, with a warning.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export PYTHONUNBUFFERED=1  # per-rank logs written as they happen, not at exit

infir_default_nproc() {
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    nvidia-smi -L | grep -c '^GPU'
  else
    echo 1
  fi
}

# infir_launch LOG_DIR [torchrun options...] -- [program args...]
# Runs INFIR_CMD on every rank through launch/elastic.py (torchrun + a verdict naming a dead rank),
# each rank's stdout/stderr in LOG_DIR/<run>/attempt_<n>/<local rank>/ and on the console.
infir_launch() {
  local log_dir="$1"; shift
  local torchrun_opts=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do torchrun_opts+=("$1"); shift; done
  [[ "${1:-}" == "--" ]] && shift
  local cmd default=infir-train
  command -v infir-train >/dev/null 2>&1 || default="${PYTHON:-python} -m infir.train.cli"
  read -r -a cmd <<< "${INFIR_CMD:-$default}"
  mkdir -p "$log_dir"
  export TORCH_FR_DUMP_TEMP_FILE="${TORCH_FR_DUMP_TEMP_FILE:-$log_dir/nccl_trace_rank_}"
  echo "infir-launch: ${cmd[*]} on $(hostname), per-rank logs in $log_dir" >&2
  "${PYTHON:-python}" "$INFIR_LAUNCH_DIR/elastic.py" "${torchrun_opts[@]}" \
    --max-restarts "${MAX_RESTARTS:-0}" --log-dir "$log_dir" --redirects 3 --tee 3 \
    --no-python "${cmd[@]}" "$@"
}
