"""``model.from_hf=PATH``: the model keys of a Hugging Face model, read from its config.json.

PATH is a model folder (its ``config.json``), the config.json itself, or a model id
(``meta-llama/Llama-3.1-8B``) already in the local Hugging Face cache, found offline (no download):
``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub`` (default
``~/.cache/huggingface/hub``), in the hub's layout ``models--ORG--NAME/snapshots/REV/config.json``
with ``refs/main`` naming REV (``ORG/NAME@REV`` picks a revision; without refs/main, the one
snapshot there). When it is in none of them the error names every folder looked in.
The override expands, in place, into the ``model.*`` overrides that give llmtrain's model the
same shape; a ``model.*`` key given anywhere else on the command line (or in ``--config``) wins
over the file's value. Weights are not read here: ``train.init_from=PATH`` loads them
(launcher/train/checkpoint/init_from.py), and refuses tensors the shape does not hold.

Architectures (``model_type``), their fields as transformers' configuration classes name them:
- ``llama``, ``mistral``, ``qwen2``: RMSNorm, SwiGLU (``hidden_act`` silu), RoPE (``rope_theta``),
  grouped-query attention (``num_key_value_heads``), ``head_dim`` when given, tied or untied
  head (``tie_word_embeddings``), ``attention_bias`` (Llama) for biases on every projection.
- ``mixtral``: the same with ``num_local_experts`` experts, ``num_experts_per_tok`` active.
- ``qwen3``: the Llama shape with ``head_dim`` given separately and q/k RMSNorm (``model.qk_norm``:
  plan prices it, run refuses it: the training model has none); ``qwen3_moe``: the same with
  ``num_experts`` experts of ``moe_intermediate_size``, ``num_experts_per_tok`` active, no shared
  expert, dense layers first (``mlp_only_layers`` 0..k-1, every ``decoder_sparse_step``=1).
- ``gpt2``: LayerNorm, GELU, learned positions (``n_positions`` becomes ``model.seq_length``, as
  the position table's size), tied head, biases, multi-head attention.
Not modelled, and so not carried over (the shape is still exact), each said in a note that
`plan` and `validate` print (``expand_with_notes``): ``rope_scaling`` (Llama 3.1's long-context
frequency scaling), Mistral's ``sliding_window``, Qwen2's q/k/v-only biases (llmtrain
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
from launcher.config.composition import config_file
from launcher.config.composition.overrides import override_key
from launcher.config.norms import LAYERNORM_EPS, RMSNORM_EPS
from launcher.errors import ConfigError
from launcher.excerpt import excerpt

KEY = "model.from_hf"
LLAMA_LIKE = ("llama", "mistral", "qwen2", "mixtral", "qwen3", "qwen3_moe")
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
            "norm_eps": float(_num(config, "layer_norm_epsilon", where, LAYERNORM_EPS)),
            "position": "learned",
            "tie_embeddings": True,
            "qk_norm": False,
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
        "norm_eps": float(_num(config, "rms_norm_eps", where, RMSNORM_EPS)),
        "position": "rope",
        "rope_theta": float(_num(config, "rope_theta", where, 10000.0)),
        "tie_embeddings": bool(config.get("tie_word_embeddings", kind == "qwen2")),
        "qk_norm": kind in ("qwen3", "qwen3_moe"),
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
    if kind == "qwen3_moe":
        keys.update(_qwen3_moe(config, where))
    return keys


def _qwen3_moe(config: dict[str, Any], where: str) -> dict[str, Any]:
    """Qwen3-MoE's experts (transformers' Qwen3MoeConfig): every decoder_sparse_step-th layer not
    in mlp_only_layers is MoE. llmtrain's models hold dense layers first, then MoE layers."""
    layers = _num(config, "num_hidden_layers", where)
    step = _num(config, "decoder_sparse_step", where, 1)
    dense = config.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) for i in dense):
        raise ConfigError([f"{where}: mlp_only_layers must be a list of layer numbers"])
    moe = [i for i in range(layers) if i not in dense and (i + 1) % max(1, step) == 0]
    first = layers - len(moe)
    if moe != list(range(first, layers)):
        raise ConfigError(
            [
                f"{where}: decoder_sparse_step={step}, mlp_only_layers={dense[:8]}: llmtrain's "
                "MoE models hold their dense layers first (model.moe_dense_layers), not "
                "interleaved"
            ]
        )
    return {
        "num_experts": _num(config, "num_experts", where),
        "moe_top_k": _num(config, "num_experts_per_tok", where),
        "moe_ffn_hidden_size": _num(config, "moe_intermediate_size", where),
        "moe_shared_experts": 0,
        "moe_dense_layers": first,
    }


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
    return {override_key(text) for text in overrides if not text.lstrip("+").startswith(KEY)}


