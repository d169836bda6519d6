"""Activation memory of one Megatron-Core transformer layer, tensor by tensor, with what
backend.recompute_modules and backend.offload_modules free (backend=megatron, recompute none or
selective; full recompute keeps only the layer input: launcher/plan/memory/estimate.py).

Read in NVIDIA/Megatron-LM core_v0.16.1 (commit 55ac7082517c3878ae653c07c09c534b8aed49f6) and
Transformer Engine's modules as Megatron-Core's TE layer spec uses them:
- attention: the fused QKV projection (TELayerNormColumnParallelLinear) keeps the layer input
  for the norm's backward and the norm output for its weight gradient (fp8: Transformer Engine
  saves the quantized copy, 1 byte); the fused attention kernel keeps q, k, v, its output and the
  fp32 log-sum-exp; the output projection keeps its input, the attention output (fp8: a
  quantized copy of it besides the kernel's own bf16 output). Multi-latent attention
  (megatron/core/transformer/multi_latent_attention.py): a separate input norm whose output the
  down projections keep, and the compressed q / kv latents kept by the up projections
  (TELayerNormColumnParallelLinear: input and norm output); its q, k, v after the up
  projection and RoPE are what the attention kernel keeps.
- dense MLP (megatron/core/transformer/mlp.py): fc1 keeps its norm output (as QKV does);
  Megatron-LM fuses the SwiGLU (backend.swiglu_fusion; --no-bias-swiglu-fusion turns it off;
  Megatron-Bridge's model providers set bias_activation_fusion=True), and the fused function
  keeps only its input, fc1's output (2f values: megatron/core/fusions/fused_bias_swiglu.py,
  SwiGLUFunction save_for_backward(input)); unfused (mlp.py glu(), the Megatron-LM of before
  2024-01, when the flag came) SiLU's output is kept too; fc2 keeps its input (f values; fp8: 1
  byte).
- MoE layer (megatron/core/transformer/moe/): a separate pre-MLP norm whose output the router and
  the shared experts keep; the router's fp32 logits and scores (8 bytes an expert); each routed
  copy's grouped-GEMM input (TEGroupedMLP.linear_fc1), fc1 output (kept by
  weighted_bias_swiglu_impl, WeightedSwiGLUFunction save_for_backward(input, weights): the
  router probability is applied inside the activation, experts.py TEGroupedMLP.forward) and
  fc2 input, plus its fp32 probability; unpermutation scatters the expert outputs back without
  keeping them. The busiest rank holds model.moe_load_imbalance x the mean routed copies
  (dropless routing; Megatron-Bridge's benchmark recipes set moe_router_force_load_balancing,
  exact balance: 1.0). With expert tensor parallel 1 each rank's experts see the tokens of its
  own sequence shard; with etp > 1 the dispatcher gathers etp shards and the intermediates
  split over etp.
- recompute_modules (transformer_layer.py, moe/experts.py, multi_latent_attention.py):
  core_attn checkpoints the attention kernel (its inputs stay as the checkpoint's, the output
  as the projection's: only the log-sum-exp, or eager attention's scores, is freed); mlp
  checkpoints a dense layer's MLP (not MoE layers': "if not self.is_moe_layer"); moe the whole
  MoE layer; shared_experts the shared experts; moe_act discards the activation's output, the
  fc2 input (CheckpointWithoutOutput); layernorm discards a separate norm's output (MLA's input
  norm, an MoE layer's pre-MLP norm; the dense TE spec fuses both norms into the linear layers,
  so there it frees nothing); mla_up_proj discards q, k, v after the up projections and RoPE.
  While a layer runs its backward, what it recomputes exists once again (one layer).
- offload_modules (megatron/core/pipeline_parallel/fine_grained_activation_offload.py): each
  module's input goes to host memory after the forward and comes back before its backward; the
  manager keeps the last group of each name on the GPU and reloads the next chunk's last layer
  ahead, so two layers' offloaded tensors are resident at the peak.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.backends.activation_modules import offload_modules, recompute_modules
from launcher.backends.common import backend_of, expert_tensor_parallel
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan.model_shape import ModelShape

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Saved:
    """One tensor a layer keeps for its backward: bytes per token of the rank's sequence shard
    (mbs x seq / cp tokens), and the modules whose recompute or offload frees it."""

    name: str
    bytes_per_token: float
    recompute: frozenset[str] = frozenset()
    offload: frozenset[str] = frozenset()


@dataclass(frozen=True)
class LayerActivations:
    """Bytes of one layer for one micro-batch on one GPU: `kept` until its backward; `recomputed`
    and `offloaded`: what the modules freed (recomputed exists again once, offloaded twice, at the
    peak: module docstring)."""

    kept: float
    recomputed: float
    offloaded: float

    @property
    def transient(self) -> float:
        return self.recomputed + 2.0 * self.offloaded


def applies(cfg: LLMTrainConfig) -> bool:
    """Megatron-Core's layer, not fully recomputed (full keeps the layer input only)."""
    return backend_of(cfg).name == "megatron" and cfg.train.recompute in ("none", "selective")


