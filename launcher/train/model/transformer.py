"""The decoder-only transformer that `llmtrain run` trains, built from a ``ModelConfig``.

Its parameter count equals ``launcher.plan.model_shape.ModelShape(cfg).total_params()`` for every
shape (the architecture is described there; ``tests/unit/train/model/test_train_model.py`` checks
each recipe).

Module names follow torchtitan, so parallel plans can address them:

    Transformer
      tok_embeddings   nn.Embedding [V, h]           (None on pipeline stages that do not embed)
      pos_embeddings   nn.Embedding [s, h] | None    (learned positions only)
      layers           nn.ModuleDict "0".."L-1" of TransformerBlock (pipeline stages delete entries)
        attention_norm, attention (Attention: wq wk wv wo | MLAttention), ffn_norm,
        feed_forward (MLP: w1 w2 [w3]) on dense layers | moe (MoE: router experts shared_experts)
      norm             final norm                     (None on non-last pipeline stages)
      output           nn.Linear [h -> V] | None      (None when tied: uses tok_embeddings.weight)

Choices worth knowing:
- Attention goes through ``F.scaled_dot_product_attention``. ``model.attention=flash`` passes
  ``is_causal=True`` (flash / memory-efficient kernels on GPU); ``eager`` passes an explicit boolean
  lower-triangular ``attn_mask`` instead, which rules out the flash kernel (memory-efficient or math
  path). GQA uses SDPA's ``enable_gqa`` (no repeated k/v copies). Packed rows attend within each
  example through flex_attention or SDPA with a dense mask (``model.packed_attention``,
  ``launcher.train.model.document_mask``).
- Head counts are read from the projections' outputs at forward time (``view(b, s, -1, d)``), so
  tensor-parallel Colwise/Rowwise sharding of wq/wk/wv/wo needs no change here (DTensor weights
  report their global shape, so the weights are not consulted). Replicating kv heads when
  kv_heads < tp is the engine's job.
- RoPE: rotate-half form (GPT-NeoX / Llama), base ``model.rope_theta`` (10000; Llama 3: 500000),
  tables computed per forward (no buffers, so a model built on the meta device needs nothing
  re-initialised after ``to_empty``). Norm epsilon: ``model.norm_eps`` (None: LayerNorm 1e-5,
  RMSNorm 1e-6; ``launcher.config.norms``).
- Dropout (``model.attention_dropout`` on the attention probabilities, ``model.hidden_dropout`` on
  each residual branch) is active in training mode only. Its masks come from torch's global
  generator, which the trainer reseeds every step from (seed, step, rank) (``seed_step``), so a
  resumed run draws the same masks as an uninterrupted one.
- MoE: token-choice top-k, dropless; gate weights: a softmax over the k selected router logits
  (Mixtral style; DeepSeek-V3's sigmoid gating and its router bias are not modelled); no auxiliary
  loss; the experts run as grouped GEMMs over tokens sorted by expert
  (``launcher.train.model.experts``: ``torch._grouped_mm`` where the build has it, a padded ``bmm``
  elsewhere; no loop over experts), their weights stacked per forward, so every expert's parameters
  join the graph even on zero tokens and all get a gradient (DDP needs no
  ``find_unused_parameters``). Under expert parallel (``apply_expert_parallel``) each rank keeps
  E/ep experts and tokens travel by all-to-all (``launcher.train.parallel.expert_parallel``). Under
  tensor parallel the engine shards each expert like an MLP and replicates the router; the experts
  then use their local shards and sum their output over tp themselves
  (``launcher.train.model.experts``).
- Context parallel (``apply_context_parallel``): positions and attention follow the rank's
  load-balanced chunks; attention is ring attention (``launcher.train.parallel.ring_attention``).
- Recompute (``apply_recompute``): full checkpoints each block (only its input kept); selective
  checkpoints a dense block with op-level selective checkpointing
  (``launcher.train.model.selective_checkpoint``, the policy torchtitan calls "op": every other
  matrix product's output and the attention kernel's output are kept, the rest is recomputed in the
  backward); an MoE block checkpoints only its
  attention core and the shared experts' activation function (the dispatch's collectives and
  their Python-side counts stay out of any replay). plan prices each
  (launcher/backends/common.py selective_recompute).
- Init (``launcher.train.model.init_weights``): GPT-2's normal(0, 0.02), the residual projections at
  0.02/sqrt(2L), each parameter from a generator seeded by its name, so a pipeline stage gets
  exactly the weights its layers have in the whole model.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from launcher.config.norms import RMSNORM_EPS, norm_epsilon
from launcher.config.schema import ModelConfig
from launcher.plan.model_shape import ModelShape
from launcher.train.finetune.masked_loss import masked_loss
from launcher.train.model.chunked_loss import chunked_cross_entropy
from launcher.train.model.document_mask import DocumentMask, flex_core, resolve_kernel
from launcher.train.model.experts import compute_dtype, routed, stack
from launcher.train.model.init_weights import init_weights, skip_default_init
from launcher.train.model.selective_checkpoint import selective_context
from launcher.train.parallel.expert_parallel import ExpertParallel
from launcher.train.parallel.ring_attention import ContextParallel

ROPE_THETA = 10_000.0
RECOMPUTE_MODES = ("none", "selective", "full")


def _call(module: nn.Module, *args: Any) -> torch.Tensor:
    """Call a module and type its result (nn.Module.__call__ returns Any)."""
    return cast(torch.Tensor, module(*args))


def norm_layer(kind: str, dim: int, eps: float | None = None) -> nn.Module:
    """The norm module of model.norm (also what `llmtrain calibrate` times, train/op_timing.py)."""
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=norm_epsilon(kind, eps), bias=True)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=norm_epsilon(kind, eps))
    raise ValueError(f"model.norm={kind!r}: expected layernorm or rmsnorm")


# --- rotary position embedding -------------------------------------------------------------------
def rope_tables(
    seq_len: int,
    dim: int,
    device: torch.device,
    positions: torch.Tensor | None = None,
    theta: float = ROPE_THETA,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [seq_len, dim] (fp32) for rotate-half RoPE with base `theta`, at
    positions 0..seq_len-1 or at the given `positions` (a context-parallel rank's tokens), or
    [b, seq_len, dim] for per-row positions [b, seq_len] (packed examples, ``DocumentMask``)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    if positions is None:
        positions = torch.arange(seq_len, device=device)
    freqs = positions.to(torch.float32)[..., None] * inv_freq
    angles = torch.cat([freqs, freqs], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [b, s, heads, dim] by position; computed in fp32, returned in x's dtype."""
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    if cos.dim() == 3:  # per-row positions [b, s, dim]
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    else:
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return (x.float() * cos + rotated * sin).to(x.dtype)


