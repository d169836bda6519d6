"""Hugging Face model folders on disk: safetensors shards, their index, config.json, tokenizer.

``write_hf_folder`` writes into a temporary sibling folder and renames it into place, so a reader
never sees half an export; ``read_hf_folder`` reads one back (one ``model.safetensors`` or the
shards its ``model.safetensors.index.json`` lists). safetensors files hold raw tensors and a JSON
header only: reading them executes nothing. Each file's header is checked against the file
(``launcher.export.safetensors_header``) before the library reads it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from launcher import bounded_read
from launcher.excerpt import excerpt
from launcher.export.safetensors_header import read_header
from launcher.export.safetensors_stream import Spec, Streamed, write_file

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
# transformers' default max_shard_size for save_pretrained.
DEFAULT_SHARD_BYTES = 5 * 10**9


def _shards(specs: list[Spec], max_bytes: int) -> list[list[Spec]]:
    """The tensors by name, a new shard whenever the next would take one past `max_bytes`."""
    shards: list[list[Spec]] = [[]]
    size = 0
    for spec in sorted(specs, key=lambda s: s.name):
        if shards[-1] and size + spec.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += spec.nbytes
    return shards


def write_hf_folder(
    out: Path,
    tensors: Mapping[str, torch.Tensor] | Streamed,
    config: Mapping[str, Any],
    tokenizer: Path | None = None,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    metadata: Mapping[str, str] | None = None,
    extra_files: Mapping[str, bytes] | None = None,
) -> list[Path]:
    """Write the folder `out` (which must not exist, or be empty); return the files written.
    `tensors`: in memory, or ``Streamed`` (each made when its turn comes and written before the
    next is made: ``safetensors_stream``). `extra_files`: {file name: content} written beside
    (generation_config.json, ...)."""
    out = Path(out)
    if out.is_symlink() or (out.exists() and (not out.is_dir() or any(out.iterdir()))):
        raise FileExistsError(f"{out}: exists and is not an empty folder; choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        stream = tensors if isinstance(tensors, Streamed) else Streamed.of(tensors)
        shards = _shards(stream.specs, max_shard_bytes)
        meta = {"format": "pt", **(metadata or {})}
        if len(shards) == 1:
            write_file(tmp / SINGLE_FILE, shards[0], stream.make, meta)
        else:
            weight_map: dict[str, str] = {}
            total = 0
            for i, shard in enumerate(shards, start=1):
                name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                write_file(tmp / name, shard, stream.make, meta)
                for spec in shard:
                    weight_map[spec.name] = name
                    total += spec.nbytes
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (tmp / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        (tmp / CONFIG_FILE).write_text(json.dumps(dict(config), indent=2, sort_keys=True) + "\n")
        if tokenizer is not None:
            shutil.copyfile(tokenizer, tmp / TOKENIZER_FILE)
        for name, content in (extra_files or {}).items():
            if Path(name).name != name or name.startswith("."):
                raise ValueError(f"extra file name {name!r} is not a plain file name")
            (tmp / name).write_bytes(content)
        umask = os.umask(0)
        os.umask(umask)
        for path in tmp.iterdir():
            path.chmod(0o666 & ~umask)  # as an ordinary file, not mkstemp's owner-only mode
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        tmp.chmod(0o777 & ~umask)
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sorted(out.iterdir())


def _load(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file `path`, its header checked first (a HeaderError, a
    ValueError, names what is wrong); what the library still refuses is a ValueError too."""
    read_header(path)
    try:
        return load_file(str(path))
    except Exception as exc:  # the library's SafetensorError, or an OSError of the mmap
        raise ValueError(
            f"{path}: not a readable safetensors file ({type(exc).__name__})"
        ) from None


def read_hf_folder(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, config.json) of a Hugging Face model folder."""
    folder = Path(folder)
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path}: missing; is {folder} a Hugging Face model folder?")
    # Read bounded (a regular file, no blocking, 1 MiB / 64 MiB, nesting 32): a link is fine,
    # the Hugging Face cache links snapshots to blobs.
    config = bounded_read.read_json(config_path, max_bytes=1 << 20, follow_symlinks=True)
    if (folder / SINGLE_FILE).is_file():
        return _load(folder / SINGLE_FILE), config
    index_path = folder / INDEX_FILE
    if not index_path.is_file():
        raise FileNotFoundError(f"{folder}: neither {SINGLE_FILE} nor {INDEX_FILE}")
    index = bounded_read.read_json(index_path, max_bytes=64 << 20, follow_symlinks=True)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise ValueError(f"{index_path}: no weight_map of tensor names to shard files")
    tensors: dict[str, torch.Tensor] = {}
    for name in sorted(set(weight_map.values())):
        shard = (folder / name).resolve()
        if shard.parent != folder.resolve():
            raise ValueError(f"{index_path}: shard {excerpt(name)} lies outside the folder")
        tensors.update(_load(shard))
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
        raise ValueError(f"{index_path}: tensors listed but absent: {', '.join(missing[:4])}")
    return tensors, config
