#!/usr/bin/env bash
# Run on EVERY node of the job (by hand, by SLURM's srun - see launch/slurm.sbatch - or by any scheduler).
# Nodes meet at a c10d rendezvous hosted by the launcher on MASTER_ADDR; ranks are assigned by the
# rendezvous, so no NODE_RANK is needed and nodes may start in any order.
#
#   NNODES=2 MASTER_ADDR=node001 RDZV_ID=myjob launch/torchrun_multinode.sh model=qwen2.5-7b parallel=tp4 ...
#
# Required: NNODES, MASTER_ADDR (a host every node can reach). Optional: MASTER_PORT (29500),
# RDZV_ID (same on all nodes and unique per job; default infir-$MASTER_ADDR-$MASTER_PORT),
# RDZV_TIMEOUT (seconds to wait for all nodes, 900), and those of launch/lib.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

: "${NNODES:?set NNODES to the number of nodes of the job}"
: "${MASTER_ADDR:?set MASTER_ADDR to the host of the rendezvous (any one node of the job)}"
port="${MASTER_PORT:-29500}"
rdzv_id="${RDZV_ID:-infir-$MASTER_ADDR-$port}"

log_dir="${INFIR_LOG_DIR:-outputs/logs}/$rdzv_id/$(hostname)-$$"
infir_launch "$log_dir" \
  --nnodes "$NNODES" --nproc-per-node "${NPROC_PER_NODE:-$(infir_default_nproc)}" \
  --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$port" --rdzv-id "$rdzv_id" \
  --rdzv-conf "join_timeout=${RDZV_TIMEOUT:-900}" \
  -- "$@"
