"""``train.init_from=DIR``: start a fresh run (step 0, fresh optimizer) from existing weights.

DIR is a Hugging Face folder as ``llmtrain export`` writes it (config.json + safetensors), a run
directory (its newest checkpoint that verifies), or one checkpoint folder (``step_XXXXXXXX``, which
must verify). The weights are mapped to llmtrain's names (``hf_layout``) and must match the
configured model exactly: every parameter present with its shape, nothing left over. ``problems``
says what differs (key and both shapes) from the shapes alone, without reading the data
(``preflight`` calls it before any process starts); ``open_source`` gives the engines a reader of
the boxes each rank holds (``HFSlices``, ``CheckpointSlices``: our checkpoints of either engine).
A run that has checkpoints of its own resumes from them instead (the trainer
logs that init_from is ignored).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from launcher import bounded_read
from launcher.config.schema import LLMTrainConfig, ModelConfig

KEY = "train.init_from"


class InitFromError(ValueError):
    """The weights in train.init_from cannot start this model (the message says why)."""


def _kind(path: Path) -> str:
    if path.is_symlink() and not path.resolve().is_dir():
        raise InitFromError(f"{KEY}={path}: a dangling symbolic link")
    if not path.is_dir():
        raise InitFromError(
            f"{KEY}={path}: no such folder; give a Hugging Face model folder (llmtrain export), "
            "a run directory or a checkpoint folder"
        )
    if (path / "config.json").is_file():
        return "hf"
    if (path / "manifest.json").is_file():
        return "checkpoint"
    if (path / "config.yaml").is_file() and (path / "checkpoints").is_dir():
        return "run"
    raise InitFromError(
        f"{KEY}={path}: neither a Hugging Face model folder (config.json + safetensors), a run "
        "directory (config.yaml + checkpoints/) nor a checkpoint folder (manifest.json)"
    )


def _checkpoint(path: Path, kind: str) -> Path:
    """The checkpoint folder (step_XXXXXXXX) to read: `path`, or a run's newest that verifies."""
    from launcher.train.checkpoint.store import latest_valid, verify

    if kind == "checkpoint":
        problem = verify(path)
        if problem is not None:
            raise InitFromError(f"{KEY}={path}: checkpoint refused: {problem}")
        return path
    found = latest_valid(path / "checkpoints")
    if found is None:
        raise InitFromError(f"{KEY}={path}: the run has no checkpoint that verifies")
    return found.path


