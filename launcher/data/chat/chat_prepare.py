"""`llmtrain data prepare --input-format chat|instruct|preference`: conversations to token ids
and loss roles.

Each conversation (``launcher.data.chat.chat_records``) is rendered with the chat template
(``templating.chat_template``), tokenized with the tokenizer.json (no special tokens added: the
template writes them) and each token given a role byte:

    0  not an assistant token (system, user and tool text, the template's markup)
    1  an assistant turn, not the last of its conversation
    2  the last assistant turn (the completion of an instruct record)

The roles are stored, not a mask: ``data.train_on`` picks the trained tokens when a run opens the
data (assistant: roles 1 and 2; completion: role 2; all: every token), and so do packing and the
over-long policy (``launcher.data.packing``), so none of them needs the data prepared again.

An instruct record with a tokenizer that has no chat template is the prompt's text followed by the
completion's and the end-of-document token (role 2 on the completion and that token).

A preference record (``launcher.data.chat.preference_records``) is two examples, prompt + chosen and
prompt + rejected, stored one after the other (sequences 2i and 2i + 1 of its split, a pair never
split between train and valid); the response is each one's last assistant turn (role 2), and
index.json's ``chat`` holds ``input_format: "preference"`` and the pair counts.

Layout of the output folder (index.json ``layout: "chat"``): per split, two Megatron-LM indexed
datasets with one sequence per conversation, the same lengths: ``{split}_chat_tokens.bin/.idx``
(token ids) and ``{split}_chat_roles.bin/.idx`` (uint8 roles), plus ``tokenizer.json`` and
``tokenizer_config.json`` (the template) copied beside. Nothing here imports torch.

Every conversation is rendered in one child process under the budget of ``launcher.data.limits``
(``templating.template_worker``), streamed while this process tokenizes; a conversation the
template refuses, or one that runs over a budget, ends the command with exit 2 naming FILE:LINE,
the template (and its line where known) and the budget.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from launcher import fsio
from launcher.data.chat.chat_records import INPUT_FORMATS, Conversation, conversation, record_format
from launcher.data.chat.preference_records import PREFERENCE, pair
from launcher.data.dataset_records import RecordOptions, iter_records
from launcher.data.hf_tokenizer import HFTokenizerFile
from launcher.data.length_histogram import HISTOGRAM_KEY, length_histogram
from launcher.data.limits import DataLimits
from launcher.data.templating.chat_template import (
    CONFIG_FILE,
    ChatTemplate,
    TemplateBudgetExceeded,
    TemplateRenderError,
    token_mask,
)
from launcher.data.templating.template_worker import TemplateWorker, refusal
from launcher.errors import UserError
from launcher.excerpt import message as quoted

CHAT_LAYOUT = "chat"
# Built-in chat templates, `--chat-template NAME`: Jinja files written for llmtrain from each
# format's public description (cited at the top of each file), checked token for token against
# transformers on the models' real templates (tests/unit/data/test_named_templates.py).
TEMPLATES_DIR = Path(__file__).resolve().parents[1] / "templates"
NAMED_TEMPLATES = ("chatml", "gemma", "llama3", "mistral", "phi3")
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

    def encode(self, conversation: Conversation, limits: DataLimits | None = None) -> Example:
        """One conversation's ids and roles, rendered in this process (under the sandbox's own
        guard; ``prepare_chat`` renders in the template worker)."""
        if self.template is None:
            return self._plain_pair(conversation)
        limits = limits or DataLimits()
        messages = [dict(m) for m in conversation.messages]
        where, origin = conversation.where, self.template.origin
        try:
            text, spans = self.template.conversation(messages, self.specials, limits)
        except TemplateBudgetExceeded as exc:
            raise refusal(where, origin, str(exc), exc.kind, limits) from None
        except TemplateRenderError as exc:
            raise refusal(where, origin, str(exc), None, limits) from None
        return self.encode_rendered(conversation, text, spans)

    def encode_rendered(
        self, conversation: Conversation, text: str, spans: list[tuple[int, int, int]]
    ) -> Example:
        """Ids and roles of a rendered conversation (`spans`: its assistant turns, extended over
        the turn ends)."""
        if not spans:
            raise UserError(
                f"{conversation.where}: no assistant text to train on (only tool calls without "
                "content)"
            )
        try:
            encoding = self.tokenizer._tok.encode(text, add_special_tokens=False)
        except Exception as exc:  # the library's TypeError / its own exceptions
            raise UserError(
                f"{conversation.where}: the tokenizer cannot encode this conversation "
                f"({type(exc).__name__}: {quoted(str(exc))})"
            ) from None
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


def _groups(
    inputs: Sequence[str | Path], fmt: str, options: RecordOptions, limits: DataLimits
) -> Iterator[tuple[Conversation, ...]]:
    """The records as groups of conversations stored together: one conversation, or a
    preference pair (chosen then rejected, sequences 2i and 2i + 1 of their split)."""
    if fmt not in (*INPUT_FORMATS, PREFERENCE):
        choices = ", ".join((*INPUT_FORMATS, PREFERENCE))
        raise UserError(f"--input-format={fmt}: must be one of {choices}")
    for where, record in iter_records(inputs, options, limits):
        yield pair(where, record) if fmt == PREFERENCE else (conversation(where, record, fmt),)


def detect_format(
    inputs: Sequence[str | Path], options: RecordOptions, limits: DataLimits | None = None
) -> str:
    """chat, instruct or preference, from the first record (``chat_records.record_format``)."""
    for where, record in iter_records(inputs, options, limits):
        found = record_format(record)
        if found is None:
            keys = ", ".join(sorted(map(str, record))[:8]) or "none"
            raise UserError(
                f'{where}: expected "messages", "conversations", "prompt" and "completion", or '
                f'"chosen" and "rejected" (rename columns with --columns messages=COLUMN); the '
                f"record has keys: {keys}"
            )
        return found
    raise UserError(f"no records in {', '.join(map(str, inputs))}: every input is empty")


def load_chat_tokenizer(
    tokenizer: str, chat_template: str | None, eod_token: str | None, input_format: str
) -> ChatTokenizer:
    """The tokenizer.json at `tokenizer` and its template: `chat_template` (a .jinja file, or the
    name of a built-in template: ``NAMED_TEMPLATES``), else the chat_template of the
    tokenizer_config.json beside it; the special tokens (bos_token, eos_token) always come from
    that file. Instruct data may go without."""
    if tokenizer in ("byte", "bpe"):
        raise UserError(
            f"--tokenizer={tokenizer}: chat and instruct data need the model's tokenizer.json "
            "(its special tokens and chat template), e.g. --tokenizer /models/llama3/tokenizer.json"
        )
    path = Path(tokenizer).expanduser()
    tok = HFTokenizerFile(path, eod_token)
    config = path.parent / CONFIG_FILE
    template_file = Path(chat_template).expanduser() if chat_template else None
    named = chat_template in NAMED_TEMPLATES and not (template_file and template_file.exists())
    if named:
        template_file = TEMPLATES_DIR / f"{chat_template}.jinja"
    if template_file is not None and not template_file.exists():  # a FIFO: the reader says so
        raise UserError(
            f"--chat-template {chat_template}: no such file (a Jinja template), nor a built-in "
            f"template ({', '.join(NAMED_TEMPLATES)})"
        )
    try:
        template: ChatTemplate | None = ChatTemplate.from_tokenizer_config(config, template_file)
        if named and template is not None:
            template = replace(template, origin=f"{chat_template} (built in)")
    except UserError:
        if input_format not in ("instruct", PREFERENCE):
            raise
        template = None
    return ChatTokenizer(tok, template)


@dataclass
class _Split:
    tokens: Any
    roles: Any
    examples: int = 0
    records: int = 0  # conversations, or preference pairs (two examples each)
    tokens_total: int = 0
    assistant_tokens: int = 0
    lengths: list[int] = field(default_factory=list)


def prepare_chat(
    files: Sequence[str | Path],
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
    options: RecordOptions | None = None,
    limits: DataLimits | None = None,
) -> dict[str, Any]:
    """Write the chat splits into `tmp` (the caller installs it); the index fields they need.
    `files`: JSON Lines, parquet, saved dataset folders, dataset ids
    (``launcher.data.dataset_records``, `options` their split and column mapping).
    `is_valid(i, fraction)`: whether example i is held out (``prepare.is_valid_document``);
    `limits`: what one record and its rendering may cost."""
    from launcher.data.megatron_indexed import IndexedDatasetWriter

    options = options or RecordOptions()
    limits = limits or DataLimits()
    fmt = input_format or detect_format(files, options, limits)
    tok = load_chat_tokenizer(tokenizer, chat_template, eod_token, fmt)
    if tok.template is not None:
        tok.template.check()
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
    # Every conversation goes through the template worker in order; a group (one conversation,
    # or a preference pair) is written together, into one split.
    sizes: deque[int] = deque()

    def conversations() -> Iterator[Conversation]:
        for group in _groups(files, fmt, options, limits):
            sizes.append(len(group))
            yield from group

    examples = _examples(tok, conversations(), limits)
    with contextlib.closing(examples) as encoded:  # stops the worker on any error
        count = _write_groups(encoded, sizes, splits, is_valid, valid_fraction, report, fmt)
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
            # The training examples by padded length: what plan prices data.packing=false with.
            HISTOGRAM_KEY: length_histogram(train.lengths),
            "pad_id": tok.tokenizer.eod_id if tok.tokenizer.eod_id is not None else 0,
            **(
                {"train_pairs": train.records, "valid_pairs": valid.records}
                if fmt == PREFERENCE
                else {}
            ),
        },
        "source": {**source, "documents": count},
    }


def _examples(
    tok: ChatTokenizer, conversations: Iterable[Conversation], limits: DataLimits
) -> Generator[Example, None, None]:
    """Each conversation's example, in order: rendered by the template worker (started at the
    first conversation, so that a bad first record costs no process), or a plain instruct pair
    when there is no template."""
    if tok.template is None:
        for conversation in conversations:
            yield tok.encode(conversation, limits)
        return
    records = iter(conversations)
    first = next(records, None)
    if first is None:
        return
    with TemplateWorker(tok.template, tok.specials, limits) as worker:
        for conversation, text, spans in worker.render_all(itertools.chain([first], records)):
            yield tok.encode_rendered(conversation, text, spans)


def _write_groups(
    examples: Iterable[Example],
    sizes: deque[int],
    splits: dict[str, _Split],
    is_valid: Callable[[int, float], bool],
    valid_fraction: float,
    report: Any,
    fmt: str,
) -> int:
    """Append each group of examples (`sizes`: how many examples each group has, in order) to
    its split; how many groups there were."""
    count = 0
    left = 0
    split = splits["train"]
    for example in examples:
        if left == 0:  # a new group: one split for all of it
            left = sizes.popleft()
            split = splits["valid" if is_valid(count, valid_fraction) else "train"]
            split.records += 1
            count += 1
            if report is not None and count % 10_000 == 0:
                report(f"{count:,} {'pairs' if fmt == PREFERENCE else 'conversations'}")
        split.tokens.add_document(example.ids)
        split.roles.add_document(example.roles)
        split.examples += 1
        split.tokens_total += int(example.ids.size)
        split.lengths.append(int(example.ids.size))
        split.assistant_tokens += int((example.roles > 0).sum())
        left -= 1
    return count
