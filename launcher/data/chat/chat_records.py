"""Conversations out of JSON Lines records, for supervised fine-tuning data.

One record a line (blank lines skipped), in one of three shapes:

- ``chat`` (OpenAI style): ``{"messages": [{"role": "system"|"user"|"assistant"|"tool",
  "content": "..."}, ...]}`` (an assistant message may carry ``tool_calls``, a tool message a
  ``tool_call_id`` / ``name``; they are passed to the template as they are);
- ``chat`` (ShareGPT style): ``{"conversations": [{"from": "system"|"human"|"gpt"|"tool", "value":
  "..."}, ...]}`` (``human``/``user`` become user, ``gpt``/``assistant`` assistant,
  ``tool``/``function``/``observation`` tool);
- ``instruct``: ``{"prompt": "...", "completion": "..."}`` (also ``instruction``/``input``/
  ``output``, Alpaca style: the prompt is the instruction, a blank line and the input when there is
  one), rendered as one user and one assistant message.

``detect_format`` tells chat from instruct by the first record. Every problem is a ``UserError``
naming the file and line: bad JSON, a record of another shape, an unknown role, a message without
text, a conversation without an assistant message, an assistant message with empty content, a
line over the record budget (``--max-record-mib``, read no further), a string holding a lone
surrogate (named by its field: ``messages[1].content``). What a record holds is quoted only
through ``launcher.excerpt``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.data.documents import json_line, record_lines
from launcher.data.limits import DataLimits
from launcher.errors import UserError
from launcher.excerpt import excerpt

INPUT_FORMATS = ("chat", "instruct")
ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}


@dataclass(frozen=True)
class Conversation:
    where: str  # FILE:LINE
    messages: tuple[dict[str, Any], ...]
    # instruct records: the prompt and the completion as plain text (for tokenizers without a chat
    # template); None for chat records.
    pair: tuple[str, str] | None = None


def _records(path: Path, limits: DataLimits) -> Iterator[tuple[str, dict[str, Any]]]:
    for where, line in record_lines(path, limits):
        record = json_line(line, where)
        if not isinstance(record, dict):
            raise UserError(f"{where}: expected a JSON object, got {type(record).__name__}")
        yield where, record


def record_format(record: dict[str, Any]) -> str | None:
    if "chosen" in record and "rejected" in record:  # launcher.data.chat.preference_records
        return "preference"
    if "messages" in record or "conversations" in record:
        return "chat"
    if ("prompt" in record and "completion" in record) or (
        "instruction" in record and "output" in record
    ):
        return "instruct"
    return None


def detect_format(files: list[Path], limits: DataLimits | None = None) -> str:
    """chat or instruct, from the first record of the first file that has one."""
    for path in files:
        for where, record in _records(path, limits or DataLimits()):
            found = record_format(record)
            if found is None:
                raise UserError(_shape_error(where, record))
            return found
    raise UserError(f"no records in {', '.join(map(str, files))}: every file is empty")


def _shape_error(where: str, record: dict[str, Any], expected: str | None = None) -> str:
    keys = ", ".join(excerpt(k) for k in sorted(map(str, record))[:8]) or "none"
    wanted = {
        "chat": '"messages" (role/content) or "conversations" (from/value)',
        "instruct": '"prompt" and "completion" (or "instruction" and "output")',
        None: '"messages", "conversations", "prompt" and "completion", or "chosen" and "rejected"',
    }[expected]
    return f"{where}: expected {wanted}; the record has keys: {keys}"


def _text(value: Any, where: str, what: str) -> str:
    if not isinstance(value, str):
        raise UserError(f"{where}: {what} is {type(value).__name__}, expected a string")
    return value


def _chat(where: str, record: dict[str, Any]) -> Conversation:
    if "messages" in record:
        raw, role_key, text_key, roles = record["messages"], "role", "content", None
    else:
        raw, role_key, text_key, roles = record["conversations"], "from", "value", SHAREGPT_ROLES
    field_name = "messages" if roles is None else "conversations"
    if not isinstance(raw, list) or not raw:
        raise UserError(f"{where}: {field_name!r} must be a non-empty list of messages")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        at = f"{where}: {field_name}[{i}]"
        if not isinstance(item, dict):
            raise UserError(f"{at}: expected an object with {role_key!r} and {text_key!r}")
        role = item.get(role_key)
        known = ROLES if roles is None else tuple(roles)
        if role not in known:
            raise UserError(
                f"{at}: unknown role {excerpt(role)}; expected one of {', '.join(known)}"
            )
        role = role if roles is None else roles[role]
        message = {k: v for k, v in item.items() if k not in (role_key, text_key)}
        content = item.get(text_key)
        if content is None and role == "assistant" and item.get("tool_calls"):
            message.update(role=role, content=None)
        else:
            text = _text(content, at, repr(text_key))
            if role == "assistant" and not text.strip():
                raise UserError(f"{at}: an assistant message with empty content")
            message.update(role=role, content=text)
        messages.append(message)
    if not any(m["role"] == "assistant" for m in messages):
        raise UserError(f"{where}: no assistant message (nothing to train on)")
    return Conversation(where, tuple(messages))


def _instruct(where: str, record: dict[str, Any]) -> Conversation:
    if "prompt" in record and "completion" in record:
        prompt = _text(record["prompt"], where, '"prompt"')
        completion = _text(record["completion"], where, '"completion"')
    elif "instruction" in record and "output" in record:
        prompt = _text(record["instruction"], where, '"instruction"')
        extra = record.get("input") or ""
        if _text(extra, where, '"input"'):
            prompt = f"{prompt}\n\n{extra}"
        completion = _text(record["output"], where, '"output"')
    else:
        raise UserError(_shape_error(where, record, "instruct"))
    if not completion.strip():
        raise UserError(f"{where}: an empty completion (nothing to train on)")
    messages = ({"role": "user", "content": prompt}, {"role": "assistant", "content": completion})
    return Conversation(where, messages, (prompt, completion))


def iter_conversations(
    files: list[Path], input_format: str, limits: DataLimits | None = None
) -> Iterator[Conversation]:
    """Every record of `files` (in order) as a Conversation; UserError naming FILE:LINE."""
    if input_format not in INPUT_FORMATS:
        raise UserError(f"--input-format={input_format}: must be one of {', '.join(INPUT_FORMATS)}")
    for path in files:
        if path.suffix != ".jsonl":
            raise UserError(
                f"--input {path}: chat and instruct data are read from JSON Lines files "
                "(*.jsonl, one record a line)"
            )
        for where, record in _records(path, limits or DataLimits()):
            yield conversation(where, record, input_format)


def conversation(where: str, record: dict[str, Any], input_format: str) -> Conversation:
    """One record of `input_format` (chat or instruct) as a Conversation; UserError naming
    `where` when it has another shape."""
    if record_format(record) != input_format:
        raise UserError(_shape_error(where, record, input_format))
    return _chat(where, record) if input_format == "chat" else _instruct(where, record)
