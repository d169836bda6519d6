"""The KV cache of `llmtrain sample` (launcher/train/kv_cache.py): prefill then one token at a
time gives the full forward's logits at every position (GQA with RoPE, learned positions, tied
head), and what it cannot run is said up front."""

from __future__ import annotations

import pytest
import torch

from launcher.config.schema import ModelConfig
from launcher.train.kv_cache import KVCache, supports
from launcher.train.model.transformer import build_model

BASE = dict(num_layers=2, hidden_size=32, ffn_hidden_size=48, num_attention_heads=4,
            vocab_size=50, seq_length=16, norm="rmsnorm", activation="swiglu")  # fmt: skip


@pytest.mark.parametrize(
    "shape",
    [
        {"num_kv_heads": 2, "position": "rope", "tie_embeddings": False},
        {"num_kv_heads": 4, "position": "learned", "tie_embeddings": True},
    ],
)
def test_cached_logits_equal_the_full_forward(shape: dict[str, object]) -> None:
    cfg = ModelConfig(**BASE, **shape)  # type: ignore[arg-type]
    model = build_model(cfg, "cpu", seed=1).eval()
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (2, cfg.seq_length), generator=generator)
    with torch.no_grad():
        full = model(tokens)
    assert supports(model)
    cache = KVCache(model)
    parts = [cache.forward(tokens[:, :5])]  # the prompt at once, then token by token
    parts += [cache.forward(tokens[:, i : i + 1]) for i in range(5, cfg.seq_length)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="at most seq_length"):
        cache.forward(tokens[:, :1])


def test_multi_head_latent_attention_keeps_the_full_forward() -> None:
    cfg = ModelConfig(**BASE, kv_lora_rank=8, qk_rope_head_dim=4, v_head_dim=8, position="rope")  # type: ignore[arg-type]
    assert not supports(build_model(cfg, "cpu", seed=1))
