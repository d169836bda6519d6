"""Checkpoint state of the torch engine: what DCP saves and loads in place (the model and
optimizer state dicts, every layout), and the files beside it (ZeRO-1's per-rank optimizer
shards, the dynamic loss scaler), as torchtitan's ``checkpoint`` module holds its state. Every
file is read once through the verified ``CheckpointFiles`` (``launcher.train.safe_load``)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.optim import Optimizer

from launcher.train import fp8
from launcher.train.engines.torch_parallelize import TorchEngineError
from launcher.train.safe_load import (
    CheckpointFiles,
    SafeFileSystemReader,
    TensorOnlyLoadPlanner,
    UnsafeCheckpointError,
    checkpoint_failure,
    first_failure,
    read_json,
    read_non_tensor_state,
    split_non_tensor_state,
    write_non_tensor_state,
)

STATE_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
# finetune=lora|qlora: only what trains (the adapters and their optimizer state); the frozen base
# comes from train.init_from (its digest is checked beside, launcher.train.lora.BASE_FILE). Not
# strict on load: the model's frozen entries are absent by design, while DCP refuses any adapter
# entry the checkpoint lacks.
TRAINABLE_OPTIONS = StateDictOptions(
    flatten_optimizer_state_dict=True, ignore_frozen_params=True, strict=False
)
# In a checkpoint's engine folder, next to the DCP files: the dynamic loss scaler's state (rank 0)
# and, with zero.stage=1, each rank's shard of the optimizer states.
SCALER_FILE = "loss_scaler.json"
ZERO1_OPTIM_FILE = "zero1_optim_rank{rank}.pt"


def model_arg(parts: list[nn.Module]) -> Any:
    """The model as DCP's state-dict helpers take it: the module, or the list of pipeline chunks."""
    return parts[0] if len(parts) == 1 else parts


def state_options(parts: list[nn.Module]) -> StateDictOptions:
    """TRAINABLE_OPTIONS where some parameters are frozen (fine-tuning), else STATE_OPTIONS."""
    frozen = any(not p.requires_grad for part in parts for p in part.parameters())
    return TRAINABLE_OPTIONS if frozen else STATE_OPTIONS


def engine_state(parts: list[nn.Module], optimizer: Optimizer, fp8_fsdp: bool) -> dict[str, Any]:
    """The model and optimizer state dicts DCP saves and loads in place (flattened optimizer
    state, as pipeline resumes need; see platform notes)."""
    model = model_arg(parts)
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        # DCP does not know ZeroRedundancyOptimizer: the model goes through DCP, each rank's
        # optimizer shard into its own file (_save_extra).
        return {"model": get_model_state_dict(model, options=state_options(parts))}
    model_sd, optim_sd = get_state_dict(model, optimizer, options=state_options(parts))
    if fp8_fsdp:  # plain tensors in place of torchao's fp8 all-gather wrapper
        model_sd, optim_sd = fp8.plain_tensors(model_sd), fp8.plain_tensors(optim_sd)
    return {"model": model_sd, "optim": optim_sd}


def save_extra(
    directory: Path, rank: int, optimizer: Optimizer, scaler: torch.amp.GradScaler | None
) -> list[Path]:
    """The optimizer shard of ZeRO-1 (every rank) and the loss scaler's state (rank 0)."""
    written: list[Path] = []
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        path = directory / ZERO1_OPTIM_FILE.format(rank=rank)
        torch.save(optimizer.optim.state_dict(), path)
        written.append(path)
    if scaler is not None and rank == 0:
        path = directory / SCALER_FILE
        path.write_text(json.dumps(scaler.state_dict(), sort_keys=True) + "\n")
        written.append(path)
    return written


def save_state(
    directory: Path,
    parts: list[nn.Module],
    optimizer: Optimizer,
    scaler: torch.amp.GradScaler | None,
    fp8_fsdp: bool,
) -> list[Path]:
    """Write the engine's state into `directory` (a collective); the files this rank wrote."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rank = dist.get_rank()
    tensors, others = split_non_tensor_state(engine_state(parts, optimizer, fp8_fsdp))
    try:
        dcp_save(tensors, storage_writer=FileSystemWriter(str(directory)))
    except CheckpointException as exc:  # a BaseException: surface the rank's real error
        inner = first_failure(exc)
        if isinstance(inner, OSError):  # disk full, read-only: the writer says so plainly
            raise inner from None
        raise RuntimeError(f"{directory}: {checkpoint_failure(exc)}") from None
    mine = [
        write_non_tensor_state(directory, rank, others),
        *save_extra(directory, rank, optimizer, scaler),
    ]
    dist.barrier()
    mine += list(directory.glob(f"__{rank}_*.distcp"))
    if rank == 0:
        mine += [p for p in directory.iterdir() if p.name == ".metadata"]
    return sorted(mine)


def load_state(
    directory: Path,
    files: CheckpointFiles,
    parts: list[nn.Module],
    optimizer: Optimizer,
    scaler: torch.amp.GradScaler | None,
    fp8_fsdp: bool,
) -> None:
    """Restore from `directory`, every file read once through `files` (checked against the
    manifest); never unpickles code (see ``safe_load``; the ZeRO-1 shard and the scaler are
    read weights-only and as JSON)."""
    directory = Path(directory)
    state = engine_state(parts, optimizer, fp8_fsdp)
    tensors, others = split_non_tensor_state(state)
    saved = read_non_tensor_state(directory, files)
    try:
        dcp_load(
            tensors,
            storage_reader=SafeFileSystemReader(str(directory), files),
            planner=TensorOnlyLoadPlanner(),
        )
    except CheckpointException as exc:  # a BaseException: make it an ordinary error
        raise UnsafeCheckpointError(checkpoint_failure(exc)) from None
    for part in state:
        for key in others.get(part, {}):
            if key not in saved.get(part, {}):
                raise TorchEngineError(f"{directory}: checkpoint lacks {part} entry {key!r}")
            state[part][key] = saved[part][key]
        for key, value in tensors[part].items():
            state[part][key] = value
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        set_model_state_dict(model_arg(parts), state["model"], options=state_options(parts))
        shard = directory / ZERO1_OPTIM_FILE.format(rank=dist.get_rank())
        data = io.BytesIO(files.read(shard))
        optimizer.optim.load_state_dict(torch.load(data, weights_only=True))
    else:
        set_state_dict(
            model_arg(parts),
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=state_options(parts),
        )
    if scaler is not None:
        scaler.load_state_dict(read_json(files, directory / SCALER_FILE))
