"""`llmtrain data prepare --input-format chat|instruct`: conversations to token ids and loss roles.

Each conversation (``launcher.data.chat_records``) is rendered with the chat template
(``launcher.data.chat_template``), tokenized with the tokenizer.json (no special tokens added: the
template writes them) and each token given a role byte:

    0  not an assistant token (system, user and tool text, the template's markup)
    1  an assistant turn, not the last of its conversation
    2  the last assistant turn (the completion of an instruct record)

The roles are stored, not a mask: ``data.train_on`` picks the trained tokens when a run opens the
data (assistant: roles 1 and 2; completion: role 2; all: every token), and so do packing and the
over-long policy (``launcher.data.packing``), so none of them needs the data prepared again.

An instruct record with a tokenizer that has no chat template is the prompt's text followed by the
completion's and the end-of-document token (role 2 on the completion and that token).

Layout of the output folder (index.json ``layout: "chat"``): per split, two Megatron-LM indexed
datasets with one sequence per conversation, the same lengths: ``{split}_chat_tokens.bin/.idx``
(token ids) and ``{split}_chat_roles.bin/.idx`` (uint8 roles), plus ``tokenizer.json`` and
``tokenizer_config.json`` (the template) copied beside. Nothing here imports torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from launcher import fsio
from launcher.data.chat_records import Conversation, detect_format, iter_conversations
from launcher.data.chat_template import (
    CONFIG_FILE,
    ChatTemplate,
    TemplateRenderError,
    extend_over_turn_end,
    token_mask,
)
from launcher.data.hf_tokenizer import HFTokenizerFile
from launcher.errors import UserError

CHAT_LAYOUT = "chat"
ROLE_PROMPT, ROLE_ASSISTANT, ROLE_FINAL = 0, 1, 2


def prefixes(split: str) -> dict[str, str]:
    return {"tokens": f"{split}_chat_tokens", "roles": f"{split}_chat_roles"}


@dataclass
class Example:
    ids: np.ndarray  # int64
    roles: np.ndarray  # uint8


@dataclass
class ChatTokenizer:
    """tokenizer.json + chat template: conversations to (ids, roles)."""

    tokenizer: HFTokenizerFile
    template: ChatTemplate | None
    specials: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        raw = self.tokenizer._tok
        added = raw.get_added_tokens_decoder().values()
        self.specials = tuple(t.content for t in added if t.special)

    def encode(self, conversation: Conversation) -> Example:
        if self.template is None:
            return self._plain_pair(conversation)
        messages = [dict(m) for m in conversation.messages]
        try:
            text = self.template.render(messages)
            spans = self.template.assistant_spans(messages, text)
        except TemplateRenderError as exc:
            raise UserError(
                f"{conversation.where}: the chat template ({self.template.origin}) refuses this "
                f"conversation: {exc}"
            ) from None
        spans = extend_over_turn_end(text, spans, self.specials)
        if not spans:
            raise UserError(
                f"{conversation.where}: no assistant text to train on (only tool calls without "
                "content)"
            )
        encoding = self.tokenizer._tok.encode(text, add_special_tokens=False)
        marks = np.asarray(token_mask(encoding.offsets, spans), dtype=np.int64)
        roles = np.where(marks == 0, ROLE_PROMPT, ROLE_ASSISTANT).astype(np.uint8)
        roles[marks == len(spans)] = ROLE_FINAL
        if not (roles > 0).any():
            raise UserError(f"{conversation.where}: the assistant text encodes to no token")
        return Example(np.asarray(encoding.ids, dtype=np.int64), roles)

    def _plain_pair(self, conversation: Conversation) -> Example:
        if conversation.pair is None:
            raise UserError(
                f"{conversation.where}: chat records need a chat template: the tokenizer has "
                f"no chat_template in its {CONFIG_FILE}; give one with --chat-template FILE.jinja"
            )
        prompt, completion = conversation.pair
        tok = self.tokenizer
        head = tok.encode(prompt)
        tail = tok.encode(completion)
        eod = np.asarray([tok.eod_id] if tok.eod_id is not None else [], dtype=np.int64)
        ids = np.concatenate([head, tail, eod]).astype(np.int64)
        roles = np.zeros(ids.size, dtype=np.uint8)
        roles[head.size :] = ROLE_FINAL
        return Example(ids, roles)


def load_chat_tokenizer(
    tokenizer: str, chat_template: str | None, eod_token: str | None, input_format: str
) -> ChatTokenizer:
    """The tokenizer.json at `tokenizer` and its template: `chat_template` (a .jinja file), else
    the chat_template of the tokenizer_config.json beside it. Instruct data may go without."""
    if tokenizer in ("byte", "bpe"):
        raise UserError(
            f"--tokenizer={tokenizer}: chat and instruct data need the model's tokenizer.json "
            "(its special tokens and chat template), e.g. --tokenizer /models/llama3/tokenizer.json"
        )
    path = Path(tokenizer).expanduser()
    tok = HFTokenizerFile(path, eod_token)
    config = path.parent / CONFIG_FILE
    template_file = Path(chat_template).expanduser() if chat_template else None
    if template_file is not None and not template_file.is_file():
        raise UserError(f"--chat-template {chat_template}: no such file (a Jinja template)")
    try:
        template: ChatTemplate | None = ChatTemplate.from_tokenizer_config(config, template_file)
    except UserError:
        if input_format != "instruct":
            raise
        template = None
    return ChatTokenizer(tok, template)


@dataclass
class _Split:
    tokens: Any
    roles: Any
    examples: int = 0
    tokens_total: int = 0
    assistant_tokens: int = 0


def prepare_chat(
    files: Sequence[Path],
    tmp: Path,
    tokenizer: str,
    input_format: str | None,
    chat_template: str | None,
    eod_token: str | None,
    valid_fraction: float,
    source: dict[str, Any],
    is_valid: Callable[[int, float], bool],
    tokenizer_file: str = "tokenizer.json",
    report: Any = None,
) -> dict[str, Any]:
    """Write the chat splits into `tmp` (the caller installs it); the index fields they need.
    `is_valid(i, fraction)`: whether example i is held out (``prepare.is_valid_document``)."""
    from launcher.data.megatron_indexed import IndexedDatasetWriter

    fmt = input_format or detect_format(list(files))
    tok = load_chat_tokenizer(tokenizer, chat_template, eod_token, fmt)
    tok.tokenizer.save(tmp / tokenizer_file)
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if tok.template is not None:
        config.update(tok.template.special_tokens)
        config["chat_template"] = tok.template.source
    fsio.write_json_atomic(tmp / CONFIG_FILE, config)
    vocab = tok.tokenizer.vocab_size
    splits: dict[str, _Split] = {}
    for name in ("train", "valid"):
        names = prefixes(name)
        roles = IndexedDatasetWriter(tmp / names["roles"], 256)
        roles.dtype = np.dtype(np.uint8)
        splits[name] = _Split(IndexedDatasetWriter(tmp / names["tokens"], vocab), roles)
    count = 0
    for conversation in iter_conversations(list(files), fmt):
        example = tok.encode(conversation)
        split = splits["valid" if is_valid(count, valid_fraction) else "train"]
        split.tokens.add_document(example.ids)
        split.roles.add_document(example.roles)
        split.examples += 1
        split.tokens_total += int(example.ids.size)
        split.assistant_tokens += int((example.roles > 0).sum())
        count += 1
        if report is not None and count % 10_000 == 0:
            report(f"{count:,} conversations")
    for split in splits.values():
        split.tokens.finish()
        split.roles.finish()
    train, valid = splits["train"], splits["valid"]
    if train.examples == 0:
        raise UserError(f"no conversations in {', '.join(map(str, files))}: every file is empty")
    out_prefixes = {"train": prefixes("train")["tokens"]}
    roles_prefixes = {"train": prefixes("train")["roles"]}
    if valid.examples:
        out_prefixes["valid"] = prefixes("valid")["tokens"]
        roles_prefixes["valid"] = prefixes("valid")["roles"]
    else:
        for prefix in prefixes("valid").values():
            for suffix in (".bin", ".idx"):
                os.unlink(tmp / f"{prefix}{suffix}")
    return {
        "vocab_size": vocab,
        "eod_id": tok.tokenizer.eod_id,
        "tokenizer_file": tokenizer_file,
        "total_tokens": train.tokens_total,
        "valid_tokens": valid.tokens_total,
        "valid_documents": valid.examples,
        "megatron_prefixes": out_prefixes,
        "chat": {
            "input_format": fmt,
            "template": tok.template.origin if tok.template is not None else None,
            "roles_prefixes": roles_prefixes,
            "train_examples": train.examples,
            "valid_examples": valid.examples,
            "assistant_tokens": train.assistant_tokens,
            "pad_id": tok.tokenizer.eod_id if tok.tokenizer.eod_id is not None else 0,
        },
        "source": {**source, "documents": count},
    }