@dataclass(frozen=True)
class _Widths:
    """What every tensor's size below is made of: bytes per element, the splits, the flags."""

    hidden: int
    tp: int
    sp: int  # tp with sequence parallel (norm inputs and outputs split), else 1
    dt: float  # bytes per element in the compute dtype
    lin: float  # a linear layer's saved input (Transformer Engine fp8: quantized, 1 byte)
    fp8: bool
    gated: float  # fc1's outputs per ffn unit (SwiGLU: gate and up)
    unfused: bool  # SwiGLU without Megatron-LM's fusion (backend.swiglu_fusion=false)


def _widths(cfg: LLMTrainConfig, layout: Layout) -> _Widths:
    """The sizes shared by the attention and MLP halves of one layer."""
    m = cfg.model
    tp = max(1, layout.tp)
    dt = float(DTYPE_BYTES.get(cfg.precision.compute_dtype, 2))
    fp8 = cfg.precision.fp8
    return _Widths(
        hidden=m.hidden_size,
        tp=tp,
        sp=tp if cfg.parallel.sequence_parallel else 1,
        dt=dt,
        lin=1.0 if fp8 else dt,
        fp8=fp8,
        gated=2.0 if m.activation == "swiglu" else 1.0,
        unfused=m.activation == "swiglu" and not cfg.backend.swiglu_fusion,
    )


def saved_tensors(cfg: LLMTrainConfig, layout: Layout, moe: bool) -> list[Saved]:
    """What one Megatron-Core layer keeps, per token of the rank's shard (module docstring)."""
    w = _widths(cfg, layout)
    return [
        *_attention_tensors(cfg, layout, w),
        Saved("MLP norm input", w.dt * w.hidden / w.sp, offload=frozenset({"mlp_norm"})),
        *(_moe_tensors(cfg, layout, w) if moe else _dense_mlp_tensors(cfg, w)),
    ]


def _attention_tensors(cfg: LLMTrainConfig, layout: Layout, w: _Widths) -> list[Saved]:
    """The attention half: norm input, QKV input, q/k/v, output, log-sum-exp; MLA's latents,
    eager attention's scores and the dropout masks when there are any."""
    shape = ModelShape(cfg.model)
    m = cfg.model
    h, heads, tp, sp, dt, lin = w.hidden, m.num_attention_heads, w.tp, w.sp, w.dt, w.lin
    dropout = m.attention_dropout > 0 or m.hidden_dropout > 0
    eager = m.attention == "eager" and layout.cp <= 1
    if shape.is_mla:
        q_dim = k_dim = heads * (shape.head_dim + shape.rope_dim)
        v_dim = o_dim = heads * shape.v_dim
    else:
        q_dim = o_dim = heads * shape.head_dim
        k_dim = v_dim = shape.kv_heads * shape.head_dim
    f = frozenset
    out = [
        Saved("attention norm input", dt * h / sp, offload=f({"attn_norm"})),
        Saved(
            "QKV input (norm output)",
            lin * h / sp,
            # MLA's input norm is a separate module (layernorm recompute discards its output);
            # the dense spec fuses it into the QKV projection.
            recompute=f({"layernorm"}) if shape.is_mla else f(),
            offload=f({"qkv_linear"}),
        ),
        Saved(
            "q, k, v",
            dt * (q_dim + k_dim + v_dim) / tp,
            recompute=f({"mla_up_proj"}) if shape.is_mla else f(),
            offload=f({"core_attn"}),
        ),
        Saved("attention output", dt * o_dim / tp, offload=f({"attn_proj"})),
        Saved("log-sum-exp", 4.0 * heads / tp, recompute=f({"core_attn"})),
    ]
    if w.fp8:
        out.append(Saved("output projection input (fp8 copy)", o_dim / tp))
    if shape.is_mla:
        q_rank = m.q_lora_rank or 0
        kv_rank = m.kv_lora_rank or 0
        # The up projections keep their input and norm output; the decoupled RoPE key is kept for
        # its own rotation. Not split over tp (the down projections are duplicated).
        out.append(Saved("MLA latents", dt * (2.0 * q_rank + 2.0 * kv_rank + shape.rope_dim)))
    if eager:
        per_score = (5.0 if dropout else 2.0) * heads * m.seq_length / tp
        out.append(Saved("attention scores", per_score, recompute=f({"core_attn"})))
    if dropout:
        out.append(Saved("dropout masks", 2.0 * h / sp))
    return out


