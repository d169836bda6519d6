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

Every error is a ``UserError`` naming the file (and line or column) at fault. A JSON Lines line is
read bounded (``launcher.bounded_read.lines``: longer than ``--max-record-mib`` is refused before
it is parsed), and so is a document bound for the `tokenizers` library (``max_document_bytes``,
``launcher.data.limits``). A string holding a lone surrogate (a ``\\ud800`` escape without its
pair: no character, which the tokenizer cannot read) is refused naming its field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from launcher import bounded_read
from launcher.data.limits import RECORD_OPTION, DataLimits
from launcher.errors import UserError
from launcher.excerpt import excerpt
from launcher.excerpt import message as quoted

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
            why = bounded_read.not_regular(path)  # a FIFO, a socket: there, but no file
            raise UserError(f"{path}: {why or 'no such file or directory'}")
    return list(found)


def iter_documents(
    inputs: Sequence[Path],
    text_key: str = "text",
    allow_binary: bool = False,
    limits: DataLimits | None = None,
    max_document_bytes: int | None = None,
) -> Iterator[str]:
    """Each document of `inputs` (see the module docstring). `limits`: the record budget of a
    JSON Lines line; `max_document_bytes`: the most one document may hold (None: no bound; a
    document bound for the tokenizers library has one)."""
    limits = limits or DataLimits()
    for path in find_inputs(inputs):
        if is_saved_dataset(path):
            texts = _saved_dataset(path, text_key)
        elif path.suffix == ".jsonl":
            texts = _jsonl(path, text_key, limits)
        elif path.suffix == ".json":
            texts = _json(path, text_key)
        elif path.suffix == ".parquet":
            texts = _parquet(path, text_key)
        else:
            texts = iter([read_text_file(path, allow_binary, max_document_bytes)])
        for number, text in enumerate(texts):
            if max_document_bytes is not None and len(text) > max_document_bytes:
                raise UserError(too_long(f"{path} (document {number + 1})", max_document_bytes))
            yield text


def too_long(where: str, max_bytes: int) -> str:
    """The message of a record or document over the record budget."""
    return (
        f"{where}: longer than {max_bytes:,} bytes, the most one record or document may hold "
        f"(the tokenizers library needs some 160 bytes of memory per character: "
        f"launcher/data/limits.py); split it, or raise the bound with {RECORD_OPTION} (now "
        f"{-(-max_bytes // (1 << 20))})"
    )


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


def read_text_file(path: Path, allow_binary: bool = False, max_bytes: int | None = None) -> str:
    if max_bytes is not None and path.stat().st_size > max_bytes:
        raise UserError(too_long(str(path), max_bytes))
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
    nested JSON (Python's parser recurses: a line of 2,000 '[' would raise RecursionError), or
    a string holding a lone surrogate (``refuse_surrogates``)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: invalid JSON ({exc.msg})") from None
    except RecursionError:
        raise UserError(f"{where}: invalid JSON (nested too deeply)") from None
    refuse_surrogates(line, record, where)
    return record


# The escape of a surrogate half (U+D800-U+DFFF): only JSON escapes can make one, and a pair
# of them is one character (json joins it), so the record is searched only when the text has one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
SURROGATE = re.compile("[\ud800-\udfff]")  # a lone one is no character


def refuse_surrogates(text: str, document: Any, where: str) -> None:
    """UserError naming the field of `document` (parsed from JSON `text`) whose string holds
    a lone surrogate, if one does."""
    if "\\u" not in text or _SURROGATE_ESCAPE.search(text) is None:
        return
    stack: list[tuple[str, Any]] = [("", document)]
    while stack:
        field, value = stack.pop()
        if isinstance(value, str):
            found = SURROGATE.search(value)
            if found is not None:
                name = field or "the value"
                raise UserError(
                    f"{where}: {name} holds a lone surrogate ({excerpt(found.group())} at "
                    f"character {found.start()}), half of a UTF-16 pair and no character, which "
                    "the tokenizer cannot read; fix the record (a whole pair such as "
                    "\\ud83d\\ude00 is fine)"
                )
        elif isinstance(value, dict):
            for key, item in reversed(value.items()):
                stack.append((f"{field}{'.' if field else ''}{excerpt(key)[1:-1]}", item))
                stack.append((f"{field} (a key)", key))
        elif isinstance(value, list):
            stack.extend((f"{field}[{i}]", item) for i, item in reversed(list(enumerate(value))))


def record_lines(path: Path, limits: DataLimits) -> Iterator[tuple[str, str]]:
    """(FILE:LINE, text) of each non-blank line of a JSON Lines file, read bounded (a FIFO or
    folder refused, a line over the record budget refused unread); UserError naming the line."""
    number = 0
    try:
        for number, raw in bounded_read.lines(path, limits.record_bytes):
            line = raw.decode("utf-8")
            if line.strip():
                yield f"{path}:{number}", line
    except bounded_read.LineTooLong as exc:
        raise UserError(too_long(f"{path}:{exc.number}", exc.max_bytes)) from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}:{number + 1}: not UTF-8 text ({exc.reason})") from None
    except bounded_read.FileRefused as exc:
        raise UserError(f"{path}: {exc}") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror})") from None


