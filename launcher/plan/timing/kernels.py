"""Compute time of one micro-batch, operator class by operator class.

One place per formula; the fitted constants (``fitted.py``) are dimensionless and few.

- GEMMs (the linear layers, the router, the output head): a smooth roofline (``gemm_time``) of
  the operand bytes over HBM and FLOPs / (peak x efficiency). The
  efficiency is the catalog's large-GEMM ceiling (MAMF, measured on the best shapes) times
  d / (d + gemm_half_dim), d the smaller output dimension min(m, n): a thin output (a narrow
  expert, a projection split over many tp ranks, few tokens per expert) fills fewer tensor-core
  tiles and waves; the memory term of the roofline (Williams et al. 2009: arithmetic intensity
  of an m x n x k GEMM is mnk / (mn + nk + mk)) prices a short reduction dimension. Forward 2mnk,
  backward 4mnk (data and weight gradients of the same shapes). fp8 runs only the linear layers'
  GEMMs at the fp8 peak (Transformer Engine / torchao keep the output head and attention in bf16),
  at fp8_gemm_ratio of the bf16 efficiency.
- Grouped expert GEMMs at the shape each expert really gets: m = tokens x top_k x ep / experts
  per local expert (balanced routing; Megatron-core / DeepEP dispatch): few tokens per expert
  (fine-grained MoE without enough expert parallelism) run far below peak through
  gemm_efficiency (m = 256 at half_dim 128: 2/3 of the large-GEMM rate). The router's GEMM is
  h x experts on every token; its softmax / top-k / load-balancing loss and the token permutation
  and unpermutation (top_k copies of the hidden state gathered and scattered, forward and
  backward) are HBM copies (moe_routing_bytes, at COPY_EFFICIENCY of the bandwidth).
- Attention core with flash attention (Dao et al. 2022, 2023; Shah et al. 2024): causal FLOPs
  (half of the full s x s product) at the kernel's published benchmark rate (ATTENTION_KERNEL_RATE;
  te: Transformer Engine / cuDNN; sdpa: PyTorch's FlashAttention-2) times one fitted realisation
  factor times s / (s + ATTN_HALF_SEQ)
  for a key block of s (s / cp per ring step with context parallelism: each step is one kernel call
  on a block of that length). Forward 1, backward 2.5 forward-equivalents (the backward recomputes
  QK^T: five matmuls against two). Packed rows' kernels (flex, or SDPA with a dense mask):
  packed_rows.py. Eager attention (Megatron 2021) is two batched GEMMs per head
  (QK^T and AV, smallest dimension head_dim) plus its softmax as bytes below.
- Everything else -- norms, residual adds, rotary, activation functions, dropout, the softmax of
  eager attention, fp8 casts, the cross-entropy over the vocabulary (MoE routing: see above) --
  is memory-bound: the bytes each op reads and writes (per token: multiples of h, f/tp, V/tp),
  times bytes_factor (achieved vs peak HBM bandwidth and the small ops not listed), over the HBM
  bandwidth. It scales with b*s*h per layer, not with FLOPs. torch.compile fuses elementwise ops:
  compile_bytes of the traffic remains; Megatron fuses them by hand (bias-GeLU, bias-dropout-add,
  scale-mask-softmax, fused norms and RoPE: Narayanan et al. 2021 section 4.2, Transformer Engine),
  priced the same. Backward moves twice the forward's bytes.
- Recompute: the forwards each mode runs again (launcher/plan/recompute.py): full = the whole
  layer; op-level selective = half of the layer GEMMs and all the element-wise ops; core = the
  attention core (and eager attention's softmax), per layer kind as the backend runs it.
- GPU power cap (cluster.power_limit_w under the board's TDP): dynamic power ~ C V^2 f with the
  voltage scaling with the clock (DVFS), so P ~ f^3 and the clock falls to (P / TDP)^(1/3) of
  nominal; compute-bound parts slow down by that, HBM-bound ones do not.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from launcher.backends.common import backend_of, recompute_mode
from launcher.backends.engine_choices import compile_in_force
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan import finetune
from launcher.plan.calibration.fitted import ATTN_HALF_SEQ, ComputeConstants, constants
from launcher.plan.dtypes import DTYPE_BYTES
from launcher.plan.memory.layer_activations import uses_dropout
from launcher.plan.model_shape import ModelShape
from launcher.plan.recompute import extra_forwards, recomputes_scores
from launcher.plan.speed_features import (
    fp8_cast_bytes,
    launch_seconds_removed,
    loss_bytes_per_logit,
    router_score_passes,
)
from launcher.plan.timing.packed_rows import packed_attention_s, packed_kernel_of


@dataclass(frozen=True)
class ComputeParts:
    """Seconds of one micro-batch on one GPU of a stage, per operator class."""

    linear_s: float  # linear-layer GEMMs (the part tensor-parallel comm can hide behind)
    other_gemm_s: float  # router, output head
    attention_s: float
    bytes_s: float
    # Kernel launch gaps removed by CUDA graphs and fused kernels (plan/speed_features.py).
    launch_removed_s: float = 0.0

    @property
    def total_s(self) -> float:
        total = self.linear_s + self.other_gemm_s + self.attention_s + self.bytes_s
        return total - self.launch_removed_s


def gemm_efficiency(min_dim: float, mamf: float, half_dim: float) -> float:
    """Fraction of peak a GEMM whose smallest dimension is `min_dim` reaches (module docstring).

    e.g. MAMF 0.80, half_dim 64: d = 8192 -> 0.794; d = 512 -> 0.711; d = 128 -> 0.533.
    """
    d = max(1.0, min_dim)
    return mamf * d / (d + half_dim)


def gemm_time(
    flops: float,
    m: float,
    n: float,
    k: float,
    peak: float,
    mamf: float,
    half_dim: float,
    hbm_bytes_per_s: float,
    elem_bytes: float,
) -> float:
    """Seconds for `flops` of GEMMs of shape m x n x k: the compute time at
    gemm_efficiency(min dim) and the time to move their operands and result over HBM, combined
    as a smooth roofline sqrt(compute^2 + memory^2) (Williams et al. 2009: a kernel is bound by
    whichever is slower; the smooth sum charges the regime near the ridge point, where real
    kernels reach neither bound).

    e.g. H100 (989 TFLOP/s bf16, 3.35 TB/s), MAMF 0.8, half_dim 0: a 4096^3 GEMM: compute
    1.37e11 / 7.9e14 = 174 us, memory 3 x 4096^2 x 2 B / 3.35e12 = 30 us -> 176 us; a batched
    attention-score GEMM 2048 x 2048 x 96 moves (2 x 2048 x 96 + 2048^2) x 2 B per 8.1e8 FLOPs,
    88 FLOP/B, and is memory-bound on an A100 (ridge 153 FLOP/B).
    """
    if flops <= 0:
        return 0.0
    # Tile fill depends on the output's dimensions (m x n tiles, waves over the SMs); a short
    # reduction dimension k only lowers the arithmetic intensity, which the memory term prices.
    eff = gemm_efficiency(min(m, n), mamf, half_dim)
    compute = flops / (peak * eff)
    count = flops / (2.0 * max(1.0, m) * max(1.0, n) * max(1.0, k))
    memory = count * (m * k + k * n + m * n) * elem_bytes / hbm_bytes_per_s
    return float((compute * compute + memory * memory) ** 0.5)


def attention_kernel(cfg: LLMTrainConfig) -> str:
    """te | sdpa: backend.attention_kernel, else te for megatron and sdpa otherwise."""
    if cfg.backend.attention_kernel:
        return cfg.backend.attention_kernel
    return backend_of(cfg).attention_kernel


# Causal flash attention, forward + backward, head dim 128, long sequences: fraction of the bf16
# dense peak in the kernels' own benchmarks (read approximately off the papers' figures; the
# backward, 2.5x the forward's FLOPs, dominates the combined rate):
# - A100, FlashAttention-2 (= PyTorch SDPA's flash kernel; TE/cuDNN reach the same): ~225 of 312
#   TFLOP/s fwd+bwd (Dao 2023, FlashAttention-2, Fig. 6) -> 0.72.
# - H100, FlashAttention-2 / SDPA (not using wgmma / TMA): ~330 of 989 (Shah et al. 2024,
#   FlashAttention-3, Figs. 5-6, FA2 baseline) -> 0.33; cuDNN / FA3 class (Transformer Engine):
#   forward ~740 (0.75), backward ~530 (0.53) -> 3.5 / (1/0.75 + 2.5/0.53) = 0.58.
# - B200: cuDNN 9 fused attention about the same fractions as on Hopper (NVIDIA cuDNN 9 release
#   notes / blog, ~1.6 PFLOP/s forward of 2.25) -> 0.55; FA2-class kernels as on Hopper -> 0.33.
# Which kernel PyTorch's SDPA picks depends on the build: from 2.5.1 cuDNN attention is opt-in
# (pytorch/pytorch#138522, after 2.5's bugs), so SDPA runs FlashAttention-2 ("sdpa" above); later
# builds prefer cuDNN on sm90 / sm100 once the bundled cuDNN is newer than 9.15
# (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, check_prefer_cudnn_attention; the 2.11
# wheels cross it), a cuDNN-class rate: backend.attention_kernel=te prices that, and `llmtrain
# calibrate` measures whichever kernel the machine runs.
ATTENTION_KERNEL_RATE: dict[tuple[str, str], float] = {
    ("ampere", "te"): 0.72,
    ("ampere", "sdpa"): 0.72,
    ("hopper", "te"): 0.58,
    ("hopper", "sdpa"): 0.33,
    ("blackwell", "te"): 0.55,
    ("blackwell", "sdpa"): 0.33,
}


def attention_efficiency(
    block: float, c: ComputeConstants, kernel: str = "te", arch: str = "hopper"
) -> float:
    """Fraction of the bf16 peak flash attention reaches on key blocks of `block` tokens: the
    kernel's benchmark rate x the fitted realisation factor x block / (block + ATTN_HALF_SEQ)."""
    rate = ATTENTION_KERNEL_RATE.get((arch, kernel), 0.5)
    return rate * c.attn_efficiency * block / (block + ATTN_HALF_SEQ)


