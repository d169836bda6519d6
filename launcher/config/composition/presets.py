"""Model shapes from conf/model/, for code that builds configurations without composing them.

The calibration points and the worked exercises in tests need published shapes (Llama 2 7B,
Llama 3 8B, GPT-3 175B, ...). Those shapes live once, with their sources, in conf/model/NAME.yaml;
this reads one of them into a ``ModelConfig`` (no Hydra: the files are flat key/value maps that a
test composes and validates for every recipe), with optional changes on top.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from launcher import resources
from launcher.config.schema import ModelConfig


def model_preset(name: str, **changes: Any) -> ModelConfig:
    """conf/model/NAME.yaml as a ModelConfig, with ``changes`` applied (e.g. seq_length=2048)."""
    import yaml

    path = resources.conf_dir() / "model" / f"{name}.yaml"
    values = yaml.safe_load(path.read_text(encoding="utf-8"))
    return dataclasses.replace(ModelConfig(**values), **changes)
