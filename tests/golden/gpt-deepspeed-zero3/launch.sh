#!/usr/bin/env bash
# Run this on each of the 1 node(s), the same RDZV_ENDPOINT everywhere: the first
# node's address and a free port there, e.g. RDZV_ENDPOINT=10.0.0.1:29500 ./launch.sh
# (under SLURM, job.sbatch does this for you).
set -euo pipefail
cd /home/me/project
export NCCL_IB_DISABLE=0
export OMP_NUM_THREADS=1
export PYTHONUNBUFFERED=1
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
RDZV_ENDPOINT="${RDZV_ENDPOINT:-127.0.0.1:29500}"
RDZV_ID="${RDZV_ID:-llmtrain}"
exec /opt/llmtrain/venv/bin/python -m torch.distributed.run \
    --nnodes=1 \
    --nproc-per-node=8 \
    --rdzv-backend=c10d \
    --rdzv-endpoint="$RDZV_ENDPOINT" \
    --rdzv-id="$RDZV_ID" \
    --max-restarts=0 \
    -m launcher.train.loop /scratch/runs/gpt-deepspeed-zero3
