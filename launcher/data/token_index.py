"""The index of a prepared data folder, ``index.json``: what its shards (or Megatron-LM pairs, or
chat pairs) hold, how they were tokenized and how many tokens each split has.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launcher import bounded_read
from launcher.errors import UserError
from launcher.excerpt import excerpt
from launcher.excerpt import name as escaped

INDEX_FORMAT = "llmtrain-tokens-v1"
INDEX_FILE = "index.json"
# An index lists a shard per 16M tokens: a few MB for the largest corpora.
_MAX_INDEX_BYTES = 64 << 20


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
    # layout "chat" (chat.chat_prepare): conversations with per-token loss roles; here the
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
        try:  # bounded: a FIFO in its place is refused as such, never waited on
            data = bounded_read.read_json(file, max_bytes=_MAX_INDEX_BYTES, follow_symlinks=True)
        except FileNotFoundError:
            hint = (
                "it holds no index.json" if directory.is_dir() else "the directory does not exist"
            )
            raise UserError(
                f"{directory} is not a prepared data directory ({hint}); "
                f"make one with: llmtrain data prepare --input TEXT... --output {directory}"
            ) from None
        except (OSError, bounded_read.FileRefused) as exc:
            raise UserError(f"{file} {exc}") from None
        try:
            if not isinstance(data, dict):
                raise ValueError("expected a JSON object")
            if data.get("format") != INDEX_FORMAT:
                raise ValueError(f"format {excerpt(data.get('format'))}, expected {INDEX_FORMAT!r}")
            shards = tuple(ShardInfo(**s) for s in data.pop("shards"))
            valid = tuple(ShardInfo(**s) for s in data.pop("valid_shards", []))
            if data.get("layout", "shards") not in ("shards", "megatron", "chat"):
                raise ValueError(
                    f"layout {excerpt(data.get('layout'))}, expected shards, megatron or chat"
                )
            return cls(**data, shards=shards, valid_shards=valid, path=directory)
        except (ValueError, TypeError, KeyError) as exc:
            raise UserError(
                f"{file} is not a valid llmtrain token index: {escaped(str(exc), 200)}"
            ) from None


def check_vocab(index: PreparedIndex, model_vocab: int) -> None:
    """Refuse data whose token ids do not fit the model's embedding."""
    if index.vocab_size > model_vocab:
        where = f" ({index.path})" if index.path else ""
        raise UserError(
            f"data vocab {index.vocab_size}{where} > model.vocab_size={model_vocab}; "
            f"set model.vocab_size={index.vocab_size}"
        )
