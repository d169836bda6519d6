"""Hugging Face export layouts, checked against an independent reference forward.

The reference below is written from transformers' documented semantics (modeling_llama.py,
modeling_mixtral.py, modeling_gpt2.py) in numpy and reads only what the exported folder holds: the
HF tensor names and config.json. If a name, a transpose, the q/k/v order, the kv-head grouping, the
router normalisation or a config value were wrong, its logits would not match llmtrain's model.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from launcher.config.schema import ModelConfig
from launcher.export.hf_files import INDEX_FILE, read_hf_folder, write_hf_folder
from launcher.export.hf_layout import LayoutError, from_hf, hf_architecture, hf_config, to_hf
from launcher.train.model.init_weights import init_weights
from launcher.train.model.transformer import Transformer

pytestmark = pytest.mark.unit

LLAMA = ModelConfig(
    num_layers=2,
    hidden_size=32,
    ffn_hidden_size=48,
    num_attention_heads=4,
    num_kv_heads=2,
    vocab_size=50,
    seq_length=12,
    activation="swiglu",
    norm="rmsnorm",
    position="rope",
    tie_embeddings=False,
    rope_theta=500_000.0,
    norm_eps=1e-5,
)
GPT2 = ModelConfig(
    num_layers=2,
    hidden_size=32,
    ffn_hidden_size=64,
    num_attention_heads=4,
    vocab_size=50,
    seq_length=12,
    activation="gelu",
    norm="layernorm",
    position="learned",
    tie_embeddings=True,
    linear_bias=True,
)
CASES = {
    "llama-gqa-untied": LLAMA,
    "llama-tied-bias": dataclasses.replace(LLAMA, tie_embeddings=True, linear_bias=True),
    "mixtral": dataclasses.replace(LLAMA, num_experts=4, moe_top_k=2, moe_ffn_hidden_size=24),
    "gpt2": GPT2,
    "gpt2-no-bias": dataclasses.replace(GPT2, linear_bias=False),
}


# --- the reference: HF semantics in numpy ---------------------------------------------------------
def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def _gelu_new(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """q [heads, s, d], k/v [heads, s, d] -> [s, heads*d]."""
    s, d = q.shape[1], q.shape[2]
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(d)
    scores = np.where(np.tril(np.ones((s, s), dtype=bool)), scores, -np.inf)
    out = _softmax(scores) @ v
    return out.transpose(1, 0, 2).reshape(s, -1)


def _linear(t: dict[str, np.ndarray], name: str, x: np.ndarray) -> np.ndarray:
    y = x @ t[f"{name}.weight"].T
    return y + t[f"{name}.bias"] if f"{name}.bias" in t else y


def reference_llama(t: dict[str, np.ndarray], c: dict, tokens: np.ndarray) -> np.ndarray:
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    s = tokens.shape[0]
    inv = 1.0 / c["rope_theta"] ** (np.arange(0, hd, 2) / hd)
    emb = np.concatenate([np.outer(np.arange(s), inv)] * 2, -1)
    cos, sin = np.cos(emb), np.sin(emb)

    def rope(x: np.ndarray) -> np.ndarray:  # rotate_half
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return x * cos + np.concatenate([-x2, x1], -1) * sin

    x = t["model.embed_tokens.weight"][tokens]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        a = _rms(x, t[f"{p}.input_layernorm.weight"], c["rms_norm_eps"])
        q = _linear(t, f"{p}.self_attn.q_proj", a).reshape(s, nh, hd).transpose(1, 0, 2)
        k = _linear(t, f"{p}.self_attn.k_proj", a).reshape(s, nkv, hd).transpose(1, 0, 2)
        v = _linear(t, f"{p}.self_attn.v_proj", a).reshape(s, nkv, hd).transpose(1, 0, 2)
        rep = nh // nkv  # repeat_kv: query head j reads kv head j // rep
        k, v = np.repeat(rope(k), rep, axis=0), np.repeat(v, rep, axis=0)
        x = x + _linear(t, f"{p}.self_attn.o_proj", _causal_attention(rope(q), k, v))
        m = _rms(x, t[f"{p}.post_attention_layernorm.weight"], c["rms_norm_eps"])
        if "num_local_experts" in c:
            moe = f"{p}.block_sparse_moe"
            probs = _softmax(m @ t[f"{moe}.gate.weight"].T)
            top = np.argsort(-probs, -1)[:, : c["num_experts_per_tok"]]
            out = np.zeros_like(m)
            for row in range(s):
                weights = probs[row, top[row]] / probs[row, top[row]].sum()
                for e, w in zip(top[row], weights, strict=True):
                    ex = f"{moe}.experts.{e}"
                    y = _silu(_linear(t, f"{ex}.w1", m[row])) * _linear(t, f"{ex}.w3", m[row])
                    out[row] += w * _linear(t, f"{ex}.w2", y)
            x = x + out
        else:
            gate = _silu(_linear(t, f"{p}.mlp.gate_proj", m))
            x = x + _linear(t, f"{p}.mlp.down_proj", gate * _linear(t, f"{p}.mlp.up_proj", m))
    x = _rms(x, t["model.norm.weight"], c["rms_norm_eps"])
    head = t["model.embed_tokens.weight"] if c["tie_word_embeddings"] else t["lm_head.weight"]
    return x @ head.T


def reference_gpt2(t: dict[str, np.ndarray], c: dict, tokens: np.ndarray) -> np.ndarray:
    s, h, nh, eps = tokens.shape[0], c["n_embd"], c["n_head"], c["layer_norm_epsilon"]

    def conv1d(name: str, x: np.ndarray) -> np.ndarray:  # Conv1D: x @ W[in, out] + b
        return x @ t[f"{name}.weight"] + t[f"{name}.bias"]

    x = t["transformer.wte.weight"][tokens] + t["transformer.wpe.weight"][:s]
    for i in range(c["n_layer"]):
        p = f"transformer.h.{i}"
        a = _layer_norm(x, t[f"{p}.ln_1.weight"], t[f"{p}.ln_1.bias"], eps)
        q, k, v = np.split(conv1d(f"{p}.attn.c_attn", a), 3, axis=-1)
        heads = [z.reshape(s, nh, h // nh).transpose(1, 0, 2) for z in (q, k, v)]
        x = x + conv1d(f"{p}.attn.c_proj", _causal_attention(*heads))
        m = _layer_norm(x, t[f"{p}.ln_2.weight"], t[f"{p}.ln_2.bias"], eps)
        x = x + conv1d(f"{p}.mlp.c_proj", _gelu_new(conv1d(f"{p}.mlp.c_fc", m)))
    x = _layer_norm(x, t["transformer.ln_f.weight"], t["transformer.ln_f.bias"], eps)
    return x @ t["transformer.wte.weight"].T


# --- tests ---------------------------------------------------------------------------------------
def _trained_like(cfg: ModelConfig) -> Transformer:
    model = Transformer(cfg)
    init_weights(model, seed=3)
    with torch.no_grad():  # norms and biases away from their 1/0 init, so mix-ups show
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(
                    torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.1
                )
    return model.eval()


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_matches_the_reference_forward(case: str, tmp_path: Path) -> None:
    cfg = CASES[case]
    model = _trained_like(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (1, cfg.seq_length), generator=torch.Generator())
    with torch.no_grad():
        ours = model(tokens)[0].numpy().astype(np.float64)
    out = tmp_path / "hf"
    write_hf_folder(out, to_hf(model.state_dict(), cfg), hf_config(cfg))
    tensors, config = read_hf_folder(out)
    assert config["architectures"] == [hf_architecture(cfg)]
    arrays = {k: v.numpy().astype(np.float64) for k, v in tensors.items()}
    reference = reference_gpt2 if config["model_type"] == "gpt2" else reference_llama
    theirs = reference(arrays, config, tokens[0].numpy())
    np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-4)

    # ... and back in (train.init_from): the same logits, bit for bit.
    again = Transformer(cfg).eval()
    again.load_state_dict(from_hf(tensors, cfg), strict=True)
    with torch.no_grad():
        assert torch.equal(again(tokens)[0], model(tokens)[0])


def test_large_exports_are_sharded_with_an_index(tmp_path: Path) -> None:
    model = _trained_like(LLAMA)
    files = write_hf_folder(
        tmp_path / "hf", to_hf(model.state_dict(), LLAMA), hf_config(LLAMA), max_shard_bytes=20_000
    )
    shards = [f for f in files if f.suffix == ".safetensors"]
    assert len(shards) > 2
    index = json.loads((tmp_path / "hf" / INDEX_FILE).read_text())
    assert set(index["weight_map"].values()) == {f.name for f in shards}
    tensors, _ = read_hf_folder(tmp_path / "hf")
    state = model.state_dict()
    assert all(torch.equal(from_hf(tensors, LLAMA)[k], state[k]) for k in state)


def test_export_refuses_to_overwrite_and_leaves_nothing_behind(tmp_path: Path) -> None:
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        write_hf_folder(tmp_path / "hf", {"a": torch.zeros(1)}, {})
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]
    assert (tmp_path / "hf" / "keep.txt").read_text() == "mine"


def test_models_without_a_layout_are_refused() -> None:
    with pytest.raises(LayoutError, match="kv_lora_rank"):
        hf_architecture(dataclasses.replace(LLAMA, kv_lora_rank=16, qk_rope_head_dim=8))
    with pytest.raises(LayoutError, match=r"model\.norm=rmsnorm, model\.activation=gelu"):
        hf_architecture(dataclasses.replace(LLAMA, activation="gelu"))
