"""`llmtrain data prepare`: documents into a prepared token folder, written atomically.

A prepared data directory holds memory-mappable token shards and an index::

    DIR/index.json          format, dtype, vocab_size, tokenizer, shards (file, tokens, sha256), ...
                            (launcher.data.token_index)
    DIR/shard_00000.bin     raw tokens, little-endian, uint8 (vocab <= 256) / uint16 / uint32
                            (launcher.data.token_writer)
    DIR/tokenizer.json      the trained BPE, or a copy of the user's tokenizer.json
                            (launcher.data.tokenizer)

Documents come from ``launcher.data.documents``: a whole text file each, or one record each of
JSON Lines / JSON / parquet / saved Hugging Face datasets (``--text-key``), in input order. The
tokenizer is the byte tokenizer, a byte-level BPE trained here (``<|endoftext|>``, id 0, is its
end-of-document token), or the user's own ``tokenizer.json`` (``launcher.data.hf_tokenizer``: its
end-of-document token found or named with ``--eod-token``); the EOD is appended after every
document (the byte tokenizer's is id 256, one past the bytes, vocabulary 257, as `llmtrain data
prepare` writes it; ``byte_eod=False``, the built-in corpus (``launcher.data.builtin_corpus``) and
data prepared before it have none, vocabulary 256, and read as they are). BPE and
tokenizer.json encode documents in batches on the library's thread pool (every core), while a
reader thread parses the next batch (``bench/data_prepare.py`` measures it). Whole documents
are held out as the validation split (``--valid-fraction``, ``is_valid_document``); with
``fmt="megatron"`` each split is a Megatron-LM ``.bin/.idx`` pair instead of shards. Training
windows are non-overlapping runs of seq_length + 1 tokens over the concatenation of all shards
(``launcher.train.data.TokenShards``, the runtime reader); the tail is dropped. Chat and instruct
records go to ``launcher.data.chat.chat_prepare``.

Nothing here imports torch, and nothing is ever downloaded: a BPE is trained locally with the
`tokenizers` library.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from launcher import fsio, outputs
from launcher.data.dataset_records import RecordOptions, is_dataset_id
from launcher.data.documents import find_inputs, is_saved_dataset, iter_documents, looks_binary
from launcher.data.hf_tokenizer import HFTokenizerFile
from launcher.data.limits import DataLimits
from launcher.data.megatron_indexed import optimal_dtype
from launcher.data.token_index import INDEX_FILE, PreparedIndex
from launcher.data.token_writer import FORMATS, SplitSpec, is_valid_document, write_splits
from launcher.data.tokenizer import (
    TOKENIZER_FILE,
    BPETokenizer,
    ByteTokenizer,
    vocab_shortfall,
    write_tokenizer_config,
)
from launcher.errors import UserError

COMMAND = "llmtrain data prepare"  # names the outputs marker's writer (launcher.outputs)
# Inputs read record by record (launcher.data.documents): never refused as binary.
_STRUCTURED = (".jsonl", ".json", ".parquet")


# --- prepare -------------------------------------------------------------------------------------
def check_output(
    output: Path, inputs: Sequence[Path], files: Sequence[Path], overwrite: bool
) -> str:
    """Refuse an output folder that holds or is inside an input, or one llmtrain must not write
    (``launcher.outputs.check_target``: the current directory, a run directory, a folder holding
    one, a non-empty folder without --overwrite, or with it one `data prepare` did not write).
    What is at `output` now (``outputs.NEW``, ``EMPTY`` or ``REPLACE``)."""
    outputs.refuse_cwd(output, "--output", "data/tokens")
    out = output.expanduser().resolve()
    for given in [*inputs, *files]:
        src = Path(given).expanduser().resolve()
        if src == out or out in src.parents or src in out.parents:
            raise UserError(
                f"--output {output}: overlaps the input {given}; write the shards to a separate "
                "folder, e.g. --output data/tokens"
            )
    return outputs.check_target(output, "--output", COMMAND, overwrite, "a prepared dataset")


@fsio.disk_full_is_user_error("output", "--output")
def prepare(
    inputs: Sequence[Path],
    output: Path,
    tokenizer: str = "byte",
    vocab_size: int = 4096,
    shard_tokens: int = 2**24,
    overwrite: bool = False,
    source: dict[str, Any] | None = None,
    allow_binary: bool = False,
    text_key: str = "text",
    eod_token: str | None = None,
    report: Any = None,
    valid_fraction: float = 0.0,
    fmt: str = "shards",
    input_format: str | None = None,
    chat_template: str | None = None,
    byte_eod: bool = False,
    limits: DataLimits | None = None,
    records: RecordOptions | None = None,
) -> PreparedIndex:
    """Tokenize documents into token shards + index.json under `output` (written atomically).

    `fmt`: "shards" (llmtrain's shard files) or "megatron" (``train_text_document.bin/.idx`` and
    ``valid_text_document.bin/.idx``, Megatron-LM's indexed format, which llmtrain reads too).
    `valid_fraction`: the share of whole documents held out as the validation split
    (``is_valid_document``).

    `input_format`: "text" (documents), "chat", "instruct" or "preference" (conversations, or
    pairs of them, with loss roles, ``chat.chat_prepare``; `chat_template` a Jinja file
    replacing the tokenizer's; their inputs may also be parquet files, ``save_to_disk`` folders
    and cached dataset ids, `records` a ``dataset_records.RecordOptions``: split and columns);
    None: told from the records (``detect_input_format``).

    `tokenizer`: "byte", "bpe" (trained here with `vocab_size`) or the path of a Hugging Face
    tokenizer.json. `limits`: what one record or document may hold (``launcher.data.limits``:
    a JSON Lines line always; a whole document too when a BPE or tokenizer.json encodes it).
    `report(line)` receives a progress line now and then. Raises UserError for missing inputs,
    inputs with no text, binary inputs (unless `allow_binary`), and an output that overlaps an
    input or is an existing non-empty folder (with `overwrite`: unless it is a prepared dataset)."""
    output = Path(output)
    limits = limits or DataLimits()
    kind = input_format or detect_input_format(inputs, text_key, limits)
    if input_format is None and kind == "text" and _names_records(inputs, records):
        kind = ""  # a dataset id, or --columns: told from the first record (chat_prepare)
    if kind != "text":
        return _prepare_conversations(
            inputs, output, kind, tokenizer, chat_template, eod_token, overwrite, fmt,
            valid_fraction, source or {}, report, limits, records,
        )  # fmt: skip
    if records is not None and records != RecordOptions():
        raise UserError(
            "--split / --columns: only chat, instruct and preference records use them; add "
            "--input-format chat (or instruct, preference)"
        )
    if chat_template is not None:
        raise UserError(
            "--chat-template: only chat and instruct data use a template; add --input-format chat"
        )
    user_tokenizer = None
    if tokenizer not in ("byte", "bpe"):
        user_tokenizer = HFTokenizerFile(Path(tokenizer).expanduser(), eod_token)
    _check_split_options(shard_tokens, valid_fraction, fmt)
    files = find_inputs(inputs)
    found = check_output(output, inputs, files, overwrite)
    output = output.expanduser().resolve()
    _check_text_inputs(inputs, files, allow_binary)

    # The tokenizers library (a BPE, a tokenizer.json) holds ~160 bytes per character it encodes:
    # a document over the record budget is refused before it gets there.
    longest = None if tokenizer == "byte" else limits.record_bytes

    def documents() -> Iterator[str]:
        # Binary inputs were refused above, or are allowed: decode what is there.
        return iter_documents(files, text_key, True, limits, longest)

    tmp = outputs.temporary_sibling(output)
    try:
        tok = user_tokenizer
        if tok is None:
            tok = _byte_or_bpe(tokenizer, documents, vocab_size, byte_eod, report)
        tokenizer_file = None
        if tok.name != "byte":
            tok.save(tmp / TOKENIZER_FILE)
            tokenizer_file = TOKENIZER_FILE
            write_tokenizer_config(tmp, tok)
        split = SplitSpec(valid_fraction, fmt, shard_tokens)
        write_splits(documents(), len(files), tmp, tok, tokenizer_file, split, source or {}, report)
        outputs.install(tmp, output, "--output", COMMAND, found)
    finally:
        outputs.discard(tmp)
    return PreparedIndex.load(output)


def _check_split_options(shard_tokens: int, valid_fraction: float, fmt: str) -> None:
    if shard_tokens < 1:
        raise UserError(f"shard_tokens={shard_tokens}: must be positive")
    if not 0.0 <= valid_fraction < 1.0:
        raise UserError(
            f"--valid-fraction={valid_fraction}: must lie in [0, 1), e.g. --valid-fraction 0.01"
        )
    if fmt not in FORMATS:
        raise UserError(f"--format={fmt}: must be one of {', '.join(FORMATS)}")


def _check_text_inputs(inputs: Sequence[Path], files: Sequence[Path], allow_binary: bool) -> None:
    """Refuse inputs that do not look like text (unless `allow_binary`), and inputs that are all
    empty."""
    if not allow_binary:
        for f in files:
            why = None if is_saved_dataset(f) or f.suffix in _STRUCTURED else looks_binary(f)
            if why:
                raise UserError(
                    f"--input {f}: does not look like text ({why}); pass --allow-binary to "
                    "tokenize it anyway (undecodable bytes become U+FFFD)"
                )
    if not any(is_saved_dataset(f) or f.stat().st_size for f in files):
        raise UserError(f"no text in {', '.join(str(p) for p in inputs)}: every file is empty")


def _byte_or_bpe(
    tokenizer: str,
    documents: Callable[[], Iterator[str]],
    vocab_size: int,
    byte_eod: bool,
    report: Any,
) -> Any:
    """The byte tokenizer, or a BPE of `vocab_size` trained on `documents()` (a smaller
    vocabulary than asked for is reported as a note)."""
    if tokenizer != "bpe":
        return ByteTokenizer(eod=byte_eod)
    tok = BPETokenizer.train(documents(), vocab_size)
    shortfall = vocab_shortfall(vocab_size, tok.vocab_size)
    if shortfall and report is not None:
        report(f"note: {shortfall}")
    return tok


TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
INPUT_FORMATS = ("text", "chat", "instruct", "preference")


def detect_input_format(
    inputs: Sequence[Path], text_key: str = "text", limits: DataLimits | None = None
) -> str:
    """text, chat or instruct: chat/instruct when every input is JSON Lines whose first record has
    no `text_key` but the keys of a conversation (``chat.chat_records``). The first line
    is read bounded; a file that cannot be read is "text" (whose reader says why)."""
    from launcher.data.chat.chat_records import record_format
    from launcher.data.documents import record_lines

    try:
        files = find_inputs(inputs)
    except UserError:
        return "text"  # prepare() says what is missing
    if not files or any(f.suffix != ".jsonl" for f in files):
        return "text"
    try:
        for _, line in record_lines(files[0], limits or DataLimits()):
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                return "text"  # the text reader names the file and line
            if not isinstance(record, dict) or text_key in record:
                return "text"
            return record_format(record) or "text"
    except UserError:
        return "text"
    return "text"


def _names_records(inputs: Sequence[Path], records: RecordOptions | None) -> bool:
    """A dataset id among `inputs`, or a column mapping: records, not text."""
    return any(is_dataset_id(p) for p in inputs) or bool(records and records.columns)


def _prepare_conversations(
    inputs: Sequence[Path],
    output: Path,
    kind: str,
    tokenizer: str,
    chat_template: str | None,
    eod_token: str | None,
    overwrite: bool,
    fmt: str,
    valid_fraction: float,
    source: dict[str, Any],
    report: Any,
    limits: DataLimits,
    records: RecordOptions | None = None,
) -> PreparedIndex:
    """Chat or instruct records into a "chat" layout folder (launcher.data.chat.chat_prepare);
    `kind` "" tells the format from the first record."""
    from launcher.data.chat.chat_prepare import prepare_chat
    from launcher.data.dataset_records import record_inputs

    if kind and kind not in INPUT_FORMATS:
        raise UserError(f"--input-format={kind}: must be one of {', '.join(INPUT_FORMATS)}")
    if fmt != "megatron":
        raise UserError(
            f"--format={fmt}: chat and instruct data are written as Megatron indexed pairs "
            "(tokens and loss roles); leave --format out (or --format megatron)"
        )
    if not 0.0 <= valid_fraction < 1.0:
        raise UserError(
            f"--valid-fraction={valid_fraction}: must lie in [0, 1), e.g. --valid-fraction 0.01"
        )
    files = record_inputs(inputs)
    paths = [Path(p) for p in files if isinstance(p, Path)]
    found = check_output(output, [Path(p) for p in inputs if Path(p).exists()], paths, overwrite)
    output = output.expanduser().resolve()
    tmp = outputs.temporary_sibling(output)
    try:
        fields = prepare_chat(
            files, tmp, tokenizer, kind or None, chat_template, eod_token, valid_fraction,
            source, is_valid_document, TOKENIZER_FILE, report, records, limits,
        )  # fmt: skip
        index = PreparedIndex(
            dtype=str(np.dtype(optimal_dtype(fields["vocab_size"]))),
            tokenizer="hf",
            shards=(),
            source_files=len(files),
            valid_fraction=valid_fraction,
            layout="chat",
            **fields,
        )
        fsio.write_json_atomic(tmp / INDEX_FILE, index.to_json())
        outputs.install(tmp, output, "--output", COMMAND, found)
    finally:
        outputs.discard(tmp)
    return PreparedIndex.load(output)
