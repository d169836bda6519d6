"""A key/value cache for generation (`llmtrain sample`): each new token runs through the model once,
attending to the keys and values of the tokens before it kept from earlier steps, instead of the
whole window being run again (``launcher.train.model.transformer.Transformer.forward``).

The cached forward is the model's own forward split by position: the same modules (embeddings,
norms, wq/wk/wv/wo, feed-forward or MoE, head), rotary tables at the absolute positions of the new
tokens, and a causal mask over [cached + new] keys; its logits equal the full forward's
(tests/unit/train/test_kv_cache.py). It covers the standard attention (``model.Attention``: MHA and
GQA, RoPE or learned positions) of a whole model on one device; ``supports`` says no for multi-head
latent attention and partial or parallelised models, which keep the full forward. The cache holds
at most ``seq_length`` positions: past it the window slides and every position would move, so the
caller goes back to the full forward of the newest window (what the model was trained on).
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F

from launcher.train.model.transformer import (
    Attention,
    Transformer,
    TransformerBlock,
    _call,
    apply_rope,
    rope_tables,
)


def supports(model: Any) -> bool:
    """Whether ``KVCache`` can run `model` (a whole Transformer with standard attention)."""
    if not isinstance(model, Transformer) or model.context_parallel is not None:
        return False
    if model.tok_embeddings is None or model.norm is None:
        return False
    return all(isinstance(layer.attention, Attention) for layer in model.layers.values())


class KVCache:
    """The keys and values [b, kv_heads, cached, d] of each layer, grown by ``forward``."""

    def __init__(self, model: Transformer):
        assert supports(model)
        self.model = model
        self.length = 0
        self.keys: dict[str, torch.Tensor] = {}
        self.values: dict[str, torch.Tensor] = {}

    def _attend(self, name: str, attention: Attention, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        d = attention.head_dim
        q = attention.wq(x).view(b, s, -1, d)
        k = attention.wk(x).view(b, s, -1, d)
        v = attention.wv(x).view(b, s, -1, d)
        if attention.use_rope:
            positions = torch.arange(self.length, self.length + s, device=x.device)
            cos, sin = rope_tables(s, d, x.device, positions, attention.rope_theta)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        if name in self.keys:
            k = torch.cat([self.keys[name], k], dim=2)
            v = torch.cat([self.values[name], v], dim=2)
        self.keys[name], self.values[name] = k, v
        total = k.shape[2]
        # New token i (absolute position length + i) sees keys 0 .. length + i.
        mask = torch.ones(s, total, dtype=torch.bool, device=x.device).tril(self.length)
        q = q.transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1]
        )
        return _call(attention.wo, out.transpose(1, 2).reshape(b, s, -1))

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [b, s, V] of `tokens` [b, s], the positions after the cached ones."""
        model = self.model
        s = tokens.shape[1]
        if self.length + s > model.config.seq_length:
            raise ValueError("the KV cache holds at most seq_length positions")
        assert model.tok_embeddings is not None and model.norm is not None
        h = model.tok_embeddings(tokens)
        if model.pos_embeddings is not None:
            positions = torch.arange(self.length, self.length + s, device=tokens.device)
            h = h + model.pos_embeddings(positions)
        for name, module in model.layers.items():
            layer = cast(TransformerBlock, module)
            attention = layer.attention
            assert isinstance(attention, Attention)
            h = h + self._attend(name, attention, _call(layer.attention_norm, h))
            ffn = layer.moe if layer.moe is not None else layer.feed_forward
            assert ffn is not None
            h = h + _call(ffn, _call(layer.ffn_norm, h))
        self.length += s
        h = model.norm(h)
        weight = model.head_weight()
        assert weight is not None
        return model.output(h) if model.output is not None else F.linear(h, weight)
