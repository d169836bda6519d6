"""Models by name (issue 33, item 8): a model id resolves offline from the local Hugging Face
cache, and says where it looked when it is not there; Qwen3 and Qwen3-MoE configs map to
llmtrain's model (plan prices q/k norm, run refuses it); what a config.json sets that is not
carried over (Llama 3.1's rope_scaling) is said in a note."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.config.composition.compose import compose_config
from launcher.errors import ConfigError
from launcher.plan.model_shape import ModelShape
from launcher.verdict import assess

pytestmark = pytest.mark.unit

# Published configs (huggingface.co/meta-llama/Llama-3.1-8B, Qwen/Qwen3-0.6B, Qwen/Qwen3-30B-A3B
# config.json), the fields the mapping reads.
LLAMA31_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}
QWEN3_06B = {
    "model_type": "qwen3",
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "use_sliding_window": False,
    "tie_word_embeddings": True,
    "vocab_size": 151936,
}
QWEN3_30B_A3B = {
    "model_type": "qwen3_moe",
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "mlp_only_layers": [],
    "moe_intermediate_size": 768,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "vocab_size": 151936,
}


def cache_model(hub: Path, model_id: str, config: dict[str, object], rev: str = "0a1b2c") -> Path:
    repo = hub / f"models--{model_id.replace('/', '--')}"
    (repo / "snapshots" / rev).mkdir(parents=True)
    (repo / "snapshots" / rev / "config.json").write_text(json.dumps(config))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(rev)
    return repo


@pytest.fixture
def clean_hf_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("variable", ["HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME", None])
def test_a_model_id_in_the_local_cache_resolves_offline(
    variable: str | None, clean_hf_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = clean_hf_env / "cache"
    hub = {
        "HF_HOME": root / "hub",
        "HF_HUB_CACHE": root,
        "XDG_CACHE_HOME": root / "huggingface" / "hub",
        None: clean_hf_env / "home" / ".cache" / "huggingface" / "hub",
    }[variable]
    if variable:
        monkeypatch.setenv(variable, str(root))
    cache_model(hub, "meta-llama/Llama-3.1-8B", LLAMA31_8B)
    model = compose_config(["model.from_hf=meta-llama/Llama-3.1-8B"]).config.model
    assert model.name == "hf-Llama-3.1-8B"
    assert (model.num_layers, model.hidden_size, model.num_kv_heads) == (32, 4096, 8)
    assert model.rope_theta == 500000.0


def test_a_revision_and_the_folders_looked_in(
    clean_hf_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(clean_hf_env / "hf"))
    repo = cache_model(clean_hf_env / "hf" / "hub", "Qwen/Qwen3-0.6B", QWEN3_06B, rev="aaa")
    (repo / "snapshots" / "bbb").mkdir()
    (repo / "snapshots" / "bbb" / "config.json").write_text(
        json.dumps({**QWEN3_06B, "num_hidden_layers": 2})
    )
    assert compose_config(["model.from_hf=Qwen/Qwen3-0.6B"]).config.model.num_layers == 28
    assert compose_config(["model.from_hf=Qwen/Qwen3-0.6B@bbb"]).config.model.num_layers == 2
    with pytest.raises(ConfigError) as info:
        compose_config(["model.from_hf=meta-llama/Llama-3.1-8B"])
    text = str(info.value)
    assert "not in the local Hugging Face cache" in text
    assert str(clean_hf_env / "hf" / "hub" / "models--meta-llama--Llama-3.1-8B") in text
    assert "huggingface-cli download meta-llama/Llama-3.1-8B config.json" in text
    # a refs/main that would lead out of the snapshots folder is not followed
    (repo / "refs" / "main").write_text("../../../../etc")
    with pytest.raises(ConfigError, match="not in the local Hugging Face cache"):
        compose_config(["model.from_hf=Qwen/Qwen3-0.6B"])


def test_qwen3_maps_with_qk_norm_and_its_published_size(tmp_path: Path) -> None:
    folder = tmp_path / "Qwen3-0.6B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN3_06B))
    model = compose_config([f"model.from_hf={folder}"]).config.model
    assert model.qk_norm and model.head_dim == 128 and model.tie_embeddings
    # Qwen/Qwen3-0.6B: 596,049,920 parameters (its safetensors index, tied embedding counted once)
    assert ModelShape(model).total_params() == 596_049_920


def test_qwen3_moe_maps_experts_without_a_shared_one(tmp_path: Path) -> None:
    folder = tmp_path / "Qwen3-30B-A3B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN3_30B_A3B))
    model = compose_config([f"model.from_hf={folder}"]).config.model
    assert (model.num_experts, model.moe_top_k, model.moe_ffn_hidden_size) == (128, 8, 768)
    assert model.moe_shared_experts == 0 and model.moe_dense_layers == 0 and model.qk_norm
    shape = ModelShape(model)
    # Qwen's model card: 30.5B parameters in total, 3.3B activated
    assert shape.total_params() / 1e9 == pytest.approx(30.5, abs=0.05)
    assert shape.active_params() / 1e9 == pytest.approx(3.3, abs=0.06)
    interleaved = tmp_path / "interleaved"
    interleaved.mkdir()
    (interleaved / "config.json").write_text(
        json.dumps({**QWEN3_30B_A3B, "decoder_sparse_step": 2})
    )
    with pytest.raises(ConfigError, match="dense layers first"):
        compose_config([f"model.from_hf={interleaved}"])


def test_plan_prices_qk_norm_and_run_refuses_it(tmp_path: Path) -> None:
    folder = tmp_path / "Qwen3-0.6B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN3_06B))
    verdict = assess([f"model.from_hf={folder}", "cluster=h100-80gb", "train.global_batch_size=64"])
    assert verdict.valid and verdict.plan is not None
    assert any("model.qk_norm=true" in p for p in verdict.refusals["run"])
    assert verdict.exit_code("validate") == 0 and verdict.exit_code("run") == 2


def test_rope_scaling_is_said_not_dropped(tmp_path: Path) -> None:
    folder = tmp_path / "Llama-3.1-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA31_8B))
    composed = compose_config([f"model.from_hf={folder}"])
    assert any("rope_scaling (llama3, factor 8.0) is not carried over" in n for n in composed.notes)
    verdict = assess([f"model.from_hf={folder}", "cluster=h100-80gb", "train.global_batch_size=64"])
    assert any("rope_scaling" in note for note in verdict.notes)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({**LLAMA31_8B, "rope_scaling": None}))
    assert compose_config([f"model.from_hf={plain}"]).notes == ()