# Not fitted (an estimate): a gather or scatter of whole hidden-state rows (4-14 KB each) is a
# streaming device copy; device-to-device copies reach about 0.8-0.9 of the HBM datasheet bandwidth
# (cudaMemcpy D2D / nvbandwidth on A100 and H100); the lower end, for the index reads.
COPY_EFFICIENCY = 0.8
# The unfused loss per logit, forward and backward: the logits in the compute dtype, their fp32
# copy, the softmax and the loss (Megatron's vocab-parallel cross-entropy; ~30 bytes a logit).
UNFUSED_LOSS_BYTES = 30.0


def moe_routing_bytes(
    h: int, top_k: int, experts: int, act_bytes: int, score_passes: float = 5.0
) -> float:
    """HBM bytes per token and MoE layer, forward, of the router's non-GEMM work and the token
    permutation (Megatron-Core moe_utils permute / unpermute, Transformer Engine's fused
    moe_permute, torchtitan's MoE generate_permute_indices + index gather):

    - router: fp32 logits written, softmax (or sigmoid) read + written, top-k read, the load
      balancing loss read: 5 x 4 bytes per expert score;
    - permute: top_k copies of the token gathered into expert order (read + write top_k x h);
    - unpermute: the top_k expert outputs read, weighted by their fp32 probabilities and summed
      into one token (read top_k x h, write h).

    e.g. h 2048, top_k 8, 128 experts, bf16: 20 x 128 + (2 x 8 + 8 + 1) x 2048 x 2 + 8 x 4
    = 2,560 + 102,400 + 32 = 104,992 bytes. The backward moves the same again twice (gradients
    unpermuted and permuted back; the caller's byte passes).
    """
    router = score_passes * 4.0 * experts
    permute = 2.0 * top_k * h * act_bytes
    unpermute = (top_k + 1.0) * h * act_bytes + 4.0 * top_k
    return router + permute + unpermute


