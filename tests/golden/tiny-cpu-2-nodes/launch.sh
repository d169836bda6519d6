#!/usr/bin/env bash
# Run this on each of the 2 node(s), the same RDZV_ENDPOINT everywhere: the first
# node's address and a free port there, e.g. RDZV_ENDPOINT=10.0.0.1:29500 ./launch.sh
# (under SLURM, job.sbatch does this for you).
set -euo pipefail
cd /home/me/project
export DS_ACCELERATOR=cpu
export LLMTRAIN_DEVICE=cpu
export OMP_NUM_THREADS=1
export PYTHONUNBUFFERED=1
RDZV_ENDPOINT="${RDZV_ENDPOINT:-127.0.0.1:29500}"
RDZV_ID="${RDZV_ID:-llmtrain}"
exec /opt/llmtrain/venv/bin/python -m torch.distributed.run \
    --nnodes=2 \
    --nproc-per-node=1 \
    --rdzv-backend=c10d \
    --rdzv-endpoint="$RDZV_ENDPOINT" \
    --rdzv-id="$RDZV_ID" \
    --max-restarts=0 \
    -m launcher.train.loop /scratch/runs/tiny-cpu-2-nodes
