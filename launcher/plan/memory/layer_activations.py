"""Activation bytes one transformer layer stores for its backward, per token: Korthikanti et al.
2022 ("Reducing Activation Recomputation in Large Transformer Models"), generalised term by term
to GQA, MLA, SwiGLU and MoE, with the recompute modes of plan/recompute.py, fp8 inputs and
torch.compile's rematerialisation, and the residual stream's dtype under torch.autocast
(``residual_stream``). Megatron-Core's layer is counted tensor by tensor in
plan/memory/mcore_activations.py instead (plan/memory/stage_activations.py picks)."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.backends.build_order import autocasts_fp32_parameters
from launcher.config.schema import LLMTrainConfig
from launcher.plan.model_shape import ModelShape
from launcher.plan.recompute import resolve as resolve_recompute


def uses_dropout(cfg: LLMTrainConfig) -> bool:
    """Dropout masks are kept (1 byte each) and traffic paid when either dropout is on."""
    return cfg.model.attention_dropout > 0 or cfg.model.hidden_dropout > 0


# Bytes a token per ffn width the MLP keeps under torch.compile (layer_activation_terms).
COMPILED_MLP_BYTES_PER_F = {"swiglu": 6.0, "gelu": 4.0}


@dataclass(frozen=True)
class ResidualStream:
    """How a layer's residual stream is saved (``residual_stream``): bytes of an element of the
    layer's input (its first norm saves it) and of the sum after attention (the second norm's
    input), and whether each projection saves its own compute-dtype copy of its input."""

    input_bytes: float = 2.0
    sum_bytes: float = 2.0
    cast_per_linear: bool = False


# The stream in the compute dtype, one copy of each norm's output for all the projections
# reading it: bf16 parameters (FSDP2's MixedPrecisionPolicy, precision=bf16-pure, DeepSpeed's
# bf16 module, a LoRA base frozen in bf16), and Megatron-Core's layer.
BF16_STREAM = ResidualStream()


def residual_stream(cfg: LLMTrainConfig, compiled: bool) -> ResidualStream:
    """What the torch engine's layer keeps of its residual stream in this layout.

    Without FSDP2 (zero.stage 0/1: one GPU, DDP, tp/pp with the engine's own reduction) mixed
    precision is ``torch.autocast`` over fp32 parameters (launcher/train/engines/torch_engine.py
    ``_autocast``; backends/build_order.py ``autocasts_fp32_parameters``). The embedding is on
    none of autocast's lists, so it returns its fp32 weight's rows; a linear's bf16 output added
    to them is promoted to fp32; layer_norm / rms_norm are on the fp32 list (aten/src/ATen/
    autocast_mode.h, v2.13): the stream stays fp32 through every block, and each norm saves
    its fp32 input. Each linear casts its input to bf16 itself, and autocast caches the casts of
    leaf tensors that require grad only (aten/src/ATen/autocast_mode.cpp ``cached_cast``: the
    weights), so wq, wk and wv (and SwiGLU's w1 and w3) each save their own bf16 copy of the
    same norm output. Under FSDP2 (zero.stage 2/3) ``MixedPrecisionPolicy(param_dtype=bf16)``
    hands the forward bf16 parameters and the engine runs no autocast: the stream is bf16, one
    copy of each norm output. Measured on the CPU with saved_tensors_hooks
    (tests/unit/plan/memory/test_residual_stream.py; one block with h 128, GQA 4/2 heads of 32,
    SwiGLU 320, 256 tokens): 5,728 bytes a token under autocast (44.8 h), 4,440 in bf16
    (34.7 h); this prices 44.1 h and 34.1 h (the norms' mean and rstd and RoPE's tables are
    not priced).

    Compiled blocks (torch.compile per block) save the fp32 input the block is given, but
    AOTAutograd merges the identical casts and its partitioner keeps bf16 tensors inside
    (measured with backend aot_eager_decomp_partition on the CPU: +2 h over a bf16 block, the
    input alone). fp8's Float8Linear inputs keep their own rule (layer_activation_terms' fp8).
    The fp32 stream needs trainable fp32 embeddings (full training with fp32 master weights)
    or fp32 frozen ones (LoRA bases on the CPU; on a GPU they are frozen in the compute dtype).
    """
    p = cfg.precision
    fp32_embedding = p.master_weights if cfg.finetune.name == "full" else cfg.cluster.gpu == "cpu"
    if not (autocasts_fp32_parameters(cfg) and fp32_embedding):
        return BF16_STREAM
    if compiled:
        return ResidualStream(input_bytes=4.0)
    return ResidualStream(input_bytes=4.0, sum_bytes=4.0, cast_per_linear=not p.fp8)


@dataclass(frozen=True)
class ActivationTerms:
    """Bytes per token of one layer: `replicated` is split over tp only with sequence parallelism,
    `sharded` always over tp; `scores` is the s^2 part per token and key, split over tp."""

    replicated: float
    sharded: float
    scores: float


def layer_activation_terms(
    shape: ModelShape,
    *,
    recompute: str,
    attention: str,
    moe: bool,
    dropout: bool,
    fp8: bool = False,
    compiled: bool = False,
    stream: ResidualStream = BF16_STREAM,
) -> ActivationTerms:
    """Activation bytes per token stored by one transformer layer for its backward pass.

    Korthikanti et al. 2022, section 4.1, term by term (16-bit activations, 1-byte dropout masks),
    written for general head counts and MLPs. For GPT (MHA, GELU MLP of 4h, dropout) it gives
    34 s b h + 5 a s^2 b; with TP t: s b h (10 + 24/t + 5 a s/(h t)); with sequence parallel:
    s b h (34 + 5 a s/h) / t (their equations 1-3).

    `compiled`: the block runs under torch.compile (EngineChoices.compiled_blocks). AOTAutograd's
    min-cut partitioner (torch/_functorch/partitioners.py, min_cut_rematerialization_partition)
    chooses what the backward recomputes; measured with saved_tensors_hooks on the CPU (inductor
    and aot_eager_decomp_partition agree, torch 2.13): SwiGLU keeps three of its four f-wide
    bf16 tensors (6f bytes a token, COMPILED_MLP_BYTES_PER_F), GELU keeps both (4f, as eager);
    with fp8 (not measured) the FC1 outputs alone are priced (2f, 4f).
    (On one H100 llama3-1b at seq 8192 peaked 4.06 GiB lower compiled than eager; this says
    4.0 GiB: 16 layers x 8,192 tokens x (2 x 8,192 of the MLP + 8 x 2,048 of autocast's
    residual stream, ``residual_stream``). A check, nothing fitted.)

    `stream`: the residual stream's bytes and the projections' input copies (``residual_stream``:
    fp32 under torch.autocast without FSDP2, one bf16 copy per projection).
    """
    m = shape.model
    h = m.hidden_size
    heads = m.num_attention_heads
    if shape.is_mla:
        q_dim = k_dim = heads * (shape.head_dim + shape.rope_dim)
        v_dim = o_dim = heads * shape.v_dim
    else:
        q_dim = o_dim = heads * shape.head_dim
        k_dim = v_dim = shape.kv_heads * shape.head_dim
    mask = 1.0 if dropout else 0.0
    per_f = _mlp_bytes_per_f(m.activation, compiled=compiled, fp8=fp8)
    if moe:
        f_e = m.moe_ffn_hidden_size or m.ffn_hidden_size
        k = (m.moe_top_k or 1) + m.moe_shared_experts
        # Each of top_k + shared expert copies keeps its input (2h) and intermediates; the router
        # keeps fp32 logits and probabilities (2 * 4 E); the combine keeps the expert outputs (2h).
        mlp_shr = k * (2.0 * h + per_f * f_e + 2.0 * h) + 8.0 * (m.num_experts or 0)
        mlp_out = 2.0 * h
    else:
        mlp_shr = per_f * m.ffn_hidden_size
        mlp_out = 2.0 * h
    # Eager attention stores softmax output (2), dropout mask (1) and dropout output (2) per score.
    score_bytes = (5.0 if dropout else 2.0) * heads if attention == "eager" else 0.0
    lse = 4.0 * heads if attention == "flash" else 0.0  # flash keeps fp32 log-sum-exp per head
    # plan.recompute's modes ("selective": op with flash attention, core with eager).
    mode = resolve_recompute(recompute, attention == "eager")
    layer_input = stream.input_bytes * h
    if mode == "full":
        # Only the layer input survives the forward (checkpoint boundary).
        return ActivationTerms(replicated=layer_input, sharded=0.0, scores=0.0)
    if mode == "op":
        # Op-level selective checkpointing (PyTorch SAC, torchtitan's "op" policy): the layer input,
        # the attention output (+lse) and every other matmul output are saved; norms, activation
        # functions and the other matmuls are recomputed.
        mlp_mm = 2.0 * (m.ffn_hidden_size * (2 if m.activation == "swiglu" else 1))
        if moe:
            mlp_mm = mlp_shr / 2.0
        half = 0.5 * (2.0 * (q_dim + k_dim + v_dim) + mlp_mm)
        return ActivationTerms(
            replicated=layer_input + 0.5 * (2.0 * h + mlp_out),
            sharded=2.0 * o_dim + lse + half,
            scores=0.0,
        )
    # The norms' and projections' inputs, dropout masks after attention and MLP.
    replicated = _stream_bytes(shape, stream, moe) + 2.0 * mask * h
    # Q, K, V for the score and value products, the attention output (projection input).
    sharded = 2.0 * (q_dim + k_dim + v_dim + o_dim) + lse + mlp_shr
    if mode == "core" and attention == "flash":
        # The attention core checkpointed: its inputs q, k, v are kept (by the checkpoint, as
        # the kernel kept them) and its output by the output projection; only the fp32
        # log-sum-exp is not (Megatron-Core's core_attn; llmtrain's MoE blocks).
        sharded -= lse
    if fp8:
        # fp8 training saves each linear layer's input in fp8 for its weight gradient
        # (Transformer Engine; torchao Float8Linear): QKV and FC1 inputs (h each), the output
        # projection's input (o_dim) and FC2's input (f per routed copy) at 1 byte, not 2.
        # Compiled, FC2's input is taken as recomputed (above): none to hold in fp8.
        f_in = 0 if compiled else m.ffn_hidden_size
        if moe and not compiled:
            f_in = (m.moe_ffn_hidden_size or m.ffn_hidden_size) * (
                (m.moe_top_k or 1) + m.moe_shared_experts
            )
        replicated -= 2.0 * h
        sharded -= o_dim + f_in
    scores = 0.0 if mode == "core" else score_bytes
    return ActivationTerms(replicated=replicated, sharded=sharded, scores=scores)


def _mlp_bytes_per_f(activation: str, *, compiled: bool, fp8: bool) -> float:
    """The MLP's stored intermediates per token and ffn width: GELU keeps fc1's output and the
    GELU output (4f); SwiGLU keeps gate, up, silu(gate) and their product (8f; measured by
    Megatron's get_training_info for its fused bias_swiglu too); compiled, as measured
    (COMPILED_MLP_BYTES_PER_F)."""
    per_f = 8.0 if activation == "swiglu" else 4.0
    if compiled and fp8:
        # Not measured under Float8Linear: the FC1 outputs alone (the rule before the bf16
        # measurement; the recorded H100 runs: 1B +5.1%, 8B of 4 layers -10.2%).
        return per_f / 2.0
    return COMPILED_MLP_BYTES_PER_F[activation] if compiled else per_f


def _stream_bytes(shape: ModelShape, stream: ResidualStream, moe: bool) -> float:
    """Per token: the norms' inputs (the layer input and the sum after attention) and the
    projections' inputs (2h each; one copy per projection under autocast: wq wk wv, or MLA's
    two down-projections; SwiGLU's w1 and w3; the MoE block's copies are not measured and are
    priced once)."""
    m = shape.model
    h = m.hidden_size
    reads = 2.0
    if stream.cast_per_linear:
        reads = (2.0 if shape.is_mla else 3.0) + (
            2.0 if m.activation == "swiglu" and not moe else 1.0
        )
    return (stream.input_bytes + stream.sum_bytes) * h + 2.0 * h * reads


def layer_activation_bytes(
    shape: ModelShape,
    *,
    micro_batch: int,
    seq: int,
    tp: int,
    cp: int,
    recompute: str,
    attention: str,
    moe: bool,
    sequence_parallel: bool,
    dropout: bool,
    fp8: bool = False,
    compiled: bool = False,
    stream: ResidualStream = BF16_STREAM,
) -> float:
    """Bytes one layer keeps for one micro-batch on one GPU (tokens split over cp)."""
    t = layer_activation_terms(
        shape,
        recompute=recompute,
        attention=attention,
        moe=moe,
        dropout=dropout,
        fp8=fp8,
        compiled=compiled,
        stream=stream,
    )
    tokens = micro_batch * seq / max(1, cp)
    rep = t.replicated / (tp if sequence_parallel else 1)
    # Each local query token scores against all s keys (ring attention with cp).
    return tokens * (rep + t.sharded / tp + t.scores * seq / tp)