def _dense_mlp_tensors(cfg: LLMTrainConfig, w: _Widths) -> list[Saved]:
    """A dense layer's MLP: fc1's input and output, fc2's input (unfused SwiGLU: SiLU's too)."""
    ffn = cfg.model.ffn_hidden_size
    mlp = frozenset({"mlp"})
    out = [
        Saved("fc1 input (norm output)", w.lin * w.hidden / w.sp, recompute=mlp),
        Saved("fc1 output (activation input)", w.dt * w.gated * ffn / w.tp, recompute=mlp),
        Saved("fc2 input", w.lin * ffn / w.tp, recompute=mlp),
    ]
    if w.unfused:
        # mlp.py's glu(): silu(gate) * up, each op keeping its inputs: SiLU's output too.
        out.append(Saved("SiLU output (unfused SwiGLU)", w.dt * ffn / w.tp, recompute=mlp))
    return out


def _moe_tensors(cfg: LLMTrainConfig, layout: Layout, w: _Widths) -> list[Saved]:
    """An MoE layer: the router's input and scores, each routed copy's grouped-GEMM tensors on
    the busiest rank, and the shared experts' when there are any."""
    m = cfg.model
    h, sp, dt, lin, gated = w.hidden, w.sp, w.dt, w.lin, w.gated
    experts = m.num_experts or 0
    top_k = m.moe_top_k or 1
    f_e = m.moe_ffn_hidden_size or m.ffn_hidden_size
    f = frozenset
    whole = f({"moe"})
    out = [
        Saved(
            "router and shared-expert input (norm output)",
            dt * h / sp,
            recompute=f({"layernorm", "moe"}),
        ),
        Saved("router logits and scores (fp32)", 8.0 * experts / sp, recompute=whole),
    ]
    etp = expert_tensor_parallel(cfg, layout)
    # Routed copies per token of the rank's shard on the busiest rank: top_k x imbalance, times
    # etp / sp tokens (the dispatcher gathers the etp group's shards).
    copies = top_k * max(1.0, float(m.moe_load_imbalance)) * etp / sp
    out += [
        Saved(
            "expert fc1 input (permuted tokens)",
            copies * lin * h,
            recompute=whole,
            offload=f({"expert_fc1"}),
        ),
        Saved(
            "expert fc1 output (activation input)",
            copies * dt * gated * f_e / etp,
            recompute=whole,
            offload=f({"moe_act"}),
        ),
        Saved("expert fc2 input", copies * lin * f_e / etp, recompute=f({"moe_act", "moe"})),
        Saved("routing probabilities (fp32)", copies * 4.0, recompute=whole),
    ]
    if w.unfused:
        # experts.py bias_act_func without fusion: glu() keeps SiLU's output, the product with
        # the probabilities keeps glu's output.
        out.append(
            Saved(
                "SiLU and GLU outputs (unfused SwiGLU)",
                copies * dt * 2.0 * f_e / etp,
                recompute=f({"moe_act", "moe"}),
            )
        )
    if m.moe_shared_experts:
        f_s = m.moe_shared_experts * f_e
        shared = f({"shared_experts", "moe"})
        out += [
            Saved("shared-expert fc1 output", dt * gated * f_s / w.tp, recompute=shared),
            Saved("shared-expert fc2 input", lin * f_s / w.tp, recompute=shared),
        ]
        if w.fp8:
            out.append(Saved("shared-expert fc1 input (fp8 copy)", h / sp, recompute=shared))
    return out


def layer_activations(cfg: LLMTrainConfig, layout: Layout, moe: bool) -> LayerActivations:
    """One layer's bytes for one micro-batch under the configured recompute and offload modules.
    A tensor both recomputed and offloaded counts as recomputed (nothing is left to offload)."""
    rec = set(recompute_modules(cfg))
    off = set(offload_modules(cfg))
    tokens = layout.micro_batch_size * cfg.model.seq_length / max(1, layout.cp)
    kept = recomputed = offloaded = 0.0
    for s in saved_tensors(cfg, layout, moe):
        b = s.bytes_per_token * tokens
        if s.recompute & rec:
            recomputed += b
        elif s.offload & off:
            offloaded += b
        else:
            kept += b
    return LayerActivations(kept, recomputed, offloaded)


__all__ = ["LayerActivations", "Saved", "applies", "layer_activations", "saved_tensors"]
