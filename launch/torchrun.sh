#!/usr/bin/env bash
# One node, NPROC_PER_NODE ranks (default: one per GPU), per-rank logs; arguments go to infir-train.
#
#   launch/torchrun.sh model=tiny precision=bf16 run_dir=outputs/demo/cpt            # CPU: 1 rank (gloo)
#   NPROC_PER_NODE=2 launch/torchrun.sh model=qwen2.5-1.5b parallel=tp2 run_dir=outputs/tp2
#
# See launch/lib.sh for the environment it reads (INFIR_CMD, INFIR_LOG_DIR, MAX_RESTARTS, NCCL defaults).
# If a rank dies the job stops, names it and its log, and exits non-zero; the same command resumes.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

log_dir="${INFIR_LOG_DIR:-outputs/logs}/$(date -u +%Y%m%dT%H%M%SZ)-$$"
infir_launch "$log_dir" --standalone --nnodes 1 --nproc-per-node "${NPROC_PER_NODE:-$(infir_default_nproc)}" -- "$@"