def clock_factor(power_limit_w: float | None, tdp_w: float | None) -> float:
    """Clock fraction under a power cap: (P / TDP)^(1/3), 1 without a cap (module docstring)."""
    if not power_limit_w or not tdp_w or power_limit_w >= tdp_w:
        return 1.0
    return float((power_limit_w / tdp_w) ** (1.0 / 3.0))


@dataclass(frozen=True)
class _Key:
    """Everything the compute time of a micro-batch depends on (memoisation key)."""

    arch: str
    c: ComputeConstants
    peak: float
    matmul_peak: float
    fp8: bool
    mamf: float
    hbm_gbps: float
    clock: float
    # model
    h: int
    q_dim: int
    kv_dim: int
    attn_params: int
    heads: int
    head_dim_qk: int
    head_dim_v: int
    ffn: int
    gated: bool
    vocab: int
    vocab_tp: int
    experts: int
    top_k: int
    moe_ffn: int
    shared: int
    imbalance: float
    rope: bool
    dropout: bool
    eager: bool
    kernel: str
    packed: str  # packed rows' kernel (flex | sdpa), "" where rows are not packed
    seq: int
    act_bytes: int
    # layout / run
    tokens: float
    tp: int
    cp: int
    ep: int
    sp: bool
    dense_layers: int
    moe_layers: int
    head: bool
    recompute_dense: str  # plan.recompute mode of the dense layers
    recompute_moe: str  # ... and of the MoE layers
    compile: bool
    m_limit: bool
    # finetune=lora|qlora (launcher/plan/finetune.py): frozen linears skip their weight-gradient
    # GEMM (2 passes, not 3); the adapters' forward FLOPs a token per layer and their rank.
    frozen: bool = False
    adapter_flops: float = 0.0
    adapter_rank: int = 0
    # The speed features' byte counts (launcher/plan/speed_features.py): bytes per element of an
    # fp8 cast, fp32 passes over the router's scores, bytes per logit of the loss.
    fp8_cast: float = 3.0
    router_passes: float = 5.0
    loss_bytes: float = 30.0
    # Seconds of launch gaps removed per dense / MoE layer and micro-batch.
    launch_dense_s: float = 0.0
    launch_moe_s: float = 0.0


