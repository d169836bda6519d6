"""What a checkpoint's engine folder is (the torch engine's DCP or DeepSpeed's files), the names
in it, and the error for one that cannot be read back into a model: shared by ``consolidate``
and ``deepspeed_tensors`` (which ``consolidate`` opens), so neither imports the other's caller.
"""

from __future__ import annotations

from pathlib import Path

DCP_METADATA = ".metadata"
DS_TAG = "engine"  # DeepSpeedEngine's checkpoint tag (launcher.train.engines.deepspeed_engine.TAG)
MODEL_PREFIX = "model."
COMPILED = "_orig_mod."  # torch.compile's wrapper, in the names of a compiled model's tensors


class ConsolidateError(ValueError):
    """The checkpoint folder is not one llmtrain can read back into a full model."""


def clean(name: str) -> str:
    """A tensor's name as the model (not compiled) has it."""
    return name.replace(COMPILED, "")


def is_dcp(engine_dir: Path) -> bool:
    return (Path(engine_dir) / DCP_METADATA).is_file()


def is_deepspeed(engine_dir: Path) -> bool:
    return (Path(engine_dir) / DS_TAG).is_dir()
