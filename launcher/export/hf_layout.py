"""Hugging Face checkpoint layouts for llmtrain's model: tensor names, orientation, config.json.

Three layouts, chosen by the model's shape (``hf_architecture``):

- ``LlamaForCausalLM``: RMSNorm, SwiGLU, RoPE (rotate-half, as llmtrain's model, so q/k need no
  permutation), optional grouped-query attention, tied or untied head, optional linear biases
  (``attention_bias`` / ``mlp_bias``). Names from transformers' ``modeling_llama.py``.
- ``MixtralForCausalLM``: the same with every layer a top-k softmax-gated mixture of SwiGLU experts
  (``block_sparse_moe.gate`` and ``experts.{j}.w1/w2/w3``, Mixtral's own names).
- ``GPT2LMHeadModel``: LayerNorm, tanh-GELU (``gelu_new``), learned positions, tied head, multi-head
  attention. GPT-2's ``Conv1D`` stores weights as [in, out] (the transpose of ``nn.Linear``) and
  fuses q, k, v into one ``c_attn``. A model without linear biases exports zero biases.

Anything else (MLA, shared experts, dense-then-MoE layers, ...) has no layout here and is refused
with the keys that make it so. Pure functions over ``{name: array}`` mappings: the arrays may be
torch tensors or numpy arrays (only ``.T``, slicing and concatenation are used).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from launcher.config.norms import norm_epsilon
from launcher.config.schema import ModelConfig
from launcher.plan.model_shape import ModelShape


class LayoutError(ValueError):
    """The model has no Hugging Face layout here; the message names the keys."""


def hf_architecture(m: ModelConfig) -> str:
    """The transformers architecture that holds this model exactly, or LayoutError."""
    shape = ModelShape(m)
    problems: list[str] = []
    if shape.is_mla:
        problems.append("model.kv_lora_rank (multi-head latent attention)")
    if shape.is_moe and (m.moe_shared_experts or m.moe_dense_layers):
        problems.append("model.moe_shared_experts / model.moe_dense_layers (DeepSeek-style MoE)")
    if problems:
        raise LayoutError("no Hugging Face layout here for " + "; ".join(problems))
    llama_like = m.norm == "rmsnorm" and m.activation == "swiglu" and m.position == "rope"
    gpt2_like = m.norm == "layernorm" and m.activation == "gelu" and m.position == "learned"
    if llama_like:
        return "MixtralForCausalLM" if shape.is_moe else "LlamaForCausalLM"
    if (
        gpt2_like
        and not shape.is_moe
        and m.tie_embeddings
        and shape.kv_heads == m.num_attention_heads
    ):
        return "GPT2LMHeadModel"
    raise LayoutError(
        "no Hugging Face layout here for model.norm="
        f"{m.norm}, model.activation={m.activation}, model.position={m.position}, "
        f"model.tie_embeddings={m.tie_embeddings}, kv heads {shape.kv_heads}: use "
        "rmsnorm+swiglu+rope (Llama / Mixtral) or layernorm+gelu+learned, tied, multi-head (GPT-2)"
    )


def hf_config(m: ModelConfig, torch_dtype: str = "float32") -> dict[str, Any]:
    """config.json for the architecture `hf_architecture(m)` names."""
    arch = hf_architecture(m)
    shape = ModelShape(m)
    if arch == "GPT2LMHeadModel":
        return {
            "architectures": [arch],
            "model_type": "gpt2",
            "vocab_size": m.vocab_size,
            "n_positions": m.seq_length,
            "n_embd": m.hidden_size,
            "n_layer": m.num_layers,
            "n_head": m.num_attention_heads,
            "n_inner": m.ffn_hidden_size,
            "activation_function": "gelu_new",
            "layer_norm_epsilon": norm_epsilon("layernorm", m.norm_eps),
            "resid_pdrop": m.hidden_dropout,
            "embd_pdrop": 0.0,
            "attn_pdrop": m.attention_dropout,
            "tie_word_embeddings": True,
            "torch_dtype": torch_dtype,
        }
    config: dict[str, Any] = {
        "architectures": [arch],
        "model_type": "mixtral" if arch == "MixtralForCausalLM" else "llama",
        "vocab_size": m.vocab_size,
        "hidden_size": m.hidden_size,
        "intermediate_size": (m.moe_ffn_hidden_size or m.ffn_hidden_size)
        if shape.is_moe
        else m.ffn_hidden_size,
        "num_hidden_layers": m.num_layers,
        "num_attention_heads": m.num_attention_heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": m.seq_length,
        "rms_norm_eps": norm_epsilon("rmsnorm", m.norm_eps),
        "rope_theta": m.rope_theta,
        "attention_dropout": m.attention_dropout,
        "tie_word_embeddings": m.tie_embeddings,
        "torch_dtype": torch_dtype,
    }
    if arch == "MixtralForCausalLM":
        config["num_local_experts"] = m.num_experts
        config["num_experts_per_tok"] = m.moe_top_k or 1
    else:
        config["attention_bias"] = m.linear_bias
        config["mlp_bias"] = m.linear_bias
    return config


# --- names ---------------------------------------------------------------------------------------
def _llama_names(m: ModelConfig) -> dict[str, str]:
    """llmtrain name -> HF name for the Llama and Mixtral layouts (weights kept as nn.Linear)."""
    names = {
        "tok_embeddings.weight": "model.embed_tokens.weight",
        "norm.weight": "model.norm.weight",
    }
    if not m.tie_embeddings:
        names["output.weight"] = "lm_head.weight"
    kinds = ("weight", "bias") if m.linear_bias else ("weight",)
    for i in range(m.num_layers):
        ours, theirs = f"layers.{i}", f"model.layers.{i}"
        names[f"{ours}.attention_norm.weight"] = f"{theirs}.input_layernorm.weight"
        names[f"{ours}.ffn_norm.weight"] = f"{theirs}.post_attention_layernorm.weight"
        for w, proj in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj"), ("wo", "o_proj")):
            for kind in kinds:
                names[f"{ours}.attention.{w}.{kind}"] = f"{theirs}.self_attn.{proj}.{kind}"
        if m.num_experts:
            names[f"{ours}.moe.router.weight"] = f"{theirs}.block_sparse_moe.gate.weight"
            for j in range(m.num_experts):
                for w in ("w1", "w2", "w3"):
                    for kind in kinds:
                        names[f"{ours}.moe.experts.{j}.{w}.{kind}"] = (
                            f"{theirs}.block_sparse_moe.experts.{j}.{w}.{kind}"
                        )
        else:
            for w, proj in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
                for kind in kinds:
                    names[f"{ours}.feed_forward.{w}.{kind}"] = f"{theirs}.mlp.{proj}.{kind}"
    return names


Array = Any
Transform = Callable[[Mapping[str, Array]], dict[str, Array]]


@dataclass(frozen=True)
class Recipe:
    """One HF tensor: made by `make` from llmtrain's tensors `inputs` (in that order)."""

    inputs: tuple[str, ...]
    make: Callable[[list[Array]], Array]