def stage_parts(
    cfg: LLMTrainConfig,
    layout: Layout,
    arch: str,
    peak: float,
    matmul_peak: float,
    mamf: float,
    hbm_gbps: float,
    tdp_w: float | None,
    *,
    dense_layers: int,
    moe_layers: int,
    head: bool,
    m_limit: bool = False,
) -> ComputeParts:
    """Compute time of one micro-batch on one GPU holding the given layers (see module docstring).

    m_limit: price every token-count GEMM dimension as if it were unbounded (full tiles, weights
    read once for infinitely many tokens). That is a lower bound of the per-token time at any
    micro-batch size, which the layout search scales by tokens to prune layouts.
    """
    m = cfg.model
    shape = ModelShape(m)
    if shape.is_mla:
        q_dim = m.num_attention_heads * (shape.head_dim + shape.rope_dim)
        kv_dim = q_dim
        d_qk, d_v = shape.head_dim + shape.rope_dim, shape.v_dim
    else:
        q_dim = m.num_attention_heads * shape.head_dim
        kv_dim = shape.kv_heads * shape.head_dim
        d_qk = d_v = shape.head_dim

    key = _Key(
        arch=arch,
        c=constants(arch),
        peak=peak,
        matmul_peak=matmul_peak,
        fp8=matmul_peak > peak,
        mamf=mamf,
        hbm_gbps=hbm_gbps,
        clock=clock_factor(cfg.cluster.power_limit_w, tdp_w),
        h=m.hidden_size,
        q_dim=q_dim,
        kv_dim=kv_dim,
        attn_params=shape.attention_params(),
        heads=m.num_attention_heads,
        head_dim_qk=d_qk,
        head_dim_v=d_v,
        ffn=m.ffn_hidden_size,
        gated=m.activation == "swiglu",
        vocab=m.vocab_size,
        # The tp ranks the output layer is split over (1 where the backend keeps it whole).
        vocab_tp=backend_of(cfg).vocab_split(layout.tp),
        experts=m.num_experts or 0,
        top_k=m.moe_top_k or 1,
        moe_ffn=m.moe_ffn_hidden_size or m.ffn_hidden_size,
        shared=m.moe_shared_experts,
        imbalance=max(1.0, float(m.moe_load_imbalance)),
        rope=m.position == "rope",
        dropout=uses_dropout(cfg),
        eager=m.attention == "eager",
        kernel=attention_kernel(cfg),
        packed=packed_kernel_of(cfg),
        seq=m.seq_length,
        act_bytes=DTYPE_BYTES[cfg.precision.compute_dtype],
        tokens=layout.micro_batch_size * m.seq_length / max(1, layout.cp),
        tp=max(1, layout.tp),
        cp=max(1, layout.cp),
        ep=max(1, layout.ep),
        sp=cfg.parallel.sequence_parallel,
        dense_layers=dense_layers,
        moe_layers=moe_layers,
        head=head,
        recompute_dense=recompute_mode(cfg, moe=False),
        recompute_moe=recompute_mode(cfg, moe=True),
        # As the engine runs (engine_choices); Megatron's hand-fused kernels count as compiled.
        compile=compile_in_force(cfg)[0],
        m_limit=m_limit,
        frozen=finetune.is_finetune(cfg),
        adapter_flops=finetune.adapter_flops_per_token_layer(cfg) / max(1, layout.tp)
        if finetune.is_finetune(cfg)
        else 0.0,
        adapter_rank=cfg.finetune.rank,
        fp8_cast=fp8_cast_bytes(cfg),
        router_passes=router_score_passes(cfg),
        loss_bytes=loss_bytes_per_logit(cfg, UNFUSED_LOSS_BYTES),
        launch_dense_s=launch_seconds_removed(cfg, layout, dense_layers=1, moe_layers=0),
        launch_moe_s=launch_seconds_removed(cfg, layout, dense_layers=0, moe_layers=1),
    )
    return _parts(key)


