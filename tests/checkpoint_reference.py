"""A checkpoint read whole, the tests' reference for the readers that read it box by box.

DCP: every model tensor allocated whole and filled by DCP's own ``load`` (its resharding from
the shards, not llmtrain's box planner), through the same checked reader and tensor-only planner
the product uses. DeepSpeed: each tensor read whole through ``open_tensors`` (compared elsewhere
with DeepSpeed's own ``zero_to_fp32``: tests/unit/train/checkpoint/test_deepspeed_tensors.py).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch


def full_state(engine_dir: Path, num_layers: int, files: Any) -> dict[str, torch.Tensor]:
    """{llmtrain parameter name: full tensor} of the checkpoint engine folder `engine_dir`, every
    file read through `files` (``safe_load.CheckpointFiles``)."""
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    from launcher.train.checkpoint.consolidate import _dcp_model_entries, is_dcp, open_tensors
    from launcher.train.checkpoint.engine_dirs import clean
    from launcher.train.checkpoint.safe_load import SafeFileSystemReader, TensorOnlyLoadPlanner

    engine_dir = Path(engine_dir)
    if not is_dcp(engine_dir):
        tensors = open_tensors(engine_dir, num_layers, files)
        return {name: tensors.tensor(name) for name in tensors.entries}
    model = {
        name: torch.empty(size, dtype=dtype)
        for name, (size, dtype) in _dcp_model_entries(engine_dir, files).items()
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming a single process": intended
        dcp_load(
            {"model": model},
            storage_reader=SafeFileSystemReader(str(engine_dir), files),
            planner=TensorOnlyLoadPlanner(),
            no_dist=True,
        )
    return {clean(k): v for k, v in model.items()}
