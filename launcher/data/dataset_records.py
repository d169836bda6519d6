"""Records for chat, instruct and preference data where users keep them: JSON Lines files,
parquet files, folders written by ``datasets.save_to_disk`` and dataset ids already in the local
Hugging Face datasets cache, with ``--split`` and a column mapping (``--columns
messages=conversation``).

Everything but JSON Lines is read through the ``datasets`` library (the ``datasets`` extra,
imported only here and only when such an input is given), never over the network: the hub is
switched off (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``, the variables ``datasets`` documents
for offline use: https://huggingface.co/docs/datasets/loading#offline) while a dataset is opened,
so a dataset id is found in the cache (``$HF_DATASETS_CACHE``, else ``datasets.config``'s
``~/.cache/huggingface/datasets``) or refused with exit 2 naming it and where it looked.

- ``*.jsonl``: one JSON object a line (``launcher.data.chat.chat_records``);
- ``*.parquet``: ``datasets.Dataset.from_parquet``, one split;
- a ``save_to_disk`` folder: ``datasets.load_from_disk``; a ``DatasetDict`` folder gives its
  ``--split`` (default ``train``);
- any other ``--input`` that is no path and reads as a dataset id (``name`` or ``owner/name``):
  ``datasets.load_dataset(id, split=--split)`` from the cache.

``--columns TARGET=SOURCE`` (repeatable) renames the column SOURCE to the field TARGET the record
shapes expect (``messages``, ``conversations``, ``prompt``, ``completion``, ``chosen``,
``rejected``, ...), for every input.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.data.limits import DataLimits
from launcher.errors import UserError

DATASET_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


@dataclass(frozen=True)
class RecordOptions:
    """``--split`` and ``--columns`` of `data prepare`."""

    split: str = "train"
    columns: tuple[tuple[str, str], ...] = ()  # (target field, source column)

    def rename(self, record: dict[str, Any], where: str) -> dict[str, Any]:
        if not self.columns:
            return record
        out = dict(record)
        for target, source in self.columns:
            if source not in record:
                have = ", ".join(sorted(map(str, record))[:12]) or "none"
                raise UserError(
                    f"{where}: --columns {target}={source}: no column {source!r} (the record "
                    f"has: {have})"
                )
            out.pop(source)
            out[target] = record[source]
        return out


def parse_columns(values: Sequence[str] | None) -> tuple[tuple[str, str], ...]:
    """``--columns messages=conversation`` (repeatable) as (target, source) pairs."""
    pairs: list[tuple[str, str]] = []
    for value in values or ():
        target, sep, source = value.partition("=")
        if not sep or not target.strip() or not source.strip():
            raise UserError(
                f"--columns {value}: expected TARGET=SOURCE, e.g. --columns messages=conversation"
            )
        pairs.append((target.strip(), source.strip()))
    targets = [t for t, _ in pairs]
    if len(set(targets)) != len(targets):
        raise UserError(f"--columns: a field named twice ({', '.join(targets)})")
    return tuple(pairs)


def is_dataset_id(raw: str | Path) -> bool:
    """An --input that is no existing path but reads as a hub dataset id (name or owner/name)."""
    text = str(raw)
    return not Path(text).expanduser().exists() and bool(DATASET_ID.match(text))


def is_saved_folder(path: Path) -> bool:
    return path.is_dir() and any(
        (path / name).is_file() for name in ("state.json", "dataset_dict.json")
    )


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise UserError(
            "reading parquet files, saved datasets and dataset ids needs the datasets library: "
            "pip install 'llmtrain[datasets]' (or give JSON Lines files)"
        ) from None
    return datasets


@contextmanager
def _offline() -> Iterator[Any]:
    """`datasets` with the hub switched off (its variables and the flags read from them at
    import), restored after."""
    saved = {name: os.environ.get(name) for name in _OFFLINE_VARIABLES}
    os.environ.update(dict.fromkeys(_OFFLINE_VARIABLES, "1"))
    datasets = _datasets()
    import huggingface_hub.constants as hub_constants

    flags = [(datasets.config, "HF_HUB_OFFLINE"), (datasets.config, "HF_DATASETS_OFFLINE")]
    flags.append((hub_constants, "HF_HUB_OFFLINE"))
    old = [(obj, name, getattr(obj, name)) for obj, name in flags if hasattr(obj, name)]
    for obj, name, _ in old:
        setattr(obj, name, True)
    try:
        yield datasets
    finally:
        for obj, name, value in old:
            setattr(obj, name, value)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def cache_folder(datasets: Any) -> str:
    return os.environ.get("HF_DATASETS_CACHE") or str(datasets.config.HF_DATASETS_CACHE)


def _open(source: str, options: RecordOptions) -> Any:
    """The `datasets.Dataset` behind one non-JSONL input."""
    path = Path(source).expanduser()
    with _offline() as datasets:
        if path.is_file() and path.suffix == ".parquet":
            try:
                return datasets.Dataset.from_parquet(str(path), keep_in_memory=False)
            except Exception as exc:  # pyarrow / datasets raise their own errors
                raise UserError(f"--input {source}: not a readable parquet file ({exc})") from None
        if is_saved_folder(path):
            try:
                loaded = datasets.load_from_disk(str(path))
            except Exception as exc:
                raise UserError(f"--input {source}: not a readable saved dataset ({exc})") from None
            if isinstance(loaded, datasets.DatasetDict):
                if options.split not in loaded:
                    raise UserError(
                        f"--split {options.split}: {source} has the splits "
                        f"{', '.join(loaded)}; e.g. --split {next(iter(loaded))}"
                    )
                return loaded[options.split]
            return loaded
        folder = cache_folder(datasets)
        try:
            return datasets.load_dataset(source, split=options.split, cache_dir=folder)
        except Exception as exc:  # offline misses raise ConnectionError, ValueError, ...
            reason = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            raise UserError(
                f"--input {source}: not a file, a saved dataset folder, nor a dataset id with "
                f"split {options.split!r} in the local Hugging Face datasets cache ({folder}; "
                f"set HF_DATASETS_CACHE to look elsewhere; nothing is downloaded): {reason}"
            ) from None


def dataset_records(source: str, options: RecordOptions) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, record) for each row of a parquet file, saved folder or cached dataset id."""
    dataset = _open(source, options)
    for number, row in enumerate(dataset, start=1):
        where = f"{source}[{options.split}] row {number}"
        yield where, options.rename(dict(row), where)


