"""A DeepSpeed checkpoint's model tensors, each (or one box of one) read on its own (issue #39):
what export, sample and train.init_from read, never the whole checkpoint at once.

DeepSpeed (0.19.8) writes its files with ``torch.save``. Each file is opened through the
checkpoint's ``safe_load.CheckpointFiles.open`` (hashed whole through one descriptor, in bounded
chunks, and compared with the manifest); its pickle is loaded weights-only on the meta device,
no tensor data read (``saved_tensors.layout``, with ``safe_load.deepspeed_globals``); values are
then read by offset through that descriptor, only the runs of the box asked for, at most
``saved_tensors.Descriptors.LIMIT`` files open at once (a file closed is opened again, never
hashed again, and refused if it is not the inode first read: ``saved_tensors``, also why a file
changed after its hash is refused and why nothing is mapped).
The most held at once is the box asked for (a whole tensor for export and sample).

What is where (the names are the model's, ``_orig_mod.`` of torch.compile removed):

- ZeRO 0-2: ``mp_rank_00_model_states.pt``'s ``module``, each tensor where it is stored.
- Pipeline stages: one ``layer_XX-model_states.pt`` per layer: layer 0 the embedding, 1..L the
  blocks (``layers.{i-1}.``), L+1 the final norm and head (``deepspeed_engine.pipeline_layers``).
- ZeRO-3: the weights are the fp32 partitions in the W optimizer files. Each rank's
  ``optimizer_state_dict`` -> ``fp32_flat_groups`` (1-D tensors, read as one run); the trainable
  parameters, in the order of the model-states file's ``param_shapes`` (a list of {name: shape},
  one per group), each take n = ceil(numel / W) elements of every rank's run, back to back: rank r
  holds elements [r n, (r+1) n) of the parameter flattened, the last part padded. Frozen
  parameters (``frozen_param_shapes``) are rank r's ``frozen_param_fragments`` concatenated in
  rank order; buffers are rank 0's ``module`` entries named in ``buffer_names``, floating ones as
  fp32; ``shared_params`` maps a name to the one it shares. This is what DeepSpeed's
  ``zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint`` (deepspeed/utils/zero_to_fp32.py,
  v0.19.8) merges after reading every file whole, Adam moments included; here a box reads only
  the parts of the ranks that hold it, and the result is the same to the bit
  (tests/unit/train/checkpoint/test_deepspeed_tensors.py, and a real ZeRO-3 run in
  tests/integration/test_export_run.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from launcher.train.checkpoint.engine_dirs import DS_TAG, ConsolidateError
from launcher.train.checkpoint.engine_dirs import clean as _clean
from launcher.train.checkpoint.saved_tensors import (
    Descriptors,
    PooledFile,
    Stored,
    layout,
    where_stored,
)

if TYPE_CHECKING:
    from launcher.train.checkpoint.safe_load import CheckpointFiles

LAYER_FILE = re.compile(r"layer_(\d+)-(?:model_00-)?model_states\.pt$")
ZERO3_MODEL_FILES = "zero_pp_rank_*_mp_rank_00_model_states.pt"
MODULE_FILE = "mp_rank_00_model_states.pt"


class Values(Protocol):
    """A tensor's values, flattened row-major: ``read(part, start)`` fills the contiguous 1-D
    `part` with elements [start, start + part.numel())."""

    @property
    def dtype(self) -> torch.dtype: ...

    def read(self, part: torch.Tensor, start: int) -> None: ...


@dataclass(frozen=True)
class Concat:
    """1-D tensors read as one run, in order (a rank's flat groups; a frozen parameter's
    fragments)."""

    parts: tuple[Stored, ...]

    @property
    def dtype(self) -> torch.dtype:
        return self.parts[0].dtype

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.parts)

    def read(self, part: torch.Tensor, start: int) -> None:
        end, first = start + part.numel(), 0
        for stored in self.parts:
            lo, hi = max(start, first), min(end, first + stored.numel)
            if lo < hi:
                stored.read(part[lo - start : hi - start], lo - first)
            first += stored.numel


@dataclass(frozen=True)
class Partitioned:
    """A ZeRO-3 parameter: rank r's run holds its elements [r n, (r+1) n) from `offset` on."""

    ranks: tuple[Concat, ...]
    offset: int
    n: int

    @property
    def dtype(self) -> torch.dtype:
        return self.ranks[0].dtype

    def read(self, part: torch.Tensor, start: int) -> None:
        done, total = 0, part.numel()
        while done < total:
            rank, within = divmod(start + done, self.n)
            take = min(self.n - within, total - done)
            self.ranks[rank].read(part[done : done + take], self.offset + within)
            done += take


@dataclass(frozen=True)
class Entry:
    """One model tensor: where its values are, its shape, and the dtype it is given as."""

    values: Values
    shape: tuple[int, ...]
    dtype: torch.dtype


def _load(files: Descriptors, path: Path) -> tuple[Any, PooledFile]:
    """The pickle of the torch.save file `path`, its tensors on meta (``saved_tensors.layout``),
    and the file their values are read through (checked: ``saved_tensors.Descriptors``)."""
    from launcher.train.checkpoint.safe_load import deepspeed_globals

    stream = PooledFile(files, path)  # hashed against the manifest at its first read
    return layout(stream, path, deepspeed_globals()), stream