def _jsonl(path: Path, text_key: str, limits: DataLimits) -> Iterator[str]:
    for where, line in record_lines(path, limits):
        yield _text_of(json_line(line, where), text_key, where)


def _json(path: Path, text_key: str) -> Iterator[str]:
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: invalid JSON ({exc})") from None
    except RecursionError:
        raise UserError(f"{path}: invalid JSON (nested too deeply)") from None
    refuse_surrogates(text, data, str(path))
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
                f"{where}: no {text_key!r} column (it has: {_names(names)}); pass --text-key NAME"
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
        raise UserError(f"{path}: not a readable parquet file ({quoted(str(exc))})") from None
    if text_key not in file.schema_arrow.names:
        names = _names(file.schema_arrow.names)
        raise UserError(f"{path}: no {text_key!r} column (it has: {names}); pass --text-key NAME")
    yield from _column_texts(
        file.iter_batches(batch_size=_BATCH_ROWS, columns=[text_key]), text_key, str(path)
    )


def _names(names: Sequence[str]) -> str:
    """Column names found in a file, for a message (the first 8, quoted short)."""
    return ", ".join(excerpt(str(n)) for n in list(names)[:8])


def _meta(file: Path) -> dict[str, Any]:
    """A saved dataset's small JSON file (state.json, dataset_dict.json), read bounded."""
    try:
        document = bounded_read.read_json(file, max_bytes=16 << 20, follow_symlinks=True)
    except (OSError, bounded_read.FileRefused) as exc:
        raise UserError(f"{file}: {exc}") from None
    if not isinstance(document, dict):
        raise UserError(f"{file}: expected a JSON object")
    return document


def _saved_dataset(path: Path, text_key: str) -> Iterator[str]:
    pa = _pyarrow()
    if (path / "dataset_dict.json").is_file():
        splits = _meta(path / "dataset_dict.json").get("splits", [])
        if not isinstance(splits, list) or "train" not in splits:
            raise UserError(
                f"{path}: a DatasetDict without a 'train' split (has {excerpt(splits)})"
            )
        yield from _saved_dataset(path / "train", text_key)
        return
    entries = _meta(path / "state.json").get("_data_files", [])
    try:
        files = [path / str(entry["filename"]) for entry in entries]
    except (TypeError, KeyError):
        raise UserError(
            f"{path / 'state.json'}: _data_files must list {{filename}} objects"
        ) from None
    if not files:
        files = sorted(path.glob("*.arrow"))
    for file in files:
        if file.resolve().parent != path.resolve():
            raise UserError(
                f"{path / 'state.json'}: data file {excerpt(file.name)} outside the folder"
            )
        with pa.memory_map(str(file)) as source:
            try:
                reader = pa.ipc.open_stream(source)
            except Exception as exc:
                raise UserError(f"{file}: not an Arrow stream ({quoted(str(exc))})") from None
            yield from _column_texts(iter(reader), text_key, str(file))
