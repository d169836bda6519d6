"""Where training and validation tokens come from: ``data.path`` / ``data.blend`` resolved to files.

A dataset path is one of
- a folder ``llmtrain data prepare`` wrote (``index.json``): its ``train`` split, and its ``valid``
  split when it holds one; the files are Megatron ``.bin/.idx`` pairs (``--format megatron``, the
  default) or llmtrain's own shards (``--format shards``, and the built-in corpus);
- a Megatron-LM indexed dataset prefix (``PREFIX.bin`` + ``PREFIX.idx``, e.g. the output of
  Megatron-LM's ``tools/preprocess_data.py``): all of it is training data, it has no validation
  split and says nothing of its tokenizer (a ``tokenizer.json`` beside it is used when present).

``describe`` reads only metadata (index.json, the .idx header) so `run`'s pre-launch checks can
name the key, the rule and a working value before any process starts. No torch import.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launcher import bounded_read
from launcher.errors import UserError

if TYPE_CHECKING:
    from launcher.data.blend import BlendEntry

# numpy (through launcher.data.blend and megatron_indexed) is imported only where it is used:
# `llmtrain render` reads this module and answers without it.

INDEX_FILE = "index.json"


@dataclass(frozen=True)
class SourceInfo:
    """What a dataset path holds, from its metadata."""

    key: str  # the config key that named it, e.g. data.blend[1]
    path: Path
    kind: str  # "prepared" | "megatron"
    train_tokens: int
    valid_tokens: int  # 0: no validation split
    vocab_size: int | None  # None: unknown (a bare Megatron prefix)
    eod_id: int | None
    tokenizer: str | None  # byte | bpe | hf | None
    tokenizer_file: Path | None  # a tokenizer.json beside the data, when there is one
    # Megatron prefixes of the splits, when the data is in .bin/.idx form (None: llmtrain shards).
    train_prefix: Path | None
    valid_prefix: Path | None
    # Chat data (index.json layout "chat", launcher.data.chat.chat_prepare): the prefixes above hold
    # the tokens, these the per-token loss roles; and what the index records of it.
    train_roles: Path | None = None
    valid_roles: Path | None = None
    chat: dict[str, object] | None = None


def megatron_tokens(prefix: Path) -> int:
    """Tokens in PREFIX.idx (from its header and lengths; the .bin is not read)."""
    import numpy as np

    from launcher.data.megatron_indexed import DTYPE_CODES, MAGIC

    idx = Path(f"{prefix}.idx")  # not with_suffix: a prefix may hold dots (web.en_text_document)
    with open(idx, "rb") as f:
        header = f.read(34)
        if len(header) < 34 or header[:9] != MAGIC:
            raise ValueError(f"{idx}: not a Megatron MMIDIDX index")
        code = header[17]
        if code not in DTYPE_CODES:
            raise ValueError(f"{idx}: unknown token dtype code {code}")
        (count,) = struct.unpack("<Q", header[18:26])
        sizes = np.frombuffer(f.read(4 * count), dtype=np.int32)
        if sizes.size != count:
            raise ValueError(f"{idx}: truncated ({count} sequence lengths promised)")
        return int(sizes.astype(np.int64).sum())


def _refuse_non_files(key: str, spec: str, *paths: Path) -> None:
    """UserError naming `key` for the first of `paths` that is there but is no regular file (a
    FIFO, a folder): said as what it is, never as missing, and never opened."""
    for path in paths:
        why = bounded_read.not_regular(path)
        if why is not None:
            raise UserError(f"{key}={spec}: {path} {why}")


def describe(spec: str, key: str) -> SourceInfo:
    """What `spec` (a prepared folder or a Megatron prefix) holds; UserError naming `key`."""
    path = Path(spec).expanduser()
    bin_file, idx_file = Path(f"{path}.bin"), Path(f"{path}.idx")
    _refuse_non_files(key, spec, path / INDEX_FILE, bin_file, idx_file)
    if (path / INDEX_FILE).is_file():
        from launcher.data.token_index import PreparedIndex

        try:
            index = PreparedIndex.load(path)
        except UserError as exc:
            raise UserError(f"{key}={spec}: {exc}") from None
        train_prefix = valid_prefix = None
        roles: dict[str, str] = {}
        if index.layout == "chat":
            roles = dict(index.chat.get("roles_prefixes", {}))
        if index.layout in ("megatron", "chat"):
            train_prefix = path / index.megatron_prefixes["train"]
            if "valid" in index.megatron_prefixes:
                valid_prefix = path / index.megatron_prefixes["valid"]
        files = [path / s.file for s in (*index.shards, *index.valid_shards)]
        files += [
            path / f"{p}{x}"
            for p in (*index.megatron_prefixes.values(), *roles.values())
            for x in (".bin", ".idx")
        ]
        _refuse_non_files(key, spec, *files)
        missing = [f for f in files if not f.is_file()]
        if missing:
            raise UserError(
                f"{key}={spec}: {missing[0].name}, listed in {INDEX_FILE}, is missing; prepare "
                f"the data again (llmtrain data prepare ... --output {spec} --overwrite)"
            )
        tok_file = path / index.tokenizer_file if index.tokenizer_file else None
        return SourceInfo(
            key, path, "prepared", index.total_tokens, index.valid_tokens, index.vocab_size,
            index.eod_id, index.tokenizer, tok_file, train_prefix, valid_prefix,
            path / roles["train"] if "train" in roles else None,
            path / roles["valid"] if "valid" in roles else None,
            index.chat if index.layout == "chat" else None,
        )  # fmt: skip
    if bin_file.is_file() and idx_file.is_file():
        try:
            tokens = megatron_tokens(path)
        except (OSError, ValueError) as exc:
            raise UserError(f"{key}={spec}: {exc}") from None
        beside = path.parent / "tokenizer.json"
        _refuse_non_files(key, spec, beside)
        return SourceInfo(
            key, path, "megatron", tokens, 0, None, None, None,
            beside if beside.is_file() else None, path, None,
        )  # fmt: skip
    absent = idx_file if bin_file.is_file() else bin_file
    raise UserError(
        f"{key}={spec}: no dataset there (neither a folder with {INDEX_FILE} nor a Megatron "
        f"prefix: {absent} is missing); prepare one with `llmtrain data prepare --input TEXT "
        f"--output {spec}`, or give the prefix of PREFIX.bin/PREFIX.idx, e.g. "
        "/data/web_text_document"
    )


@dataclass(frozen=True)
class DataSpec:
    """The training data of a config: weighted entries (one entry of weight 1 for data.path)."""

    entries: tuple[BlendEntry, ...]
    keys: tuple[str, ...]  # the config key naming each entry's path


def data_spec(path: str | None, blend: list[object] | None) -> DataSpec | None:
    """data.path / data.blend as weighted entries; None for the built-in corpus."""
    if not blend and path is None:
        return None
    from launcher.data.blend import BlendEntry, parse_blend

    if blend:
        if path is not None:
            raise UserError(
                f"data.path={path} and data.blend are both set: give one, e.g. data.path=null"
            )
        entries = parse_blend(blend)
        keys = tuple(f"data.blend[{2 * i + 1}]" for i in range(len(entries)))
        return DataSpec(tuple(entries), keys)
    if path is None:
        return None
    return DataSpec((BlendEntry(1.0, Path(path)),), ("data.path",))


def _eval_on(eval_every: int | None) -> bool:
    return bool(eval_every and eval_every > 0)


def validation_sources(
    infos: list[SourceInfo], weights: list[float], valid_path: str | None
) -> list[tuple[float, SourceInfo, str]]:
    """(weight, source, split) of the validation data: data.valid_path (its valid split, else all
    of it), else every training source with a valid split, weights renormalised."""
    if valid_path is not None:
        info = describe(valid_path, "data.valid_path")
        return [(1.0, info, "valid" if info.valid_tokens else "train")]
    chosen = [(w, i, "valid") for w, i in zip(weights, infos, strict=True) if i.valid_tokens]
    total = sum(w for w, _, _ in chosen)
    return [(w / total, i, s) for w, i, s in chosen]


def source_problems(
    path: str | None,
    blend: list[object],
    valid_path: str | None,
    model_vocab: int,
    seq_length: int,
    global_batch: int,
    eval_every: int | None,
) -> list[str]:
    """Every problem with the data files of a config, each naming the key, the rule and a value
    that works (the shape of data.blend is checked by the validation rules)."""
    spec = data_spec(path, blend or None)
    if spec is None:
        if _eval_on(eval_every) and valid_path is None:
            return [
                f"train.eval_every={eval_every}: the built-in corpus has no validation split; "
                "prepare your data with `llmtrain data prepare ... --valid-fraction 0.01` and set "
                "data.path=DIR (or data.valid_path=DIR), or set train.eval_every=0"
            ]
        return []
    problems: list[str] = []
    infos: list[SourceInfo] = []
    for entry, key in zip(spec.entries, spec.keys, strict=True):
        try:
            infos.append(describe(str(entry.prefix), key))
        except UserError as exc:
            problems.append(str(exc))
    if problems:
        return problems
    width = seq_length + 1
    vocabs = {i.vocab_size for i in infos if i.vocab_size is not None}
    if len(vocabs) > 1:
        listed = ", ".join(f"{i.key}={i.path} ({i.vocab_size})" for i in infos if i.vocab_size)
        problems.append(
            f"data.blend: the datasets were tokenized with different vocabularies ({listed}); a "
            "blend needs one tokenizer: prepare them all with the same --tokenizer"
        )
    for info in infos:
        if info.vocab_size is not None and info.vocab_size > model_vocab:
            problems.append(
                f"model.vocab_size={model_vocab} is smaller than the vocabulary of {info.key}="
                f"{info.path} ({info.vocab_size}, {info.tokenizer} tokenizer); set "
                f"model.vocab_size={info.vocab_size} or more"
            )
        if info.chat is None and info.train_tokens < width:
            most = max(1, info.train_tokens - 1)
            problems.append(
                f"{info.key}={info.path}: {info.train_tokens:,} tokens cannot give one training "
                f"sequence of model.seq_length={seq_length} + 1; add text, or set "
                f"model.seq_length={most} or less"
            )
    chat = [i for i in infos if i.chat is not None]
    if chat and (len(infos) > 1 or blend):
        problems.append(
            f"data.blend: {chat[0].key}={chat[0].path} is chat data; a blend takes pre-training "
            "token data only: give the chat dataset alone as data.path"
        )
        return problems
    if chat:
        return problems  # rows are counted after packing (launcher.data.chat.chat_checks)
    windows = sum(i.train_tokens // width for i in infos)
    if not problems and len(infos) == 1 and windows < global_batch:
        info = infos[0]
        problems.append(
            f"{info.key}={info.path}: {info.train_tokens:,} tokens make {windows} sequences of "
            f"model.seq_length={seq_length} + 1, fewer than one global batch ({global_batch}); "
            "add text, or lower train.global_batch_size or model.seq_length"
        )
    if _eval_on(eval_every):
        try:
            valid = validation_sources(infos, [e.weight for e in spec.entries], valid_path)
        except UserError as exc:
            return [*problems, str(exc)]
        if not valid:
            keys = ", ".join(i.key for i in infos)
            problems.append(
                f"train.eval_every={eval_every}: no validation data ({keys} hold no valid split); "
                "prepare with `llmtrain data prepare ... --valid-fraction 0.01`, set "
                "data.valid_path=DIR_OR_PREFIX, or train.eval_every=0"
            )
        for _, info, split in valid:
            tokens = info.valid_tokens if split == "valid" else info.train_tokens
            if tokens < width:
                problems.append(
                    f"{info.key}={info.path}: its validation split has {tokens:,} tokens, fewer "
                    f"than one sequence of model.seq_length={seq_length} + 1; prepare with a "
                    "larger --valid-fraction, or set data.valid_path=DIR_OR_PREFIX"
                )
    return problems


@dataclass(frozen=True)
class MegatronData:
    """Data and tokenizer facts the rendered Megatron-LM job needs (``megatron_data``)."""

    train: tuple[tuple[float, str], ...]  # (weight, prefix) of each training dataset
    valid: tuple[tuple[float, str], ...]  # empty: no separate validation data
    tokenizer_dir: str | None  # a folder holding tokenizer.json (HuggingFaceTokenizer)
    notes: tuple[str, ...]  # what Megatron-LM cannot read as given


def megatron_data(path: str | None, blend: list[object], valid_path: str | None) -> MegatronData:
    """Resolve data.path / data.blend / data.valid_path to Megatron prefixes, reading only
    metadata. A path that is not there (data on the cluster only) is taken as a Megatron prefix."""
    try:
        spec = data_spec(path, blend or None)
    except UserError:
        spec = None
    if spec is None:
        return MegatronData((), (), None, ())
    train: list[tuple[float, str]] = []
    valid: list[tuple[float, str]] = []
    notes: list[str] = []
    tokenizer_dir = None
    for entry, key in zip(spec.entries, spec.keys, strict=True):
        try:
            info = describe(str(entry.prefix), key)
        except UserError:
            train.append((entry.weight, str(entry.prefix)))
            continue
        if info.tokenizer_file is not None and tokenizer_dir is None:
            tokenizer_dir = str(info.tokenizer_file.parent)
        if info.chat is not None:
            notes.append(
                f"{key}={info.path} is chat data with per-token loss masks, which Megatron-LM's "
                "GPTDataset does not read: fine-tune it with backend=torch or backend=deepspeed"
            )
            continue
        if info.train_prefix is None:
            notes.append(
                f"{key}={info.path} is in llmtrain's shard format, which Megatron-LM does not "
                f"read: prepare it again with `llmtrain data prepare ... --format megatron`"
            )
            continue
        train.append((entry.weight, str(info.train_prefix)))
        if info.valid_prefix is not None:
            valid.append((entry.weight, str(info.valid_prefix)))
    if valid_path is not None:
        try:
            vinfo = describe(valid_path, "data.valid_path")
            prefix = vinfo.valid_prefix or vinfo.train_prefix
            valid = [(1.0, str(prefix))] if prefix is not None else []
        except UserError:
            valid = [(1.0, valid_path)]
    return MegatronData(tuple(train), tuple(valid), tokenizer_dir, tuple(notes))
