"""The operators one GPU runs for one micro-batch, as the engine
(``launcher.train.model.transformer``) runs them.

One list, read by both sides of a measured plan: ``llmtrain calibrate`` (launcher/launch/
calibrate.py) times these shapes on the machine, and the planner (``launcher.plan.timing.measured``)
looks the same shapes up in the profile. Pure arithmetic on the configuration; no torch.

Per GPU (tensor-parallel shards divided by tp, tokens t = micro_batch x seq / cp):
- attention projections: wq [t x h] -> [t x q/tp], wk and wv -> kv/tp each, wo [t x q/tp] -> h
  (separate nn.Linear calls in the engine, not one fused QKV GEMM);
- MLP: w1 (and w3 for SwiGLU) h -> f/tp, w2 f/tp -> h;
- MoE layers: router h -> E, E/ep local experts each on t x top_k x ep / E tokens (balanced
  routing; x model.moe_load_imbalance on the busiest rank), shared experts on all t tokens;
- output layer over the vocabulary: h -> V/tp (last stage; V where the backend keeps it whole);
- attention core: causal SDPA of [b, heads/tp, s/cp, d];
- element-wise work of one layer: two norms, two residual adds, rotary on q and k, the MLP's
  activation (GELU, or SiLU x up), dropout where configured;
- loss: cross-entropy of fp32 logits over V/tp, with the embedding lookup (first stage) beside it.
MLA projections are not listed (priced from the catalog, and named so).
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.backends.common import backend_of
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan.model_shape import ModelShape


@dataclass(frozen=True)
class Gemm:
    """`count` GEMMs of [m x k] @ [k x n] per layer (or per step for the head)."""

    name: str
    m: int
    n: int
    k: int
    count: int = 1

    @property
    def flops(self) -> float:
        """Forward FLOPs of all `count` GEMMs (2 m n k each)."""
        return 2.0 * self.m * self.n * self.k * self.count

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.m, self.n, self.k)


@dataclass(frozen=True)
class AttentionOp:
    batch: int
    heads: int
    kv_heads: int
    seq: int
    head_dim: int
    kind: str  # flash | eager (the engine's model.attention)


@dataclass(frozen=True)
class Operators:
    """What one GPU of a layout computes per micro-batch (module docstring)."""

    dtype: str
    tokens: int
    hidden: int  # h
    ffn_local: int  # f / tp of the dense MLP
    gated: bool
    norm: str
    rope: bool
    dropout: bool
    vocab_local: int
    dense_gemms: tuple[Gemm, ...]  # one dense layer
    moe_gemms: tuple[Gemm, ...]  # one MoE layer (attention projections included)
    head_gemm: Gemm
    attention: AttentionOp
    mla: bool


def _i(x: float) -> int:
    return max(1, round(x))


def operators(cfg: LLMTrainConfig, layout: Layout) -> Operators:
    m = cfg.model
    shape = ModelShape(m)
    tp, cp, ep = max(1, layout.tp), max(1, layout.cp), max(1, layout.ep)
    vocab_tp = backend_of(cfg).vocab_split(tp)  # the output layer's split (Backend.tp_splits_vocab)
    t = _i(layout.micro_batch_size * m.seq_length / cp)
    h = m.hidden_size
    q = m.num_attention_heads * shape.head_dim
    kv = shape.kv_heads * shape.head_dim
    g = 2 if m.activation == "swiglu" else 1
    attn = (
        Gemm("attention wq", t, _i(q / tp), h),
        Gemm("attention wk+wv", t, _i(kv / tp), h, 2),
        Gemm("attention wo", t, h, _i(q / tp)),
    )
    f = _i(m.ffn_hidden_size / tp)
    dense = (*attn, Gemm("mlp w1" + ("+w3" if g == 2 else ""), t, f, h, g), Gemm("mlp w2", t, h, f))
    moe: tuple[Gemm, ...] = ()
    if shape.is_moe:
        experts = m.num_experts or 1
        top_k = m.moe_top_k or 1
        fe = _i((m.moe_ffn_hidden_size or m.ffn_hidden_size) / tp)
        local = max(1, experts // ep)
        # The busiest rank's experts (model.moe_load_imbalance x the mean tokens).
        per_expert = _i(t * top_k * ep / experts * max(1.0, float(m.moe_load_imbalance)))
        moe = (
            *attn,
            Gemm("moe router", t, experts, h),
            Gemm("expert w1" + ("+w3" if g == 2 else ""), per_expert, fe, h, g * local),
            Gemm("expert w2", per_expert, h, fe, local),
        )
        if m.moe_shared_experts:
            fs = fe * m.moe_shared_experts
            moe += (
                Gemm("shared expert w1" + ("+w3" if g == 2 else ""), t, fs, h, g),
                Gemm("shared expert w2", t, h, fs),
            )
    return Operators(
        dtype=cfg.precision.compute_dtype,
        tokens=t,
        hidden=h,
        ffn_local=f,
        gated=g == 2,
        norm=m.norm,
        rope=m.position == "rope",
        dropout=bool(m.hidden_dropout or m.attention_dropout),
        vocab_local=_i(m.vocab_size / vocab_tp),
        dense_gemms=dense,
        moe_gemms=moe,
        head_gemm=Gemm("output layer", t, _i(m.vocab_size / vocab_tp), h),
        attention=AttentionOp(
            batch=layout.micro_batch_size,
            heads=_i(m.num_attention_heads / tp),
            kv_heads=_i(shape.kv_heads / tp),
            seq=_i(m.seq_length / cp),
            head_dim=shape.head_dim,
            kind=m.attention,
        ),
        mla=shape.is_mla,
    )


def elementwise_bytes(ops: Operators, elem_bytes: int) -> float:
    """Bytes the element-wise work of one layer reads and writes in its forward (the ops of the
    module docstring, each tensor read once and written once; calibrate times the same ops)."""
    t, h, f = ops.tokens, ops.hidden, ops.ffn_local
    q_local = ops.attention.heads * ops.attention.head_dim
    kv_local = ops.attention.kv_heads * ops.attention.head_dim
    per_token = 2 * 2 * h + 2 * 3 * h  # two norms (read, write), two residual adds (2 in, 1 out)
    per_token += (3 if ops.gated else 2) * f  # activation: GELU in/out, or SiLU(gate) x up
    if ops.rope:
        per_token += 2 * (q_local + kv_local)
    if ops.dropout:
        per_token += 2 * 2 * h
    return float(t * per_token * elem_bytes)


__all__ = ["AttentionOp", "Gemm", "Operators", "elementwise_bytes", "operators"]
