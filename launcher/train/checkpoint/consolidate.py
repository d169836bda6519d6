"""The full, unsharded model state of a checkpoint, read in one process without a process group.

Whatever layout wrote it:

- torch engine (DCP; DDP, FSDP2 ZeRO-2/3, tensor/pipeline/expert parallel, ZeRO-1): the
  ``.metadata`` lists every model tensor with its global shape; DCP's own resharding fills a
  tensor (or one box of it: ``DcpTensors.box``) from the shards that overlap it. The metadata
  goes through ``safe_load.SafeFileSystemReader`` and the ``TensorOnlyLoadPlanner``: nothing is
  unpickled but the allow-listed metadata classes, and the optimizer entries are never read.
- DeepSpeed engine (ZeRO 0-2's module file, pipeline stages' layer files, ZeRO-3's fp32
  partitions in the optimizer files): ``deepspeed_tensors.DeepSpeedTensors``, each file's pickle
  read weights-only with no tensor data, each box read from where its values lie.

Every file is checked against the manifest before it is read (``safe_load.CheckpointFiles``):
streamed and hashed through one descriptor, then read by offset through it.

``shapes`` gives the tensor shapes alone (what ``train.init_from`` checks before training);
``open_tensors`` the tensors one at a time (``gather``: export and sample;
``init_from.CheckpointSlices``: the boxes a rank holds); ``full_state`` every tensor at once.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from launcher.train.checkpoint.deepspeed_tensors import DeepSpeedTensors
from launcher.train.checkpoint.engine_dirs import (
    DCP_METADATA,
    DS_TAG,
    MODEL_PREFIX,
    ConsolidateError,
    is_dcp,
    is_deepspeed,
)
from launcher.train.checkpoint.engine_dirs import clean as _clean

if TYPE_CHECKING:
    from launcher.train.checkpoint.safe_load import CheckpointFiles

# engine_dirs' names that callers read from here
__all__ = ["ConsolidateError", "DcpTensors", "full_state", "is_dcp", "open_tensors", "shapes"]


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

    def box(self, name: str, offsets: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
        """The box `offsets` + `shape` of the tensor `name`."""
        index = tuple(slice(o, o + n) for o, n in zip(offsets, shape, strict=True))
        return self.tensor(name)[index]


def _cached_reader(path: str, files: CheckpointFiles, metadata: Any) -> Any:
    """A ``SafeFileSystemReader`` that serves `metadata` (already read and checked) again."""
    from launcher.train.checkpoint.safe_load import SafeFileSystemReader

    class Reader(SafeFileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            assert metadata.storage_meta is not None
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return Reader(path, files)


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


def open_tensors(engine_dir: Path, num_layers: int, files: CheckpointFiles) -> Any:
    """The model tensors of the checkpoint engine folder `engine_dir`, each read when asked for:
    ``DcpTensors`` or ``deepspeed_tensors.DeepSpeedTensors`` (both: ``entries``, ``specs()``,
    ``tensor(name)``, ``box(name, offsets, shape)``), every file read through `files`
    (``CheckpointFiles.verified`` of the checkpoint)."""
    engine_dir = Path(engine_dir)
    if is_dcp(engine_dir):
        return DcpTensors(engine_dir, files)
    if is_deepspeed(engine_dir):
        with _stdout_to_stderr():  # importing DeepSpeed logs
            return DeepSpeedTensors(engine_dir, num_layers, files)
    raise ConsolidateError(
        f"{engine_dir}: neither a torch (DCP {DCP_METADATA}) nor a DeepSpeed ({DS_TAG}/) checkpoint"
    )


def full_state(
    engine_dir: Path, num_layers: int, files: CheckpointFiles
) -> dict[str, torch.Tensor]:
    """{llmtrain parameter name: full tensor} of the checkpoint engine folder `engine_dir`, every
    file read through `files` (``CheckpointFiles.verified`` of the checkpoint)."""
    engine_dir = Path(engine_dir)
    if is_dcp(engine_dir):
        return _dcp_state(engine_dir, files)
    tensors = open_tensors(engine_dir, num_layers, files)
    return {name: tensors.tensor(name) for name in tensors.entries}


def shapes(engine_dir: Path, num_layers: int, files: CheckpointFiles) -> dict[str, tuple[int, ...]]:
    """{llmtrain parameter name: shape}, from the DCP metadata or the DeepSpeed pickles alone."""
    engine_dir = Path(engine_dir)
    if is_dcp(engine_dir):
        entries = _dcp_model_entries(engine_dir, files)
        return {_clean(k): tuple(size) for k, (size, _) in entries.items()}
    return {
        k: shape for k, (shape, _) in open_tensors(engine_dir, num_layers, files).specs().items()
    }