def _hf_files(path: Path) -> list[Path]:
    """The folder's safetensors files (one, or the shards its index lists, inside it)."""
    from launcher.export.hf_files import INDEX_FILE, SINGLE_FILE

    if (path / SINGLE_FILE).is_file():
        files = [path / SINGLE_FILE]
    elif (path / INDEX_FILE).is_file():
        try:  # bounded: an index is a few MB at most; a FIFO or a huge file is refused
            index = bounded_read.read_json(
                path / INDEX_FILE, max_bytes=64 << 20, follow_symlinks=True
            )
            weight_map = index["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InitFromError(f"{KEY}={path}: unreadable {INDEX_FILE} ({exc})") from None
        files = [path / name for name in sorted(set(weight_map.values()))]
    else:
        raise InitFromError(f"{KEY}={path}: no {SINGLE_FILE} or {INDEX_FILE}")
    for file in files:
        if file.resolve().parent != path.resolve():
            raise InitFromError(f"{KEY}={path}: shard {file.name!r} lies outside the folder")
    return files


def _hf_shapes(path: Path) -> dict[str, torch.Tensor]:
    """The folder's tensors as shape-only stand-ins on `meta`: nothing read but the headers, each
    checked against its file (launcher.export.safetensors_header)."""
    from launcher.export.safetensors_header import read_header

    out: dict[str, torch.Tensor] = {}
    for file in _hf_files(path):
        for name, entry in read_header(file).items():
            out[name] = torch.empty(entry.shape, device="meta")
    return out


def _shapes(path: Path, m: ModelConfig) -> dict[str, tuple[int, ...]]:
    """{llmtrain parameter name: shape} of train.init_from, from headers and metadata alone (an
    HF folder's safetensors headers, our checkpoints' DCP metadata or DeepSpeed pickles, every
    file of those checked against the verified manifest first)."""
    from launcher.export.hf_layout import LayoutError, from_hf
    from launcher.train.checkpoint.consolidate import ConsolidateError, shapes
    from launcher.train.checkpoint.safe_load import CheckpointFiles, UnsafeCheckpointError
    from launcher.train.checkpoint.store import ENGINE_DIR

    kind = _kind(path)
    try:
        if kind == "hf":
            return {k: tuple(v.shape) for k, v in from_hf(_hf_shapes(path), m).items()}
        checkpoint = _checkpoint(path, kind)
        files = CheckpointFiles.verified(checkpoint)
        return dict(shapes(checkpoint / ENGINE_DIR, m.num_layers, files))
    except (
        LayoutError,
        ConsolidateError,
        UnsafeCheckpointError,
        KeyError,
        OSError,
        ValueError,
    ) as exc:
        if isinstance(exc, InitFromError):
            raise
        raise InitFromError(f"{KEY}={path}: {exc}") from None


def expected_shapes(m: ModelConfig) -> dict[str, tuple[int, ...]]:
    from launcher.train.model.transformer import build_model

    model = build_model(m, "meta")
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def mismatches(have: dict[str, tuple[int, ...]], want: dict[str, tuple[int, ...]]) -> list[str]:
    """What keeps `have` from loading into a model of shapes `want` (empty: compatible)."""
    problems = []
    for key in sorted(want):
        if key not in have:
            problems.append(f"{key}: missing from the weights (the model has {list(want[key])})")
        elif have[key] != want[key]:
            problems.append(f"{key}: weights {list(have[key])}, model {list(want[key])}")
    for key in sorted(set(have) - set(want)):
        problems.append(f"{key}: in the weights ({list(have[key])}), not in the model")
    return problems


def problems(cfg: LLMTrainConfig) -> list[str]:
    """Why train.init_from cannot start this model (from the shapes alone)."""
    if cfg.train.init_from is None:
        return []
    path = Path(cfg.train.init_from).expanduser()
    try:
        have = _shapes(path, cfg.model)
    except InitFromError as exc:
        return [str(exc)]
    found = mismatches(have, expected_shapes(cfg.model))
    if not found:
        return []
    shown = found[:5] + ([f"... and {len(found) - 5} more"] if len(found) > 5 else [])
    return [
        f"{KEY}={path} does not fit the configured model.*: "
        + "; ".join(shown)
        + " (set model.* to the shape the weights were trained with)"
    ]


class HFSlices:
    """train.init_from's Hugging Face safetensors (one file or index-sharded), read slice by
    slice: each rank reads only the boxes it holds, with plain file reads into the tensor it
    returns (``checkpoint.safetensors_slices``: no memory mapping, whose pages would stay in
    the rank's resident set), converted to the parameter's dtype per slice
    (``launcher.train.parallel.build``); a frozen tensor's digest is read in bounded chunks of rows.
    `slices` maps our names to theirs (``hf_layout.hf_slices``: a rename, or GPT-2's transposed
    and fused q/k/v, whose box is a box of the fused tensor). Safetensors never unpickles."""

    def __init__(
        self,
        path: Path,
        slices: dict[str, Any],
        shapes: dict[str, tuple[int, ...]] | None = None,
    ):
        from launcher.export.hf_layout import Slice
        from launcher.train.checkpoint.safetensors_slices import read_header

        self.path, self.shapes = path, shapes or {}
        self.slices = {k: Slice(v) if isinstance(v, str) else v for k, v in slices.items()}
        self.where: dict[str, Any] = {}
        for file in _hf_files(path):
            self.where.update(read_header(file))

    def has(self, name: str) -> bool:
        from launcher.train.finetune.lora import plain_name

        return plain_name(name) in self.slices

    def box(self, name: str, offsets: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
        from launcher.train.checkpoint.safetensors_slices import read_box
        from launcher.train.finetune.lora import plain_name

        where = self.slices[plain_name(name)]
        entry = self.where[where.name]
        if where.transposed:  # ours[r, c] = theirs[c, first + r]
            theirs = (offsets[1], where.first + offsets[0])
            return read_box(entry, theirs, (shape[1], shape[0])).T
        return read_box(entry, (where.first + offsets[0], *offsets[1:]), shape)

    def digest(self, name: str) -> str:
        """``lora.base_digest``'s hex of the whole tensor (its values as fp32 bytes)."""
        from launcher.train.checkpoint.safetensors_slices import fp32_digest, rows_digest
        from launcher.train.finetune.lora import plain_name

        where = self.slices[plain_name(name)]
        entry = self.where[where.name]
        ours = self.shapes.get(plain_name(name), entry.shape)
        if not where.transposed and ours == entry.shape:
            return fp32_digest(entry)
        # A part of a fused tensor, or a transposed one: our rows, from the model's shape.
        return rows_digest(ours, lambda offsets, box: self.box(name, offsets, box))

    def __len__(self) -> int:
        return len(self.slices)


class CheckpointSlices:
    """train.init_from's llmtrain checkpoint, read box by box: the torch engine's DCP
    (``consolidate.DcpTensors.box``) or DeepSpeed's files (``deepspeed_tensors.DeepSpeedTensors``:
    ZeRO 0-2, pipeline stages, a ZeRO-3 parameter from the ranks' fp32 partitions that hold the
    box), so a rank reads only what it keeps; every file hashed against the verified manifest
    as it is streamed (``safe_load``)."""

    def __init__(self, tensors: Any):
        self.tensors = tensors

    def has(self, name: str) -> bool:
        from launcher.train.finetune.lora import plain_name

        return plain_name(name) in self.tensors.entries

    def box(self, name: str, offsets: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
        from launcher.train.finetune.lora import plain_name

        box: torch.Tensor = self.tensors.box(plain_name(name), offsets, shape)
        return box

    def __len__(self) -> int:
        return len(self.tensors.entries)


def open_source(cfg: LLMTrainConfig) -> Any:
    """train.init_from for the engines' build (``train.parallel.build``), checked against the
    model first (every name and shape, from the headers, the DCP metadata or the DeepSpeed pickles
    alone): Hugging Face folders read by slice (``HFSlices``), our checkpoints of either engine box
    by box (``CheckpointSlices``)."""
    from launcher.export.hf_layout import hf_slices
    from launcher.train.checkpoint.consolidate import open_tensors
    from launcher.train.checkpoint.safe_load import CheckpointFiles, UnsafeCheckpointError
    from launcher.train.checkpoint.store import ENGINE_DIR

    assert cfg.train.init_from is not None
    path = Path(cfg.train.init_from).expanduser()
    kind = _kind(path)
    want = expected_shapes(cfg.model)
    try:
        if kind == "hf":
            source: Any = HFSlices(path, dict(hf_slices(cfg.model)), want)
            have = _shapes(path, cfg.model)
        else:
            checkpoint = _checkpoint(path, kind)
            files = CheckpointFiles.verified(checkpoint)
            tensors = open_tensors(checkpoint / ENGINE_DIR, cfg.model.num_layers, files)
            source = CheckpointSlices(tensors)
            have = {k: shape for k, (shape, _) in tensors.specs().items()}
    except (OSError, ValueError, UnsafeCheckpointError) as exc:
        if isinstance(exc, InitFromError):
            raise
        raise InitFromError(f"{KEY}={path}: {exc}") from None
    found = mismatches(have, want)
    if found:
        raise InitFromError(f"{KEY}={path} does not fit the model: " + "; ".join(found[:5]))
    return source
