"""Token data preparation: tokenizers, `llmtrain data prepare`, the built-in offline corpus.

A prepared data directory holds memory-mappable token shards and an index::

    DIR/index.json          format, dtype, vocab_size, tokenizer, shards (file, tokens, sha256), ...
    DIR/shard_00000.bin     raw tokens, little-endian, uint8 (vocab <= 256) / uint16 / uint32
    DIR/tokenizer.json      the trained BPE, or a copy of the user's tokenizer.json

Documents come from ``launcher.data.documents``: a whole text file each, or one record each of
JSON Lines / JSON / parquet / saved Hugging Face datasets (``--text-key``), in input order. The
tokenizer is the byte tokenizer, a byte-level BPE trained here (``<|endoftext|>``, id 0, is its
end-of-document token), or the user's own ``tokenizer.json`` (``launcher.data.hf_tokenizer``: its
end-of-document token found or named with ``--eod-token``); the EOD is appended after every
document (the byte tokenizer's is id 256, one past the bytes, vocabulary 257, as `llmtrain data
prepare` writes it; ``byte_eod=False``, the built-in corpus and data prepared before it have none,
vocabulary 256, and read as they are). BPE and
tokenizer.json encode documents in batches on the library's thread pool (every core), while a
reader thread parses the next batch (``bench/data_prepare.py`` measures it). Whole documents
are held out as the validation split (``--valid-fraction``, ``is_valid_document``); with
``fmt="megatron"`` each split is a Megatron-LM ``.bin/.idx`` pair instead of shards. Training
windows are non-overlapping runs of seq_length + 1 tokens over the concatenation of all shards
(``launcher.train.data.TokenShards``, the runtime reader); the tail is dropped.

Nothing here imports torch, and nothing is ever downloaded: a BPE is trained locally with the
`tokenizers` library, and the built-in corpus is the Python standard library's own source files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from launcher import file_lock, fsio, outputs
from launcher.data.documents import find_inputs, is_saved_dataset, iter_documents, looks_binary
from launcher.data.hf_tokenizer import HFTokenizerFile
from launcher.data.megatron_indexed import optimal_dtype
from launcher.errors import UserError

INDEX_FORMAT = "llmtrain-tokens-v1"
INDEX_FILE = "index.json"
COMMAND = "llmtrain data prepare"  # names the outputs marker's writer (launcher.outputs)
TOKENIZER_FILE = "tokenizer.json"
EOD_TOKEN = "<|endoftext|>"

BUILTIN_CORPUS = "corpus-stdlib-v1"
# The built-in corpus: at most this many bytes of stdlib source (~4.2M byte tokens, ten times what
# recipe=tiny's 200 steps x 8 x 257 tokens read), skipping files larger than _STDLIB_MAX_FILE.
_STDLIB_MAX_BYTES = 4 * 2**20
_STDLIB_MAX_FILE = 200_000
_STDLIB_SKIP_DIRS = frozenset(
    {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}
)


# --- tokenizers ----------------------------------------------------------------------------------
class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eod_id: int | None

    def encode(self, text: str) -> np.ndarray: ...

    def decode(self, ids: Sequence[int] | np.ndarray) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens (ids 0-255); with `eod`, id 256 ends each document (vocabulary 257)."""

    name = "byte"

    def __init__(self, eod: bool = False):
        self.eod_id: int | None = 256 if eod else None
        self.vocab_size = 257 if eod else 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        data = np.asarray(ids)
        data = data[(data >= 0) & (data < 256)]  # the end-of-document id is no byte
        return bytes(data.astype(np.uint8).tolist()).decode("utf-8", errors="replace")


