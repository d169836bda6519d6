"""Documents out of the files a user already has: text, JSON Lines, JSON, parquet, saved datasets.

``iter_documents(paths, text_key)`` yields one string per document, in a deterministic order
(inputs in the order given, files inside a folder sorted by path):

- ``*.txt *.md *.py *.rst`` and any other file named directly: the whole file is one document;
  it must be UTF-8 text (a NUL byte or invalid UTF-8 is refused unless ``allow_binary``, where
  undecodable bytes become U+FFFD).
- ``*.jsonl`` (also ``.jsonl.gz`` is not read: decompress first): one JSON object per line, the
  document is ``object[text_key]``; blank lines are skipped.
- ``*.json``: a JSON array of objects (or an object whose only list value holds them).
- ``*.parquet``: the ``text_key`` column, read in record batches with pyarrow.
- a Hugging Face ``datasets`` folder saved with ``save_to_disk`` (it holds ``state.json`` and
  ``dataset_info.json``): its ``*.arrow`` files (Arrow IPC streams), ``text_key`` column; a
  ``DatasetDict`` folder (``dataset_dict.json``) reads its ``train`` split.

Every error is a ``UserError`` naming the file (and line or column) at fault.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from launcher.errors import UserError
from launcher.excerpt import excerpt

TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst")
STRUCTURED_SUFFIXES = (".jsonl", ".json", ".parquet")
_BATCH_ROWS = 4096


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise UserError(
            "reading parquet files or saved datasets needs pyarrow: pip install 'llmtrain[data]'"
        ) from None
    return pyarrow


def is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and (
        (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()
    )


def find_inputs(inputs: Sequence[Path]) -> list[Path]:
    """Files and saved-dataset folders to read, in order, without duplicates."""
    if not inputs:
        raise UserError("no input given: pass --input PATH (a file or a directory)")
    found: dict[Path, None] = {}
    for raw in inputs:
        path = Path(raw)
        if is_saved_dataset(path) or path.is_file():
            found[path] = None
        elif path.is_dir():
            wanted = TEXT_SUFFIXES + STRUCTURED_SUFFIXES
            files = sorted(p for p in path.rglob("*") if p.suffix in wanted and p.is_file())
            if not files:
                raise UserError(
                    f"{path}: no text files or records "
                    f"({', '.join('*' + s for s in wanted)}) in this directory"
                )
            found.update(dict.fromkeys(files))
        else:
            raise UserError(f"{path}: no such file or directory")
    return list(found)


def iter_documents(
    inputs: Sequence[Path], text_key: str = "text", allow_binary: bool = False
) -> Iterator[str]:
    for path in find_inputs(inputs):
        if is_saved_dataset(path):
            yield from _saved_dataset(path, text_key)
        elif path.suffix == ".jsonl":
            yield from _jsonl(path, text_key)
        elif path.suffix == ".json":
            yield from _json(path, text_key)
        elif path.suffix == ".parquet":
            yield from _parquet(path, text_key)
        else:
            yield read_text_file(path, allow_binary)


def looks_binary(path: Path, probe: int = 1 << 16) -> str | None:
    """Why `path` does not look like text (NUL bytes, not UTF-8), or None."""
    import codecs

    with open(path, "rb") as f:
        head = f.read(probe)
    if b"\0" in head:
        return "it holds NUL bytes"
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) < probe)
    except UnicodeDecodeError as exc:
        return f"it is not UTF-8 text (byte {exc.start})"
    return None


def read_text_file(path: Path, allow_binary: bool = False) -> str:
    if not allow_binary:
        why = looks_binary(path)
        if why:
            raise UserError(
                f"--input {path}: does not look like text ({why}); pass --allow-binary to "
                "tokenize it anyway (undecodable bytes become U+FFFD)"
            )
    return path.read_bytes().decode("utf-8", errors="replace")


def _text_of(record: Any, text_key: str, where: str) -> str:
    if not isinstance(record, dict):
        raise UserError(f"{where}: expected a JSON object with a {text_key!r} field")
    if text_key not in record:
        keys = ", ".join(excerpt(k) for k in sorted(map(str, record))[:8])
        raise UserError(f"{where}: no {text_key!r} field (it has: {keys}); pass --text-key NAME")
    value = record[text_key]
    if not isinstance(value, str):
        raise UserError(f"{where}: {text_key!r} is {type(value).__name__}, expected a string")
    return value


def json_line(line: str, where: str) -> Any:
    """One JSON Lines record; UserError naming `where` (FILE:LINE) for invalid or too deeply
    nested JSON (Python's parser recurses: a line of 2,000 '[' would raise RecursionError)."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: invalid JSON ({exc.msg})") from None
    except RecursionError:
        raise UserError(f"{where}: invalid JSON (nested too deeply)") from None


def _jsonl(path: Path, text_key: str) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        number = 0
        try:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                record = json_line(line, f"{path}:{number}")
                yield _text_of(record, text_key, f"{path}:{number}")
        except UnicodeDecodeError:
            raise UserError(f"{path}:{number + 1}: not UTF-8 text") from None


def _json(path: Path, text_key: str) -> Iterator[str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: invalid JSON ({exc})") from None
    except RecursionError:
        raise UserError(f"{path}: invalid JSON (nested too deeply)") from None
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise UserError(f"{path}: expected a JSON array of objects, or one object holding one")
        data = lists[0]
    if not isinstance(data, list):
        raise UserError(f"{path}: expected a JSON array of objects")
    for i, record in enumerate(data):
        yield _text_of(record, text_key, f"{path}[{i}]")


def _column_texts(batches: Iterator[Any], text_key: str, where: str) -> Iterator[str]:
    for batch in batches:
        names = list(batch.schema.names)
        if text_key not in names:
            raise UserError(
                f"{where}: no {text_key!r} column (it has: {', '.join(names[:8])}); "
                "pass --text-key NAME"
            )
        for value in batch.column(names.index(text_key)).to_pylist():
            if value is None:
                continue
            if not isinstance(value, str):
                raise UserError(f"{where}: column {text_key!r} holds {type(value).__name__}")
            yield value


def _parquet(path: Path, text_key: str) -> Iterator[str]:
    pa = _pyarrow()
    try:
        file = pa.parquet.ParquetFile(str(path))
    except Exception as exc:  # pyarrow raises its own ArrowInvalid
        raise UserError(f"{path}: not a readable parquet file ({exc})") from None
    if text_key not in file.schema_arrow.names:
        names = ", ".join(file.schema_arrow.names[:8])
        raise UserError(f"{path}: no {text_key!r} column (it has: {names}); pass --text-key NAME")
    yield from _column_texts(
        file.iter_batches(batch_size=_BATCH_ROWS, columns=[text_key]), text_key, str(path)
    )


def _saved_dataset(path: Path, text_key: str) -> Iterator[str]:
    pa = _pyarrow()
    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        if "train" not in splits:
            raise UserError(f"{path}: a DatasetDict without a 'train' split (has {splits})")
        yield from _saved_dataset(path / "train", text_key)
        return
    state = json.loads((path / "state.json").read_text())
    files = [path / entry["filename"] for entry in state.get("_data_files", [])]
    if not files:
        files = sorted(path.glob("*.arrow"))
    for file in files:
        if file.resolve().parent != path.resolve():
            raise UserError(f"{path / 'state.json'}: data file {file.name!r} outside the folder")
        with pa.memory_map(str(file)) as source:
            try:
                reader = pa.ipc.open_stream(source)
            except Exception as exc:
                raise UserError(f"{file}: not an Arrow stream ({exc})") from None
            yield from _column_texts(iter(reader), text_key, str(file))
