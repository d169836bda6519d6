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
The file is read as ``--config`` files are (a regular file, bounded size, no YAML aliases).
"""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path
from typing import Any

from launcher.config import config_file
from launcher.errors import ConfigError

KEY = "model.from_hf"
LLAMA_LIKE = ("llama", "mistral", "qwen2", "mixtral")
SUPPORTED = (*LLAMA_LIKE, "gpt2")


def _num(config: dict[str, Any], field: str, where: str, default: Any = None) -> Any:
    value = config.get(field, default)
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError([f"{where}: {field} must be a number, found {value!r}"])
    return value


def model_keys(config: dict[str, Any], where: str, name: str) -> dict[str, Any]:
    """llmtrain's model keys (without the `model.` prefix) for a config.json's contents."""
    kind = config.get("model_type")
    if kind not in SUPPORTED:
        raise ConfigError(
            [
                f"{where}: model_type {kind!r} has no llmtrain layout; model.from_hf reads "
                f"{', '.join(SUPPORTED)} models (or set the model.* keys yourself)"
            ]
        )
    if kind == "gpt2":
        hidden = _num(config, "n_embd", where)
        act = config.get("activation_function", "gelu_new")
        if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
            raise ConfigError([f"{where}: activation_function {act!r}; llmtrain's GPT-2 is GELU"])
        return {
            "name": name,
            "num_layers": _num(config, "n_layer", where),
            "hidden_size": hidden,
            "ffn_hidden_size": config.get("n_inner") or 4 * hidden,
            "num_attention_heads": _num(config, "n_head", where),
            "num_kv_heads": None,
            "head_dim": None,
            "vocab_size": _num(config, "vocab_size", where),
            "seq_length": _num(config, "n_positions", where),
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
        raise ConfigError([f"{where}: hidden_act {act!r}; llmtrain's {kind} MLP is SwiGLU (silu)"])
    heads = _num(config, "num_attention_heads", where)
    hidden = _num(config, "hidden_size", where)
    head_dim = config.get("head_dim")
    keys: dict[str, Any] = {
        "name": name,
        "num_layers": _num(config, "num_hidden_layers", where),
        "hidden_size": hidden,
        "ffn_hidden_size": _num(config, "intermediate_size", where),
        "num_attention_heads": heads,
        "num_kv_heads": _num(config, "num_key_value_heads", where, heads),
        "head_dim": None
        if head_dim in (None, hidden // heads)
        else _num(config, "head_dim", where),
        "vocab_size": _num(config, "vocab_size", where),
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
        keys["num_experts"] = _num(config, "num_local_experts", where)
        keys["moe_top_k"] = _num(config, "num_experts_per_tok", where)
        keys["moe_ffn_hidden_size"] = keys["ffn_hidden_size"]
    return keys


def _read_json(path: Path, where: str) -> dict[str, Any]:
    """config.json as a mapping: a regular file (a symbolic link to one is fine: the Hugging Face
    cache links snapshots to blobs) of at most 1 MiB of JSON. Errors never quote the file."""
    try:
        info = path.stat()
    except OSError as exc:
        raise ConfigError([f"{where}: {path} cannot be read ({exc.strerror})"]) from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError([f"{where}: {path} is not a regular file"])
    if info.st_size > config_file.MAX_BYTES:
        raise ConfigError([f"{where}: {path} is {info.st_size:,} bytes; not a model config.json"])
    try:
        with open(path, "rb") as f:
            node = json.loads(f.read(config_file.MAX_BYTES + 1))
    except (OSError, ValueError, RecursionError):
        raise ConfigError([f"{where}: {path} is not a JSON file (a model's config.json)"]) from None
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
