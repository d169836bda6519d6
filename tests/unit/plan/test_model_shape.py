"""Parameter counts against published totals, and term by term for a small model."""

from __future__ import annotations

import pytest

from launcher.config.composition.compose import compose_config
from launcher.config.schema import ModelConfig
from launcher.plan.model_shape import ModelShape, human_count

pytestmark = pytest.mark.unit


def test_tiny_gpt_term_by_term() -> None:
    # h=128, f=512, V=256, s=256, 4 layers, LayerNorm, GELU, biases, tied, learned positions.
    m = ModelConfig(
        num_layers=4,
        hidden_size=128,
        ffn_hidden_size=512,
        num_attention_heads=4,
        vocab_size=256,
        seq_length=256,
        linear_bias=True,
        tie_embeddings=True,
    )
    shape = ModelShape(m)
    attention = 4 * 128 * 128 + 4 * 128  # q, k, v, o weights + biases (MHA: kv dim = h)
    mlp = 2 * 128 * 512 + 512 + 128  # fc1 + fc2 weights, their biases
    norms = 2 * (2 * 128)  # two LayerNorms, weight + bias
    layer = attention + mlp + norms
    embedding = 256 * 128 + 256 * 128  # tokens + positions
    final_norm = 2 * 128
    assert shape.attention_params() == attention
    assert shape.mlp_params(512) == mlp
    assert shape.total_params() == 4 * layer + embedding + final_norm


# (recipe, published total parameters, tolerance). Sources: Llama 3 paper Table 3 (8B, 70B,
# 405B); Mixtral paper (46.7B total, 12.9B active); DeepSeek-V3 report (671B total, 37B active);
# GPT-3 paper Table 2.1 (175B).
PUBLISHED = [
    ("llama3-8b", 8.03e9, 0.01),
    ("llama3-70b", 70.6e9, 0.01),
    ("llama3-405b", 405.9e9, 0.01),
    ("mixtral-8x7b", 46.7e9, 0.01),
    ("deepseek-v3", 671e9, 0.01),
    ("gpt3-175b", 175e9, 0.02),
]


@pytest.mark.parametrize(("recipe", "published", "tolerance"), PUBLISHED)
def test_published_totals(recipe: str, published: float, tolerance: float) -> None:
    total = ModelShape(compose_config([f"recipe={recipe}"]).config.model).total_params()
    assert abs(total - published) / published < tolerance, human_count(total)


def test_moe_active_params() -> None:
    mixtral = ModelShape(compose_config(["recipe=mixtral-8x7b"]).config.model)
    assert abs(mixtral.active_params() - 12.9e9) / 12.9e9 < 0.01
    deepseek = ModelShape(compose_config(["recipe=deepseek-v3"]).config.model)
    assert abs(deepseek.active_params() - 37e9) / 37e9 < 0.03


def test_human_count() -> None:
    assert human_count(8_030_261_248) == "8.03B"
    assert human_count(405_853_388_800) == "406B"
    assert human_count(999) == "999"
