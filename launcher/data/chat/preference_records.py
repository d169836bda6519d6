"""Preference pairs out of JSON Lines records, for `data prepare --input-format preference`.

One record a line (blank lines skipped) with ``chosen`` and ``rejected`` and, usually, ``prompt``:

- strings (TRL's "standard" preference format): ``{"prompt": "...", "chosen": "...",
  "rejected": "..."}``: the prompt is one user message, each response one assistant message;
- message lists (TRL's "conversational" format): ``{"prompt": [{"role": "user", "content":
  "..."}, ...], "chosen": [{"role": "assistant", "content": "..."}], "rejected": [...]}``;
- UltraFeedback-binarized's shape: ``prompt`` a string and ``chosen`` / ``rejected`` whole
  conversations that start with that prompt as a user message (the prompt is taken off them);
- no ``prompt`` (TRL's "implicit prompt"): ``chosen`` and ``rejected`` whole conversations, the
  prompt being the messages they share at the start.

After the prompt is taken off, each response must be exactly one assistant message with text.
A pair becomes two conversations, prompt + chosen and prompt + rejected
(``chat.chat_records.Conversation``), which ``launcher.data.chat.chat_prepare`` renders with
the chat template: the response is the conversation's last assistant turn (role 2), the tokens
that carry the loss. Every problem is a ``UserError`` naming the file and line.
"""

from __future__ import annotations

from typing import Any

from launcher.data.chat.chat_records import ROLES, Conversation
from launcher.errors import UserError

PREFERENCE = "preference"


def is_preference(record: dict[str, Any]) -> bool:
    return "chosen" in record and "rejected" in record


def _messages(value: Any, where: str, key: str, role: str) -> list[dict[str, Any]]:
    """A string as one message of `role`, or a list of role/content messages, checked."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if not isinstance(value, list) or not value:
        raise UserError(
            f"{where}: {key!r} must be a string or a non-empty list of messages "
            f"(role/content), got {type(value).__name__}"
        )
    out = []
    for i, item in enumerate(value):
        at = f"{where}: {key}[{i}]"
        if not isinstance(item, dict):
            raise UserError(f"{at}: expected an object with 'role' and 'content'")
        if item.get("role") not in ROLES:
            raise UserError(
                f"{at}: unknown role {item.get('role')!r}; expected one of {', '.join(ROLES)}"
            )
        if not isinstance(item.get("content"), str):
            kind = type(item.get("content")).__name__
            raise UserError(f"{at}: 'content' is {kind}, expected a string")
        out.append(dict(item))
    return out


def _shared_start(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _response(
    messages: list[dict[str, Any]], prompt: list[dict[str, Any]], where: str, key: str
) -> dict[str, Any]:
    """The one assistant message left of `messages` once `prompt` is taken off its start."""
    if messages[: len(prompt)] == prompt and len(messages) > len(prompt):
        messages = messages[len(prompt) :]
    if len(messages) != 1 or messages[0]["role"] != "assistant":
        roles = ", ".join(m["role"] for m in messages)
        raise UserError(
            f"{where}: {key!r} must be one assistant message once the prompt is taken off its "
            f"start, got {len(messages)} message(s) ({roles})"
        )
    if not messages[0]["content"].strip():
        raise UserError(f"{where}: {key!r} is an empty response (nothing to compare)")
    return messages[0]


def pair(where: str, record: dict[str, Any]) -> tuple[Conversation, Conversation]:
    """(prompt + chosen, prompt + rejected) of one record (module docstring)."""
    if not is_preference(record):
        keys = ", ".join(sorted(map(str, record))[:8]) or "none"
        raise UserError(
            f'{where}: expected "chosen" and "rejected" (and "prompt"); the record has keys: {keys}'
        )
    chosen = _messages(record["chosen"], where, "chosen", "assistant")
    rejected = _messages(record["rejected"], where, "rejected", "assistant")
    if "prompt" in record:
        prompt = _messages(record["prompt"], where, "prompt", "user")
    else:
        prompt = chosen[: _shared_start(chosen, rejected)]
        if not prompt:
            raise UserError(
                f'{where}: no "prompt", and "chosen" and "rejected" share no first message to '
                'take as the prompt; add "prompt"'
            )
    if prompt[-1]["role"] == "assistant":
        raise UserError(f"{where}: the prompt ends with an assistant message; it must end with "
                        "the message the responses answer (user, system or tool)")  # fmt: skip
    out = []
    for key, messages in (("chosen", chosen), ("rejected", rejected)):
        response = _response(messages, prompt, where, key)
        strings = isinstance(record.get("prompt"), str) and isinstance(record[key], str)
        plain = (record["prompt"], record[key]) if strings else None
        out.append(Conversation(f"{where} ({key})", (*prompt, response), plain))
    return out[0], out[1]