def _same(parts: list[Array]) -> Array:
    return parts[0]


def hf_recipes(m: ModelConfig) -> dict[str, Recipe]:
    """{HF name: Recipe} of `hf_architecture(m)`: each HF tensor from the few llmtrain tensors
    it is made of (one, or a GPT-2 layer's q, k, v), so an export can make them one at a time."""
    if hf_architecture(m) == "GPT2LMHeadModel":
        return _gpt2_recipes(m)
    return {theirs: Recipe((ours,), _same) for ours, theirs in _llama_names(m).items()}


def to_hf(state: Mapping[str, Array], m: ModelConfig) -> dict[str, Array]:
    """llmtrain's full (unsharded) state dict -> HF tensors of `hf_architecture(m)`."""
    recipes = hf_recipes(m)
    if hf_architecture(m) != "GPT2LMHeadModel":
        _check_names(state, [r.inputs[0] for r in recipes.values()], "llmtrain checkpoint")
    return {name: r.make([state[k] for k in r.inputs]) for name, r in recipes.items()}


def from_hf(tensors: Mapping[str, Array], m: ModelConfig) -> dict[str, Array]:
    """HF tensors of `hf_architecture(m)` -> llmtrain's state dict (for train.init_from)."""
    if hf_architecture(m) == "GPT2LMHeadModel":
        return _gpt2_to_ours(tensors, m)
    names = _llama_names(m)
    _check_names(tensors, names.values(), "Hugging Face checkpoint")
    return {ours: tensors[theirs] for ours, theirs in names.items()}


