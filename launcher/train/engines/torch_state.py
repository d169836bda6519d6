"""Checkpoint state of the torch engine: what DCP saves and loads in place (the model and
optimizer state dicts, every layout), and the files beside it (ZeRO-1's per-rank optimizer
shards, the dynamic loss scaler), as torchtitan's ``checkpoint`` module holds its state. Every
file is read once through the verified ``CheckpointFiles``
(``launcher.train.checkpoint.safe_load``)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any, cast

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
from torch.optim import Optimizer

from launcher.train.checkpoint.safe_load import (
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
from launcher.train.engines.torch_parallelize import TorchEngineError
from launcher.train.model import fp8

STATE_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
# finetune=lora|qlora: only what trains (the adapters and their optimizer state); the frozen base
# comes from train.init_from (its digest is checked beside, launcher.train.finetune.lora.BASE_FILE).
# Not strict on load: the model's frozen entries are absent by design, while DCP refuses any adapter
# entry the checkpoint lacks.
TRAINABLE_OPTIONS = StateDictOptions(
    flatten_optimizer_state_dict=True, ignore_frozen_params=True, strict=False
)
# In a checkpoint's engine folder, next to the DCP files: the dynamic loss scaler's state (rank 0)
# and, with zero.stage=1, each rank's shard of the optimizer states.
SCALER_FILE = "loss_scaler.json"
ZERO1_OPTIM_FILE = "zero1_optim_rank{rank}.pt"


def model_arg(parts: list[nn.Module]) -> nn.Module:
    """The model as DCP's state-dict helpers take it (one ``nn.Module``): the module, or the
    pipeline chunks of this rank in an ``nn.ModuleList``, whose keys ``chunk_keys`` maps back."""
    return parts[0] if len(parts) == 1 else nn.ModuleList(parts)


# The flattened optimizer state (flatten_optimizer_state_dict=True) names each entry
# "state.<fqn>.<key>" or "param_groups.<fqn>.<key>" (torch.distributed.checkpoint.state_dict,
# _flatten_optim_state_dict); the model state names it "<fqn>".
_OPTIM_SECTIONS = ("state.", "param_groups.")


def _own_name(key: str) -> str:
    """A key of the ModuleList of chunks without the chunk index it prefixes to the FQN."""
    for section in _OPTIM_SECTIONS:
        if key.startswith(section):
            return section + key[len(section) :].split(".", 1)[1]
    return key.split(".", 1)[1]


def chunk_keys(
    parts: list[nn.Module], state: dict[str, dict[str, Any]]
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """`state` ({"model": ..., "optim": ...} of ``model_arg(parts)``) under the model's own names,
    and the map back to the ModuleList's keys. Several pipeline chunks merge into one state per
    rank, as torchtitan's ``ModelWrapper`` / ``OptimizersContainer`` merge theirs
    (torchtitan/components/checkpoint.py): the checkpoint holds the model's own parameter names
    (what ``launcher.train.checkpoint.consolidate`` reads back), whatever the pipeline split."""
    if len(parts) == 1:
        return state, {}
    merged: dict[str, dict[str, Any]] = {}
    back: dict[str, str] = {}
    for part, entries in state.items():
        merged[part] = {}
        for key, value in entries.items():
            own = _own_name(key)
            if own in merged[part]:  # chunks hold disjoint layers; a shared entry has no owner
                raise TorchEngineError(f"pipeline chunks share the {part} entry {own!r}")
            merged[part][own] = value
            back[f"{part}/{own}"] = key
    return merged, back


def _chunk_entries(state: dict[str, Any], part: str, back: dict[str, str]) -> dict[str, Any]:
    """The `part` entries of a merged state under the ModuleList's keys again (``chunk_keys``)."""
    if not back:
        return state
    return {back[f"{part}/{key}"]: value for key, value in state.items()}


def _is_zero1(optimizer: Optimizer) -> bool:
    """ZeroRedundancyOptimizer (zero.stage=1), checked without importing torch.distributed.optim
    (its functional optimizers are TorchScript-compiled at import: ~0.9 s a rank, measured here),
    which only a zero.stage=1 run has imported."""
    zero = sys.modules.get("torch.distributed.optim")
    return zero is not None and isinstance(optimizer, zero.ZeroRedundancyOptimizer)


def state_options(parts: list[nn.Module]) -> StateDictOptions:
    """TRAINABLE_OPTIONS where some parameters are frozen (fine-tuning), else STATE_OPTIONS."""
    frozen = any(not p.requires_grad for part in parts for p in part.parameters())
    return TRAINABLE_OPTIONS if frozen else STATE_OPTIONS


def _engine_state(
    parts: list[nn.Module], optimizer: Optimizer, fp8_fsdp: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    """``engine_state`` and the map from its keys back to those of ``model_arg(parts)``."""
    model = model_arg(parts)
    if _is_zero1(optimizer):
        # DCP does not know ZeroRedundancyOptimizer: the model goes through DCP, each rank's
        # optimizer shard into its own file (_save_extra).
        model_only = {"model": get_model_state_dict(model, options=state_options(parts))}
        return chunk_keys(parts, model_only)
    # One optimizer over every chunk of the rank: its flattened state names each parameter by
    # the same FQN as the model state.
    model_sd, optim_sd = get_state_dict(model, optimizer, options=state_options(parts))
    if fp8_fsdp:  # plain tensors in place of torchao's fp8 all-gather wrapper
        model_sd, optim_sd = fp8.plain_tensors(model_sd), fp8.plain_tensors(optim_sd)
    return chunk_keys(parts, {"model": model_sd, "optim": optim_sd})


def engine_state(parts: list[nn.Module], optimizer: Optimizer, fp8_fsdp: bool) -> dict[str, Any]:
    """The model and optimizer state dicts DCP saves and loads in place (flattened optimizer
    state, as pipeline resumes need; see platform notes), keyed by the model's own parameter
    names whether this rank holds the whole model or several pipeline chunks."""
    return _engine_state(parts, optimizer, fp8_fsdp)[0]


def save_extra(
    directory: Path, rank: int, optimizer: Optimizer, scaler: torch.amp.GradScaler | None
) -> list[Path]:
    """The optimizer shard of ZeRO-1 (every rank) and the loss scaler's state (rank 0)."""
    written: list[Path] = []
    if _is_zero1(optimizer):
        path = directory / ZERO1_OPTIM_FILE.format(rank=rank)
        torch.save(cast(Any, optimizer).optim.state_dict(), path)
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
    state, back = _engine_state(parts, optimizer, fp8_fsdp)
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
    if _is_zero1(optimizer):
        model_sd = _chunk_entries(state["model"], "model", back)
        set_model_state_dict(model_arg(parts), model_sd, options=state_options(parts))
        shard = directory / ZERO1_OPTIM_FILE.format(rank=dist.get_rank())
        data = io.BytesIO(files.read(shard))
        cast(Any, optimizer).optim.load_state_dict(torch.load(data, weights_only=True))
    else:
        set_state_dict(
            model_arg(parts),
            optimizer,
            model_state_dict=_chunk_entries(state["model"], "model", back),
            optim_state_dict=_chunk_entries(state["optim"], "optim", back),
            options=state_options(parts),
        )
    if scaler is not None:
        scaler.load_state_dict(read_json(files, directory / SCALER_FILE))
