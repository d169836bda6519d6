"""What the Megatron-Core speed features remove from a step, and what CUDA graphs hold
(launcher/backends/speed_features.py says when each runs; every function here is 0 / unchanged
with the keys at their defaults).

- CUDA graphs (backend.cuda_graphs): a graph replays its kernels without a launch each; what that
  removes is the GPU's idle gap between back-to-back launched kernels, KERNEL_GAP_GRAPHED_S per
  graphed kernel. The kernels of a layer, forward, by scope, are GRAPHED_KERNELS'; the backward
  runs about two kernels per forward one (data and weight gradients, element-wise backwards):
  3 per forward kernel in all.
- CUDA graphs' memory: Transformer Engine's graphs (megatron/core/transformer/cuda_graphs.py,
  TECudaGraphHelper._get_sample_arguments, core_v0.16.1) give every graphed (layer,
  micro-batch) its own static input, reused only once that micro-batch's backward has finished,
  so one static hidden-state input per graphed layer-forward in flight; the outputs are written
  into the next graph's input (make_graphed_callables' _reuse_graph_input_output_buffers, which
  Megatron sets from TE 2.7), and the backward graphs share one layer's static gradient buffers
  (grad output and grad input). The activations the graphs save live in the graphs' pool but are
  the eager layer's (counted already). Megatron's local full-iteration graph takes token ids as
  its static input: nothing beyond the eager peak is counted.
- Fused kernels remove launches (KERNEL_GAP_S each) and HBM passes: the router fusion
  (--moe-router-fusion: Transformer Engine's fused_topk_with_score_function and the fused
  aux-loss scores, megatron/core/transformer/moe/moe_utils.py topk_routing_with_score_function)
  removes the score function's write and the top-k's re-read of the fp32 scores (2 of the 5
  passes kernels.moe_routing_bytes counts); the permute fusion (--moe-permute-fusion, moe_utils
  permute / unpermute with fused=True) replaces the unfused index building (routing-map
  transpose, two masked_selects, the probabilities' transpose) and the unpermute's multiply,
  zero fill and scatter_add by one kernel each. The rows' bytes kernels.py counts are the fused
  kernels' already (gather, weighted scatter), so only the launches go.
- fp8 scaling (backend.fp8_scaling): every fp8 cast reads the input (2 bytes) and writes fp8 (1):
  delayed scaling (Megatron-Core's default recipe) takes the scale from the amax history and
  reduces the new amax inside the cast; current (tensorwise) scaling needs the amax first, one
  more read of the input (Transformer Engine Float8CurrentScalingQuantizer: compute_amax, then
  the cast); mxfp8 and blockwise compute each block's scale inside the cast and write it (one
  E8M0 byte per 32 elements, or an fp32 scale per 128, row-wise and column-wise).
- Fused cross-entropy (backend.cross_entropy_fusion, Transformer Engine's Triton kernels,
  NVIDIA/TransformerEngine 02965d2 transformer_engine/pytorch/triton/cross_entropy.py): one read
  of the logits in the forward (online softmax), one read and an in-place write in the backward:
  3 compute-dtype passes per logit, against the unfused loss's fp32 copy, softmax and loss
  passes (kernels.py: 30 bytes a logit).
"""

from __future__ import annotations

from launcher.backends.speed_features import graph_scope, graphed
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan.dtypes import DTYPE_BYTES

# NVIDIA Technical Blog, "Getting Started with CUDA Graphs" (A. Gray, 2019): a chain of short
# kernels (2.9 us each) ran at 3.8 us per kernel launched back to back in a stream and at 3.4 us
# per kernel replayed from a graph: the gap between launched kernels is 0.9 us, of which a graph
# removes 0.4 us.
KERNEL_GAP_S = 0.9e-6
KERNEL_GAP_GRAPHED_S = 0.4e-6
# Backward kernels per forward kernel (data and weight gradient GEMMs, element-wise backwards):
# a layer runs 1 + 2 = 3 kernels per forward kernel (recompute's extra forwards not counted).
KERNELS_PER_FORWARD_KERNEL = 3.0

# Forward kernels of one Megatron-Core transformer layer with Transformer Engine, by graph scope:
# attn: input norm + QKV GEMM (LayerNormLinear), fused RoPE, attention, projection GEMM,
#   bias-dropout-add = 6;
# mlp: norm, FC1 GEMM, fused activation, FC2 GEMM, bias-dropout-add = 5;
# moe_router: norm, router GEMM, and the routing's own kernels: unfused the score function,
#   top-k, probabilities and routing map each zero-filled and scattered, the aux-loss scores'
#   score function and sum = 8; fused 2 (fused_topk_with_score_function, the fused aux-loss
#   scores);
# moe_preprocess: the tokens per expert (sum over the routing map) and their cumulative sum.
# fp8 adds one cast per GEMM input (2 per attention, 2 per MLP); tensor parallelism with sequence
# parallelism an all-gather and a reduce-scatter per block.
ATTN_KERNELS = 6.0
MLP_KERNELS = 5.0
ROUTER_KERNELS = 2.0
ROUTING_KERNELS_UNFUSED = 8.0
ROUTING_KERNELS_FUSED = 2.0
PREPROCESS_KERNELS = 2.0
# The MoE block's kernels outside the router (full-iteration graphs only): dispatch and combine
# (2 collectives each way), grouped FC1, activation, grouped FC2, permute and unpermute.
EXPERT_KERNELS = 9.0
# Unfused permute (moe_utils.permute: routing-map transpose, token-index masked_select, the
# probabilities' transpose and masked_select, index_select = 5) and unpermute (the
# probabilities' transpose and masked_select, multiply, zeros, scatter_add = 5), against one
# fused kernel each.
PERMUTE_KERNELS_REMOVED = 4.0 + 4.0


