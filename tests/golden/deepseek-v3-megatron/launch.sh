#!/usr/bin/env bash
# Run this on each of the 256 node(s), the same RDZV_ENDPOINT everywhere: the first
# node's address and a free port there, e.g. RDZV_ENDPOINT=10.0.0.1:29500 ./launch.sh
# (under SLURM, job.sbatch does this for you).
set -euo pipefail
cd /home/me/project
export NCCL_IB_DISABLE=0
export OMP_NUM_THREADS=1
export PYTHONUNBUFFERED=1
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
if [ -z "${MEGATRON_LM_PATH:-}" ]; then
  echo "llmtrain: set MEGATRON_LM_PATH to your Megatron-LM checkout (the folder holding pretrain_gpt.py), or backend.megatron_path" >&2
  exit 2
fi
export PYTHONPATH="$MEGATRON_LM_PATH"
RDZV_ENDPOINT="${RDZV_ENDPOINT:-127.0.0.1:29500}"
RDZV_ID="${RDZV_ID:-llmtrain}"
exec /opt/llmtrain/venv/bin/python -m torch.distributed.run \
    --nnodes=256 \
    --nproc-per-node=8 \
    --rdzv-backend=c10d \
    --rdzv-endpoint="$RDZV_ENDPOINT" \
    --rdzv-id="$RDZV_ID" \
    --max-restarts=0 \
    "$MEGATRON_LM_PATH"/pretrain_gpt.py \
    --num-layers 61 \
    --hidden-size 7168 \
    --ffn-hidden-size 18432 \
    --num-attention-heads 128 \
    --multi-latent-attention \
    --kv-lora-rank 512 \
    --q-lora-rank 1536 \
    --qk-head-dim 128 \
    --qk-pos-emb-head-dim 64 \
    --v-head-dim 128 \
    --seq-length 4096 \
    --max-position-embeddings 4096 \
    --vocab-size 129280 \
    --tokenizer-type NullTokenizer \
    --mock-data \
    --save /scratch/runs/deepseek-v3-megatron/checkpoints \
    --load /scratch/runs/deepseek-v3-megatron/checkpoints \
    --exit-signal-handler \
    --eval-iters 0 \
    --eval-interval 235240 \
    --swiglu \
    --normalization RMSNorm \
    --position-embedding-type rope \
    --rotary-base 10000 \
    --norm-epsilon 1e-06 \
    --attention-dropout 0.0 \
    --hidden-dropout 0.0 \
    --untie-embeddings-and-output-weights \
    --disable-bias-linear \
    --num-experts 256 \
    --moe-router-topk 8 \
    --moe-grouped-gemm \
    --moe-ffn-hidden-size 2048 \
    --moe-shared-expert-intermediate-size 2048 \
    --moe-layer-freq '([0]*3+[1]*58)' \
    --moe-token-dispatcher-type flex \
    --moe-flex-dispatcher-backend deepep \
    --tensor-model-parallel-size 1 \
    --pipeline-model-parallel-size 16 \
    --decoder-first-pipeline-num-layers 3 \
    --decoder-last-pipeline-num-layers 2 \
    --context-parallel-size 1 \
    --expert-model-parallel-size 64 \
    --use-distributed-optimizer \
    --micro-batch-size 1 \
    --global-batch-size 15360 \
    --train-iters 235240 \
    --optimizer adam \
    --lr 0.00022 \
    --min-lr 2.2e-05 \
    --lr-warmup-iters 2000 \
    --lr-decay-style cosine \
    --weight-decay 0.1 \
    --clip-grad 1.0 \
    --seed 1234 \
    --adam-beta1 0.9 \
    --adam-beta2 0.95 \
    --adam-eps 1e-08 \
    --bf16 \
    --fp8-format hybrid \
    --recompute-granularity full \
    --recompute-method uniform \
    --recompute-num-layers 1 \
    --save-interval 235240
