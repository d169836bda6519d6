"""The full, unsharded model state of a checkpoint, read in one process without a process group.

Whatever layout wrote it:

- torch engine (DCP; DDP, FSDP2 ZeRO-2/3, tensor/pipeline/expert parallel, ZeRO-1): the
  ``.metadata`` lists every model tensor with its global shape; each is allocated whole and DCP's
  own resharding fills it from the shards (``dcp_load(no_dist=True)``). The metadata goes through
  ``safe_load.SafeFileSystemReader`` and the ``TensorOnlyLoadPlanner``: nothing is unpickled but
  the allow-listed metadata classes, and the optimizer entries are never read.
- DeepSpeed engine: ZeRO 0-2 keep the whole module in ``mp_rank_00_model_states.pt``; ZeRO-3
  keeps only fp32 partitions in the optimizer files, merged by DeepSpeed's ``zero_to_fp32``;
  pipeline stages write one ``layer_XX-model_states.pt`` per layer (the embedding, each
  block, the head), mapped back to the model's names. Every file is read weights-only (tensors,
  builtins and DeepSpeed's few allow-listed classes; see ``safe_load.weights_only_load``).

Every file is read once, through the checkpoint's ``safe_load.CheckpointFiles`` (its bytes checked
against the manifest, then deserialized from that same buffer).

``shapes`` gives the tensor shapes alone (what ``train.init_from`` checks before training);
``DcpTensors`` reads a DCP checkpoint's tensors one at a time (``gather``, export and sample,
``init_from.CheckpointSlices``), its files streamed (``CheckpointFiles.open``) rather than each
read whole.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from launcher.train.checkpoint.safe_load import CheckpointFiles

DCP_METADATA = ".metadata"
DS_TAG = "engine"  # DeepSpeedEngine's checkpoint tag (launcher.train.engines.deepspeed_engine.TAG)
MODEL_PREFIX = "model."
_COMPILED = "_orig_mod."
_LAYER_FILE = re.compile(r"layer_(\d+)-(?:model_00-)?model_states\.pt$")


class ConsolidateError(ValueError):
    """The checkpoint folder is not one llmtrain can read back into a full model."""


def _clean(name: str) -> str:
    return name.replace(_COMPILED, "")


def is_dcp(engine_dir: Path) -> bool:
    return (engine_dir / DCP_METADATA).is_file()


def is_deepspeed(engine_dir: Path) -> bool:
    return (engine_dir / DS_TAG).is_dir()


def _dcp_model_entries(
    engine_dir: Path, files: CheckpointFiles, metadata: Any = None
) -> dict[str, tuple[torch.Size, torch.dtype]]:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from launcher.train.checkpoint.safe_load import SafeFileSystemReader

    if metadata is None:
        metadata = SafeFileSystemReader(str(engine_dir), files).read_metadata()
    entries = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith(MODEL_PREFIX) and isinstance(meta, TensorStorageMetadata):
            entries[key[len(MODEL_PREFIX) :]] = (meta.size, meta.properties.dtype)
    if not entries:
        raise ConsolidateError(f"{engine_dir}: the DCP checkpoint holds no model tensors")
    return entries


def _dcp_state(engine_dir: Path, files: CheckpointFiles) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    from launcher.train.checkpoint.safe_load import (
        SafeFileSystemReader,
        TensorOnlyLoadPlanner,
        UnsafeCheckpointError,
        checkpoint_failure,
    )

    model = {
        name: torch.empty(size, dtype=dtype)
        for name, (size, dtype) in _dcp_model_entries(engine_dir, files).items()
    }
    try:
        with warnings.catch_warnings():
            # "torch.distributed is ... uninitialized, assuming ... a single process": intended.
            warnings.simplefilter("ignore", UserWarning)
            dcp_load(
                {"model": model},
                storage_reader=SafeFileSystemReader(str(engine_dir), files),
                planner=TensorOnlyLoadPlanner(),
                no_dist=True,
            )
    except CheckpointException as exc:
        raise UnsafeCheckpointError(checkpoint_failure(exc)) from None
    return {_clean(k): v for k, v in model.items()}


class DcpTensors:
    """The model tensors of a DCP checkpoint, each read whole on its own (``tensor``) by DCP's
    own resharding from the shards that overlap it: the most in memory at once is that tensor
    (and one saved chunk while it is copied in), whatever the layout that wrote it. Files are
    streamed through ``CheckpointFiles.open`` (hashed against the manifest, read by offset); the
    metadata is read once."""

    def __init__(self, engine_dir: Path, files: CheckpointFiles):
        from launcher.train.checkpoint.safe_load import SafeFileSystemReader

        self.engine_dir, self.files = Path(engine_dir), files
        reader = SafeFileSystemReader(str(engine_dir), files)
        metadata = reader.read_metadata()
        self._reader = _cached_reader(str(engine_dir), files, metadata)
        self.entries = {
            _clean(k): (MODEL_PREFIX + k, tuple(size), dtype)
            for k, (size, dtype) in _dcp_model_entries(engine_dir, files, metadata).items()
        }

    def specs(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """{name: (shape, dtype)} of every model tensor, from the metadata alone."""
        return {name: (shape, dtype) for name, (_, shape, dtype) in self.entries.items()}

    def tensor(self, name: str) -> torch.Tensor:
        """The whole tensor `name`, read from the shards that hold it."""
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

        from launcher.train.checkpoint.safe_load import (
            TensorOnlyLoadPlanner,
            UnsafeCheckpointError,
            checkpoint_failure,
        )

        key, shape, dtype = self.entries[name]
        out = torch.empty(shape, dtype=dtype)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # "assuming a single process"
                dcp_load(
                    {"model": {key[len(MODEL_PREFIX) :]: out}},
                    storage_reader=self._reader,
                    planner=TensorOnlyLoadPlanner(),
                    no_dist=True,
                )
        except CheckpointException as exc:
            raise UnsafeCheckpointError(checkpoint_failure(exc)) from None
        return out


def _cached_reader(path: str, files: CheckpointFiles, metadata: Any) -> Any:
    """A ``SafeFileSystemReader`` that serves `metadata` (already read and checked) again."""
    from launcher.train.checkpoint.safe_load import SafeFileSystemReader

    class Reader(SafeFileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            assert metadata.storage_meta is not None
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return Reader(path, files)


def _deepspeed_state(
    engine_dir: Path, num_layers: int, files: CheckpointFiles
) -> dict[str, torch.Tensor]:
    from launcher.train.checkpoint.safe_load import (
        deepspeed_loading,
        verify_weights_only,
        weights_only_load,
    )

    tag_dir = engine_dir / DS_TAG
    verify_weights_only(engine_dir, files)  # every *.pt weights-only, before DeepSpeed opens any
    listed = files.names("*.pt", tag_dir)
    layer_files = [p for p in listed if p.name.startswith("layer_") and _LAYER_FILE.search(p.name)]
    if layer_files:
        return _pipeline_state(
            layer_files, num_layers, lambda p: weights_only_load(p, "cpu", files)
        )
    if files.names("zero_pp_rank_*_mp_rank_00_model_states.pt", tag_dir):
        # ZeRO-3: each rank's fp32 partition sits in its optimizer file; DeepSpeed merges them.
        from launcher.train.deepspeed_import import import_deepspeed

        import_deepspeed()
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        with deepspeed_loading(files):
            merged = get_fp32_state_dict_from_zero_checkpoint(str(engine_dir), tag=DS_TAG)
        return {_clean(k): v for k, v in merged.items()}
    states = tag_dir / "mp_rank_00_model_states.pt"
    if states not in listed:
        raise ConsolidateError(
            f"{tag_dir}: no mp_rank_00_model_states.pt (a DeepSpeed checkpoint?)"
        )
    saved = weights_only_load(states, "cpu", files)
    if not isinstance(saved, dict) or not isinstance(saved.get("module"), dict):
        raise ConsolidateError(f"{states}: not a DeepSpeed model-states file")
    module: dict[str, torch.Tensor] = saved["module"]
    return {_clean(k): v for k, v in module.items() if isinstance(v, torch.Tensor)}


def _pipeline_state(
    paths: list[Path], num_layers: int, load: Callable[[Path], Any]
) -> dict[str, torch.Tensor]:
    """DeepSpeed PipelineModule layer files -> model names: layer 0 is the embedding, 1..L the
    blocks (``layers.{i-1}``), L+1 the final norm and head (deepspeed_engine.pipeline_layers)."""
    state: dict[str, torch.Tensor] = {}
    for path in paths:
        match = _LAYER_FILE.search(path.name)
        assert match is not None
        index = int(match.group(1))
        tensors = load(path)
        if not isinstance(tensors, dict):
            raise ConsolidateError(f"{path}: not a DeepSpeed layer file")
        prefix = f"layers.{index - 1}." if 1 <= index <= num_layers else ""
        for key, value in tensors.items():
            state[prefix + _clean(key)] = value
    return state


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """DeepSpeed logs to stdout (its handler holds the stream): send file descriptor 1 to 2 while
    it runs, so that `export --json` prints nothing but its document on stdout."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def full_state(
    engine_dir: Path, num_layers: int, files: CheckpointFiles
) -> dict[str, torch.Tensor]:
    """{llmtrain parameter name: full tensor} of the checkpoint engine folder `engine_dir`, every
    file read through `files` (``CheckpointFiles.verified`` of the checkpoint)."""
    engine_dir = Path(engine_dir)
    if is_dcp(engine_dir):
        return _dcp_state(engine_dir, files)
    if is_deepspeed(engine_dir):
        with _stdout_to_stderr():
            return _deepspeed_state(engine_dir, num_layers, files)
    raise ConsolidateError(
        f"{engine_dir}: neither a torch (DCP {DCP_METADATA}) nor a DeepSpeed ({DS_TAG}/) checkpoint"
    )


def shapes(engine_dir: Path, num_layers: int, files: CheckpointFiles) -> dict[str, tuple[int, ...]]:
    """{llmtrain parameter name: shape}; DCP from its metadata alone, DeepSpeed by reading."""
    engine_dir = Path(engine_dir)
    if is_dcp(engine_dir):
        entries = _dcp_model_entries(engine_dir, files)
        return {_clean(k): tuple(size) for k, (size, _) in entries.items()}
    return {k: tuple(v.shape) for k, v in full_state(engine_dir, num_layers, files).items()}
