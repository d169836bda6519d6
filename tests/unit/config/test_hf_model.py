"""model.from_hf=PATH: a Hugging Face config.json becomes the model keys, and back."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from launcher.config.composition.compose import compose_config
from launcher.config.schema import ModelConfig
from launcher.errors import ConfigError
from launcher.export.hf_layout import hf_config
from launcher.plan.model_shape import ModelShape

pytestmark = pytest.mark.unit


def write(folder: Path, config: dict[str, object]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("recipe", ["llama3-8b", "mixtral-8x7b", "gpt-125m", "tiny"])
def test_export_config_read_back_gives_the_same_model(recipe: str, tmp_path: Path) -> None:
    # config.json as `llmtrain export` writes it, read back: the same model. Not carried: the name
    # (hf-<folder>), a rope model's seq_length (a training choice, not a weight shape), and a
    # GPT-2's biases (GPT-2 always has them; export writes zeros for a model without).
    model = compose_config([f"recipe={recipe}"]).config.model
    folder = write(tmp_path / "m", hf_config(model))
    back = compose_config([f"recipe={recipe}", f"model.from_hf={folder}"]).config.model
    assert back.name == "hf-m"
    skip = {"name", "linear_bias"} if model.position == "learned" else {"name", "seq_length"}
    for field in dataclasses.fields(model):
        if field.name not in skip:
            assert effective(back, field.name) == effective(model, field.name), field.name


def effective(m: ModelConfig, name: str) -> object:
    """A key's meaning: None for head_dim / norm_eps stands for the derived value / the norm's
    usual epsilon (launcher/config/schema/model.py), which config.json writes out."""
    if name == "head_dim":
        return ModelShape(m).head_dim
    if name == "norm_eps" and m.norm_eps is None:
        return 1e-5 if m.norm == "layernorm" else 1e-6
    return getattr(m, name)


def test_a_published_llama3_8b_config(tmp_path: Path) -> None:
    # Meta-Llama-3.1-8B's config.json fields (as published with the model): 32 layers of 4096,
    # 14336 MLP, 32 heads over 8 key/value heads, vocab 128256, theta 500000, eps 1e-5, untied.
    folder = write(
        tmp_path / "Llama-3.1-8B",
        {
            "model_type": "llama",
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "vocab_size": 128256,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-05,
            "rope_theta": 500000.0,
            "tie_word_embeddings": False,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0},
        },
    )
    m = compose_config([f"model.from_hf={folder}", "model.num_layers=2"]).config.model
    assert (m.hidden_size, m.ffn_hidden_size, m.num_kv_heads, m.vocab_size) == (
        4096,
        14336,
        8,
        128256,
    )
    assert m.num_layers == 2  # a key given on the command line wins over the file
    assert (m.activation, m.norm, m.position, m.norm_eps, m.rope_theta) == (
        "swiglu",
        "rmsnorm",
        "rope",
        1e-5,
        500000.0,
    )
    assert m.tie_embeddings is False and m.name == "hf-Llama-3.1-8B"
    # The config.json itself may be given, and its keys are traced to it.
    same = compose_config([f"model.from_hf={folder / 'config.json'}"])
    assert same.config.model.hidden_size == 4096


def test_qwen2_and_gpt2(tmp_path: Path) -> None:
    qwen = write(
        tmp_path / "qwen",
        {
            "model_type": "qwen2",
            "hidden_size": 896,
            "intermediate_size": 4864,
            "num_hidden_layers": 24,
            "num_attention_heads": 14,
            "num_key_value_heads": 2,
            "vocab_size": 151936,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": True,
        },
    )
    m = compose_config([f"model.from_hf={qwen}"]).config.model
    assert (m.num_kv_heads, m.tie_embeddings, m.linear_bias) == (2, True, False)
    gpt2 = write(
        tmp_path / "gpt2",
        {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024}
        | {"vocab_size": 50257, "activation_function": "gelu_new"},
    )
    g = compose_config([f"model.from_hf={gpt2}"]).config.model
    assert (g.ffn_hidden_size, g.seq_length, g.position, g.linear_bias) == (
        3072,
        1024,
        "learned",
        True,
    )


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('{"model_type": "t5"}', "model_type 't5' has no llmtrain layout"),
        ('{"model_type": "llama", "hidden_size": "big"}', "must be a number"),
        ("root:x:0:0:root:/root:/bin/bash\n", "is not a JSON file"),
        ("[1, 2]", "holds no JSON object"),
        ('{"model_type": "llama", "hidden_act": "gelu"}', "SwiGLU"),
    ],
)
def test_bad_files_name_the_key_and_never_quote_the_file(
    content: str, says: str, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(ConfigError) as exc:
        compose_config([f"model.from_hf={tmp_path}"])
    message = str(exc.value)
    assert message.startswith("model.from_hf=") and says in message
    assert "/root:/bin/bash" not in message


def test_missing_twice_and_empty(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model\.from_hf=.*cannot be read"):
        compose_config([f"model.from_hf={tmp_path}/nowhere"])
    folder = write(tmp_path / "m", hf_config(compose_config([]).config.model))
    with pytest.raises(ConfigError, match="given 2 times"):
        compose_config([f"model.from_hf={folder}", f"model.from_hf={folder}"])
    with pytest.raises(ConfigError, match="give a Hugging Face model folder"):
        compose_config(["model.from_hf="])