def expand(overrides: tuple[str, ...]) -> tuple[str, ...]:
    """Each `model.from_hf=PATH` replaced, in place, by the model keys of PATH's config.json;
    keys given elsewhere win. Raises ConfigError naming model.from_hf."""
    return expand_with_notes(overrides)[0]


_MODEL_ID = re.compile(
    r"^([A-Za-z0-9][A-Za-z0-9_.-]*)/([A-Za-z0-9][A-Za-z0-9_.-]*)(?:@([\w.-]+))?$"
)


def hub_caches() -> list[Path]:
    """The Hugging Face hub cache folders to look in, in the order huggingface_hub uses them."""
    import os

    env = os.environ
    if env.get("HF_HUB_CACHE"):
        return [Path(env["HF_HUB_CACHE"]).expanduser()]
    if env.get("HF_HOME"):
        return [Path(env["HF_HOME"]).expanduser() / "hub"]
    xdg = env.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return [Path(xdg).expanduser() / "huggingface" / "hub"]


def cached_config(model_id: str, where: str) -> Path:
    """config.json of `ORG/NAME[@REV]` in the local hub cache (hub_caches), or ConfigError
    naming every folder looked in. Nothing is downloaded."""
    match = _MODEL_ID.match(model_id)
    if match is None:
        raise ConfigError([f"{where}: not a model folder, config.json or ORG/NAME model id"])
    org, name, revision = match.groups()
    looked = []
    for cache in hub_caches():
        repo = cache / f"models--{org}--{name}"
        looked.append(str(repo))
        snapshots = repo / "snapshots"
        if not snapshots.is_dir():
            continue
        rev = revision
        if rev is None:
            ref = repo / "refs" / "main"
            try:
                data = bounded_read.read_regular(ref, 4096, follow_symlinks=True)
                rev = data.decode("utf-8", errors="replace")[:200].strip()
            except (OSError, ValueError):
                found = sorted(p.name for p in snapshots.iterdir() if p.is_dir())
                rev = found[0] if len(found) == 1 else None
        if rev is None or not re.fullmatch(r"[\w.-]+", rev) or rev in (".", ".."):
            continue  # several snapshots and no refs/main, or a ref that names no folder
        config = snapshots / rev / "config.json"
        if config.exists():
            return config
        looked[-1] += f" (no snapshots/{rev}/config.json)"
    raise ConfigError(
        [
            f"{where}: no such folder or file here, and {model_id} is not in the local Hugging "
            f"Face cache (looked in {'; '.join(looked)}; HF_HUB_CACHE or HF_HOME move it). "
            f"Fetch its config with `huggingface-cli download {org}/{name} config.json` on a "
            "machine with network access, or give the model's folder"
        ]
    )


def _dropped(config: dict[str, Any], where: str) -> list[str]:
    """Notes for what the file sets that llmtrain's model does not carry over."""
    notes = []
    scaling = config.get("rope_scaling")
    if isinstance(scaling, dict) and scaling:
        kind = scaling.get("rope_type") or scaling.get("type") or "?"
        factor = scaling.get("factor")
        notes.append(
            f"{where}: rope_scaling ({kind}"
            + (f", factor {factor}" if factor is not None else "")
            + ") is not carried over: llmtrain's RoPE uses rope_theta alone. The plan's "
            "shape, memory and time are the same; positions beyond the original context "
            "(and train.init_from of these weights there) differ from the original model"
        )
    window = config.get("sliding_window")
    if config.get("use_sliding_window", window is not None) and isinstance(window, int):
        notes.append(
            f"{where}: sliding_window={window} is not carried over: llmtrain attends to the "
            "whole sequence (attention time is priced for full causal attention)"
        )
    return notes


def expand_with_notes(overrides: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """expand(), and the notes on what the config.json sets that is not carried over."""
    found = [t for t in overrides if t.lstrip("+").partition("=")[0].strip() == KEY]
    notes: list[str] = []
    if not found:
        return overrides, ()
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
        where = f"{KEY}={value}"
        if not path.exists() and _MODEL_ID.match(value):
            config_path = cached_config(value, where)
            stem = value.split("/", 1)[1].split("@", 1)[0]
        else:
            config_path = path / "config.json" if path.is_dir() else path
            stem = path.name if path.is_dir() else path.parent.name
        node = _read_json(config_path, where)
        notes += _dropped(node, where)
        name = "hf-" + (re.sub(r"[^A-Za-z0-9_.-]", "-", stem).strip("-.") or "model")
        for key, item in model_keys(node, where, name).items():
            dotted = f"model.{key}"
            if dotted in explicit:
                continue
            override = f"{dotted}={_value(item)}"
            config_file.ORIGINS[override] = f"{config_path} ({KEY})"
            out.append(override)
    return tuple(out), tuple(notes)