def _gemm(
    k: _Key,
    flops_per_token: float,
    m_dim: float,
    n: float,
    kk: float,
    peak: float,
    e: float,
    *,
    tokens_dim: bool = True,
) -> float:
    """Seconds of the micro-batch's GEMMs of `flops_per_token` (gemm_time at this stage's
    constants); `e` is the fp8 efficiency ratio (1: not an fp8 GEMM)."""
    c = k.c
    if k.m_limit and tokens_dim:
        m_dim = 1e15  # token dimensions (not the eager score GEMMs' fixed s x s)
    return gemm_time(
        k.tokens * flops_per_token,
        m_dim,
        n,
        kk,
        peak,
        k.mamf * e * c.gemm_sustained,
        c.gemm_half_dim,
        k.hbm_gbps * 1e9,
        1.0 if (k.fp8 and peak == k.matmul_peak and e != 1.0) else float(k.act_bytes),
    )


@dataclass(frozen=True)
class _LayerGemms:
    """Forward GEMM seconds of one layer (and the head), per class."""

    attn_lin: float
    dense_mlp: float
    moe_mlp: float
    router: float
    head: float


def _layer_gemms(k: _Key) -> _LayerGemms:
    tp, t, h = k.tp, k.tokens, k.h
    eff8 = k.c.fp8_gemm_ratio if k.fp8 else 1.0
    lin_peak = k.matmul_peak
    g = 2 if k.gated else 1
    if k.attn_params and k.q_dim and k.kv_dim == k.q_dim and k.head_dim_qk != k.head_dim_v:
        # MLA: its projections as one GEMM of the attention parameters, smallest dim the q width.
        attn_lin = _gemm(
            k, 2.0 * k.attn_params / tp, t, h, k.heads * k.head_dim_v / tp, lin_peak, eff8
        )
    else:
        qkv_n = (k.q_dim + 2 * k.kv_dim) / tp
        attn_lin = _gemm(k, 2.0 * h * qkv_n, t, qkv_n, h, lin_peak, eff8) + _gemm(
            k, 2.0 * k.q_dim / tp * h, t, h, k.q_dim / tp, lin_peak, eff8
        )
    dense_mlp = _gemm(k, 2.0 * h * k.ffn * (g + 1) / tp, t, k.ffn / tp, h, lin_peak, eff8)
    moe_mlp = 0.0
    router = 0.0
    if k.experts > 1:
        # The busiest rank's experts get `imbalance` x the mean tokens and set the pace.
        per_expert_tokens = t * k.top_k * k.ep / k.experts * k.imbalance
        f_e = k.moe_ffn
        moe_mlp = (
            k.imbalance
            * k.top_k
            * _gemm(k, 2.0 * h * f_e * (g + 1) / tp, per_expert_tokens, f_e / tp, h, lin_peak, eff8)
        )
        if k.shared:
            f_s = f_e * k.shared
            moe_mlp += _gemm(k, 2.0 * h * f_s * (g + 1) / tp, t, f_s / tp, h, lin_peak, eff8)
        router = _gemm(k, 2.0 * h * k.experts, t, k.experts, h, k.peak, 1.0)
    v_local = k.vocab / k.vocab_tp
    head = _gemm(k, 2.0 * h * v_local, t, v_local, h, k.peak, 1.0) if k.head else 0.0
    return _LayerGemms(attn_lin, dense_mlp, moe_mlp, router, head)


