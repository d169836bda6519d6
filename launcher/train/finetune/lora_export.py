"""A LoRA run's checkpoint out of llmtrain: merged into its base, or the adapters alone as PEFT.

A finetune=lora|qlora checkpoint holds the adapters (and their optimizer state) plus the digest of
the base weights they were trained on (``lora.BASE_FILE``). The base is rebuilt as the run built
it: train.init_from's weights (``init_from.load_state``), or, without one, the seeded random
initialisation (train.seed); its digest must equal the checkpoint's, or nothing is exported (the
base folder changed since training).

- Merged (``llmtrain export RUN --out DIR``): W + (alpha / r) * B @ A for every adapted weight,
  in fp32, then written as any full run's export (``hf_export``).
- Adapter (``--adapter``): a PEFT folder for a Llama-layout model: ``adapter_config.json``
  (peft_type LORA, r, lora_alpha, lora_dropout, target_modules as Hugging Face's projection names
  q_proj .. down_proj) and ``adapter_model.safetensors`` with PEFT's key names
  (``base_model.model.<HF module>.lora_A.weight`` / ``lora_B.weight``: peft's
  ``get_peft_model_state_dict`` drops the adapter name "default" from its saved keys). Loaded with
  ``PeftModel.from_pretrained(base, DIR)`` onto the base exported from train.init_from, or
  ``AutoPeftModelForCausalLM.from_pretrained(DIR)``: ``base_model_name_or_path`` names a base
  transformers loads (``peft_base``): train.init_from's Hugging Face folder as an absolute path,
  or, when train.init_from is an llmtrain run or checkpoint, ``DIR/base``, that run exported
  beside the adapters (``hf_export``). The run's tokenizer files are written beside too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from launcher.config.adapters import HF_NAMES
from launcher.config.schema import LLMTrainConfig
from launcher.errors import UserError
from launcher.train.finetune import lora

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def adapters_of(state: dict[str, torch.Tensor], where: Path) -> dict[str, torch.Tensor]:
    """The adapter tensors of a consolidated finetune checkpoint (refused when there are none)."""
    found = {k: v.float() for k, v in state.items() if lora.is_adapter(k)}
    if not found:
        raise UserError(f"{where}: a finetune run's checkpoint without adapter tensors")
    return found


def base_model(cfg: LLMTrainConfig) -> torch.nn.Module:
    """The frozen base as the run built it (module docstring), on the CPU in fp32."""
    from launcher.train.checkpoint.init_from import InitFromError, copy_into, load_state
    from launcher.train.model.transformer import build_model

    model = build_model(cfg.model, "cpu", seed=cfg.train.seed)
    if cfg.train.init_from is not None:
        try:
            copy_into(model, load_state(cfg))
        except InitFromError as exc:
            raise UserError(f"the run's base: {exc}") from None
    return model


def checked_base(
    cfg: LLMTrainConfig, engine_dir: Path, files: Any, outcome: str
) -> dict[str, torch.Tensor]:
    """The base's state dict, its digest checked against the checkpoint's BASE_FILE; a refusal
    ends with `outcome` (what the command did not do: "nothing was exported")."""
    from launcher.train.checkpoint.safe_load import read_json

    model = base_model(cfg)
    digest = lora.combined_digest(lora.base_digest(dict(model.named_parameters())))
    try:
        saved = read_json(files, engine_dir / lora.BASE_FILE)
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"{engine_dir}: no readable {lora.BASE_FILE} ({exc})") from None
    problem = lora.base_problem(saved, digest)
    if problem is not None:
        raise UserError(f"{engine_dir}: {problem}; {outcome}")
    return {k: v.detach() for k, v in model.state_dict().items()}


def merged(
    cfg: LLMTrainConfig,
    state: dict[str, torch.Tensor],
    engine_dir: Path,
    files: Any,
    outcome: str = "nothing was exported",
) -> dict[str, torch.Tensor]:
    """The plain model's state dict: the checked base with the adapters merged (`outcome`: what
    a refused base means for the command, see ``checked_base``)."""
    adapters = adapters_of(state, engine_dir)
    base = checked_base(cfg, engine_dir, files, outcome)
    scale = cfg.finetune.alpha / cfg.finetune.rank
    return lora.merge_adapters(base, adapters, scale)


def peft_tensors(adapters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our adapter names -> PEFT's for a Llama model (module docstring)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in adapters.items():
        # layers.{i}.{attention|feed_forward}.{w}.lora_{a|b}.weight
        parts = name.split(".")
        if len(parts) != 6 or parts[0] != "layers" or parts[3] not in HF_NAMES:
            raise UserError(f"adapter {name!r}: not a projection of a Llama block")
        layer, block, proj, which = parts[1], parts[2], parts[3], parts[4]
        module = "self_attn" if block == "attention" else "mlp"
        letter = "A" if which == "lora_a" else "B"
        key = f"base_model.model.model.layers.{layer}.{module}.{HF_NAMES[proj]}"
        out[f"{key}.lora_{letter}.weight"] = tensor.contiguous()
    return out


def peft_config(cfg: LLMTrainConfig, adapters: dict[str, torch.Tensor]) -> dict[str, Any]:
    ft = cfg.finetune
    targets = sorted({HF_NAMES[k.split(".")[3]] for k in adapters})
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": ft.rank,
        "lora_alpha": ft.alpha,
        "lora_dropout": ft.dropout,
        "target_modules": targets,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "base_model_name_or_path": peft_base(cfg),
    }


def peft_base(cfg: LLMTrainConfig) -> str | None:
    """train.init_from as base_model_name_or_path when it is a Hugging Face folder: absolute, so
    the adapter folder loads from any working directory; None otherwise."""
    if cfg.train.init_from is None:
        return None
    path = Path(cfg.train.init_from).expanduser()
    return str(path.resolve()) if (path / "config.json").is_file() else None


def base_run(cfg: LLMTrainConfig) -> tuple[Path, int | None] | None:
    """The llmtrain run (and step, for a checkpoint folder) train.init_from names, whose export
    is the adapters' base; None for a Hugging Face folder or no train.init_from."""
    if cfg.train.init_from is None or peft_base(cfg) is not None:
        return None
    path = Path(cfg.train.init_from).expanduser()
    if (path / "manifest.json").is_file() and path.name.startswith("step_"):
        return path.parent.parent, int(path.name.removeprefix("step_"))
    return path, None


def write_adapter_folder(
    folder: Path,
    cfg: LLMTrainConfig,
    adapters: dict[str, Any],
    base: str | None = None,
    extra_files: dict[str, bytes] | None = None,
) -> None:
    """The PEFT folder: adapters, adapter_config.json naming `base` (default: ``peft_base``),
    and `extra_files` (the tokenizer's)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    tensors = peft_tensors(adapters)
    save_file(tensors, str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config = peft_config(cfg, adapters)
    config["base_model_name_or_path"] = base if base is not None else peft_base(cfg)
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    (folder / ADAPTER_CONFIG).write_text(text)
    for name, data in (extra_files or {}).items():
        (folder / name).write_bytes(data)
