"""A LoRA run's checkpoint out of llmtrain: merged into its base, or the adapters alone as PEFT.

A finetune=lora|qlora checkpoint holds the adapters (and their optimizer state) plus the digest of
the base weights they were trained on (``lora.BASE_FILE``). The base is rebuilt as the run built
it, tensor by tensor (``launcher.train.checkpoint.gather.merged``): train.init_from's weights, or,
without one, the seeded random initialisation (train.seed); its digest must equal the
checkpoint's, or nothing is exported (the base folder changed since training).

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

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


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