def attention_core(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kind: str,
    dropout: float = 0.0,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of q [b, hq, s, d] over k, v [b, hkv, s, d] (hq a multiple of hkv), with
    dropout probability `dropout` on the attention weights. `mask` [b, 1, s, s] (packed examples,
    ``DocumentMask``) replaces the causal mask; without it ``flash`` keeps SDPA's is_causal path."""
    gqa = q.shape[1] != k.shape[1]
    if mask is not None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, enable_gqa=gqa
        )
    if kind == "flash":
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=dropout, enable_gqa=gqa
        )
    s = q.shape[2]
    mask = torch.ones(s, k.shape[2], dtype=torch.bool, device=q.device).tril()
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout, enable_gqa=gqa
    )


def seed_step(seed: int, step: int, rank: int) -> None:
    """Reseed torch's global generator for optimizer step `step` on `rank`.

    Dropout masks then depend on (seed, step, rank) only: a resumed run draws what an
    uninterrupted one does."""
    torch.manual_seed(zlib.crc32(f"{seed}/{step}/{rank}".encode()))


class _CoreMixin:
    """Runs the attention core, checkpointed when selective recompute is on, or as ring
    attention over the context-parallel group when ``context_parallel`` is set."""

    recompute_core: bool
    kind: str
    context_parallel: ContextParallel | None = None
    dropout: float
    training: bool

    def _positions(self, device: torch.device) -> torch.Tensor | None:
        cp = self.context_parallel
        return None if cp is None else cp.positions(device)

    def _core(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        doc: DocumentMask | None = None,
    ) -> torch.Tensor:
        if self.context_parallel is not None:  # no attention dropout here (backends/torch.py)
            if doc is not None:
                raise ValueError("packed examples (data.packing) do not run with parallel.cp > 1")
            return self.context_parallel.attention(q, k, v)
        p = self.dropout if self.training else 0.0
        core: Callable[..., torch.Tensor] = attention_core
        args: tuple[Any, ...] = (q, k, v, self.kind, p, None if doc is None else doc.mask)
        if doc is not None and doc.block_mask is not None:  # model.packed_attention: flex
            core, args = flex_core, (q, k, v, doc.block_mask)
        if self.recompute_core and torch.is_grad_enabled():
            # use_reentrant=False replays the forward with the same RNG state (preserve_rng_state),
            # so recomputed dropout masks equal the original ones.
            return cast(torch.Tensor, checkpoint(core, *args, use_reentrant=False))
        return core(*args)


