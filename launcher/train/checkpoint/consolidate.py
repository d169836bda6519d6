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
``init_from.CheckpointSlices``: the boxes a rank holds). Nothing here reads a checkpoint whole.
"""

from __future__ import annotations

import contextlib
import math
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
__all__ = ["ConsolidateError", "DcpTensors", "is_dcp", "open_tensors", "shapes"]


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


class DcpTensors:
    """The model tensors of a DCP checkpoint, each box read on its own (``box``; ``tensor``: the
    whole tensor's box): DCP's own resharding plans the read items of the box
    (``planner_helpers.create_read_items_for_chunk_list``, torch 2.13: one per saved chunk that
    overlaps it, with the offsets in each), and each item is read from its saved chunk by offset,
    only the box's runs (``saved_tensors``: the chunk is a ``torch.save`` inside the ``.distcp``
    file), straight into the tensor returned. The most in memory at once is the box, whatever
    the layout that wrote it. Files are streamed through ``CheckpointFiles.open`` (hashed
    against the manifest, read by offset); the metadata is read once."""

    def __init__(self, engine_dir: Path, files: CheckpointFiles):
        from launcher.train.checkpoint.safe_load import SafeFileSystemReader

        self.engine_dir, self.files = Path(engine_dir), files
        reader = SafeFileSystemReader(str(engine_dir), files)
        metadata = reader.read_metadata()
        self._reader = _box_reader(str(engine_dir), files, metadata)
        self.entries = {
            _clean(k): (MODEL_PREFIX + k, tuple(size), dtype)
            for k, (size, dtype) in _dcp_model_entries(engine_dir, files, metadata).items()
        }

    def specs(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """{name: (shape, dtype)} of every model tensor, from the metadata alone."""
        return {name: (shape, dtype) for name, (_, shape, dtype) in self.entries.items()}

    def tensor(self, name: str) -> torch.Tensor:
        """The whole tensor `name`, read from the shards that hold it."""
        shape = self.entries[name][1]
        return self.box(name, (0,) * len(shape), shape)

    def box(self, name: str, offsets: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
        """The box `offsets` + `shape` of the tensor `name`, only its bytes read."""
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

        from launcher.train.checkpoint.safe_load import UnsafeCheckpointError, checkpoint_failure
        from launcher.train.checkpoint.safetensors_slices import box_outside

        key, full, dtype = self.entries[name]
        if box_outside(full, offsets, shape):
            raise ValueError(f"{name}: box {offsets} + {shape} outside {full}")
        out = torch.empty(shape, dtype=dtype)
        if out.numel() == 0:
            return out
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # "assuming a single process"
                dcp_load(
                    {"model": {key[len(MODEL_PREFIX) :]: out}},
                    storage_reader=self._reader,
                    planner=_box_planner(key, offsets, shape),
                    no_dist=True,
                )
        except CheckpointException as exc:
            raise UnsafeCheckpointError(checkpoint_failure(exc)) from None
        return out


def _box_planner(key: str, offsets: tuple[int, ...], shape: tuple[int, ...]) -> Any:
    """A ``TensorOnlyLoadPlanner`` whose plan is the read items of the box `offsets` + `shape`
    of `key` alone, written into the box-shaped tensor the state dict holds."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
    from torch.distributed.checkpoint.planner import LoadPlan
    from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

    from launcher.train.checkpoint.safe_load import TensorOnlyLoadPlanner

    class BoxPlanner(TensorOnlyLoadPlanner):
        def create_local_plan(self) -> LoadPlan:
            assert self.metadata is not None
            chunk = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(shape))
            saved = self.metadata.state_dict_metadata[key]
            items = create_read_items_for_chunk_list(key, saved, [chunk])  # type: ignore[arg-type]
            # DCP writes chunks that tile the tensor: other ones would leave part of the box as
            # torch.empty gave it (or read some of it twice)
            covered, wanted = sum(math.prod(i.lengths) for i in items), math.prod(shape)
            if covered != wanted:
                raise ConsolidateError(
                    f"{key}: the saved chunks of the box {offsets} + {shape} cover {covered} "
                    f"of the {wanted} values (metadata whose chunks do not tile the tensor)"
                )
            return LoadPlan(items)

        def lookup_tensor(self, index: Any) -> torch.Tensor:
            found: torch.Tensor = self.state_dict[index.fqn]  # the box itself, at its offsets
            return found

    return BoxPlanner()


def _box_reader(path: str, files: CheckpointFiles, metadata: Any) -> Any:
    """A ``SafeFileSystemReader`` that serves `metadata` (already read and checked) again and
    reads each item's box alone from its saved chunk (``_read_item``)."""
    from torch.futures import Future

    from launcher.train.checkpoint.safe_load import SafeFileSystemReader

    class Reader(SafeFileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            assert metadata.storage_meta is not None
            metadata.storage_meta.load_id = self.load_id
            return metadata

        def read_data(self, plan: Any, planner: Any) -> Future[None]:
            per_file: dict[str, list[Any]] = {}
            for item in plan.items:
                where = self.storage_data[item.storage_index].relative_path
                per_file.setdefault(where, []).append(item)
            for relative, items in per_file.items():
                path = self.fs.concat_path(self.path, relative)
                with self.fs.create_stream(path, "rb") as stream:
                    for item in items:
                        _read_item(self.storage_data[item.storage_index], item, stream, planner)
            done: Future[None] = Future()
            done.set_result(None)
            return done

    return Reader(path, files)


def _read_item(info: Any, item: Any, stream: Any, planner: Any) -> None:
    """One DCP read item: its box of the saved chunk (a ``torch.save`` at ``info.offset`` in
    the file) read run by run into the planner's target."""
    from torch.distributed.checkpoint.planner import LoadItemType

    from launcher.train.checkpoint.safe_load import UnsafeCheckpointError
    from launcher.train.checkpoint.safetensors_slices import box_outside, read_runs
    from launcher.train.checkpoint.saved_tensors import Window, layout, where_stored

    fqn = item.storage_index.fqn
    if item.type != LoadItemType.TENSOR or info.transform_descriptors:
        raise UnsafeCheckpointError(
            f"{stream.path}: {fqn!r} is not a plain tensor item (llmtrain writes only those)"
        )
    window = Window(stream, info.offset, info.length)
    saved = where_stored(layout(window, stream.path), window, fqn)
    offsets, lengths = tuple(item.storage_offsets), tuple(item.lengths)
    if box_outside(saved.shape, offsets, lengths):  # the metadata and the chunk disagree
        raise UnsafeCheckpointError(
            f"{stream.path}: {fqn!r}: the metadata's box {offsets} + {lengths} lies outside "
            f"the chunk saved for it, of shape {saved.shape}"
        )
    target = planner.resolve_tensor(item).detach()
    direct = target.is_contiguous() and target.dtype == saved.dtype
    part = target if direct else torch.empty(lengths, dtype=saved.dtype)
    read_runs(saved.shape, offsets, part, saved.read)
    if not direct:
        target.copy_(part)
    planner.commit_tensor(item, target)


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


def shapes(engine_dir: Path, num_layers: int, files: CheckpointFiles) -> dict[str, tuple[int, ...]]:
    """{llmtrain parameter name: shape}, from the DCP metadata or the DeepSpeed pickles alone."""
    engine_dir = Path(engine_dir)
    if is_dcp(engine_dir):
        entries = _dcp_model_entries(engine_dir, files)
        return {_clean(k): tuple(size) for k, (size, _) in entries.items()}
    return {
        k: shape for k, (shape, _) in open_tensors(engine_dir, num_layers, files).specs().items()
    }