def _block_kernels(cfg: LLMTrainConfig, layout: Layout, base: float) -> float:
    extra = 2.0 if cfg.precision.fp8 else 0.0
    if layout.tp > 1 and cfg.parallel.sequence_parallel:
        extra += 2.0
    return base + extra


def _router_kernels(cfg: LLMTrainConfig) -> float:
    routing = ROUTING_KERNELS_FUSED if cfg.backend.moe_router_fusion else ROUTING_KERNELS_UNFUSED
    return ROUTER_KERNELS + routing


def graphed_kernels(cfg: LLMTrainConfig, layout: Layout, *, moe: bool) -> float:
    """Forward kernels of one layer that CUDA graphs replay (0 without graphs)."""
    if not graphed(cfg):
        return 0.0
    scope = graph_scope(cfg)
    attn = _block_kernels(cfg, layout, ATTN_KERNELS)
    mlp = _block_kernels(cfg, layout, MLP_KERNELS)
    router = _router_kernels(cfg)
    if "full_iteration" in scope:
        return attn + (router + PREPROCESS_KERNELS + EXPERT_KERNELS if moe else mlp)
    if not scope:
        # The whole layer; an MoE layer's graph stops before the dispatch (dynamic shapes).
        return attn + (router + PREPROCESS_KERNELS if moe else mlp)
    n = attn if "attn" in scope else 0.0
    if "mlp" in scope and not moe:
        n += mlp
    if "moe_router" in scope and moe:
        n += router
    if "moe_preprocess" in scope and moe:
        n += PREPROCESS_KERNELS
    return n


def launch_seconds_removed(
    cfg: LLMTrainConfig, layout: Layout, *, dense_layers: int, moe_layers: int
) -> float:
    """Seconds of one micro-batch the graphs and the MoE fusions remove on a stage holding these
    layers (module docstring): graphed kernels' gaps, fused-away kernels' gaps."""
    graphs = dense_layers * graphed_kernels(cfg, layout, moe=False)
    graphs += moe_layers * graphed_kernels(cfg, layout, moe=True)
    removed = 0.0
    if cfg.backend.moe_router_fusion:
        removed += ROUTING_KERNELS_UNFUSED - ROUTING_KERNELS_FUSED
    if cfg.backend.moe_permute_fusion:
        removed += PERMUTE_KERNELS_REMOVED
    per_pass = graphs * KERNEL_GAP_GRAPHED_S + moe_layers * removed * KERNEL_GAP_S
    return KERNELS_PER_FORWARD_KERNEL * per_pass


def cuda_graph_static_bytes(cfg: LLMTrainConfig, layout: Layout, held: float) -> float:
    """Static buffers of the graphs on one GPU of a stage with `held` layer-forwards in flight
    (module docstring): one static hidden-state input per graphed layer-forward in flight and
    one layer's static gradient buffers (grad output, grad input)."""
    scope = graph_scope(cfg)
    if not graphed(cfg) or "full_iteration" in scope:
        return 0.0
    m = cfg.model
    sp = layout.tp if cfg.parallel.sequence_parallel else 1
    tokens = layout.micro_batch_size * m.seq_length / max(1, layout.cp) / sp
    hidden = tokens * m.hidden_size * DTYPE_BYTES[cfg.precision.compute_dtype]
    return hidden * (held + 2.0)


# Bytes per element of an fp8 cast by backend.fp8_scaling (module docstring): read 2, write 1,
# plus current scaling's amax read, or the block scales written row-wise and column-wise.
FP8_CAST_BYTES = {
    "delayed": 3.0,
    "tensorwise": 3.0 + 2.0,
    "mxfp8": 3.0 + 2.0 * 1.0 / 32.0,
    "blockwise": 3.0 + 2.0 * 4.0 / 128.0,
}


def fp8_cast_bytes(cfg: LLMTrainConfig) -> float:
    """HBM bytes per element of one fp8 cast (delayed scaling, Megatron-Core's default, when
    backend.fp8_scaling is unset; torchao's casts are priced the same)."""
    return FP8_CAST_BYTES[cfg.backend.fp8_scaling or "delayed"]


def router_score_passes(cfg: LLMTrainConfig) -> float:
    """fp32 passes over the router's expert scores per token (kernels.moe_routing_bytes): the
    logits' write, the score function's read and write, the top-k's read, the aux-loss read;
    fused, the score function's write and the top-k's re-read are gone."""
    return 3.0 if cfg.backend.moe_router_fusion else 5.0


def loss_bytes_per_logit(cfg: LLMTrainConfig, unfused: float) -> float:
    """HBM bytes per logit of the loss, forward and backward: `unfused` (kernels.py's count), or
    the fused kernel's three compute-dtype passes (module docstring)."""
    if cfg.backend.cross_entropy_fusion:
        return 3.0 * DTYPE_BYTES[cfg.precision.compute_dtype]
    return unfused


__all__ = [
    "FP8_CAST_BYTES",
    "KERNEL_GAP_GRAPHED_S",
    "KERNEL_GAP_S",
    "cuda_graph_static_bytes",
    "fp8_cast_bytes",
    "graphed_kernels",
    "launch_seconds_removed",
    "loss_bytes_per_logit",
    "router_score_passes",
]