class Attention(_CoreMixin, nn.Module):
    """Multi-head / grouped-query attention: wq [h -> heads*d], wk, wv [h -> kv_heads*d], wo."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        shape = ModelShape(cfg)
        h, d, bias = cfg.hidden_size, shape.head_dim, cfg.linear_bias
        self.head_dim = d
        self.kind = cfg.attention
        self.dropout = cfg.attention_dropout
        self.use_rope = cfg.position == "rope"
        self.rope_theta = cfg.rope_theta
        self.recompute_core = False
        self.wq = nn.Linear(h, cfg.num_attention_heads * d, bias=bias)
        self.wk = nn.Linear(h, shape.kv_heads * d, bias=bias)
        self.wv = nn.Linear(h, shape.kv_heads * d, bias=bias)
        self.wo = nn.Linear(cfg.num_attention_heads * d, h, bias=bias)

    def forward(self, x: torch.Tensor, doc: DocumentMask | None = None) -> torch.Tensor:
        b, s, _ = x.shape
        # -1: the local head count under tensor parallelism (the outputs are this rank's shard).
        q = _call(self.wq, x).view(b, s, -1, self.head_dim)
        k = _call(self.wk, x).view(b, s, -1, self.head_dim)
        v = _call(self.wv, x).view(b, s, -1, self.head_dim)
        if self.use_rope:
            positions = self._positions(x.device) if doc is None else doc.positions
            cos, sin = rope_tables(s, self.head_dim, x.device, positions, self.rope_theta)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = self._core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), doc)
        return _call(self.wo, out.transpose(1, 2).reshape(b, s, -1))


class MLAttention(_CoreMixin, nn.Module):
    """Multi-head latent attention (DeepSeek-V2 section 2.1, DeepSeek-V3).

    q: wq_a [h -> q_lora_rank], q_norm (RMSNorm), wq_b [-> heads*(d+r)] (or one wq when
    q_lora_rank is unset); kv: wkv_a [h -> kv_lora_rank + r] whose last r dims are a rope key shared
    by all heads, kv_norm (RMSNorm), wkv_b [kv_lora_rank -> heads*(d+v)]; wo [heads*v -> h].
    d = head_dim (the "nope" part of q/k), r = qk_rope_head_dim, v = v_head_dim. Softmax scale
    1/sqrt(d+r).

    ``shared_key_grad`` (set by the torch engine under tensor parallel, where each rank holds some
    of the heads): applied to the shared rope key, identity forward; its backward sums the key's
    gradient over the tensor-parallel ranks, since each rank's heads contribute only their part
    (Megatron-LM's "copy to tensor-parallel region" operator, Shoeybi et al. 2019).
    """

    shared_key_grad: Callable[[torch.Tensor], torch.Tensor] | None = None

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        shape = ModelShape(cfg)
        h, n = cfg.hidden_size, cfg.num_attention_heads
        d, r, v = shape.head_dim, shape.rope_dim, shape.v_dim
        kv_rank = cfg.kv_lora_rank or 0
        self.nope_dim, self.rope_dim, self.v_dim, self.kv_lora_rank = d, r, v, kv_rank
        self.kind = cfg.attention
        self.dropout = cfg.attention_dropout
        self.rope_theta = cfg.rope_theta
        self.recompute_core = False
        self.wq: nn.Linear | None = None
        self.wq_a: nn.Linear | None = None
        self.q_norm: nn.Module | None = None
        self.wq_b: nn.Linear | None = None
        if cfg.q_lora_rank:
            self.wq_a = nn.Linear(h, cfg.q_lora_rank, bias=False)
            self.q_norm = nn.RMSNorm(cfg.q_lora_rank, eps=RMSNORM_EPS)
            self.wq_b = nn.Linear(cfg.q_lora_rank, n * (d + r), bias=False)
        else:
            self.wq = nn.Linear(h, n * (d + r), bias=False)
        self.wkv_a = nn.Linear(h, kv_rank + r, bias=False)
        self.kv_norm = nn.RMSNorm(kv_rank, eps=RMSNORM_EPS)
        self.wkv_b = nn.Linear(kv_rank, n * (d + v), bias=False)
        self.wo = nn.Linear(n * v, h, bias=cfg.linear_bias)

    def forward(self, x: torch.Tensor, doc: DocumentMask | None = None) -> torch.Tensor:
        b, s, _ = x.shape
        d, r = self.nope_dim, self.rope_dim
        if self.wq is not None:
            q = _call(self.wq, x)
        else:
            assert self.wq_a is not None and self.q_norm is not None and self.wq_b is not None
            q = _call(self.wq_b, _call(self.q_norm, _call(self.wq_a, x)))
        q_nope, q_pe = torch.split(q.view(b, s, -1, d + r), [d, r], dim=-1)
        latent, k_pe = torch.split(_call(self.wkv_a, x), [self.kv_lora_rank, r], dim=-1)
        if self.shared_key_grad is not None:
            k_pe = self.shared_key_grad(k_pe)
        k_pe = k_pe.unsqueeze(2)  # [b, s, 1, r]: one rope key shared by every head
        if r:
            positions = None if doc is None else doc.positions
            cos, sin = rope_tables(s, r, x.device, positions, theta=self.rope_theta)
            q_pe, k_pe = apply_rope(q_pe, cos, sin), apply_rope(k_pe, cos, sin)
        kv = _call(self.wkv_b, _call(self.kv_norm, latent)).view(b, s, -1, d + self.v_dim)
        k_nope, v = torch.split(kv, [d, self.v_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, -1, k_nope.shape[2], -1)], dim=-1)
        q = torch.cat([q_nope, q_pe], dim=-1)
        out = self._core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), doc)
        return _call(self.wo, out.transpose(1, 2).reshape(b, s, -1))


# --- MLP and mixture of experts -------------------------------------------------------------------
def activate(kind: str, a: torch.Tensor, up: torch.Tensor | None) -> torch.Tensor:
    """The MLP's activation of model.activation (swiglu: silu(a) x up; else tanh GELU)."""
    if kind == "swiglu":
        assert up is not None
        return F.silu(a) * up
    return F.gelu(a, approximate="tanh")


class MLP(nn.Module):
    """GELU: w1 [h -> f], w2 [f -> h]. SwiGLU: w1 gate, w3 up [h -> f], w2 down [f -> h]."""

    def __init__(self, hidden: int, ffn: int, activation: str, bias: bool):
        super().__init__()
        if activation not in ("gelu", "swiglu"):
            raise ValueError(f"model.activation={activation!r}: expected gelu or swiglu")
        self.activation = activation
        self.recompute_act = False
        self.w1 = nn.Linear(hidden, ffn, bias=bias)
        self.w2 = nn.Linear(ffn, hidden, bias=bias)
        self.w3: nn.Linear | None = (
            nn.Linear(hidden, ffn, bias=bias) if activation == "swiglu" else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = _call(self.w1, x)
        up = _call(self.w3, x) if self.w3 is not None else None
        if self.recompute_act and torch.is_grad_enabled():
            hidden = cast(
                torch.Tensor,
                checkpoint(activate, self.activation, a, up, use_reentrant=False),
            )
        else:
            hidden = activate(self.activation, a, up)
        return _call(self.w2, hidden)


class MoE(nn.Module):
    """Token-choice top-k mixture of experts plus always-on shared experts (see module doc)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, experts = cfg.hidden_size, cfg.num_experts or 0
        ffn = cfg.moe_ffn_hidden_size or cfg.ffn_hidden_size
        self.top_k = cfg.moe_top_k or 1
        self.num_experts = experts
        self.activation = cfg.activation
        self.expert_parallel: ExpertParallel | None = None
        self.router = nn.Linear(h, experts, bias=False)
        # Keyed by the global expert index (names as a ModuleList's); expert parallel ranks
        # delete the experts they do not hold.
        self.experts = nn.ModuleDict(
            {str(e): MLP(h, ffn, cfg.activation, cfg.linear_bias) for e in range(experts)}
        )
        self.shared_experts = nn.ModuleList(
            MLP(h, ffn, cfg.activation, cfg.linear_bias) for _ in range(cfg.moe_shared_experts)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        logits = _call(self.router, flat)
        top_logits, top_index = logits.topk(self.top_k, dim=-1)
        gates = top_logits.float().softmax(dim=-1).to(flat.dtype)
        # All local experts in one grouped GEMM per projection (launcher.train.model.experts).
        weights = stack(list(self.experts.values()), self.activation, compute_dtype(flat))
        out = routed(flat, top_index, gates, weights, self.expert_parallel, self.num_experts)
        for shared in self.shared_experts:
            out = out + _call(shared, flat)
        return out.view_as(x)


# --- blocks and the model ------------------------------------------------------------------------
class TransformerBlock(nn.Module):
    """Pre-norm block: x + attention(norm(x)), then + feed_forward/moe(norm(.))."""

    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        shape = ModelShape(cfg)
        self.layer_id = layer_id
        self.recompute_full = False
        # train.recompute=selective on a dense block: op-level selective checkpointing.
        self.recompute_selective = False
        self.attention_norm = norm_layer(cfg.norm, cfg.hidden_size, cfg.norm_eps)
        self.attention: nn.Module = MLAttention(cfg) if shape.is_mla else Attention(cfg)
        self.ffn_norm = norm_layer(cfg.norm, cfg.hidden_size, cfg.norm_eps)
        self.residual_dropout = nn.Dropout(cfg.hidden_dropout)
        self.feed_forward: MLP | None = None
        self.moe: MoE | None = None
        if shape.is_moe and layer_id >= cfg.moe_dense_layers:
            self.moe = MoE(cfg)
        else:
            self.feed_forward = MLP(
                cfg.hidden_size, cfg.ffn_hidden_size, cfg.activation, cfg.linear_bias
            )

    def _forward(self, x: torch.Tensor, doc: DocumentMask | None = None) -> torch.Tensor:
        drop = self.residual_dropout
        normed = _call(self.attention_norm, x)
        # The mask goes by keyword: tensor-parallel input hooks see positional inputs only.
        attended = _call(self.attention, normed) if doc is None else self.attention(normed, doc=doc)
        h = x + _call(drop, attended)
        ffn = self.moe if self.moe is not None else self.feed_forward
        assert ffn is not None
        return h + _call(drop, _call(ffn, _call(self.ffn_norm, h)))

    def forward(self, x: torch.Tensor, doc: DocumentMask | None = None) -> torch.Tensor:
        if self.recompute_full and torch.is_grad_enabled():
            return cast(torch.Tensor, checkpoint(self._forward, x, doc, use_reentrant=False))
        if self.recompute_selective and torch.is_grad_enabled():
            out = checkpoint(
                self._forward, x, doc, use_reentrant=False, context_fn=selective_context
            )
            return cast(torch.Tensor, out)
        return self._forward(x, doc)


class Transformer(nn.Module):
    """Decoder-only transformer; any of its parts may be None on a pipeline stage.

    forward(tokens [b, s] int) -> logits [b, s, V]; forward(tokens, targets) -> the mean loss.
    Partial models:
    - input: integer tokens are embedded when ``tok_embeddings`` is present; a floating-point input
      is taken as hidden states [b, s, h] (later pipeline stages; a tied last stage keeps
      ``tok_embeddings`` for its head and still receives hidden states);
    - output: ``norm`` is applied when present; then ``output`` if present, else the tied head
      ``tok_embeddings.weight`` when tie_embeddings and both ``norm`` and ``tok_embeddings`` are
      present; otherwise the hidden states are returned.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.context_parallel: ContextParallel | None = None
        # forward(tokens, targets): the loss over chunks of tokens (set by the engine where it
        # applies; launcher.train.model.chunked_loss), tokens per chunk (None: its default).
        self.chunked_loss = False
        self.loss_chunk_tokens: int | None = None
        h = cfg.hidden_size
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(cfg.vocab_size, h)
        self.pos_embeddings: nn.Embedding | None = (
            nn.Embedding(cfg.seq_length, h) if cfg.position == "learned" else None
        )
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(cfg, i) for i in range(cfg.num_layers)}
        )
        self.norm: nn.Module | None = norm_layer(cfg.norm, h, cfg.norm_eps)
        self.output: nn.Linear | None = (
            None if cfg.tie_embeddings else nn.Linear(h, cfg.vocab_size, bias=False)
        )

    def _document_mask(self, segments: torch.Tensor) -> DocumentMask:
        """Positions and mask of packed rows, by model.packed_attention's kernel on this device."""
        c = self.config
        kernel = resolve_kernel(
            c.packed_attention, segments.device, c.attention, c.attention_dropout
        )
        return DocumentMask(segments, kernel)

    def head_weight(self) -> torch.Tensor | None:
        """The output layer's weight [V, h] (the embedding when tied), or None on a stage
        without the head."""
        if self.norm is None:
            return None
        if self.output is not None:
            return self.output.weight
        if self.config.tie_embeddings and self.tok_embeddings is not None:
            return self.tok_embeddings.weight
        return None

    def forward(
        self,
        tokens: torch.Tensor,
        targets: torch.Tensor | None = None,
        segments: torch.Tensor | None = None,
        loss_divisor: float | None = None,
    ) -> torch.Tensor:
        """Logits [b, s, V] (or hidden states, see the class doc); with `targets` [b, s], the mean
        fp32 cross-entropy instead, over chunks of tokens when ``chunked_loss`` is set (the full
        logits never exist, ``launcher.train.model.chunked_loss``), else over the full logits.

        `segments` [b, s]: the example of each token of packed rows (``DocumentMask``: positions
        restart and attention stays within each example). `loss_divisor`: targets equal to
        ``masked_loss.IGNORE_INDEX`` carry no loss and the summed loss is divided by this
        (``launcher.train.finetune.masked_loss``); None: the plain mean."""
        doc = None if segments is None else self._document_mask(segments)
        if self.tok_embeddings is not None and not tokens.is_floating_point():
            h = _call(self.tok_embeddings, tokens)
            if self.pos_embeddings is not None:
                cp = self.context_parallel
                positions = (
                    doc.positions
                    if doc is not None
                    else torch.arange(tokens.shape[1], device=tokens.device)
                    if cp is None
                    else cp.positions(tokens.device)
                )
                h = h + _call(self.pos_embeddings, positions)
        else:
            h = tokens
        for layer in self.layers.values():
            h = _call(layer, h) if doc is None else layer(h, doc=doc)
        if self.norm is not None:
            h = _call(self.norm, h)
        weight = self.head_weight()
        if targets is not None and self.chunked_loss and weight is not None:
            return chunked_cross_entropy(
                h, weight, targets, self.loss_chunk_tokens, divisor=loss_divisor
            )
        if self.output is not None:
            logits = _call(self.output, h)
        elif weight is not None:
            logits = F.linear(h, weight)
        else:
            logits = h
        return logits if targets is None else masked_loss(logits, targets, loss_divisor)