def _attention_core(k: _Key) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's attention core."""
    heads_here = k.heads / k.tp
    full_fwd = 2.0 * k.seq * heads_here * (k.head_dim_qk + k.head_dim_v)  # per token, full s x s
    if k.eager:
        attn_fwd = _gemm(k, full_fwd, k.seq, k.seq, k.head_dim_qk, k.peak, 1.0, tokens_dim=False)
        return attn_fwd, 2.0 * attn_fwd
    kernel = "sdpa" if k.packed else k.kernel  # packed_rows.py prices against FA2
    rate = k.peak * attention_efficiency(k.seq / k.cp, k.c, kernel, k.arch)
    attn_fwd = k.tokens * 0.5 * full_fwd / rate
    if k.packed:
        mask = k.tokens * k.seq * heads_here
        return packed_attention_s(
            k.packed, (attn_fwd, 2.5 * attn_fwd), k.arch, mask, k.act_bytes, k.hbm_gbps * 1e9
        )
    return attn_fwd, 2.5 * attn_fwd


@dataclass(frozen=True)
class _LayerBytes:
    """Non-GEMM HBM bytes per token of one layer's forward; `scores`: eager attention's softmax
    elements per token (recomputed with the core)."""

    dense: float
    moe: float
    scores: float


def _layer_bytes(k: _Key) -> _LayerBytes:
    """Non-GEMM bytes per token per layer, forward (elements x dtype bytes)."""
    tp, h = k.tp, k.h
    hs = h / tp if k.sp else h
    ab = k.act_bytes
    elem = 4.0 * hs + 6.0 * hs  # two norms (read + write h), two residual adds (2 reads + 1 write)
    if k.dropout:
        elem += 5.0 * hs  # bias-dropout-add after attention and MLP: read, write, 1-byte mask
    if k.rope:
        elem += 2.0 * (k.q_dim + k.kv_dim) / tp
    scores = 0.0
    if k.eager:
        # Fused scale-mask-softmax reads and writes every score; dropout reads, writes, masks it.
        scores = (2.0 + (2.5 if k.dropout else 0.0)) * (k.heads / tp) * k.seq
    dense_elem = (3.0 if k.gated else 2.0) * k.ffn / tp
    moe_elem = 0.0
    if k.experts > 1:
        f_e = k.moe_ffn
        moe_elem = (3.0 if k.gated else 2.0) * (k.imbalance * k.top_k * f_e + k.shared * f_e) / tp
    if k.fp8:
        # Cast of each linear GEMM's input to fp8: read 2 bytes, write 1 (QKV, O, FC1, FC2).
        cast_dense = k.fp8_cast * (2.0 * h + k.q_dim / tp + k.ffn / tp)
        cast_moe = k.fp8_cast * (2.0 * h + k.q_dim / tp + k.top_k * (h + k.moe_ffn / tp))
    else:
        cast_dense = cast_moe = 0.0
    return _LayerBytes(
        dense=(elem + dense_elem + scores) * ab + cast_dense,
        moe=(elem + moe_elem + scores) * ab + cast_moe,
        scores=scores,
    )