def hf_renames(m: ModelConfig) -> dict[str, str] | None:
    """llmtrain name -> HF name where the HF layout renames tensors and nothing else (Llama,
    Mixtral: a rank can read its slice of each tensor from the file); None where tensors are
    transformed (GPT-2's fused, transposed attention: ``hf_slices``)."""
    if hf_architecture(m) == "GPT2LMHeadModel":
        return None
    return _llama_names(m)


@dataclass(frozen=True)
class Slice:
    """Where one llmtrain tensor lies in an HF tensor: `name`, transposed or not, from row
    `first` of the (transposed) HF tensor on; ours[r, c] = hf.T[first + r, c] when transposed."""

    name: str
    transposed: bool = False
    first: int = 0


def hf_slices(m: ModelConfig) -> dict[str, Slice]:
    """{llmtrain name: Slice} of every tensor of `hf_architecture(m)`: a box of ours is a box of
    theirs (read by slice for train.init_from)."""
    if hf_architecture(m) != "GPT2LMHeadModel":
        return {ours: Slice(theirs) for ours, theirs in _llama_names(m).items()}
    h = m.hidden_size
    out = {
        "tok_embeddings.weight": Slice("transformer.wte.weight"),
        "pos_embeddings.weight": Slice("transformer.wpe.weight"),
        "norm.weight": Slice("transformer.ln_f.weight"),
        "norm.bias": Slice("transformer.ln_f.bias"),
    }
    kinds = ("weight", "bias") if m.linear_bias else ("weight",)
    for i in range(m.num_layers):
        ours, theirs = f"layers.{i}", f"transformer.h.{i}"
        for ln, hf_ln in (("attention_norm", "ln_1"), ("ffn_norm", "ln_2")):
            for kind in ("weight", "bias"):
                out[f"{ours}.{ln}.{kind}"] = Slice(f"{theirs}.{hf_ln}.{kind}")
        for j, w in enumerate(("wq", "wk", "wv")):
            for kind in kinds:
                transposed = kind == "weight"
                fused = f"{theirs}.attn.c_attn.{kind}"
                out[f"{ours}.attention.{w}.{kind}"] = Slice(fused, transposed, j * h)
        for ours_w, theirs_w in (
            ("attention.wo", "attn.c_proj"),
            ("feed_forward.w1", "mlp.c_fc"),
            ("feed_forward.w2", "mlp.c_proj"),
        ):
            for kind in kinds:
                out[f"{ours}.{ours_w}.{kind}"] = Slice(
                    f"{theirs}.{theirs_w}.{kind}", kind == "weight"
                )
    return out


def _check_names(have: Mapping[str, Array], want: Any, what: str) -> None:
    missing = sorted(set(want) - set(have))
    if missing:
        shown = ", ".join(missing[:4]) + (
            f" and {len(missing) - 4} more" if len(missing) > 4 else ""
        )
        raise LayoutError(f"{what} lacks {shown}: does it hold this model.* shape?")


def _zeros_like_rows(weight: Array, rows: int) -> Array:
    return weight[:rows, 0] * 0


def _transposed(parts: list[Array]) -> Array:
    return parts[0].T


def _zero_bias(parts: list[Array]) -> Array:
    return _zeros_like_rows(parts[0], parts[0].shape[0])


def _fused_qkv(parts: list[Array]) -> Array:
    return _cat(parts, 0).T


def _fused_zero_bias(parts: list[Array]) -> Array:
    return _cat([_zero_bias([p]) for p in parts], 0)


