"""Tokenized documents into the files of a prepared folder: each split (train, and the whole
documents held out for validation, ``is_valid_document``) as llmtrain's token shards or as a
Megatron-LM ``.bin/.idx`` pair, then ``index.json``. A reader thread parses the next batch of
documents while the tokenizer encodes this one (``prefetched``).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from launcher import fsio
from launcher.data.megatron_indexed import optimal_dtype
from launcher.data.token_index import INDEX_FILE, PreparedIndex, ShardInfo
from launcher.data.tokenizer import token_dtype
from launcher.errors import UserError

# Documents per encode_batch call: enough work per call for the tokenizer's thread pool to spread
# over every core, while the reader thread holds at most two such batches ahead (prefetched).
BATCH_DOCS = 512


def prefetched(items: Iterator[Any], depth: int = 2) -> Iterator[Any]:
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


def batches(docs: Iterator[str], size: int) -> Iterator[list[str]]:
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


class MegatronSplit:
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


def write_splits(
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
            name: MegatronSplit(directory, prefix, tok.vocab_size)
            for name, prefix in MEGATRON_PREFIXES.items()
        }
    else:
        writers = {
            name: ShardWriter(directory, np.dtype(dtype), split.shard_tokens, stem)
            for name, stem in (("train", "shard"), ("valid", "valid"))
        }
    counts = {"train": 0, "valid": 0}
    tokens_of = {"train": 0, "valid": 0}
    started = last = time.monotonic()
    chars = documents = tokens = 0
    for batch in prefetched(batches(docs, BATCH_DOCS)):
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
            report(progress(documents, chars, tokens, now - started))
    shards = writers["train"].close()
    valid_shards = writers["valid"].close()
    total = tokens_of["train"]
    if total == 0:
        raise UserError(f"no tokens from {source_files} input(s): every document is empty")
    if report is not None:
        report(progress(documents, chars, tokens, time.monotonic() - started))
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


def progress(documents: int, chars: int, tokens: int, seconds: float) -> str:
    rate = max(seconds, 1e-9)
    return (
        f"{documents:,} documents, {chars / 1e6:,.1f} M characters, {tokens:,} tokens "
        f"({chars / 1e6 / rate:,.1f} M chars/s, {tokens / rate:,.0f} tokens/s)"
    )


class ShardWriter:
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