def build_model(
    cfg: ModelConfig, device: str | torch.device = "cpu", seed: int | None = None
) -> Transformer:
    """The model for `cfg` on `device`. On "meta" no memory is used and nothing is initialised
    (materialise with ``model.to_empty(device=...)`` then ``init_weights(model, seed)``).
    Elsewhere the weights are initialised from `seed` (None: ``torch.initial_seed()``)."""
    device = torch.device(device)
    with device, skip_default_init():
        model = Transformer(cfg)
    if device.type != "meta":
        init_weights(model, seed)
    return model


def apply_context_parallel(model: Transformer, cp: ContextParallel) -> Transformer:
    """Make `model` run on this cp rank's load-balanced chunks: learned positions and RoPE at the
    rank's token positions, attention as ring attention over ``cp.group``. Returns `model`."""
    model.context_parallel = cp
    for module in model.modules():
        if isinstance(module, Attention):
            module.context_parallel = cp
    return model


def apply_expert_parallel(model: nn.Module, ep: ExpertParallel) -> nn.Module:
    """Keep only this ep rank's routed experts in every MoE layer (call before materialising, on
    the meta device, so the others never take memory); their tokens travel by all-to-all."""
    for module in model.modules():
        if isinstance(module, MoE):
            mine = {str(e) for e in ep.local_experts(module.num_experts)}
            for key in list(module.experts.keys()):
                if key not in mine:
                    del module.experts[key]
            module.expert_parallel = ep
    return model


def num_params(model: nn.Module) -> int:
    """Parameters, each shared tensor counted once."""
    return sum(p.numel() for p in model.parameters())


def apply_recompute(model: nn.Module, mode: str) -> nn.Module:
    """Activation recomputation per ``train.recompute``; module names are unchanged.

    full: each TransformerBlock runs under non-reentrant ``torch.utils.checkpoint`` (only its input
    is kept). selective: a dense block under op-level selective checkpointing
    (``selective_context``); an MoE block checkpoints its attention core (SDPA) and its shared
    experts' activation function only (module docstring). none: all off. Returns `model`.
    """
    if mode not in RECOMPUTE_MODES:
        raise ValueError(f"train.recompute={mode!r}: expected one of {', '.join(RECOMPUTE_MODES)}")
    for block in model.modules():
        if not isinstance(block, TransformerBlock):
            continue
        block.recompute_full = mode == "full"
        dense = block.moe is None
        block.recompute_selective = mode == "selective" and dense
        for module in block.modules():
            if isinstance(module, Attention | MLAttention):
                module.recompute_core = mode == "selective" and not dense
            elif isinstance(module, MLP):
                module.recompute_act = mode == "selective" and not dense
    return model


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy, computed in fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