class BPETokenizer:
    """Byte-level BPE (GPT-2 style) from the `tokenizers` library, trained locally."""

    name = "bpe"

    def __init__(self, tokenizer: Any):
        self._tok = tokenizer
        self.vocab_size: int = int(tokenizer.get_vocab_size())
        eod = tokenizer.token_to_id(EOD_TOKEN)
        self.eod_id: int | None = None if eod is None else int(eod)

    @classmethod
    def train(
        cls, texts: Iterable[str], vocab_size: int, eod_token: str = EOD_TOKEN
    ) -> BPETokenizer:
        """Train a byte-level BPE on `texts` (end-of-document token `eod_token`, id 0). A corpus
        with fewer distinct pairs to merge than `vocab_size` asks for gives a smaller
        vocabulary: that is said on stderr (``vocab_shortfall``)."""
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        if vocab_size < 257 + 1:
            raise UserError(
                f"data.bpe_vocab_size={vocab_size}: a byte-level BPE needs at least 258 "
                "(256 bytes, the end-of-document token and one merge)"
            )
        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[eod_token],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @classmethod
    def from_file(cls, path: Path) -> BPETokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        return cls(HFTokenizer.from_file(str(path)))

    def save(self, path: Path) -> None:
        self._tok.save(str(path))

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text).ids, dtype=np.int64)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.int64) for e in self._tok.encode_batch(list(texts))]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return str(self._tok.decode([int(i) for i in ids]))


def vocab_shortfall(asked: int, got: int) -> str | None:
    """Why a trained BPE is smaller than asked (None when it is not)."""
    if got >= asked:
        return None
    return (
        f"--vocab-size={asked}: the BPE stopped at {got} tokens because the corpus has no more "
        "pairs of tokens to merge (too little or too repetitive text); give more text, or set "
        f"model.vocab_size={got} or more"
    )


def load_tokenizer(data_dir: Path) -> Tokenizer:
    """The tokenizer a prepared directory was made with."""
    index = PreparedIndex.load(data_dir)
    if index.tokenizer == "byte":
        return ByteTokenizer(eod=index.eod_id == 256)
    path = data_dir / (index.tokenizer_file or TOKENIZER_FILE)
    if index.tokenizer == "hf":
        return HFTokenizerFile(path)
    return BPETokenizer.from_file(path)


def token_dtype(vocab_size: int) -> str:
    """Smallest unsigned dtype holding every token id."""
    if vocab_size <= 2**8:
        return "uint8"
    if vocab_size <= 2**16:
        return "uint16"
    return "uint32"


# --- the index -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShardInfo:
    file: str
    tokens: int
    sha256: str


@dataclass(frozen=True)
class PreparedIndex:
    """Contents of index.json, plus the directory it was read from (not stored)."""

    dtype: str
    vocab_size: int
    tokenizer: str
    shards: tuple[ShardInfo, ...]
    total_tokens: int
    source_files: int
    eod_id: int | None = None
    tokenizer_file: str | None = None
    source: dict[str, Any] = field(default_factory=dict)
    # The validation split: whole documents held out (see ``is_valid_document``).
    valid_fraction: float = 0.0
    valid_shards: tuple[ShardInfo, ...] = ()
    valid_tokens: int = 0
    valid_documents: int = 0
    # "shards": llmtrain's shard files above; "megatron": one PREFIX.bin/.idx pair per split, named
    # in megatron_prefixes ({"train": ..., "valid": ...}), and `shards` is empty.
    layout: str = "shards"
    megatron_prefixes: dict[str, str] = field(default_factory=dict)
    # layout "chat" (launcher.data.chat_prepare): conversations with per-token loss roles; here the
    # roles' prefixes, the input format, the template and the example counts.
    chat: dict[str, Any] = field(default_factory=dict)
    format: str = INDEX_FORMAT
    path: Path | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("path")
        data["shards"] = [asdict(s) for s in self.shards]
        data["valid_shards"] = [asdict(s) for s in self.valid_shards]
        return data

    @classmethod
    def load(cls, directory: Path) -> PreparedIndex:
        directory = Path(directory)
        file = directory / INDEX_FILE
        if not file.is_file():
            hint = (
                "it holds no index.json" if directory.is_dir() else "the directory does not exist"
            )
            raise UserError(
                f"{directory} is not a prepared data directory ({hint}); "
                f"make one with: llmtrain data prepare --input TEXT... --output {directory}"
            )
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
            if data.get("format") != INDEX_FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {INDEX_FORMAT!r}")
            shards = tuple(ShardInfo(**s) for s in data.pop("shards"))
            valid = tuple(ShardInfo(**s) for s in data.pop("valid_shards", []))
            if data.get("layout", "shards") not in ("shards", "megatron", "chat"):
                raise ValueError(
                    f"layout {data.get('layout')!r}, expected shards, megatron or chat"
                )
            return cls(**data, shards=shards, valid_shards=valid, path=directory)
        except (ValueError, TypeError, KeyError) as exc:
            raise UserError(f"{file} is not a valid llmtrain token index: {exc}") from None