def _as_is(tensor: Any, file: PooledFile, what: str) -> Entry:
    stored = where_stored(tensor, file, what)
    return Entry(stored, stored.shape, stored.dtype)


def _natural(path: Path) -> list[Any]:
    """DeepSpeed's file order (rank 10 after rank 9): digits compared as numbers."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path.name)]


def _module_entries(tag_dir: Path, listed: list[Path], files: Descriptors) -> dict[str, Entry]:
    states = tag_dir / MODULE_FILE
    if states not in listed:
        raise ConsolidateError(f"{tag_dir}: no {MODULE_FILE} (a DeepSpeed checkpoint?)")
    saved, stream = _load(files, states)
    if not isinstance(saved, dict) or not isinstance(saved.get("module"), dict):
        raise ConsolidateError(f"{states}: not a DeepSpeed model-states file")
    return {
        _clean(k): _as_is(v, stream, k)
        for k, v in saved["module"].items()
        if isinstance(v, torch.Tensor)
    }


def _pipeline_entries(paths: list[Path], num_layers: int, files: Descriptors) -> dict[str, Entry]:
    entries: dict[str, Entry] = {}
    for path in paths:
        match = LAYER_FILE.search(path.name)
        assert match is not None
        index = int(match.group(1))
        tensors, stream = _load(files, path)
        if not isinstance(tensors, dict):
            raise ConsolidateError(f"{path}: not a DeepSpeed layer file")
        prefix = f"layers.{index - 1}." if 1 <= index <= num_layers else ""
        for key, value in tensors.items():
            entries[prefix + _clean(key)] = _as_is(value, stream, key)
    return entries


def entries(engine_dir: Path, num_layers: int, files: CheckpointFiles) -> dict[str, Entry]:
    """{model name: Entry} of the DeepSpeed checkpoint engine folder `engine_dir`."""
    tag_dir = Path(engine_dir) / DS_TAG
    listed = files.names("*.pt", tag_dir)
    layers = [p for p in listed if p.name.startswith("layer_") and LAYER_FILE.search(p.name)]
    try:
        if layers:
            return _pipeline_entries(layers, num_layers, Descriptors(files))
        if files.names(ZERO3_MODEL_FILES, tag_dir):
            return _zero3_entries(tag_dir, listed, Descriptors(files))
        return _module_entries(tag_dir, listed, Descriptors(files))
    except (TypeError, ValueError, AttributeError, IndexError, KeyError) as exc:
        if isinstance(exc, ConsolidateError):
            raise
        # a pickle of other shapes or values (int() of a string, max() of an empty list)
        raise ConsolidateError(
            f"{tag_dir}: not laid out as DeepSpeed writes its checkpoints ({type(exc).__name__})"
        ) from None


def _dict(value: Any, path: Path, what: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise ConsolidateError(f"{path}: {what} is not what DeepSpeed writes (a dict)")
    return value


def _fp32_partitions(
    files: Descriptors, optims: list[Path], tag_dir: Path, ds: Any
) -> tuple[Concat, ...]:
    """Each rank's fp32 flat groups as one run, in rank order; their count is the ranks'."""
    if not optims:
        raise ConsolidateError(f"{tag_dir}: no *_optim_states.pt (ZeRO-3 keeps its weights there)")
    runs: list[Concat] = []
    world: Any = 0
    for path in optims:
        saved, stream = _load(files, path)
        state = _dict(_dict(saved, path, "the file").get(ds.OPTIMIZER_STATE_DICT), path, "it")
        if not world:  # rank 0's, as DeepSpeed reads them
            stage, count = state.get(ds.ZERO_STAGE), state.get(ds.PARTITION_COUNT)
            world = max(count) if isinstance(count, list) else count
            if stage is None or int(stage) != 3 or not isinstance(world, int) or world < 1:
                raise ConsolidateError(f"{path}: not the optimizer file of a ZeRO-3 checkpoint")
        groups = state.get(ds.FP32_FLAT_GROUPS)
        if not isinstance(groups, list) or not groups:
            raise ConsolidateError(f"{path}: no {ds.FP32_FLAT_GROUPS}")
        named = [
            where_stored(g, stream, f"{ds.FP32_FLAT_GROUPS}[{i}]") for i, g in enumerate(groups)
        ]
        if any(len(g.shape) != 1 or g.dtype != named[0].dtype for g in named):
            raise ConsolidateError(f"{path}: {ds.FP32_FLAT_GROUPS} are not 1-D of one dtype")
        runs.append(Concat(tuple(named)))
    if world != len(runs):
        raise ConsolidateError(
            f"{tag_dir}: {len(runs)} *_optim_states.pt files for {world} ranks (a rank's file "
            "missing, or left from another run)"
        )
    sizes = [g.numel for g in runs[0].parts]
    if any([g.numel for g in run.parts] != sizes for run in runs):
        raise ConsolidateError(f"{tag_dir}: the ranks' {ds.FP32_FLAT_GROUPS} differ in size")
    return tuple(runs)


def _zero3_entries(tag_dir: Path, listed: list[Path], files: Descriptors) -> dict[str, Entry]:
    """ZeRO-3 (module docstring): buffers, frozen, then trainable parameters, then the shared
    names, in ``get_fp32_state_dict_from_zero_checkpoint``'s order."""
    from launcher.train.deepspeed_import import import_deepspeed

    import_deepspeed()
    from deepspeed.checkpoint import constants as ds

    models = sorted((p for p in listed if p.name.endswith("_model_states.pt")), key=_natural)
    optims = sorted((p for p in listed if p.name.endswith("_optim_states.pt")), key=_natural)
    states = [_load(files, path) for path in models]
    for (state, _), path in zip(states, models, strict=True):
        if ds.BUFFER_NAMES not in _dict(state, path, "the file"):
            raise ConsolidateError(f"{path}: not a DeepSpeed model-states file")
    runs = _fp32_partitions(files, optims, tag_dir, ds)
    first, stream = states[0]
    found: dict[str, Entry] = {}
    buffers = set(first[ds.BUFFER_NAMES])
    for name, value in _dict(first.get("module"), models[0], "module").items():
        if name in buffers:
            stored = where_stored(value, stream, name)
            floating = stored.dtype.is_floating_point
            found[name] = Entry(stored, stored.shape, torch.float32 if floating else stored.dtype)
    frozen = _dict(first.get(ds.FROZEN_PARAM_SHAPES) or {}, models[0], ds.FROZEN_PARAM_SHAPES)
    for name, shape in frozen.items():
        found[name] = _frozen_entry(name, tuple(shape), states, ds)
    groups = first.get(ds.PARAM_SHAPES)
    if not isinstance(groups, list):
        raise ConsolidateError(f"{models[0]}: no {ds.PARAM_SHAPES} list")
    offset = 0
    for name, shape in {
        k: v for g in groups for k, v in _dict(g, models[0], "a group").items()
    }.items():
        n = -(-math.prod(shape) // len(runs))  # ceil(numel / W): the padded part of each rank
        found[name] = Entry(Partitioned(runs, offset, n), tuple(shape), runs[0].dtype)
        offset += n
    if offset != runs[0].numel:
        raise ConsolidateError(
            f"{tag_dir}: the parameters take {offset * len(runs)} of the "
            f"{runs[0].numel * len(runs)} fp32 values the optimizer files hold"
        )
    for name, shared in _dict(first.get("shared_params", {}), models[0], "shared_params").items():
        if shared in found:
            found[name] = found[shared]
    return {_clean(k): v for k, v in found.items()}


def _frozen_entry(
    name: str, shape: tuple[int, ...], states: list[tuple[Any, PooledFile]], ds: Any
) -> Entry:
    """A frozen parameter: its fragments in rank order, read as one run; they must hold its
    values in one dtype (DeepSpeed's ``torch.cat(...).narrow`` raises otherwise: here a short
    run would leave values unread)."""
    parts = []
    for state, file in states:
        fragments = _dict(state.get(ds.FROZEN_PARAM_FRAGMENTS), file.path, "its fragments")
        parts.append(where_stored(fragments.get(name), file, name))
    run = Concat(tuple(parts))
    where = parts[0].file.path.parent
    if any(p.dtype != run.dtype for p in parts):
        raise ConsolidateError(f"{where}: the ranks' fragments of {name} differ in dtype")
    if run.numel < math.prod(shape):
        raise ConsolidateError(
            f"{where}: the ranks' fragments of {name} hold {run.numel} values for "
            f"{math.prod(shape)} (a rank's file from another run?)"
        )
    return Entry(run, shape, run.dtype)


class DeepSpeedTensors:
    """The model tensors of a DeepSpeed checkpoint, each box read on its own (module
    docstring): ``box`` for train.init_from's slices, ``tensor`` for export and sample."""

    def __init__(self, engine_dir: Path, num_layers: int, files: CheckpointFiles):
        self.engine_dir, self.files = Path(engine_dir), files
        self.entries = entries(self.engine_dir, num_layers, files)

    def specs(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """{name: (shape, dtype)} of every model tensor, from the pickles alone."""
        return {name: (e.shape, e.dtype) for name, e in self.entries.items()}

    def box(self, name: str, offsets: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
        """The box `offsets` + `shape` of the tensor `name`, only its runs read."""
        from launcher.train.checkpoint.safetensors_slices import box_outside, read_runs

        entry = self.entries[name]
        if box_outside(entry.shape, offsets, shape):
            raise ValueError(f"{name}: box {offsets} + {shape} outside {entry.shape}")
        out = torch.empty(shape, dtype=entry.values.dtype)
        if out.numel():
            read_runs(entry.shape, offsets, out, entry.values.read)
        return out.to(entry.dtype)

    def tensor(self, name: str) -> torch.Tensor:
        """The whole tensor `name`."""
        shape = self.entries[name].shape
        return self.box(name, (0,) * len(shape), shape)