def iter_records(
    inputs: Sequence[str | Path], options: RecordOptions, limits: DataLimits | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, record) of every input in order: JSON Lines lines (read under `limits`, as
    ``chat_records`` reads them), dataset rows."""
    from launcher.data.chat.chat_records import _records

    for raw in inputs:
        path = Path(raw)
        if path.suffix == ".jsonl" and path.is_file():
            for where, record in _records(path, limits or DataLimits()):
                yield where, options.rename(record, where)
        elif path.suffix == ".parquet" or is_saved_folder(path) or is_dataset_id(raw):
            yield from dataset_records(str(raw), options)
        else:
            raise UserError(
                f"--input {raw}: chat, instruct and preference records are read from JSON Lines "
                "files (*.jsonl), parquet files, datasets.save_to_disk folders or a dataset id in "
                "the local Hugging Face cache"
            )


def record_inputs(inputs: Sequence[str | Path]) -> list[str | Path]:
    """The inputs in order: dataset ids as given, folders of files expanded
    (``launcher.data.documents.find_inputs``; a saved dataset folder stays one input)."""
    from launcher.data.documents import find_inputs

    if not inputs:
        raise UserError("no input given: pass --input PATH (a file, a folder or a dataset id)")
    found: list[str | Path] = []
    for raw in inputs:
        if is_dataset_id(raw):
            found.append(str(raw))
        else:
            found.extend(p for p in find_inputs([Path(raw)]) if p not in found)
    return found