def _gpt2_recipes(m: ModelConfig) -> dict[str, Recipe]:
    """GPT-2's tensors from ours: Conv1D weights transposed, q/k/v fused into c_attn, zero biases
    where the model has none."""
    out = {
        "transformer.wte.weight": Recipe(("tok_embeddings.weight",), _same),
        "transformer.wpe.weight": Recipe(("pos_embeddings.weight",), _same),
        "transformer.ln_f.weight": Recipe(("norm.weight",), _same),
        "transformer.ln_f.bias": Recipe(("norm.bias",), _same),
    }
    for i in range(m.num_layers):
        ours, theirs = f"layers.{i}", f"transformer.h.{i}"
        for ln, hf_ln in (("attention_norm", "ln_1"), ("ffn_norm", "ln_2")):
            out[f"{theirs}.{hf_ln}.weight"] = Recipe((f"{ours}.{ln}.weight",), _same)
            out[f"{theirs}.{hf_ln}.bias"] = Recipe((f"{ours}.{ln}.bias",), _same)
        qkv = tuple(f"{ours}.attention.{w}" for w in ("wq", "wk", "wv"))
        out[f"{theirs}.attn.c_attn.weight"] = Recipe(tuple(f"{p}.weight" for p in qkv), _fused_qkv)
        out[f"{theirs}.attn.c_attn.bias"] = (
            Recipe(tuple(f"{p}.bias" for p in qkv), _concat)
            if m.linear_bias
            else Recipe(tuple(f"{p}.weight" for p in qkv), _fused_zero_bias)
        )
        for ours_w, theirs_w in (
            ("attention.wo", "attn.c_proj"),
            ("feed_forward.w1", "mlp.c_fc"),
            ("feed_forward.w2", "mlp.c_proj"),
        ):
            weight = f"{ours}.{ours_w}.weight"
            out[f"{theirs}.{theirs_w}.weight"] = Recipe((weight,), _transposed)
            out[f"{theirs}.{theirs_w}.bias"] = (
                Recipe((f"{ours}.{ours_w}.bias",), _same)
                if m.linear_bias
                else Recipe((weight,), _zero_bias)
            )
    return out


def _concat(parts: list[Array]) -> Array:
    return _cat(parts, 0)


def _gpt2_to_ours(tensors: Mapping[str, Array], m: ModelConfig) -> dict[str, Array]:
    h = m.hidden_size
    need = ["transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight"]
    _check_names(tensors, need, "Hugging Face checkpoint")
    out = {
        "tok_embeddings.weight": tensors["transformer.wte.weight"],
        "pos_embeddings.weight": tensors["transformer.wpe.weight"],
        "norm.weight": tensors["transformer.ln_f.weight"],
        "norm.bias": tensors["transformer.ln_f.bias"],
    }
    for i in range(m.num_layers):
        ours, theirs = f"layers.{i}", f"transformer.h.{i}"
        for ln, hf_ln in (("attention_norm", "ln_1"), ("ffn_norm", "ln_2")):
            out[f"{ours}.{ln}.weight"] = tensors[f"{theirs}.{hf_ln}.weight"]
            out[f"{ours}.{ln}.bias"] = tensors[f"{theirs}.{hf_ln}.bias"]
        qkv = tensors[f"{theirs}.attn.c_attn.weight"].T
        qkv_bias = tensors[f"{theirs}.attn.c_attn.bias"]
        for j, w in enumerate(("wq", "wk", "wv")):
            out[f"{ours}.attention.{w}.weight"] = qkv[j * h : (j + 1) * h]
            if m.linear_bias:
                out[f"{ours}.attention.{w}.bias"] = qkv_bias[j * h : (j + 1) * h]
        for ours_w, theirs_w in (
            ("attention.wo", "attn.c_proj"),
            ("feed_forward.w1", "mlp.c_fc"),
            ("feed_forward.w2", "mlp.c_proj"),
        ):
            out[f"{ours}.{ours_w}.weight"] = tensors[f"{theirs}.{theirs_w}.weight"].T
            if m.linear_bias:
                out[f"{ours}.{ours_w}.bias"] = tensors[f"{theirs}.{theirs_w}.bias"]
    return out


def _cat(parts: list[Array], dim: int) -> Array:
    first = parts[0]
    if hasattr(first, "new_empty"):  # torch
        import torch

        return torch.cat(parts, dim)
    import numpy as np

    return np.concatenate(parts, axis=dim)
