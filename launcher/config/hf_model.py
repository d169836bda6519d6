"""``model.from_hf=PATH``: the model keys of a Hugging Face model, read from its config.json.

PATH is a model folder (its ``config.json``) or the config.json itself. The override expands, in
place, into the ``model.*`` overrides that give llmtrain's model the same shape; a ``model.*`` key
given anywhere else on the command line (or in ``--config``) wins over the file's value. Weights
are not read here: ``train.init_from=PATH`` loads them (launcher/train/init_from.py), and refuses
tensors the shape does not hold.

Architectures (``model_type``), their fields as transformers' configuration classes name them:
- ``llama``, ``mistral``, ``qwen2``: RMSNorm, SwiGLU (``hidden_act`` silu), RoPE (``rope_theta``),
  grouped-query attention (``num_key_value_heads``), ``head_dim`` when given, tied or untied
  head (``tie_word_embeddings``), ``attention_bias`` (Llama) for biases on every projection.
- ``mixtral``: the same with ``num_local_experts`` experts, ``num_experts_per_tok`` active.
- ``gpt2``: LayerNorm, GELU, learned positions (``n_positions`` becomes ``model.seq_length``, as
  the position table's size), tied head, biases, multi-head attention.
Not modelled, and so not carried over (the shape is still exact): ``rope_scaling`` (Llama 3.1's
long-context frequency scaling), Mistral's ``sliding_window``, Qwen2's q/k/v-only biases (llmtrain
has biases on every projection or none; ``train.init_from`` of Qwen2 weights refuses them).
The file is read bounded (``launcher.bounded_read``: a regular file, opened without blocking, at
most 1 MiB of JSON nested at most 32 deep); errors name the field and quote a value only as a
short, escaped excerpt (``launcher.excerpt``).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from launcher import bounded_read
from launcher.config import config_file
from launcher.errors import ConfigError
from launcher.excerpt import excerpt

KEY = "model.from_hf"
LLAMA_LIKE = ("llama", "mistral", "qwen2", "mixtral")
SUPPORTED = (*LLAMA_LIKE, "gpt2")


# No model dimension or hyper-parameter of a real config.json is anywhere near this.
_LARGEST = 1e15


def _num(config: dict[str, Any], field: str, where: str, default: Any = None) -> Any:
    value = config.get(field, default)
    if (
        value is None
        or isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or abs(value) > _LARGEST
    ):
        raise ConfigError([f"{where}: {field} must be a number, found {excerpt(value)}"])
    return value


def _count(config: dict[str, Any], field: str, where: str, default: Any = None) -> int:
    """A positive whole number (a layer, head or vocabulary count, a width)."""
    value = _num(config, field, where, default)
    if value <= 0 or value != int(value):
        raise ConfigError([f"{where}: {field} must be a positive whole number, found {value}"])
    return int(value)


def model_keys(config: dict[str, Any], where: str, name: str) -> dict[str, Any]:
    """llmtrain's model keys (without the `model.` prefix) for a config.json's contents."""
    kind = config.get("model_type")
    if kind not in SUPPORTED:
        raise ConfigError(
            [
                f"{where}: model_type {excerpt(kind)} has no llmtrain layout; model.from_hf reads "
                f"{', '.join(SUPPORTED)} models (or set the model.* keys yourself)"
            ]
        )
    if kind == "gpt2":
        hidden = _count(config, "n_embd", where)
        act = config.get("activation_function", "gelu_new")
        if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
            raise ConfigError(
                [f"{where}: activation_function {excerpt(act)}; llmtrain's GPT-2 is GELU"]
            )
        return {
            "name": name,
            "num_layers": _count(config, "n_layer", where),
            "hidden_size": hidden,
            "ffn_hidden_size": _count(config, "n_inner", where)
            if config.get("n_inner") is not None
            else 4 * hidden,
            "num_attention_heads": _count(config, "n_head", where),
            "num_kv_heads": None,
            "head_dim": None,
            "vocab_size": _count(config, "vocab_size", where),
            "seq_length": _count(config, "n_positions", where),
            "activation": "gelu",
            "norm": "layernorm",
            "norm_eps": float(_num(config, "layer_norm_epsilon", where, 1e-5)),
            "position": "learned",
            "tie_embeddings": True,
            "linear_bias": True,
            "attention_dropout": float(_num(config, "attn_pdrop", where, 0.0)),
            "hidden_dropout": float(_num(config, "resid_pdrop", where, 0.0)),
            "num_experts": None,
            "moe_top_k": None,
            "moe_ffn_hidden_size": None,
        }
    act = config.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ConfigError(
            [f"{where}: hidden_act {excerpt(act)}; llmtrain's {kind} MLP is SwiGLU (silu)"]
        )
    heads = _count(config, "num_attention_heads", where)
    hidden = _count(config, "hidden_size", where)
    head_dim = config.get("head_dim")
    keys: dict[str, Any] = {
        "name": name,
        "num_layers": _count(config, "num_hidden_layers", where),
        "hidden_size": hidden,
        "ffn_hidden_size": _count(config, "intermediate_size", where),
        "num_attention_heads": heads,
        "num_kv_heads": _count(config, "num_key_value_heads", where, heads),
        "head_dim": None
        if head_dim in (None, hidden // heads)
        else _count(config, "head_dim", where),
        "vocab_size": _count(config, "vocab_size", where),
        "activation": "swiglu",
        "norm": "rmsnorm",
        "norm_eps": float(_num(config, "rms_norm_eps", where, 1e-6)),
        "position": "rope",
        "rope_theta": float(_num(config, "rope_theta", where, 10000.0)),
        "tie_embeddings": bool(config.get("tie_word_embeddings", kind == "qwen2")),
        "linear_bias": bool(config.get("attention_bias", False)) if kind == "llama" else False,
        "attention_dropout": float(_num(config, "attention_dropout", where, 0.0)),
        "hidden_dropout": 0.0,
        "num_experts": None,
        "moe_top_k": None,
        "moe_ffn_hidden_size": None,
    }
    if kind == "mixtral":
        keys["num_experts"] = _count(config, "num_local_experts", where)
        keys["moe_top_k"] = _count(config, "num_experts_per_tok", where)
        keys["moe_ffn_hidden_size"] = keys["ffn_hidden_size"]
    return keys


def _read_json(path: Path, where: str) -> dict[str, Any]:
    """config.json as a mapping: a regular file (a symbolic link to one is fine: the Hugging Face
    cache links snapshots to blobs) of at most 1 MiB of JSON. Errors never quote the file."""
    try:
        node = bounded_read.read_json(
            path, max_bytes=config_file.MAX_BYTES, max_depth=32, follow_symlinks=True
        )
    except OSError as exc:
        raise ConfigError([f"{where}: {path} cannot be read ({exc.strerror})"]) from None
    except bounded_read.FileRefused as exc:
        why = "is not a JSON file" if str(exc).startswith("is not JSON") else str(exc)
        raise ConfigError([f"{where}: {path} {why} (a model's config.json)"]) from None
    if not isinstance(node, dict):
        raise ConfigError([f"{where}: {path} holds no JSON object (a model's config.json)"])
    return node


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _explicit_keys(overrides: tuple[str, ...]) -> set[str]:
    return {
        text.lstrip("+~").partition("=")[0].strip()
        for text in overrides
        if not text.lstrip("+").startswith(KEY)
    }


def expand(overrides: tuple[str, ...]) -> tuple[str, ...]:
    """Each `model.from_hf=PATH` replaced, in place, by the model keys of PATH's config.json;
    keys given elsewhere win. Raises ConfigError naming model.from_hf."""
    found = [t for t in overrides if t.lstrip("+").partition("=")[0].strip() == KEY]
    if not found:
        return overrides
    if len(found) > 1:
        raise ConfigError([f"{KEY} is given {len(found)} times; give one model"])
    explicit = _explicit_keys(overrides)
    out: list[str] = []
    for text in overrides:
        if text not in found:
            out.append(text)
            continue
        value = text.partition("=")[2].strip().strip("'\"")
        if not value:
            raise ConfigError([f"{KEY}: give a Hugging Face model folder or its config.json"])
        path = Path(value).expanduser()
        config_path = path / "config.json" if path.is_dir() else path
        where = f"{KEY}={value}"
        node = _read_json(config_path, where)
        stem = path.name if path.is_dir() else path.parent.name
        name = "hf-" + (re.sub(r"[^A-Za-z0-9_.-]", "-", stem).strip("-.") or "model")
        for key, item in model_keys(node, where, name).items():
            dotted = f"model.{key}"
            if dotted in explicit:
                continue
            override = f"{dotted}={_value(item)}"
            config_file.ORIGINS[override] = f"{config_path} ({KEY})"
            out.append(override)
    return tuple(out)