@functools.lru_cache(maxsize=4096)
def _parts(k: _Key) -> ComputeParts:
    """The classes' seconds: forward 1 + backward 2 passes (GEMMs, bytes), recompute's extra
    forwards (plan.recompute) per layer kind (a backend may recompute dense and MoE layers
    differently), divided by the power cap's clock where compute-bound."""
    c = k.c
    t = k.tokens
    ab = k.act_bytes
    g = _layer_gemms(k)
    attn_fwd, attn_bwd = _attention_core(k)
    lb = _layer_bytes(k)
    bytes_scale = c.bytes_factor * (c.compile_bytes if k.compile else 1.0) / (k.hbm_gbps * 1e9)
    lin_dense = g.attn_lin + g.dense_mlp
    lin_moe = g.attn_lin + g.moe_mlp
    x_d = extra_forwards(k.recompute_dense, k.eager)
    x_m = extra_forwards(k.recompute_moe, k.eager)
    n_d, n_m = k.dense_layers, k.moe_layers
    # Frozen weights (finetune): forward and input-gradient GEMMs only (launcher/plan/finetune.py).
    passes = 2.0 if k.frozen else 3.0
    linear_s = (passes + x_d.gemm) * n_d * lin_dense + (passes + x_m.gemm) * n_m * lin_moe
    if k.adapter_flops:
        # The adapters' rank-r GEMMs: forward, input and weight gradients (3 passes).
        adapters = _gemm(k, k.adapter_flops, t, k.adapter_rank, k.h, k.matmul_peak, 1.0)
        linear_s += (3.0 + x_d.gemm) * n_d * adapters
    other_s = (passes + x_m.gemm) * n_m * g.router + passes * g.head
    attention_s = n_d * (attn_fwd + attn_bwd + x_d.attention * attn_fwd) + n_m * (
        attn_fwd + attn_bwd + x_m.attention * attn_fwd
    )
    layer_bytes = (3.0 + x_d.elementwise) * n_d * lb.dense
    layer_bytes += (3.0 + x_m.elementwise) * n_m * lb.moe
    layer_bytes += (
        lb.scores
        * ab
        * (
            n_d * recomputes_scores(k.recompute_dense, k.eager)
            + n_m * recomputes_scores(k.recompute_moe, k.eager)
        )
    )
    if k.head:
        # The loss's bytes per logit (UNFUSED_LOSS_BYTES, or the fused kernel's).
        layer_bytes += k.loss_bytes * (k.vocab / k.vocab_tp)
    bytes_s = t * layer_bytes * bytes_scale
    if k.experts > 1:
        # Routing and token (un)permutation: streaming copies at COPY_EFFICIENCY of HBM, not the
        # fitted bytes_factor of the small fused ops (moe_routing_bytes); same passes as above.
        bytes_s += (
            t
            * (3.0 + x_m.elementwise)
            * n_m
            * moe_routing_bytes(k.h, k.top_k, k.experts, ab, k.router_passes)
            / (COPY_EFFICIENCY * k.hbm_gbps * 1e9)
        )
    return ComputeParts(
        linear_s=linear_s / k.clock,
        other_gemm_s=other_s / k.clock,
        attention_s=attention_s / k.clock,
        bytes_s=bytes_s,
        launch_removed_s=n_d * k.launch_dense_s + n_m * k.launch_moe_s,
    )


__all__ = [
    "ATTENTION_KERNEL_RATE",
    "COPY_EFFICIENCY",
    "ComputeParts",
    "attention_efficiency",
    "clock_factor",
    "gemm_efficiency",
    "gemm_time",
    "moe_routing_bytes",
    "stage_parts",
]