def check_vocab(index: PreparedIndex, model_vocab: int) -> None:
    """Refuse data whose token ids do not fit the model's embedding."""
    if index.vocab_size > model_vocab:
        where = f" ({index.path})" if index.path else ""
        raise UserError(
            f"data vocab {index.vocab_size}{where} > model.vocab_size={model_vocab}; "
            f"set model.vocab_size={index.vocab_size}"
        )


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
) -> PreparedIndex:
    """Tokenize documents into token shards + index.json under `output` (written atomically).

    `fmt`: "shards" (llmtrain's shard files) or "megatron" (``train_text_document.bin/.idx`` and
    ``valid_text_document.bin/.idx``, Megatron-LM's indexed format, which llmtrain reads too).
    `valid_fraction`: the share of whole documents held out as the validation split
    (``is_valid_document``).

    `input_format`: "text" (documents), "chat" or "instruct" (conversations with loss roles,
    ``launcher.data.chat_prepare``; `chat_template` a Jinja file replacing the tokenizer's);
    None: told from the records (``detect_input_format``).

    `tokenizer`: "byte", "bpe" (trained here with `vocab_size`) or the path of a Hugging Face
    tokenizer.json. `report(line)` receives a progress line now and then. Raises UserError for
    missing inputs, inputs with no text, binary inputs (unless `allow_binary`), and an output that
    overlaps an input or is an existing non-empty folder (with `overwrite`: unless it is a prepared
    dataset)."""
    output = Path(output)
    kind = input_format or detect_input_format(inputs, text_key)
    if kind != "text":
        return _prepare_conversations(
            inputs, output, kind, tokenizer, chat_template, eod_token, overwrite, fmt,
            valid_fraction, source or {}, report,
        )  # fmt: skip
    if chat_template is not None:
        raise UserError(
            "--chat-template: only chat and instruct data use a template; add --input-format chat"
        )
    user_tokenizer = None
    if tokenizer not in ("byte", "bpe"):
        user_tokenizer = HFTokenizerFile(Path(tokenizer).expanduser(), eod_token)
    if shard_tokens < 1:
        raise UserError(f"shard_tokens={shard_tokens}: must be positive")
    if not 0.0 <= valid_fraction < 1.0:
        raise UserError(
            f"--valid-fraction={valid_fraction}: must lie in [0, 1), e.g. --valid-fraction 0.01"
        )
    if fmt not in FORMATS:
        raise UserError(f"--format={fmt}: must be one of {', '.join(FORMATS)}")
    files = find_inputs(inputs)
    found = check_output(output, inputs, files, overwrite)
    output = output.expanduser().resolve()
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

    def documents() -> Iterator[str]:
        # Binary inputs were refused above, or are allowed: decode what is there.
        return iter_documents(files, text_key=text_key, allow_binary=True)

    tmp = outputs.temporary_sibling(output)
    try:
        tok: Any
        tokenizer_file = None
        if user_tokenizer is not None:
            tok = user_tokenizer
            tok.save(tmp / TOKENIZER_FILE)
            tokenizer_file = TOKENIZER_FILE
        elif tokenizer == "bpe":
            tok = BPETokenizer.train(documents(), vocab_size)
            shortfall = vocab_shortfall(vocab_size, tok.vocab_size)
            if shortfall and report is not None:
                report(f"note: {shortfall}")
            tok.save(tmp / TOKENIZER_FILE)
            tokenizer_file = TOKENIZER_FILE
        else:
            tok = ByteTokenizer(eod=byte_eod)
        split = SplitSpec(valid_fraction, fmt, shard_tokens)
        if tokenizer_file is not None:
            _write_tokenizer_config(tmp, tok)
        _write_splits(
            documents(), len(files), tmp, tok, tokenizer_file, split, source or {}, report
        )
        outputs.install(tmp, output, "--output", COMMAND, found)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return PreparedIndex.load(output)


TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
INPUT_FORMATS = ("text", "chat", "instruct")


def detect_input_format(inputs: Sequence[Path], text_key: str = "text") -> str:
    """text, chat or instruct: chat/instruct when every input is JSON Lines whose first record has
    no `text_key` but the keys of a conversation (``launcher.data.chat_records``)."""
    from launcher.data.chat_records import record_format

    try:
        files = find_inputs(inputs)
    except UserError:
        return "text"  # prepare() says what is missing
    if not files or any(f.suffix != ".jsonl" for f in files):
        return "text"
    with open(files[0], encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                return "text"  # the text reader names the file and line
            if not isinstance(record, dict) or text_key in record:
                return "text"
            return record_format(record) or "text"
    return "text"


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
) -> PreparedIndex:
    """Chat or instruct records into a "chat" layout folder (launcher.data.chat_prepare)."""
    from launcher.data.chat_prepare import prepare_chat

    if kind not in INPUT_FORMATS:
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
    files = find_inputs(inputs)
    found = check_output(output, inputs, files, overwrite)
    output = output.expanduser().resolve()
    tmp = outputs.temporary_sibling(output)
    try:
        fields = prepare_chat(
            files, tmp, tokenizer, kind, chat_template, eod_token, valid_fraction, source,
            is_valid_document, TOKENIZER_FILE, report,
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
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return PreparedIndex.load(output)


def _write_tokenizer_config(directory: Path, tok: Any) -> None:
    """tokenizer_config.json beside tokenizer.json, so that Hugging Face's
    ``AutoTokenizer.from_pretrained(DIR)`` (Megatron-LM's HuggingFaceTokenizer) loads the folder
    as a fast tokenizer with its end-of-document token, without a model config.json."""
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if tok.eod_id is not None:
        config["eos_token"] = str(tok._tok.id_to_token(tok.eod_id))
    fsio.write_json_atomic(directory / TOKENIZER_CONFIG_FILE, config)


_STRUCTURED = (".jsonl", ".json", ".parquet")
_BATCH_DOCS = 512


def _prefetched(items: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """`items`, produced on a background thread up to `depth` ahead: reading and parsing the next
    batch of documents overlaps the tokenizer's encoding of this one (it releases the GIL). The
    order is unchanged; an exception of the producer is raised here, where it would have been."""
    import queue
    import threading

    done = object()
    box: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        box.put((None, item), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            box.put((None, done))
        except BaseException as exc:  # handed to the consumer, raised there
            box.put((exc, None))

    thread = threading.Thread(target=produce, name="llmtrain-prepare-reader", daemon=True)
    thread.start()
    try:
        while True:
            error, item = box.get()
            if error is not None:
                raise error
            if item is done:
                return
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)


def _batches(docs: Iterator[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for doc in docs:
        batch.append(doc)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


FORMATS = ("megatron", "shards")
MEGATRON_PREFIXES = {"train": "train_text_document", "valid": "valid_text_document"}


def is_valid_document(i: int, fraction: float) -> bool:
    """Document i (0-based, input order) belongs to the validation split: every document where
    floor(n * fraction) steps up, so the first n documents hold floor(n * fraction) of them,
    spread evenly through the corpus, and the split depends only on the document order."""
    return fraction > 0 and int((i + 1) * fraction) > int(i * fraction)


@dataclass(frozen=True)
class SplitSpec:
    valid_fraction: float
    fmt: str
    shard_tokens: int


class _MegatronSplit:
    """One split as a Megatron PREFIX.bin/.idx pair (one document per sequence)."""

    def __init__(self, directory: Path, name: str, vocab_size: int):
        from launcher.data.megatron_indexed import IndexedDatasetWriter

        self.writer = IndexedDatasetWriter(directory / name, vocab_size)
        self.tokens = 0

    def add(self, ids: np.ndarray) -> None:
        self.writer.add_document(ids)
        self.tokens += int(ids.size)

    def close(self) -> list[ShardInfo]:
        self.writer.finish()
        return []


def _write_splits(
    docs: Iterator[str],
    source_files: int,
    directory: Path,
    tok: Any,
    tokenizer_file: str | None,
    split: SplitSpec,
    source: dict[str, Any],
    report: Any = None,
) -> PreparedIndex:
    dtype = token_dtype(tok.vocab_size)
    writers: dict[str, Any]
    if split.fmt == "megatron":
        writers = {
            name: _MegatronSplit(directory, prefix, tok.vocab_size)
            for name, prefix in MEGATRON_PREFIXES.items()
        }
    else:
        writers = {
            name: _ShardWriter(directory, np.dtype(dtype), split.shard_tokens, stem)
            for name, stem in (("train", "shard"), ("valid", "valid"))
        }
    counts = {"train": 0, "valid": 0}
    tokens_of = {"train": 0, "valid": 0}
    started = last = time.monotonic()
    chars = documents = tokens = 0
    for batch in _prefetched(_batches(docs, _BATCH_DOCS)):
        encoded = (
            tok.encode_batch(batch) if hasattr(tok, "encode_batch") else map(tok.encode, batch)
        )
        for ids in encoded:
            if tok.eod_id is not None:
                ids = np.append(ids, tok.eod_id)
            name = "valid" if is_valid_document(documents, split.valid_fraction) else "train"
            writers[name].add(ids)
            counts[name] += 1
            tokens_of[name] += int(ids.size)
            tokens += int(ids.size)
            documents += 1
        chars += sum(len(d) for d in batch)
        now = time.monotonic()
        if report is not None and now - last >= 2.0:
            last = now
            report(_progress(documents, chars, tokens, now - started))
    shards = writers["train"].close()
    valid_shards = writers["valid"].close()
    total = tokens_of["train"]
    if total == 0:
        raise UserError(f"no tokens from {source_files} input(s): every document is empty")
    if report is not None:
        report(_progress(documents, chars, tokens, time.monotonic() - started))
        if split.valid_fraction > 0 and counts["valid"] == 0:
            report(
                f"note: --valid-fraction={split.valid_fraction} of {documents} documents holds "
                "none; no validation split (use a larger fraction for evaluation)"
            )
    prefixes = dict(MEGATRON_PREFIXES) if split.fmt == "megatron" else {}
    if split.fmt == "megatron" and counts["valid"] == 0:
        for suffix in (".bin", ".idx"):
            (directory / (MEGATRON_PREFIXES["valid"] + suffix)).unlink()
        del prefixes["valid"]
    index = PreparedIndex(
        dtype=str(np.dtype(optimal_dtype(tok.vocab_size))) if split.fmt == "megatron" else dtype,
        vocab_size=tok.vocab_size,
        tokenizer=tok.name,
        shards=tuple(shards),
        total_tokens=total,
        source_files=source_files,
        eod_id=tok.eod_id,
        tokenizer_file=tokenizer_file,
        source={**source, "documents": documents},
        valid_fraction=split.valid_fraction,
        valid_shards=tuple(valid_shards),
        valid_tokens=tokens_of["valid"],
        valid_documents=counts["valid"],
        layout=split.fmt,
        megatron_prefixes=prefixes,
    )
    fsio.write_json_atomic(directory / INDEX_FILE, index.to_json())
    return index


def _progress(documents: int, chars: int, tokens: int, seconds: float) -> str:
    rate = max(seconds, 1e-9)
    return (
        f"{documents:,} documents, {chars / 1e6:,.1f} M characters, {tokens:,} tokens "
        f"({chars / 1e6 / rate:,.1f} M chars/s, {tokens / rate:,.0f} tokens/s)"
    )


class _ShardWriter:
    def __init__(
        self, directory: Path, dtype: np.dtype[Any], shard_tokens: int, stem: str = "shard"
    ):
        self.directory, self.dtype, self.shard_tokens = directory, dtype, shard_tokens
        self.stem = stem
        self.pending: list[np.ndarray] = []
        self.pending_tokens = 0
        self.shards: list[ShardInfo] = []

    def add(self, ids: np.ndarray) -> None:
        arr = ids.astype(self.dtype, copy=False)
        while arr.size:
            take = min(arr.size, self.shard_tokens - self.pending_tokens)
            self.pending.append(arr[:take])
            self.pending_tokens += take
            arr = arr[take:]
            if self.pending_tokens == self.shard_tokens:
                self._flush()

    def _flush(self) -> None:
        if not self.pending_tokens:
            return
        data = np.concatenate(self.pending).astype(self.dtype.newbyteorder("<"), copy=False)
        name = f"{self.stem}_{len(self.shards):05d}.bin"
        raw = data.tobytes()
        with open(self.directory / name, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        self.shards.append(ShardInfo(name, int(data.size), hashlib.sha256(raw).hexdigest()))
        self.pending, self.pending_tokens = [], 0

    def close(self) -> list[ShardInfo]:
        self._flush()
        return self.shards


# --- the built-in corpus -------------------------------------------------------------------------
def stdlib_source_files() -> list[Path]:
    """The built-in corpus's files: a sorted, capped selection of the stdlib's *.py sources."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chosen: list[Path] = []
    budget = _STDLIB_MAX_BYTES
    # Walk in sorted order (files of a directory before its subdirectories), pruning skipped
    # directories, and stop once the budget is spent: site-packages is never listed.
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _STDLIB_SKIP_DIRS)
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            path = Path(dirpath) / name
            size = path.stat().st_size
            if size == 0 or size > _STDLIB_MAX_FILE or size > budget:
                continue
            chosen.append(path)
            budget -= size
            if budget < 1024:
                return chosen
    return chosen


def prepared_once(
    cache_root: Path, name: str, make: Callable[[Path], object], timeout_s: float = 600.0
) -> Path:
    """`cache_root/name`, a prepared dataset `make(target)` writes once.

    Safe when several ranks call it at once: one prepares under an exclusive file lock, the others
    wait on the lock and then find index.json."""
    cache_root = Path(cache_root)
    target = cache_root / name
    if (target / INDEX_FILE).is_file():
        return target
    cache_root.mkdir(parents=True, exist_ok=True)
    busy = "another process is preparing that dataset (delete the lock file if none is)"
    with file_lock.waiting(cache_root / f"{name}.lock", timeout_s, busy=busy):
        if not (target / INDEX_FILE).is_file():
            make(target)
    return target


def builtin_corpus_dir(cache_root: Path, timeout_s: float = 600.0) -> Path:
    """The tiny recipe's offline corpus (byte tokens), prepared once under `cache_root`."""

    def make(target: Path) -> None:
        files = stdlib_source_files()
        if not files:
            raise UserError(
                f"the built-in corpus needs the Python standard library's *.py sources, and "
                f"{sysconfig.get_paths()['stdlib']} has none; prepare your own text with "
                "`llmtrain data prepare --input DIR --output DATA` and pass data.path=DATA"
            )
        source = {
            "kind": "python-stdlib",
            "python": sys.version.split()[0],
            "root": sysconfig.get_paths()["stdlib"],
        }
        prepare(files, target, tokenizer="byte", overwrite=True, source=source)

    return prepared_once(cache_root, BUILTIN_CORPUS, make, timeout_s)
